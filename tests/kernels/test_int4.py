"""int4 weights: the rounding is within half a step and never worse than Q4_0's scale, the
blocks hold each weight once, every compiled kernel equals its function against a float64
oracle (1e-5 relative): the int8-x kernels (AVX-512 VNNI, AVX-512BW, AVX2, portable loop)
x̃ W̃ + b for x̃ = x rounded to int8 per group of 32, the float ones x W̃ + b; and the seam falls
back to x W̃ + b without the extension."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import extensions, hidden, int4, is_packed, matmul

needs_ext = pytest.mark.skipif(int4.compiled() is None, reason="the _int4 extension is not built")


def _variants() -> list[str]:
    """The kernels this CPU can run, each to be forced in turn."""
    ext = int4.compiled()
    if ext is None:
        return []
    found = []
    for name in ext.kernels():
        try:
            ext.use(name)
            found.append(name)
        except ValueError:
            pass
    ext.use(None)
    return found


VARIANTS = _variants()


@pytest.fixture(params=VARIANTS or ["none"])
def variant(request):
    if request.param == "none":
        pytest.skip("the _int4 extension is not built")
    ext = int4.compiled()
    assert ext.use(request.param) == request.param
    yield request.param
    ext.use(None)


def _oracle(x: torch.Tensor, W_t: torch.Tensor, b: torch.Tensor | None, kernel: str = "float"):
    """x W̃ᵀ + b in float64 (x̃ W̃ᵀ + b, x rounded as the int8-x kernels round it, unless the
    kernel is a float one) and the magnitude Σ_i |x_i W̃_ji| + |b_j| the error is relative to."""
    x64 = x.double() if kernel.startswith("float") else int4.round_x(x)
    W64 = W_t.double()
    want, mag = x64 @ W64.T, x64.abs() @ W64.abs().T
    if b is not None:
        want, mag = want + b.double(), mag + b.double().abs()
    return want, mag


def test_rounding_is_within_half_a_step_and_no_worse_than_q4_0() -> None:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(37, 100, generator=gen) * torch.rand(37, 1, generator=gen) * 3
    W[5] = 0.0  # an all-zero channel
    W[7, 40:50] = 1e-3  # a group of small weights beside large ones
    q, d = int4.quantize(W)
    assert q.shape == (37, 128) and d.shape == (37, 4) and d.dtype == torch.float16
    assert q.min() >= -8 and q.max() <= 7 and (q[:, 100:] == 0).all()  # padding: zeros
    W_t = int4.dequantize(q, d, 100)
    Wp = torch.zeros(37, 128)
    Wp[:, :100] = W
    err = (Wp - int4.dequantize(q, d)).view(37, 4, 32)
    # inside the range of q d (q in [−8, 7]) the rounding is to nearest; the rest clips
    step = d.float()[..., None]
    lo, hi = torch.minimum(-8 * step, 7 * step), torch.maximum(-8 * step, 7 * step)
    inside = (Wp.view(37, 4, 32) <= hi) & (Wp.view(37, 4, 32) >= lo)
    assert (err.abs()[inside] <= (step.abs() / 2 * (1 + 1e-3)).expand_as(err)[inside]).all()
    # Q4_0's choice, d0 = −m / 8 with m the signed largest weight: never a smaller error
    Wg = Wp.view(37, 4, 32)
    d0 = (-Wg.gather(-1, Wg.abs().argmax(-1, keepdim=True))[..., 0] / 8).to(torch.float16)
    q0 = int4._round(Wp.view(37, 4, 32), d0)
    err0 = (Wp.view(37, 4, 32) - q0 * d0.float()[..., None]).square().sum(-1)
    assert (err.square().sum(-1) <= err0 + 1e-12).all()
    assert err.square().sum() < 0.93 * err0.sum()  # and better over the whole matrix
    assert torch.equal(W_t[5], torch.zeros(100))


@needs_ext
def test_the_compiled_search_is_the_pytorch_one() -> None:
    """The extension's scale search (C, threads) picks what the PyTorch loop picks."""
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(45, 70, generator=gen) * torch.rand(45, 1, generator=gen)
    W[3, :32] = 0.0
    W[4, :32] = 1e-6  # float16 subnormal scales
    W[6, 5] = 7e5  # a scale past float16's range: clamped
    q, d = int4.quantize(W)
    with hidden("_int4"):
        q_py, d_py = int4.quantize(W)
    assert torch.equal(q, q_py) and torch.equal(d, d_py)


