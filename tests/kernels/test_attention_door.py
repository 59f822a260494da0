"""The attention kernel's CPU small-head paths against float64 softmax(q kᵀ/√d + M) v."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glassgpt.kernels import attention_path


def test_policy_follows_the_device() -> None:
    """The same bf16 small-head shape takes the explicit product on a CPU, the fused kernel
    on a GPU; float32 and wide heads take the fused kernel everywhere."""
    assert attention_path("cpu", "bfloat16", 16, 64) == "explicit_bf16"
    assert attention_path("cpu", "bfloat16", 16, 129) == "fused_float32"
    assert attention_path("cpu", "bfloat16", 16, 64, masked=True) == "fused_float32"
    assert attention_path("cuda", "bfloat16", 16, 64) == "fused"
    assert attention_path("cpu", "float32", 16, 64) == "fused"
    assert attention_path("cpu", "bfloat16", 64, 64) == "fused"
    assert attention_path("cpu", "float32", 64, 64, dropout=True) == "math"


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-autocast", "fp32"])
@pytest.mark.parametrize("offset", [0, 7])
@pytest.mark.parametrize("length", [40, 130])  # explicit product (≤ 128 keys), fused float32
def test_small_cpu_heads_match_float64(length: int, offset: int, bf16: bool, monkeypatch) -> None:
    """On CPUs, heads narrower than 64 under bf16 autocast take the explicit product up to 128
    keys and float32 copies beyond (glassgpt's causal kernel for self-attention, the fused
    kernel after cached keys); float32 heads glassgpt's causal kernel (when
    built) for self-attention, the fused kernel after cached keys. Each agrees with the
    float64 softmax(q kᵀ/√d + M) v to the precision's accuracy, forward and backward
    (``offset``: queries after cached keys). As on a CPU with bf16 arithmetic; without it
    bf16 takes float32 copies (tests/kernels/test_flash.py)."""
    from glassgpt.kernels import attention_door, flash
    from glassgpt.kernels import bf16 as bf16_kernels

    monkeypatch.setattr(bf16_kernels, "native", lambda: True)

    fused_calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        attention_door.F,
        "scaled_dot_product_attention",
        lambda *a, **k: fused_calls.append(a[0].dtype) or real_sdpa(*a, **k),
    )
    gen = torch.Generator().manual_seed(length + offset)
    t_q, t_k = length - offset, length
    shapes = [(2, 3, t_q, 16), (2, 3, t_k, 16), (2, 3, t_k, 16)]
    q64, k64, v64 = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    g = torch.randn(2, 3, t_q, 16, generator=gen, dtype=torch.float64)
    leaves = [t.float().requires_grad_() for t in (q64, k64, v64)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        z = attention_door.attention(*leaves, offset=offset)
    z.backward(g.float())
    assert z.dtype == (torch.bfloat16 if bf16 else torch.float32)
    causal = offset == 0 and flash._flash is not None  # float32 (copies): the causal kernel
    own_kernel = (t_k <= 128 or causal) if bf16 else causal
    assert fused_calls == ([] if own_kernel else [torch.float32])

    leaves64 = [t.requires_grad_() for t in (q64, k64, v64)]
    hidden = torch.ones(t_q, t_k, dtype=torch.bool).triu(offset + 1)
    scores = (leaves64[0] @ leaves64[1].transpose(-1, -2)) / 4.0  # √16
    z64 = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ leaves64[2]
    z64.backward(g)
    # bf16 keeps 8 bits of mantissa: relative errors of a few 1e-3 per entry
    tol = 2e-2 if bf16 else 1e-5
    assert (z.double() - z64).norm() / z64.norm() < tol
    for got, want in zip(leaves, leaves64, strict=True):
        assert (got.grad.double() - want.grad).norm() / want.grad.norm() < 1.5 * tol


@pytest.mark.parametrize("kernel", [True, False], ids=["decoding-kernel", "mask"])
def test_per_row_offsets_equal_each_row_alone(kernel: bool, monkeypatch) -> None:
    """Row b's query at position offset[b] sees keys 0..offset[b] of its own row, equal to each
    row's own causal attention in float64; the keys past it are never read by the decoding
    kernel (NaN there) and weigh nothing through the mask (large finite values there)."""
    from glassgpt.kernels import attention_door

    if kernel and attention_door._attend is None:
        pytest.skip("glassgpt's decoding kernel is not built")
    if not kernel:
        monkeypatch.setattr(attention_door, "_attend", None)
    g = torch.Generator().manual_seed(0)
    B, H, Tk, D = 4, 3, 20, 16
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = torch.randn(B, H, Tk, D, generator=g), torch.randn(B, H, Tk, D, generator=g)
    offsets = torch.tensor([0, 7, 19, 3])
    for b, n in enumerate(offsets.tolist()):  # past each row's keys: values no row may see
        k[b, :, n + 1 :] = float("nan") if kernel else 1e4
        v[b, :, n + 1 :] = float("inf") if kernel else -1e4
    with torch.inference_mode():
        z = attention_door.attention(q, k, v, offsets)
    for b, n in enumerate(offsets.tolist()):
        qb, kb, vb = (t[b : b + 1].double() for t in (q, k[:, :, : n + 1], v[:, :, : n + 1]))
        want = F.scaled_dot_product_attention(qb, kb, vb)
        torch.testing.assert_close(z[b : b + 1].double(), want, rtol=1e-5, atol=1e-6)


def test_a_gpt_traces_into_one_graph_under_torch_compile() -> None:
    """Dynamo traces the whole CPU forward and loss without a graph break: the seams ask
    nothing it cannot trace while compiling (the CPU's bf16 question reads /proc/cpuinfo,
    which broke the graph at every attention before)."""
    import torch._dynamo

    from glassgpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=65, n_ctx=16, d_model=32, n_layers=2, n_heads=4))
    tokens = torch.randint(0, 65, (2, 16))
    explained = torch._dynamo.explain(model)(tokens, tokens)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
