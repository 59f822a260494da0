"""glassgpt's causal attention kernel (``glassgpt.kernels._flash``): z = softmax(q kᵀ/√d + M) v
and its gradients dq, dk, dv against autograd through the float64 softmax, at odd lengths and
widths, strided and contiguous inputs, both kernels (AVX2 and portable), any thread count; the
policy's rule and the seam's routing; a whole GPT's loss and gradients against PyTorch's kernel."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from glassgpt.kernels import attention_door, bf16, flash
from glassgpt.kernels.policy import (
    CAUSAL_MAX_HEAD,
    CAUSAL_MAX_KEYS,
    attention_path,
    keeps_probabilities,
)

ext = pytest.importorskip(
    "glassgpt.kernels._flash", reason="the C extension is not built (no compiler at install)"
)


@pytest.fixture
def portable() -> Iterator[None]:
    """The portable loops (as on a CPU without AVX2 + FMA) for one test."""
    assert ext.use_portable(True) == "portable"
    yield
    ext.use_portable(False)


def _inputs(B: int, H: int, T: int, D: int, strided: bool, seed: int) -> list[torch.Tensor]:
    """q, k, v [B, H, T, D]: views of one [B, T, 3, H, D] buffer as the model makes them, or
    three contiguous tensors; q scaled up so that some patterns are peaked."""
    gen = torch.Generator().manual_seed(seed)
    if strided:
        qkv = torch.randn(B, T, 3, H, D, generator=gen)
        qkv[:, :, 0] *= 2
        return list(qkv.permute(2, 0, 3, 1, 4).unbind(0))
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    return [q * 2, k, v]


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor):
    """z and (dq, dk, dv) for the gradient g, by autograd through the float64 softmax."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    T, D = q.shape[-2:]
    hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = (q64 @ k64.transpose(-1, -2) / math.sqrt(D)).masked_fill(hidden, -math.inf)
    z = torch.softmax(scores, -1) @ v64
    return z.detach(), torch.autograd.grad(z, (q64, k64, v64), g.double())


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    """Every entry within rel of the largest |want|, or of 1 where all are smaller (T = 1: dq
    and dk are 0, up to the float32 rounding of terms of the inputs' size, about 1)."""
    scale = max(want.abs().max().item(), 1.0)
    assert (got.double() - want).abs().max().item() <= rel * scale


def _run(q, k, v, g):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    z = flash.causal_attention(*leaves)
    z.backward(g)
    return z.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("T", [1, 7, 64, 129, 200])
@pytest.mark.parametrize("D", [8, 16, 32, 64, 12])
@pytest.mark.parametrize("H, strided", [(1, False), (4, True)])
def test_values_and_gradients_are_the_float64_softmaxs(
    T: int, D: int, H: int, strided: bool
) -> None:
    _check(T, D, H, strided)


@pytest.mark.parametrize("T, D", [(7, 8), (129, 32), (40, 12)])
@pytest.mark.parametrize("H, strided", [(1, False), (4, True)])
def test_the_portable_loops_too(T: int, D: int, H: int, strided: bool, portable: None) -> None:
    _check(T, D, H, strided)


def _check(T: int, D: int, H: int, strided: bool) -> None:
    q, k, v = _inputs(2, H, T, D, strided, seed=T * 100 + D)
    g = torch.randn(2, H, T, D, generator=torch.Generator().manual_seed(T))
    z, grads = _run(q, k, v, g)
    z64, grads64 = _oracle(q, k, v, g)
    assert z.shape == (2, H, T, D) and z.transpose(1, 2).is_contiguous()  # [B, T, H, D] buffer
    _close(z, z64)
    for got, want in zip(grads, grads64, strict=True):
        assert got.shape == (2, H, T, D)
        _close(got, want)


@pytest.mark.parametrize("D", [1, 5, 100, CAUSAL_MAX_HEAD])
def test_widths_off_the_fast_paths_vector_size(D: int) -> None:
    q, k, v = _inputs(1, 2, 37, D, True, seed=D)
    g = torch.randn(1, 2, 37, D, generator=torch.Generator().manual_seed(D))
    z, grads = _run(q, k, v, g)
    z64, grads64 = _oracle(q, k, v, g)
    _close(z, z64)
    for got, want in zip(grads, grads64, strict=True):
        _close(got, want)


