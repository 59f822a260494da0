"""int8 weights: quantization error within s/2, the compiled kernel equals x W̃ + b (float64
oracle) for every shape, and the seam falls back to the same function without the extension."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import extensions, int8, is_packed, matmul

EPS32 = 2.0**-24  # float32 unit roundoff

needs_ext = pytest.mark.skipif(int8.compiled() is None, reason="the _int8 extension is not built")


def _oracle_and_bound(
    x: torch.Tensor, W_t: torch.Tensor, b: torch.Tensor | None, *, x_rounded: bool = True
):
    """x W̃ᵀ + b in float64 (W_t = W̃ [d_out, d_in]) and the bound on a result's error: the
    float32 rounding of any summation order, (d_in + 3) u Σ_i |x_i W̃_ji| + |b_j| (d_in sums
    and products, the scales, the bias, and W̃ = q·s itself rounded to float32), plus, when
    ``x_rounded`` (the compiled kernel), x rounded to 16 bits per row: |Δx_i| ≤ r/2 with
    r = max_i |x_i| / 32767, plus 2^-7 r for the float32 rounding of r and of x/r (each
    2^-24 relative, times up to 32767), so (1/2 + 2^-7) r Σ_i |W̃_ji| more."""
    x64, W64 = x.double(), W_t.double()
    want = x64 @ W64.T
    mag = x64.abs() @ W64.abs().T
    if b is not None:
        want, mag = want + b.double(), mag + b.double().abs()
    bound = (x.shape[-1] + 3) * EPS32 * mag + 1e-30
    if x_rounded and x.shape[-1]:
        r = x64.abs().amax(dim=-1, keepdim=True) / 32767
        bound = bound + (r * (0.5 + 2**-7)) * W64.abs().sum(dim=1)
    return want, bound


def test_quantization_error_is_at_most_half_a_step() -> None:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(37, 53, generator=gen) * torch.rand(37, 1, generator=gen) * 10
    W[5] = 0.0  # an all-zero channel
    q, s = int8.quantize(W)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and s.shape == (37,)
    W_t = int8.dequantize(q, s)
    err = (W.double() - W_t.double()).abs()
    assert (err <= s.double()[:, None] / 2 * (1 + 1e-6)).all()
    assert (q.abs().amax(dim=1)[s != 1.0] == 127).all()  # each scale is used to the full
    assert torch.equal(W_t[5], torch.zeros(53))


@needs_ext
@settings(max_examples=90, deadline=None)
@given(
    M=st.integers(1, 9),
    d_in=st.integers(1, 150),
    d_out=st.integers(1, 140),  # partial groups of 32 and of panels of 8
    bias=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
    kernel=st.sampled_from(["portable", "avx2", "avx512vl", "widest"]),
    seed=st.integers(0, 2**16),
)
def test_kernel_is_x_w_tilde_plus_b(M, d_in, d_out, bias, threads, kernel, seed) -> None:
    """The portable loop, the AVX2 kernels (16 registers) and, on a CPU with AVX-512VL, the
    kernels on 32 registers, with AVX512-VNNI's vpdpwssd where it has that too ("widest")."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(d_out, d_in, generator=gen)
    x = torch.randn(M, d_in, generator=gen)
    b = torch.randn(d_out, generator=gen) if bias else None
    q, s = int8.quantize(W)
    ext = int8.compiled()
    if kernel == "portable":
        assert ext.use_portable(True) == "scalar"
    else:
        assert ext.wide_registers(kernel != "avx2") == ext.kernel()
        if kernel == "avx512vl":
            assert ext.vnni(False) == ext.kernel() != "avx512vnni"
    try:
        if M > int8.MAX_ROWS:
            with pytest.raises(ValueError, match="gemv"):
                int8.gemv(x, q, s, b, threads)
            return
        got = int8.gemv(x, q, s, b, threads)
    finally:
        ext.use_portable(False)
    want, bound = _oracle_and_bound(x, int8.dequantize(q, s), b)
    assert ((got.double() - want).abs() <= bound).all()


@needs_ext
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(768, 2304), (3072, 768), (100, 50257)])
def test_kernel_on_model_shapes_and_threads(
    shape: tuple[int, int], threads: int, rows: int
) -> None:
    """Shapes that the pool splits (the kernel's threads are used from 64 KiB of weights)."""
    d_in, d_out = shape
    gen = torch.Generator().manual_seed(d_in)
    q, s = int8.quantize(torch.randn(d_out, d_in, generator=gen))
    x, b = torch.randn(rows, d_in, generator=gen), torch.randn(d_out, generator=gen)
    got = int8.gemv(x, q, s, b, threads)
    want, bound = _oracle_and_bound(x, int8.dequantize(q, s), b)
    assert ((got.double() - want).abs() <= bound).all()


@needs_ext
@pytest.mark.parametrize("M", [1, 2, 3, 5, 7, 8])
def test_vnni_kernels_equal_the_avx2_ones_bit_for_bit(M: int) -> None:
    """vpdpwssd adds the same exact int32 pair sums as vpmaddwd + vpaddd, in the same order:
    every variant's y is the same, bit for bit."""
    ext = int8.compiled()
    if ext.kernel() == "scalar":
        pytest.skip("no AVX2 kernels here")
    gen = torch.Generator().manual_seed(M)
    W, x, b = torch.randn(200, 130, generator=gen), torch.randn(M, 130, generator=gen), None
    q, s = int8.quantize(W)
    got = {}
    try:
        for name in ("avx2", "avx512vl", "widest"):
            ext.wide_registers(name != "avx2")
            if name == "avx512vl":
                ext.vnni(False)
            got[ext.kernel()] = int8.gemv(x, q, s, b, 2)
    finally:
        ext.wide_registers(True)
    first = next(iter(got.values()))
    assert all(torch.equal(first, y) for y in got.values()), list(got)


