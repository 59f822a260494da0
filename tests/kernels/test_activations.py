"""The tanh GELU's σ form computes GPT-2's GELU and its derivative: checked against the tanh
formula in float64 NumPy, against PyTorch's fused kernel (values and gradients, stated
tolerances), and by finite differences; the other inputs keep PyTorch's kernel."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassgpt.kernels import activations, rowwise
from glassgpt.kernels.activations import (
    CompiledExactGELU,
    CompiledGELU,
    SigmoidGELU,
    gelu_tanh,
    use_sigmoid_form,
)


def _tanh_gelu_np(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """½ x (1 + tanh(u)), u = √(2/π)(x + 0.044715 x³), and its derivative, in float64."""
    k = math.sqrt(2.0 / math.pi)
    u = k * (x + 0.044715 * x**3)
    t = np.tanh(u)
    y = 0.5 * x * (1.0 + t)
    dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * k * (1.0 + 3 * 0.044715 * x**2)
    return y, dy


def _inputs(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 7, 33, generator=gen, dtype=torch.float64) * 3.0
    x[0, 0, :5] = torch.tensor([0.0, -12.0, 12.0, -40.0, 40.0], dtype=torch.float64)  # tails
    return x.to(dtype)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_sigmoid_form_matches_the_tanh_formula_values_and_gradients(dtype, tol) -> None:
    x = _inputs(dtype).requires_grad_(True)
    g = _inputs(dtype, seed=1)
    y = SigmoidGELU.apply(x)
    (dx,) = torch.autograd.grad(y, x, g)
    want_y, want_dy = _tanh_gelu_np(x.detach().double().numpy())
    np.testing.assert_allclose(y.detach().double().numpy(), want_y, rtol=tol, atol=tol)
    want_dx = want_dy * g.double().numpy()
    np.testing.assert_allclose(dx.double().numpy(), want_dx, rtol=tol, atol=tol * 10)


def test_sigmoid_form_agrees_with_pytorchs_fused_kernel_in_float32() -> None:
    x = _inputs(torch.float32, seed=2).requires_grad_(True)
    g = _inputs(torch.float32, seed=3)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = SigmoidGELU.apply(x), F.gelu(x_ref, approximate="tanh")
    (dx,) = torch.autograd.grad(y, x, g)
    (dx_ref,) = torch.autograd.grad(y_ref, x_ref, g)
    torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=2e-6)  # rounding only
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)


def test_sigmoid_form_gradient_by_finite_differences() -> None:
    x = torch.linspace(-6.0, 6.0, 41, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(SigmoidGELU.apply, (x,))


def test_dispatch_takes_the_sigmoid_form_only_where_it_applies(monkeypatch) -> None:
    calls = []
    real = SigmoidGELU.apply
    monkeypatch.setattr(SigmoidGELU, "apply", lambda x: calls.append(x.dtype) or real(x))
    monkeypatch.setattr(rowwise, "_rowwise", None)  # as without the compiled kernels
    x = _inputs(torch.float32)
    assert x.numel() < activations.MIN_ELEMENTS  # a few rows: PyTorch's kernel, bit for bit
    assert torch.equal(gelu_tanh(x), F.gelu(x, approximate="tanh")) and calls == []
    x = torch.cat([x] * (activations.MIN_ELEMENTS // x.numel() + 1))
    assert use_sigmoid_form(x) and use_sigmoid_form(x.double())
    gelu_tanh(x)
    assert calls == [torch.float32]
    xb = x.bfloat16()
    assert not use_sigmoid_form(xb)  # bf16: PyTorch's kernel, bit for bit
    assert torch.equal(gelu_tanh(xb), F.gelu(xb, approximate="tanh"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_sigmoid_form(x)
    assert calls == [torch.float32]
    monkeypatch.setattr(activations.torch.compiler, "is_compiling", lambda: True)
    x = x.requires_grad_(True)  # compiling: the plain σ expression, for inductor to fuse
    y, y_ref = gelu_tanh(x), F.gelu(x, approximate="tanh")
    assert calls == [torch.float32]
    torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=2e-6)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(*(torch.autograd.grad(t, x, g)[0] for t in (y, y_ref)),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


needs_kernel = pytest.mark.skipif(rowwise._rowwise is None, reason="_rowwise is not built")


@needs_kernel
def test_dispatch_takes_the_compiled_kernel_for_float32(monkeypatch) -> None:
    calls = []
    real = CompiledGELU.apply
    monkeypatch.setattr(CompiledGELU, "apply", lambda x: calls.append(x.shape) or real(x))
    gelu_tanh(_inputs(torch.float32).requires_grad_(True))  # small too, with autograd
    gelu_tanh(torch.randn(64, 512))
    gelu_tanh(torch.randn(64, 512).T)  # not contiguous: PyTorch's ops
    gelu_tanh(torch.randn(64, 512, dtype=torch.float64))  # float64: the σ form
    assert calls == [(6, 7, 33), (64, 512)]


def _exact_gelu_np(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x Φ(x) and Φ(x) + x φ(x) in float64 (math.erf)."""
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return x * cdf, cdf + x * pdf


# (kernel, float64 reference, tolerance on y): the exact one's Φ is within 1.5e-7
# (Abramowitz and Stegun 7.1.26), times |x| ≤ 40
KERNELS = [("tanh", _tanh_gelu_np, 2e-6), ("exact", _exact_gelu_np, 1e-6)]


