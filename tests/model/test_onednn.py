"""The oneDNN float32 linear (forward and gradients) against float64 products and the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassgpt.kernels import onednn
from glassgpt.model import reference
from glassgpt.model.layers import linear

from .helpers import numpy_weights, random_model, random_tokens, tiny_config

pytestmark = pytest.mark.skipif(
    onednn._KERNEL is None or not torch.backends.mkldnn.is_available(),
    reason="this PyTorch build has no oneDNN linear kernel",
)


def _leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(3, 50), (150,), (2, 3, 25)])
@pytest.mark.parametrize(("d_in", "d_out"), [(96, 160), (160, 96)])  # either operand narrower
def test_forward_and_gradients_match_float64(
    transposed: bool, bias: bool, lead: tuple[int, ...], d_in: int, d_out: int
) -> None:
    x_shape = (*lead, d_in)
    x64, W64, b64, g64 = _leaves(
        x_shape, (d_out, d_in) if transposed else (d_in, d_out), (d_out,), (*x_shape[:-1], d_out)
    )
    leaves64 = [t.requires_grad_() for t in (x64, W64, b64)]
    y64 = F.linear(x64, W64 if transposed else W64.T, b64 if bias else None)
    y64.backward(g64)

    x, W, b = (t.detach().float().requires_grad_() for t in leaves64)
    y = onednn.linear(x, W, b if bias else None, transposed)
    y.backward(g64.float())

    assert y.shape == y64.shape and y.dtype == torch.float32
    # float32 products of length ≤ 150 with O(1) terms: errors of order 1e-5 relative to the
    # largest entry; a wrong layout or a missing transpose is off by O(1).
    for got, want in [(y, y64), (x.grad, x64.grad), (W.grad, W64.grad)]:
        assert got.shape == want.shape
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err < 1e-5
    assert W.grad.stride() == W.stride()  # the gradient is laid out like the weight
    if bias:
        torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-5, atol=1e-5)
    else:
        assert b.grad is None


@pytest.mark.parametrize(("d_in", "d_out"), [(96, 160), (160, 96), (96, 96)])
def test_forward_keeps_the_transposed_input_only_where_it_is_the_narrower(d_in, d_out) -> None:
    """Where xᵀ is ∂W's transposed operand (d_in < d_out) the forward keeps xᵀ, made while x
    is in the caches, instead of x; otherwise x, transposed (or gᵀ) in the backward."""
    x, W = (t.float().requires_grad_() for t in _leaves((2, 50, d_in), (d_in, d_out)))
    y = onednn.OneDNNLinear.apply(x, W, None, False)
    kept = y.grad_fn.saved_tensors[0]
    if d_in < d_out:
        assert kept.shape == (d_in, 100) and torch.equal(kept, x.detach().reshape(100, d_in).T)
    else:
        assert kept.shape == (100, d_in)
    no_weight_grad = onednn.OneDNNLinear.apply(x, W.detach(), None, False)
    assert no_weight_grad.grad_fn.saved_tensors[0].shape == (100, d_in)  # x: no ∂W, no xᵀ


def test_two_products_of_one_input_share_its_transpose_while_it_is_unchanged() -> None:
    """A gated MLP's W_in and W_gate read one x: one xᵀ for both; a changed x gets its own."""
    x64, W64, V64 = _leaves((120, 64), (64, 192), (64, 256))
    x, W, V = (t.float().requires_grad_() for t in (x64, W64, V64))
    h = x * 1.0  # a non-leaf x, as the norm's output is
    a = onednn.OneDNNLinear.apply(h, W, None, False)
    b = onednn.OneDNNLinear.apply(h, V, None, False)
    shared = a.grad_fn.saved_tensors[0]
    assert shared is b.grad_fn.saved_tensors[0]
    (a.sum() + (b * b).sum()).backward()
    for t in (x64, W64, V64):
        t.requires_grad_()
    (x64 @ W64).sum().add((x64 @ V64).pow(2).sum()).backward()
    for got, want in [(x.grad, x64.grad), (W.grad, W64.grad), (V.grad, V64.grad)]:
        assert ((got.double() - want).abs().max() / want.abs().max()) < 1e-5
    with torch.no_grad():
        h.mul_(2.0)  # changed in place: a product of it now makes its own transpose
    c = onednn.OneDNNLinear.apply(h, W, None, False)
    kept = c.grad_fn.saved_tensors[0]
    assert kept is not shared and torch.equal(kept, h.detach().T)