def test_a_broadcast_gradient_and_inference() -> None:
    """z.sum() sends dz = ones with stride 0; without autograd the forward alone gives the
    same z bit for bit."""
    q, k, v = _inputs(2, 3, 50, 16, True, seed=1)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    z = flash.causal_attention(*leaves)
    z.sum().backward()
    z64, grads64 = _oracle(q, k, v, torch.ones(2, 3, 50, 16))
    _close(z.detach(), z64)
    for leaf, want in zip(leaves, grads64, strict=True):
        _close(leaf.grad, want)
    with torch.no_grad():
        assert torch.equal(flash.causal_attention(q, k, v), z.detach())


@pytest.mark.parametrize("keep_p", [False, True])
@pytest.mark.parametrize("portable_loop", [False, True])
def test_results_do_not_depend_on_the_thread_count(portable_loop: bool, keep_p: bool) -> None:
    ext.use_portable(portable_loop)
    q, k, v = _inputs(3, 4, 70, 32, True, seed=7)
    g = torch.randn(3, 4, 70, 32)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            z, kept = flash.forward(q, k, v, keep_p=keep_p)
            runs.append((z, kept, *flash.backward(q, k, v, z, kept, g)))
    finally:
        torch.set_num_threads(before)
        ext.use_portable(False)
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("T, D", [(1, 8), (7, 8), (64, 32), (70, 16), (129, 32)])
@pytest.mark.parametrize("portable_loop", [False, True])
def test_kept_p_and_recomputed_p_give_the_same_gradients(
    T: int, D: int, portable_loop: bool
) -> None:
    """The backward from the forward's P against the backward that recomputes it from lse, both
    against the float64 oracle; P itself is the softmax, zero past each row's last key and in
    the padding to 16 columns."""
    ext.use_portable(portable_loop)
    try:
        q, k, v = _inputs(2, 3, T, D, True, seed=T + D)
        g = torch.randn(2, 3, T, D, generator=torch.Generator().manual_seed(D))
        z, P = flash.forward(q, k, v, keep_p=True)
        z2, lse = flash.forward(q, k, v)
        assert torch.equal(z, z2) and P.shape == (2, 3, T, (T + 15) // 16 * 16)
        scores = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)).masked_fill(
            torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf
        )
        _close(P[..., :T], torch.softmax(scores, -1), rel=1e-6)
        assert not P[..., T:].any()
        _close(z, _oracle(q, k, v, g)[0])
        grads64 = _oracle(q, k, v, g)[1]
        from_p, from_lse = flash.backward(q, k, v, z, P, g), flash.backward(q, k, v, z, lse, g)
        for a, b, want in zip(from_p, from_lse, grads64, strict=True):
            _close(a, want)
            _close(b, want)
    finally:
        ext.use_portable(False)


def test_the_training_forward_keeps_p_for_short_rows_only() -> None:
    """P is kept while T (rounded up to 16) ≤ 4 d_head (rounded up to 8): nanoGPT's CPU shape
    and the speedrun's keep it; longer rows recompute it."""
    assert (
        keeps_probabilities(64, 32) and keeps_probabilities(128, 32) and keeps_probabilities(1, 1)
    )
    assert (
        not keeps_probabilities(129, 32)
        and not keeps_probabilities(256, 32)
        and keeps_probabilities(256, 64)
    )
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 40, 16, False, seed=2))
    z = flash.causal_attention(q, k, v)
    assert z.grad_fn.saved_tensors[-1].shape == (1, 2, 40, 48)  # P, not lse
    q, k, v = (t.detach()[..., :8].contiguous().requires_grad_() for t in (q, k, v))
    z = flash.causal_attention(q, k, v)
    assert z.grad_fn.saved_tensors[-1].shape == (1, 2, 40)  # 48 > 4 × 8: lse


def test_lse_is_the_rows_log_sum_exp() -> None:
    q, k, v = _inputs(2, 2, 33, 8, False, seed=3)
    _, lse = flash.forward(q, k, v)
    hidden = torch.ones(33, 33, dtype=torch.bool).triu(1)
    scores = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(8)).masked_fill(
        hidden, -math.inf
    )
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=0, atol=1e-5)


def test_bad_calls_are_refused() -> None:
    z = torch.empty(1, 1, 4, 8)
    with pytest.raises(ValueError, match="need 1 <= B"):
        ext.forward(z.data_ptr(), z.data_ptr(), z.data_ptr(), z.data_ptr(), 0, 0, 1, 1, 0, 8,
                    (0,) * 16, 1)  # fmt: skip
    with pytest.raises(ValueError, match="unit strides along d"):
        ext.forward(z.data_ptr(), z.data_ptr(), z.data_ptr(), z.data_ptr(), 0, 0, 1, 1, 4, 2,
                    (32, 32, 8, 1) * 3 + (32, 32, 8, 2), 1)  # fmt: skip
    with pytest.raises(ValueError, match="needs lse or P"):
        ext.backward(*(z.data_ptr(),) * 4, 0, 0, *(z.data_ptr(),) * 4, 1, 1, 4, 8,
                     (32, 32, 8, 1) * 8, 1)  # fmt: skip
    with pytest.raises(TypeError):
        ext.backward(z.data_ptr(), 1, 1, 4, 8, (0,) * 32, 1)


