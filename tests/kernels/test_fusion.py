"""Fused decoding calls (glassgpt.kernels.fusion, ``_gemv.gemv_panels_add`` and
``gemv_panels_glu``): a panel product and the residual sum after it, SwiGLU's two products
with the SiLU and the gated product, each in one parallel run. Each must give bit for bit
what the separate calls give (a replayed step stays the eager step), for every CPU variant
(AVX-512, AVX2, portable), float32 and bf16 panels, any thread count, and be the float64
function to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import dense, extension, fuse_calls

_gemv, _rowwise = extension("_gemv"), extension("_rowwise")
pytestmark = pytest.mark.skipif(
    _gemv is None or _rowwise is None, reason="glassgpt's kernels are not built"
)

VARIANTS = ["widest", "avx2", "portable"]


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest):
    """Both extensions forced to one variant (the fused SiLU follows _rowwise's)."""
    portable = request.param == "portable"
    _gemv.use_portable(portable)
    _gemv.wide_registers(request.param == "widest")
    _rowwise.use_portable(portable)
    yield request.param
    _gemv.use_portable(False)
    _gemv.wide_registers(True)
    _rowwise.use_portable(False)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _weights(K: int, N: int, half: bool, gen: torch.Generator):
    W = torch.randn(K, N, generator=gen) / K**0.5
    if half:
        W = W.bfloat16()
    return W, dense.panels(W), torch.randn(N, generator=gen)


def _product(x, P, b, y, N, threads, half) -> None:
    fn = _gemv.gemv_panels_bf16 if half else _gemv.gemv_panels
    fn(x.data_ptr(), P.data_ptr(), _ptr(b), y.data_ptr(), x.shape[0], x.shape[1], N, threads)


def _nan(M: int, N: int) -> torch.Tensor:
    return torch.full((M, N), float("nan"))  # every element must be written


SHAPES = [(576, 576), (64, 1000), (24, 40)]  # 9 panels; a partial one; one thread


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("K, N", SHAPES)
def test_product_then_residual_sum_is_the_two_calls(
    variant: str, K: int, N: int, half: bool
) -> None:
    gen = torch.Generator().manual_seed(K + N)
    W, P, b = _weights(K, N, half, gen)
    for M in sorted({1, 3, _gemv.panels_rows()}):
        M = min(M, _gemv.panels_rows())
        x, r = torch.randn(M, K, generator=gen), torch.randn(M, N, generator=gen)
        y0, out0 = _nan(M, N), _nan(M, N)
        _product(x, P, b, y0, N, 1, half)
        _rowwise.add(r.data_ptr(), y0.data_ptr(), out0.data_ptr(), M * N)
        for threads in (1, 2, 3):
            y, out = _nan(M, N), _nan(M, N)
            _gemv.gemv_panels_add(x.data_ptr(), P.data_ptr(), b.data_ptr(), y.data_ptr(), M, K,
                                  N, threads, int(half), r.data_ptr(), out.data_ptr())  # fmt: skip
            assert torch.equal(y, y0) and torch.equal(out, out0), (M, threads)
        want = r.double() + x.double() @ W.double() + b.double()
        torch.testing.assert_close(out0.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("K, N", SHAPES)
def test_gated_products_are_the_four_calls(variant: str, K: int, N: int, half: bool) -> None:
    gen = torch.Generator().manual_seed(K * N)
    W_in, P_in, b_in = _weights(K, N, half, gen)
    W_g, P_g, b_g = _weights(K, N, half, gen)
    avx2 = int(_rowwise.kernel() == "avx2")
    for M in sorted({1, 3, _gemv.panels_rows()}):
        M = min(M, _gemv.panels_rows())
        x = torch.randn(M, K, generator=gen) * 3  # gates well past SiLU's knee both ways
        a0, g0, s0, h0 = (_nan(M, N) for _ in range(4))
        _product(x, P_in, b_in, a0, N, 1, half)
        _product(x, P_g, b_g, g0, N, 1, half)
        _rowwise.silu(g0.data_ptr(), s0.data_ptr(), M * N)
        _rowwise.mul(s0.data_ptr(), a0.data_ptr(), h0.data_ptr(), M * N)
        for threads in (1, 2, 3):
            a, g, s, h = (_nan(M, N) for _ in range(4))
            _gemv.gemv_panels_glu(x.data_ptr(), P_in.data_ptr(), b_in.data_ptr(), a.data_ptr(),
                                  P_g.data_ptr(), b_g.data_ptr(), g.data_ptr(), M, K, N, threads,
                                  int(half), s.data_ptr(), h.data_ptr(), avx2)  # fmt: skip
            for got, want in ((a, a0), (g, g0), (s, s0), (h, h0)):
                assert torch.equal(got, want), (M, threads)
        xd = x.double()
        gate = xd @ W_g.double() + b_g.double()
        want = gate * torch.sigmoid(gate) * (xd @ W_in.double() + b_in.double())
        torch.testing.assert_close(h0.double(), want, rtol=1e-4, atol=1e-4)


def test_fused_calls_refuse_more_rows_than_the_panels_take() -> None:
    M = _gemv.panels_rows() + 1
    z = torch.zeros(M, 64)
    p = z.data_ptr()
    with pytest.raises(ValueError, match="gemv_panels_add"):
        _gemv.gemv_panels_add(p, p, 0, p, M, 64, 64, 1, 0, p, p)
    with pytest.raises(ValueError, match="gemv_panels_glu"):
        _gemv.gemv_panels_glu(p, p, 0, p, p, 0, p, M, 64, 64, 1, 0, p, p, 0)


def _call(fn, *args, positional=()):  # a recorded call
    return (fn, tuple(args), tuple(positional))


def test_fuse_takes_the_patterns_and_leaves_the_rest() -> None:
    """A product then a sum of its output; two products of one x, the SiLU of one and the
    gated product: fused. A sum not of the product's output, a position-moving call, another
    product kind or a SiLU of neither output: left as they were."""
    pan, bf, add, silu, mul = (_gemv.gemv_panels, _gemv.gemv_panels_bf16, _rowwise.add,
                               _rowwise.silu, _rowwise.mul)  # fmt: skip
    x, Pa, Pg, a, g, s, h, r, out = 100, 200, 300, 400, 500, 600, 700, 800, 900
    glu = [_call(pan, x, Pa, 0, a, 1, 8, 16, 2), _call(pan, x, Pg, 0, g, 1, 8, 16, 2),
           _call(silu, g, s, 16), _call(mul, s, a, h, 16)]  # fmt: skip
    residual = [_call(bf, h, Pa, 0, a, 1, 16, 8, 2), _call(add, r, a, out, 8)]
    fused = fuse_calls(glu + residual)
    assert [c[0] for c in fused] == [_gemv.gemv_panels_glu, _gemv.gemv_panels_add]
    assert fused[0][1][:7] == (x, Pa, 0, a, Pg, 0, g) and fused[0][1][11:14] == (0, s, h)
    assert fused[1][1] == (h, Pa, 0, a, 1, 16, 8, 2, 1, r, out)
    untouched = [
        [_call(pan, x, Pa, 0, a, 1, 8, 16, 2), _call(add, r, g, out, 16)],  # not y
        [_call(pan, x, Pa, 0, a, 1, 8, 16, 2), _call(add, r, a, out, 8)],  # other length
        [_call(pan, x, Pa, 0, a, 1, 8, 16, 2), _call(add, a, a, out, 16)],  # y + y
        [_call(pan, x, Pa, 0, a, 1, 8, 16, 2), _call(add, r, a, out, 16, positional=(0,))],
        [_call(_gemv.gemv_rows, x, Pa, 0, a, 1, 8, 16, 2), _call(add, r, a, out, 16)],
        [*glu[:2], _call(silu, r, s, 16), glu[3]],  # the SiLU of neither product
        [glu[0], _call(pan, out, Pg, 0, g, 1, 8, 16, 2), *glu[2:]],  # two different x
    ]
    for calls in untouched:
        assert fuse_calls(calls) == calls
