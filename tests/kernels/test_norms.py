"""The norms' training kernels (``glassgpt.kernels.norms.CompiledNorm`` on
``rowwise.norm_train`` and ``norm_train_backward``): the values and all three gradients
against PyTorch's autograd in float64, for the layer norm (centred) and the RMS norm, widths
on and off the 8-wide vectors, the AVX2 loops and the portable ones; the same bits for any
thread count; and which norms take them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import norms, rowwise

ext = pytest.importorskip(
    "glassgpt.kernels._rowwise", reason="the C extension is not built (no compiler at install)"
)


def _oracle(x, w, b, g, eps, centred):
    """y and (dx, dw, db) by autograd through the float64 formula."""
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = None if b is None else b.double().requires_grad_()
    if centred:
        y = F.layer_norm(x64, (x.shape[-1],), w64, b64, eps)
    else:
        y = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w64
    leaves = [x64, w64] + ([] if b64 is None else [b64])
    return y.detach(), torch.autograd.grad(y, leaves, g.double())


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 2e-5, terms: float = 0.0) -> None:
    """Within rel of the largest |want|, or of ``terms`` where that is larger: dx's terms are
    of the size s·|g w| and cancel, so its float32 error is of their size, not of dx's."""
    scale = max(want.abs().max().item(), terms, 1e-6)
    assert (got.double() - want).abs().max().item() <= rel * scale


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 100),
    d=st.sampled_from([1, 3, 8, 24, 32, 40, 128, 136]),
    centred=st.booleans(),
    bias=st.booleans(),
    portable_loop=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_values_and_gradients_are_the_float64_norms(
    rows: int, d: int, centred: bool, bias: bool, portable_loop: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=gen) * 3 + 1  # an offset: centring matters
    w = 1 + 0.3 * torch.randn(d, generator=gen)
    b = torch.randn(d, generator=gen) if bias and centred else None
    g = torch.randn(rows, d, generator=gen)
    ext.use_portable(portable_loop)
    try:
        leaves = [t.clone().requires_grad_() for t in (x, w)]
        b_leaf = None if b is None else b.clone().requires_grad_()
        y = norms.CompiledNorm.apply(leaves[0], leaves[1], b_leaf, 1e-5, centred)
        grads = torch.autograd.grad(y, leaves + ([] if b_leaf is None else [b_leaf]), g)
    finally:
        ext.use_portable(False)
    want_y, want_grads = _oracle(x, w, b, g, 1e-5, centred)
    _close(y, want_y, terms=w.abs().max().item())
    x64 = x.double() - (x.double().mean(-1, keepdim=True) if centred else 0)
    s = torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-5)
    terms = (s * (g * w).double().abs()).max().item()  # dx's, before they cancel
    for got, want in zip(grads, want_grads, strict=True):
        _close(got, want, terms=terms)


def test_the_results_do_not_depend_on_the_thread_count() -> None:
    """Rows in blocks of 32, their dw and db summed block by block: 1, 2 and 3 threads give
    the same bits (rows not a multiple of the block)."""
    x, g = torch.randn(203, 40), torch.randn(203, 40)
    w, b = torch.randn(40), torch.randn(40)
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            y, stats = rowwise.norm_train(x, w, b, 1e-5, centred=True)
            runs.append((y, stats, *rowwise.norm_train_backward(
                x, w, stats, g, centred=True, bias=True)))  # fmt: skip
    finally:
        torch.set_num_threads(before)
    for other in runs[1:]:
        for a, b_ in zip(runs[0], other, strict=True):
            assert torch.equal(a, b_)


def test_which_norms_take_the_kernels() -> None:
    """Training an RMS norm of float32 CPU tensors does; the layer norm keeps PyTorch's fused
    kernel (as fast there), and so do inference, float64 and non-contiguous inputs."""
    x = torch.randn(4, 70, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    assert type(norms.rms_norm(x, w, 1e-5).grad_fn).__name__ == "CompiledNormBackward"
    assert type(norms.layer_norm(x, w, None, 1e-5).grad_fn).__name__ != "CompiledNormBackward"
    for other, w_ in ((x.double(), w.double()), (x.transpose(0, 1), w)):
        assert type(norms.rms_norm(other, w_, 1e-5).grad_fn).__name__ != "CompiledNormBackward"
    with torch.no_grad():
        assert norms.rms_norm(x, w, 1e-5).grad_fn is None
    assert not rowwise.trains_norm(x, torch.ones(8), None)  # w of another width


def test_bad_calls_are_refused() -> None:
    with pytest.raises(ValueError, match="1 <= d"):
        ext.norm_train(0, 0, 0, 0, 0, 1, 0, 1e-5, 1, 1)
    with pytest.raises(ValueError, match="rows >= 0"):
        ext.norm_train_backward(0, 0, 0, 0, 0, 0, 0, -1, 4, 1, 1)
    with pytest.raises(TypeError):
        ext.norm_train(0, 0, 0)


def test_an_rms_norm_gpt_in_float32_matches_the_reference_and_float64_gradients() -> None:
    """A whole float32 GPT with RMS norms (so every norm takes the kernels in training):
    logits against the NumPy reference, every parameter's gradient against the float64
    model's (PyTorch's composite RMS norm there)."""
    from tests.model.helpers import numpy_weights, random_model, random_tokens, tiny_config

    from glassgpt.model import reference

    cfg = tiny_config(norm="rmsnorm", d_model=16, n_heads=4, d_mlp=40, n_ctx=12)
    model64 = random_model(cfg, seed=5)
    model32 = random_model(cfg, seed=5, dtype=torch.float32)
    tokens = random_tokens(cfg, batch=3, length=cfg.n_ctx)
    targets = random_tokens(cfg, batch=3, length=cfg.n_ctx, seed=9)
    logits = model32(tokens)
    assert any(
        type(n).__name__ == "CompiledNormBackward" for n in _graph(logits.grad_fn)
    )  # the kernels ran
    expected = reference.forward(cfg, numpy_weights(model64), tokens.numpy())
    np.testing.assert_allclose(logits.detach().double().numpy(), expected, rtol=0, atol=2e-5)
    F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten()).backward()
    F.cross_entropy(model64(tokens).flatten(0, 1), targets.flatten()).backward()
    grads64 = dict(model64.named_parameters())
    scale = max(p.grad.abs().max().item() for p in grads64.values())
    for name, p in model32.named_parameters():
        err = (p.grad.double() - grads64[name].grad).abs().max().item()
        assert err < 1e-5 * scale, name


def _graph(node) -> list:
    seen, stack = [], [node]
    while stack:
        n = stack.pop()
        if n is not None and n not in seen:
            seen.append(n)
            stack.extend(nx for nx, _ in n.next_functions)
    return seen