def test_only_requested_gradients_are_computed() -> None:
    x, W = (t.float() for t in _leaves((64, 128), (128, 256)))
    W.requires_grad_()
    y = onednn.OneDNNLinear.apply(x, W, None, False)
    y.sum().backward()
    assert x.grad is None
    torch.testing.assert_close(W.grad, x.T @ torch.ones(64, 256), rtol=1e-5, atol=1e-4)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_use_onednn_decides_by_cpu_dtype_size_autocast_and_flag(monkeypatch) -> None:
    big_x, big_W = torch.randn(256, 128), torch.randn(128, 384)
    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", False)
    assert not onednn.use_onednn(big_x, big_W)  # no AVX-512: MKL measured faster
    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", True)
    assert onednn.use_onednn(big_x, big_W)
    assert not onednn.use_onednn(big_x.double(), big_W.double())  # float64 stays on F.linear
    assert not onednn.use_onednn(torch.randn(1, 128), big_W)  # one row: MKL's overhead is lower
    assert not onednn.use_onednn(torch.randn(4, 8), torch.randn(8, 8))  # too small to pay
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn.use_onednn(big_x, big_W)  # autocast casts; F.linear handles it
    with torch.backends.mkldnn.flags(enabled=False):
        assert not onednn.use_onednn(big_x, big_W)


def test_linear_takes_the_onednn_path_for_three_dimensional_weights(monkeypatch) -> None:
    calls = []
    real = onednn.OneDNNLinear.apply
    monkeypatch.setattr(onednn, "MIN_MACS", 0)
    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", True)
    monkeypatch.setattr(
        "glassgpt.kernels.onednn.OneDNNLinear.apply", lambda *a: calls.append(1) or real(*a)
    )
    z, W_O = (t.float() for t in _leaves((2, 5, 4 * 6), (4, 6, 10)))
    W_O.requires_grad_()
    out = linear(z, W_O)
    assert calls == [1]
    want = z @ W_O.detach().reshape(24, 10)
    torch.testing.assert_close(out.detach(), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # nothing to record: the product alone, no Function, no saved x
        out = linear(z, W_O)
    assert calls == [1]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie", [True, False])
def test_float32_model_through_onednn_matches_reference_and_float64_gradients(
    monkeypatch, tie: bool
) -> None:
    """Every product of a whole float32 GPT through oneDNN (threshold lowered to zero): logits
    against the NumPy reference, parameter gradients against the float64 model's."""
    monkeypatch.setattr(onednn, "MIN_MACS", 0)
    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", True)
    cfg = tiny_config(d_model=16, n_heads=4, d_mlp=40, n_ctx=12, tie_embeddings=tie)
    model64 = random_model(cfg, seed=3)
    model32 = random_model(cfg, seed=3, dtype=torch.float32)
    tokens = random_tokens(cfg, batch=3, length=cfg.n_ctx)

    logits = model32(tokens)
    expected = reference.forward(cfg, numpy_weights(model64), tokens.numpy())
    np.testing.assert_allclose(logits.detach().double().numpy(), expected, rtol=0, atol=2e-5)

    targets = random_tokens(cfg, batch=3, length=cfg.n_ctx, seed=7)
    for model in (model32, model64):
        F.cross_entropy(model(tokens).flatten(0, 1).double(), targets.flatten()).backward()
    grads64 = {name: p.grad for name, p in model64.named_parameters()}
    scale = max(g.abs().max().item() for g in grads64.values())
    for name, p in model32.named_parameters():  # b_K's gradient is exactly zero in the math
        err = (p.grad.double() - grads64[name]).abs().max().item()
        assert err < 1e-5 * scale, name