@needs_kernel
@pytest.mark.parametrize(("kind", "reference", "tol"), KERNELS)
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n", [1, 7, 8, 13, 4099, 70001])
def test_compiled_kernels_match_the_formula_values_and_gradients(
    n: int, portable: bool, kind: str, reference, tol: float
) -> None:
    fn = {"tanh": CompiledGELU, "exact": CompiledExactGELU}[kind].apply
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * 3.0
    x[:5] = torch.tensor([0.0, -12.0, 12.0, -40.0, 40.0])[: min(n, 5)]
    g = torch.randn(n, generator=gen)
    try:
        rowwise._rowwise.use_portable(portable)
        xr = x.clone().requires_grad_(True)
        y = fn(xr)
        (dx,) = torch.autograd.grad(y, xr, g)
    finally:
        rowwise._rowwise.use_portable(False)
    want_y, want_dy = reference(x.double().numpy())
    np.testing.assert_allclose(y.detach().double().numpy(), want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx.double().numpy(), want_dy * g.double().numpy(),
                               rtol=2e-5, atol=2e-5)  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("exact", [False, True])
def test_compiled_kernel_gives_one_result_for_any_thread_count(exact: bool) -> None:
    x = torch.randn(3, 100_003, generator=torch.Generator().manual_seed(7))
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(8))
    outs = []
    for threads in (1, 2, 3):
        y, d = torch.empty_like(x), torch.empty_like(x)
        ext = rowwise._rowwise
        ext.gelu_many(x.data_ptr(), 0, y.data_ptr(), x.numel(), threads, exact)
        ext.gelu_many(x.data_ptr(), g.data_ptr(), d.data_ptr(), x.numel(), threads, exact)
        outs.append((y, d))
    for y, d in outs[1:]:
        assert torch.equal(y, outs[0][0]) and torch.equal(d, outs[0][1])
    with pytest.raises(ValueError, match="shape"):
        rowwise.gelu_many(x, g[:1], exact=exact)


@needs_kernel
@pytest.mark.parametrize("portable", [False, True])
def test_slope_kernel_keeps_the_forward_bits_and_the_derivative(portable: bool) -> None:
    """gelu_slope's y is gelu_many's, bit for bit, and its d the tanh formula's derivative
    (float64), the same for any thread count."""
    x = torch.randn(3, 70_001, generator=torch.Generator().manual_seed(9)) * 3.0
    x[0, :5] = torch.tensor([0.0, -12.0, 12.0, -40.0, 40.0])
    outs = []
    try:
        rowwise._rowwise.use_portable(portable)
        for threads in (1, 2, 3):
            y, d = torch.empty_like(x), torch.empty_like(x)
            rowwise._rowwise.gelu_slope(
                x.data_ptr(), y.data_ptr(), d.data_ptr(), x.numel(), threads
            )
            outs.append((y, d))
        plain = rowwise.gelu_many(x)
    finally:
        rowwise._rowwise.use_portable(False)
    for y, d in outs:
        assert torch.equal(y, plain) and torch.equal(d, outs[0][1])
    _, want = _tanh_gelu_np(x.double().numpy())
    np.testing.assert_allclose(outs[0][1].double().numpy(), want, rtol=2e-5, atol=2e-5)


@needs_kernel
def test_compiled_gelu_keeps_the_slope_only_for_autograd(monkeypatch) -> None:
    """Without a gradient to compute the forward is y alone (no slope pass, nothing kept)."""
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(4))
    slopes = []
    real = rowwise.gelu_slope
    monkeypatch.setattr(rowwise, "gelu_slope", lambda t: slopes.append(1) or real(t))
    with torch.no_grad():
        y = CompiledGELU.apply(x)
    assert slopes == [] and torch.equal(y, rowwise.gelu_many(x))
    xr = x.clone().requires_grad_(True)
    y = CompiledGELU.apply(xr)
    assert slopes == [1] and torch.equal(y.detach(), rowwise.gelu_many(x))


@needs_kernel
def test_the_models_exact_gelu_takes_the_kernel_only_for_float32(monkeypatch) -> None:
    from glassgpt.model.layers import ACTIVATION_FNS

    calls = []
    real = CompiledExactGELU.apply
    monkeypatch.setattr(CompiledExactGELU, "apply", lambda x: calls.append(x.dtype) or real(x))
    gelu = ACTIVATION_FNS["gelu"]
    x = torch.randn(8, 300, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=1e-6, atol=1e-6)
    xd = x.double()
    assert torch.equal(gelu(xd), F.gelu(xd))  # float64: PyTorch's, bit for bit
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gelu(x)
    assert calls == [torch.float32]


@pytest.mark.skipif(shutil.which("c++") is None, reason="torch.compile on a CPU needs a C compiler")
def test_compiled_gelu_tanh_agrees_with_eager_values_and_gradients() -> None:
    x = _inputs(torch.float32, seed=5).requires_grad_(True)
    g = _inputs(torch.float32, seed=6)
    torch._dynamo.reset()
    compiled = torch.compile(gelu_tanh, dynamic=False)
    y = compiled(x)
    (dx,) = torch.autograd.grad(y, x, g)
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = F.gelu(x_ref, approximate="tanh")
    (dx_ref,) = torch.autograd.grad(y_ref, x_ref, g)
    torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)