def test_panels_hold_each_weight_once_in_order() -> None:
    """p[j // 32, i // 2, j % 32, i % 2] = q[j, i], zeros in the padding past d_out and d_in
    (checked entry by entry)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (45, 5), generator=gen, dtype=torch.int8)
    p = int8.panels(q)
    assert p.shape == (2, 3, 32, 2) and p.is_contiguous()
    for j in range(64):
        for i in range(6):
            want = q[j, i].item() if j < 45 and i < 5 else 0
            assert p[j // 32, i // 2, j % 32, i % 2].item() == want


@needs_ext
@pytest.mark.parametrize("portable", [False, True])
def test_rows_of_zeros_and_non_finite_rows(portable: bool) -> None:
    """A row of zeros gives the bias; a row with an inf or a NaN (among the first 32 inputs
    or the last) gives a row of NaN; the other rows, a tiny one too, stay within the bound."""
    gen = torch.Generator().manual_seed(2)
    q, s = int8.quantize(torch.randn(20, 33, generator=gen))
    x, b = torch.randn(6, 33, generator=gen), torch.randn(20, generator=gen)
    x[0] = 0.0
    x[1, 7] = float("inf")
    x[2, 30] = float("nan")
    x[3, 32] = -float("inf")
    x[4] *= 1e-20
    ext = int8.compiled()
    ext.use_portable(portable)
    try:
        got = int8.gemv(x, q, s, b, 1)
    finally:
        ext.use_portable(False)
    assert torch.equal(got[0], b)
    assert got[1:4].isnan().all()
    want, bound = _oracle_and_bound(x[4:], int8.dequantize(q, s), b)
    assert ((got[4:].double() - want).abs() <= bound).all()


def test_gemv_checks_its_inputs() -> None:
    if int8.compiled() is None:
        pytest.skip("the _int8 extension is not built")
    q, s = int8.quantize(torch.randn(4, 8))
    with pytest.raises(ValueError, match="contiguous float32"):
        int8.gemv(torch.randn(2, 16)[:, ::2], q, s, None, 1)  # not contiguous
    with pytest.raises(ValueError, match="contiguous float32"):
        int8.gemv(torch.randn(1, 8, dtype=torch.float64), q, s, None, 1)
    with pytest.raises(ValueError, match="shapes"):
        int8.gemv(torch.randn(1, 7), q, s, None, 1)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("hide", [False, True])
def test_seam_product_few_and_many_rows(transposed: bool, hide: bool, monkeypatch) -> None:
    """pack_int8 turns W into W̃ in place; the seam's products are x W̃ + b for 1..8 rows (the
    kernel) and for more (float32), with the extension or without it (a warning, once)."""
    if hide:
        monkeypatch.setattr(int8, "compiled", lambda: None)
        monkeypatch.setattr(extensions, "_warned", set())
    elif int8.compiled() is None:
        pytest.skip("the _int8 extension is not built")
    gen = torch.Generator().manual_seed(3)
    W0 = torch.randn(40, 24, generator=gen)  # [d_out, d_in]
    W = W0.clone() if transposed else W0.T.contiguous()  # the stored layout
    b = torch.randn(40, generator=gen)
    assert int8.pack_int8(W, transposed=transposed) and is_packed(W, transposed=transposed)
    q, s = int8.quantize(W0)
    W_t = int8.dequantize(q, s)
    assert torch.equal(W if transposed else W.T, W_t)  # W is now exactly W̃
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 5, 8, 9, 30):
            x = torch.randn(rows, 24, generator=gen)
            with torch.no_grad():
                got = matmul(x.view(1, rows, 24), W, b, transposed=transposed)
            assert got.shape == (1, rows, 40)
            want, bound = _oracle_and_bound(x, W_t, b, x_rounded=rows <= int8.MAX_ROWS and not hide)
            assert ((got[0].double() - want).abs() <= bound).all()
    said = [w for w in caught if "not built" in str(w.message)]
    assert len(said) == (1 if hide else 0)


def test_a_short_prefill_reads_w_tilde_by_the_float32_kernel(monkeypatch) -> None:
    """Past the int8 kernel's rows, up to the float32 kernel's, W̃ (stored [d_in, d_out]) is
    streamed by ``_gemv``; the tied (transposed) layout and longer inputs take the seam's
    unpacked kernels."""
    from glassgpt.kernels import dense

    if dense._gemv is None:
        pytest.skip("the _gemv extension is not built")
    calls: list[int] = []
    real = dense._gemv

    class Spy:
        def gemv_rows(self, *args: object) -> None:
            calls.append(int(args[4]))  # M
            real.gemv_rows(*args)

    monkeypatch.setattr(dense, "_gemv", Spy())
    gen = torch.Generator().manual_seed(4)
    W, b = torch.randn(24, 40, generator=gen), torch.randn(40, generator=gen)
    assert int8.pack_int8(W)
    for rows in (int8.MAX_ROWS + 1, dense.SMALL_BATCH, dense.SMALL_BATCH + 1):
        x = torch.randn(rows, 24, generator=gen)
        with torch.no_grad():
            got = matmul(x, W, b)
        torch.testing.assert_close(got.double(), x.double() @ W.double() + b.double(),
                                   rtol=1e-5, atol=1e-4)  # fmt: skip
    assert calls == [int8.MAX_ROWS + 1, dense.SMALL_BATCH]


def test_pack_int8_leaves_other_dtypes_alone() -> None:
    W = torch.randn(8, 4, dtype=torch.float64)
    before = W.clone()
    assert not int8.pack_int8(W) and torch.equal(W, before) and not is_packed(W)
