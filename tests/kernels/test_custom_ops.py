"""glassgpt's kernels as PyTorch custom operators (``glassgpt.kernels.custom_ops``): each
operator's fake implementation, autograd formula and schema pass PyTorch's own ``opcheck``
(which runs them eagerly, under fake tensors and through AOT autograd, and compares); the
results equal the eager seams'; and a GPT compiled with them registered traces into one
graph that calls them, with the loss and every gradient of the eager model."""

from __future__ import annotations

import copy

import pytest
import torch

from glassgpt.kernels import custom_ops, flash, onednn

pytest.importorskip(
    "glassgpt.kernels._flash", reason="the C extensions are not built (no compiler at install)"
)


@pytest.fixture(scope="module")
def ops() -> dict:
    custom_ops.register()
    custom_ops.register()  # idempotent
    assert custom_ops.registered()
    return custom_ops._OPS


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("keep_t", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_the_linear_operator_passes_opcheck(
    ops, transposed: bool, keep_t: bool, bias: bool
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, 16, generator=gen, requires_grad=True)
    W = torch.randn(*((40, 16) if transposed else (16, 40)), generator=gen, requires_grad=True)
    b = torch.randn(40, generator=gen, requires_grad=True) if bias else None
    torch.library.opcheck(ops["linear"], (x, W, b, transposed, keep_t))


@pytest.mark.parametrize("packed", [False, True])
def test_the_attention_operator_passes_opcheck(ops, packed: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    B, H, T, D = 2, 3, 21, 8
    if packed:  # q, k, v as views of the QKV projection's [B, T, 3, H, D] output
        qkv = torch.randn(B, T, 3, H, D, generator=gen, requires_grad=True)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q, k, v = (torch.randn(B, H, T, D, generator=gen, requires_grad=True) for _ in range(3))
    torch.library.opcheck(ops["causal"], (q, k, v))


def test_the_operators_compute_what_the_eager_seams_compute(ops) -> None:
    """Forward and gradients bit for bit: the same kernels, called the same way."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 32, 64, generator=gen, requires_grad=True)
    W = torch.randn(64, 192, generator=gen, requires_grad=True)
    b = torch.randn(192, generator=gen, requires_grad=True)
    g = torch.randn(2, 32, 192, generator=gen)
    got = custom_ops.linear(x, W, b, False)
    grads = torch.autograd.grad(got, (x, W, b), g)
    want = onednn.linear(x, W, b, False)
    wants = torch.autograd.grad(want, (x, W, b), g)
    assert torch.equal(got, want)
    for a, w in zip(grads, wants):
        assert torch.equal(a, w)

    q, k, v = (torch.randn(2, 4, 40, 16, generator=gen, requires_grad=True) for _ in range(3))
    dz = torch.randn(2, 4, 40, 16, generator=gen)
    z = custom_ops.causal_attention(q, k, v)
    z_eager = flash.CausalAttention.apply(q, k, v)
    assert torch.equal(z, z_eager)
    for a, w in zip(
        torch.autograd.grad(z, (q, k, v), dz), torch.autograd.grad(z_eager, (q, k, v), dz)
    ):
        assert torch.equal(a, w)


def test_a_compiled_gpt_calls_them_and_trains_as_the_eager_one(ops) -> None:
    """One graph, no break, the products and the attention as glassgpt's operators (where
    oneDNN would take them eagerly), and the loss and every gradient of the eager model."""
    import torch._dynamo

    from glassgpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    # products of at least onednn.MIN_MACS multiply-adds, so that they take oneDNN
    model = GPT(GPTConfig(n_vocab=65, n_ctx=64, d_model=128, n_layers=2, n_heads=4, dropout=0.0))
    twin = copy.deepcopy(model)
    tokens = torch.randint(0, 65, (4, 64))
    targets = torch.randint(0, 65, (4, 64))
    explained = torch._dynamo.explain(twin)(tokens, targets)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    code = explained.graphs[0].code
    assert "glassgpt.causal_attention" in code
    if onednn.ONEDNN_PREFERRED and onednn._KERNEL is not None:
        assert "glassgpt.linear" in code

    torch._dynamo.reset()
    _, loss = model(tokens, targets)
    loss.backward()
    _, loss_c = torch.compile(twin)(tokens, targets)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for (name, p), p_c in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_c.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