def test_policy() -> None:
    """float32 causal self-attention of small heads on a CPU, with the kernel built; decoding
    steps keep their own kernel, everything else PyTorch's."""
    f32 = dict(n_queries=128, causal_kernel=True)
    assert attention_path("cpu", "float32", 32, 128, **f32) == "causal_small"
    assert attention_path("cpu", "torch.float32", CAUSAL_MAX_HEAD, CAUSAL_MAX_KEYS,
                          n_queries=CAUSAL_MAX_KEYS, causal_kernel=True) == "causal_small"  # fmt: skip
    assert attention_path("cpu", "float32", 32, 128, n_queries=128) == "fused"  # not built
    assert attention_path("cpu", "float32", 32, 128, n_queries=100, causal_kernel=True) == "fused"
    assert attention_path("cpu", "float32", 32, 128, masked=True, **f32) == "fused"
    assert attention_path("cpu", "float32", 32, 128, dropout=True, **f32) == "math"
    assert attention_path("cpu", "bfloat16", 32, 128, **f32) == "explicit_bf16"
    assert attention_path("cuda", "float32", 32, 128, **f32) == "fused"
    assert attention_path("cpu", "float32", CAUSAL_MAX_HEAD + 1, 128, **f32) == "fused"
    long = dict(n_queries=CAUSAL_MAX_KEYS + 1, causal_kernel=True)
    assert attention_path("cpu", "float32", 32, CAUSAL_MAX_KEYS + 1, **long) == "fused"
    few = dict(n_queries=4, inference=True, few_queries_kernel=True, causal_kernel=True)
    assert attention_path("cpu", "float32", 32, 4, **few) == "few_queries"
    assert (
        attention_path("cpu", "float32", 32, 4, n_queries=4, causal_kernel=True) == "causal_small"
    )


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = flash.causal_attention
    monkeypatch.setattr(flash, "causal_attention", lambda *a: calls.append(1) or real(*a))
    return calls


def test_the_seam_routes_float32_self_attention_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    q, k, v = (t.requires_grad_() for t in _inputs(2, 2, 20, 16, False, seed=5))
    z = attention_door.attention(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-6)
    assert calls == [1]
    with torch.no_grad():  # a prompt's forward (more than FEW_QUERIES queries)
        attention_door.attention(q, k, v)
    assert calls == [1, 1]
    # after cached keys, with a mask, dropout, bf16 autocast on a CPU with bf16 arithmetic:
    # not this kernel
    attention_door.attention(q[:, :, 5:], k, v, offset=5)
    attention_door.attention(q, k, v, mask=torch.ones(20, 20, dtype=torch.bool).tril())
    attention_door.attention(q, k, v, dropout_p=0.1)
    monkeypatch.setattr(bf16, "native", lambda: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attention_door.attention(q, k, v)
    assert calls == [1, 1]
    # without bf16 arithmetic, bf16 q, k, v take it on float32 copies, z rounded to bf16
    monkeypatch.setattr(bf16, "native", lambda: False)
    qb, kb, vb = (t.detach().bfloat16() for t in (q, k, v))
    z = attention_door.attention(qb, kb, vb)
    assert calls == [1, 1, 1] and z.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(qb.double(), kb.double(), vb.double(), is_causal=True)
    torch.testing.assert_close(z.double(), ref.bfloat16().double(), rtol=8e-3, atol=1e-3)
    monkeypatch.setattr(flash, "_flash", None)  # as when no C compiler was there at install
    torch.testing.assert_close(attention_door.attention(q, k, v), want)
    assert calls == [1, 1, 1]


def test_a_gpts_loss_and_gradients_match_pytorchs_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from glassgpt.model import GPT, GPTConfig

    calls = _spy(monkeypatch)
    torch.manual_seed(0)
    config = GPTConfig(n_vocab=61, n_ctx=64, d_model=64, n_layers=2, n_heads=2)
    model = GPT(config)
    tokens, targets = torch.randint(0, 61, (3, 64)), torch.randint(0, 61, (3, 64))

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        _, loss = model(tokens, targets=targets)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, grads = loss_and_grads()
    assert calls == [1, 1]  # both layers
    monkeypatch.setattr(flash, "_flash", None)
    want_loss, want_grads = loss_and_grads()
    assert calls == [1, 1]
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=0)
    for name, want in want_grads.items():
        scale = want.abs().max().item()
        assert (grads[name] - want).abs().max().item() <= 1e-5 * scale + 1e-8, name