def test_blocks_hold_each_weight_once_in_order() -> None:
    """Unpacking the kernel's blocks (nibbles, float16 scales) gives back q and d."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (37, 64), generator=gen, dtype=torch.int8)
    d = torch.rand(37, 2, generator=gen).to(torch.float16)
    w = int4.blocks(q, d)
    assert w.shape == (3, 2, 288) and w.dtype == torch.uint8
    nib = w[..., :256].reshape(3, 2, 4, 16, 4)  # [P, G, line, c, k]: inputs 8 l + k, + 4
    lo, hi = (nib & 15).int() - 8, (nib >> 4).int() - 8
    got = torch.stack([lo, hi], dim=-2).permute(0, 3, 1, 2, 4, 5).reshape(48, 64)
    assert torch.equal(got[:37], q.int()) and (got[37:] == 0).all()
    scales = w[..., 256:].contiguous().view(torch.float16).view(3, 2, 16).transpose(1, 2)
    assert torch.equal(scales.reshape(48, 2)[:37], d)


@needs_ext
@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(1, 8),
    d_in=st.integers(1, 150),  # partial groups of 32
    d_out=st.integers(1, 70),  # partial panels of 16
    bias=st.booleans(),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_every_kernel_is_x_w_tilde_plus_b(M, d_in, d_out, bias, threads, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(d_out, d_in, generator=gen)
    q, d = int4.quantize(W)
    W_t = int4.dequantize(q, d, d_in)
    x = torch.randn(M, d_in, generator=gen) * 3
    b = torch.randn(d_out, generator=gen) if bias else None
    ext = int4.compiled()
    try:
        for name in VARIANTS:
            ext.use(name)
            want, mag = _oracle(x, W_t, b, name)
            got = int4.gemv(x, q, d, b, threads)
            assert ((got.double() - want).abs() <= 1e-5 * mag + 1e-30).all(), name
    finally:
        ext.use(None)


@needs_ext
@pytest.mark.parametrize(("M", "d_in", "d_out"), [(1, 768, 200), (8, 3072, 48), (3, 768, 50)])
def test_kernel_on_model_shapes_and_threads(variant: str, M: int, d_in: int, d_out: int) -> None:
    gen = torch.Generator().manual_seed(2)
    W = torch.randn(d_out, d_in, generator=gen) * 0.02
    q, d = int4.quantize(W)
    x = torch.randn(M, d_in, generator=gen)
    b = torch.randn(d_out, generator=gen)
    want, mag = _oracle(x, int4.dequantize(q, d), b, variant)
    for threads in (1, 2, 4):
        got = int4.gemv(x, q, d, b, threads)
        assert ((got.double() - want).abs() <= 1e-5 * mag).all()


def test_round_x_is_within_half_a_step() -> None:
    """x̃ = s x8: |x − x̃| ≤ s/2 with s = max |x| / 127 per group of 32 (the largest entry kept
    to s's float32 rounding), zeros stay zeros, a group with a non-finite entry is NaN and the others not."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 70, generator=gen) * torch.tensor([[1.0], [1e-3], [50.0]])
    x[1, 32:64] = 0.0
    x[2, 5] = float("inf")
    xr = int4.round_x(x)
    assert xr.shape == (3, 70) and xr.dtype == torch.float64
    xp = torch.zeros(3, 96, dtype=torch.float64)
    xp[:, :70] = x.double()
    s = xp.view(3, 3, 32).abs().amax(-1, keepdim=True) / 127
    err = (xp[:, :70] - xr).view(3, -1)[:2]  # rows without the infinity
    assert (err.abs() <= (s[:2] / 2).expand(2, 3, 32).reshape(2, 96)[:, :70] * (1 + 1e-6)).all()
    assert (xr[1, 32:64] == 0).all() and xr[2, :32].isnan().all() and xr[2, 32:].isfinite().all()
    big = x[0].abs().argmax()
    assert (xr[0, big] - x[0, big].double()).abs() <= 1e-6 * x[0, big].abs()


@needs_ext
def test_int8_x_kernels_are_the_exact_product_within_the_rounding_of_x(variant: str) -> None:
    """Against x W̃ + b itself (no rounding in the oracle), an int8-x kernel is within
    Σ_g (s_g / 2) Σ_i |W̃_ij| of it, the bound of x's rounding; a float kernel within 1e-5; a
    row of x with a NaN gives a row of NaN."""
    gen = torch.Generator().manual_seed(6)
    W = torch.randn(40, 200, generator=gen) * 0.02
    q, d = int4.quantize(W)
    W_t = int4.dequantize(q, d, 200).double()
    x = torch.randn(3, 200, generator=gen) * 4
    x[2, 7] = float("nan")
    got = int4.gemv(x, q, d, None, 2).double()
    want, mag = _oracle(x[:2], W_t, None)
    assert got[2].isnan().all() and got[:2].isfinite().all()
    if variant.startswith("float"):
        assert ((got[:2] - want).abs() <= 1e-5 * mag).all()
        return
    xp = torch.zeros(2, 224)
    xp[:, :200] = x[:2]
    s = xp.view(2, 7, 32).abs().amax(-1).double() / 127  # [M, G]
    Wg = torch.zeros(40, 224, dtype=torch.float64)
    Wg[:, :200] = W_t
    bound = (s / 2) @ Wg.abs().view(40, 7, 32).sum(-1).T  # [M, d_out]
    err = (got[:2] - want).abs()
    assert (err <= bound * (1 + 1e-4) + 1e-5 * mag).all() and (err > 1e-5 * mag).any()


@needs_ext
def test_the_default_kernel_is_the_best_this_cpu_runs() -> None:
    ext = int4.compiled()
    assert ext.use(None) == VARIANTS[0] and ext.kernel() == VARIANTS[0]
    assert VARIANTS[-1] == "float-scalar" and "scalar" in VARIANTS  # the portable loops


@needs_ext
def test_gemv_checks_its_inputs() -> None:
    q, d = int4.quantize(torch.randn(8, 32))
    with pytest.raises(ValueError, match="shapes"):
        int4.gemv(torch.randn(9, 32), q, d, None, 1)  # more rows than the kernel takes
    with pytest.raises(ValueError, match="shapes"):
        int4.gemv(torch.randn(1, 64), q, d, None, 1)
    with pytest.raises(ValueError, match="float32"):
        int4.gemv(torch.randn(1, 32, dtype=torch.float64), q, d, None, 1)
    with pytest.raises(ValueError, match="b has shape"):
        int4.gemv(torch.randn(1, 32), q, d, torch.randn(3), 1)
    with pytest.raises(ValueError, match="no nope kernel"):
        int4.compiled().use("nope")


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("hide", [False, True])
def test_seam_product_few_and_many_rows(transposed: bool, hide: bool, monkeypatch) -> None:
    """pack_int4 turns W into W̃ in place; the seam's products are x W̃ + b for 1..8 rows (the
    kernel) and for more (float32), with the extension or without it (a warning, once). The
    width, 40, is not a multiple of the group: the last group is padded with zeros."""
    monkeypatch.setattr(extensions, "_warned", set())
    if not hide and int4.compiled() is None:
        pytest.skip("the _int4 extension is not built")
    gen = torch.Generator().manual_seed(3)
    W0 = torch.randn(24, 40, generator=gen)  # [d_out, d_in]
    W = W0.clone() if transposed else W0.T.contiguous()  # the stored layout
    b = torch.randn(24, generator=gen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hidden(*(["_int4"] if hide else [])):
            assert int4.pack_int4(W, transposed=transposed) and is_packed(W, transposed=transposed)
            q, d = int4.quantize(W0)
            W_t = int4.dequantize(q, d, 40)
            assert torch.equal(W if transposed else W.T, W_t)  # W is now exactly W̃
            for rows in (1, 5, 8, 9, 30):
                x = torch.randn(rows, 40, generator=gen)
                with torch.no_grad():
                    got = matmul(x.view(1, rows, 40), W, b, transposed=transposed)
                kernel = "float" if hide or rows > int4.MAX_ROWS else int4.compiled().kernel()
                want, mag = _oracle(x, W_t, b, kernel)
                assert ((got[0].double() - want).abs() <= 1e-5 * mag).all()
    said = [w for w in caught if "int4 kernel" in str(w.message)]
    assert len(said) == (1 if hide else 0)


def test_pack_int4_leaves_other_dtypes_alone() -> None:
    W = torch.randn(8, 32, dtype=torch.float64)
    before = W.clone()
    assert not int4.pack_int4(W) and torch.equal(W, before) and not is_packed(W)