def _from_qkv(x: torch.Tensor, B: int, H: int, T: int, D: int) -> list[torch.Tensor]:
    """q, k, v [B, H, T, D] as the model makes them: views of one projection output."""
    return list((x * 1.0).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0))


@pytest.mark.parametrize("flat", [False, True])
def test_q_k_v_of_one_projection_send_their_gradient_in_its_layout(flat: bool) -> None:
    """The same z and the same gradient of the projection, to the bit, whether autograd goes
    through the packed function or through dq, dk, dv and the unbind; and the float64 oracle."""
    B, H, T, D = 2, 3, 41, 16
    torch.manual_seed(7)
    shape = (B * T, 3 * H * D) if flat else (B, T, 3 * H * D)  # F.linear's 2-D or 3-D result
    x = torch.randn(shape, requires_grad=True)
    g = torch.randn(B, H, T, D)
    q, k, v = _from_qkv(x, B, H, T, D)
    assert flash.packed_base(q, k, v) is not None
    z = flash.causal_attention(q, k, v)
    (dx,) = torch.autograd.grad(z, x, g)
    q, k, v = _from_qkv(x, B, H, T, D)
    z_ref = flash.CausalAttention.apply(q, k, v)
    (dx_ref,) = torch.autograd.grad(z_ref, x, g)
    assert torch.equal(z, z_ref) and torch.equal(dx, dx_ref)
    want_z, want_grads = _oracle(*(t.detach() for t in _from_qkv(x, B, H, T, D)), g)
    _close(z, want_z)
    _close(dx.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4), torch.stack(want_grads))


def test_views_that_are_not_one_unbind_take_the_unpacked_function() -> None:
    """q from a hook's own tensor, a gradient hook on q, or q, k, v of different tensors: the
    gradient goes through q, k and v, so that every hook on them runs."""
    B, H, T, D = 1, 2, 9, 8
    x = torch.randn(B, T, 3 * H * D, requires_grad=True)
    q, k, v = _from_qkv(x, B, H, T, D)
    seen: list[torch.Tensor] = []
    q.register_hook(seen.append)
    assert flash.packed_base(q, k, v) is None
    flash.causal_attention(q, k, v).sum().backward()
    assert len(seen) == 1
    q, k, v = _from_qkv(x, B, H, T, D)
    assert flash.packed_base(q.transpose(1, 2).transpose(1, 2), k, v) is None
    assert flash.packed_base(*_from_qkv(x, B, H, T, D)[:2], v) is None
    with torch.no_grad():
        assert flash.packed_base(*_from_qkv(x, B, H, T, D)) is None


@pytest.mark.parametrize("onednn_on", [False, True])
def test_the_qkv_projection_reaches_the_packed_function_by_either_product_kernel(
    monkeypatch: pytest.MonkeyPatch, onednn_on: bool
) -> None:
    """q, k, v of the model's own QKV projection (``kernels.dense.matmul``) are views of one
    tensor that autograd tracks, whether oneDNN or ``F.linear`` computed it: an output that is
    a view made inside an autograd Function has an untracked base, which hid the projection
    from ``packed_base`` on AVX-512 CPUs."""
    from glassgpt.kernels import dense, onednn

    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", onednn_on)
    monkeypatch.setattr(onednn, "MIN_MACS", 0)
    B, H, T, D = 2, 2, 24, 8
    x = torch.randn(B, T, 16, requires_grad=True)
    W = torch.randn(16, 3 * H * D, requires_grad=True)
    assert onednn.use_onednn(x, W) == (onednn_on and onednn._KERNEL is not None)
    q, k, v = dense.matmul(x, W).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    assert flash.packed_base(q, k, v) is not None
    z = flash.causal_attention(q, k, v)
    assert type(z.grad_fn).__name__ == "CausalAttentionQKVBackward"
    g = torch.randn_like(z)
    dx, dW = torch.autograd.grad(z, (x, W), g)
    x64, W64 = x.detach().double(), W.detach().double()
    q, k, v = (x64 @ W64).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    want_z, (dq, dk, dv) = _oracle(q, k, v, g.double())
    dqkv = torch.stack([dq, dk, dv]).permute(1, 3, 0, 2, 4).reshape(B, T, 3 * H * D)
    _close(z, want_z)
    _close(dx, dqkv @ W64.T)
    _close(dW, x64.flatten(0, 1).T @ dqkv.flatten(0, 1))
