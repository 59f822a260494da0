"""glassgpt's own small-batch float32 product y = x W + b (``glassgpt.kernels._gemv``):
every shape, thread count and bias case against the float64 product, behind the seam for
packed weights (live and copied layouts), and the seam without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import dense, is_packed, matmul, pack, unpack

_gemv = pytest.importorskip(
    "glassgpt.kernels._gemv", reason="the C extension is not built (no compiler at install)"
)


def _rows(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, threads: int) -> torch.Tensor:
    M, K = x.shape
    y = torch.full((M, W.shape[1]), float("nan"))  # every element must be written
    b_ptr = 0 if b is None else b.data_ptr()
    _gemv.gemv_rows(x.data_ptr(), W.data_ptr(), b_ptr, y.data_ptr(), M, K, W.shape[1], threads)
    return y


def _close(got: torch.Tensor, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> None:
    want = x.double() @ W.double() + (0.0 if b is None else b.double())
    # float32 sums of K products of N(0, 1) numbers: error ~ K · 2⁻²⁴ · √K at worst
    tol = 1e-6 * x.shape[1] ** 1.5 + 1e-5
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=tol)


@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(1, 32),
    K=st.integers(1, 200),
    N=st.integers(1, 1300),  # past 512: the kernel's column chunks
    threads=st.sampled_from([1, 2, 3]),
    bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rows_kernel_is_x_w_plus_b(
    M: int, K: int, N: int, threads: int, bias: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, W = torch.randn(M, K, generator=gen), torch.randn(K, N, generator=gen)
    b = torch.randn(N, generator=gen) if bias else None
    _close(_rows(x, W, b, threads), x, W, b)


@pytest.mark.parametrize("threads", [2, 3])
def test_parts_on_the_caller_give_the_parallel_result(threads: int) -> None:
    """After slow parallel runs the parts run one after another on the caller
    (``_parallel.h``'s pacing, forced here by ``solo_for``): the same parts, the same
    summation order, so bit for bit the parallel result."""
    gen = torch.Generator().manual_seed(threads)
    x, W, b = torch.randn(3, 1030, generator=gen), torch.randn(1030, 777, generator=gen), None
    try:
        _gemv.solo_for(0)
        parallel = _rows(x, W, b, threads)
        _gemv.solo_for(10**10)
        solo = _rows(x, W, b, threads)
    finally:
        _gemv.solo_for(0)
    assert torch.equal(parallel, solo)
    _close(solo, x, W, b)


@pytest.mark.parametrize("K, N", [(768, 2304), (3072, 768), (1030, 5001)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M", [1, 3, 8])
def test_rows_kernel_at_model_shapes(K: int, N: int, threads: int, M: int) -> None:
    gen = torch.Generator().manual_seed(K + N)
    x, W, b = torch.randn(M, K, generator=gen), torch.randn(K, N, generator=gen), torch.randn(N)
    _close(_rows(x, W, b, threads), x, W, b)


def test_rows_kernel_rejects_bad_sizes() -> None:
    x = torch.zeros(33, 4)
    with pytest.raises(ValueError, match="M <= 32"):
        _gemv.gemv_rows(x.data_ptr(), x.data_ptr(), 0, x.data_ptr(), 33, 4, 4, 1)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 32, 40])  # 40: past SMALL_BATCH, F.linear
def test_packed_weight_takes_the_kernel_up_to_small_batch(
    transposed: bool, rows: int, monkeypatch
) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 96, generator=gen)  # [..., d_in], a 3-D x
    W = torch.randn(96, 130, generator=gen)  # [d_in, d_out]
    b = torch.randn(130, generator=gen)
    stored = W.T.contiguous() if transposed else W
    calls = []
    real = _gemv.gemv_rows
    monkeypatch.setattr(dense._gemv, "gemv_rows", lambda *a: calls.append(a[4]) or real(*a))
    assert pack(stored, transposed=transposed)
    with torch.no_grad():
        got = matmul(x, stored, b, transposed=transposed)
    unpack(stored)
    assert got.shape == (rows, 1, 130)
    _close(got.view(rows, 130), x.view(rows, 96), W, b)
    assert calls == ([rows] if rows <= dense.SMALL_BATCH else [])


def test_without_the_kernel_packing_still_computes_x_w_plus_b(monkeypatch) -> None:
    monkeypatch.setattr(dense, "_gemv", None)
    assert not dense.has_small_batch_kernel()
    gen = torch.Generator().manual_seed(3)
    x, W_E = torch.randn(2, 32, generator=gen), torch.randn(50, 32, generator=gen)  # tied
    assert pack(W_E, transposed=True) and is_packed(W_E, transposed=True)
    with torch.no_grad():
        got = matmul(x, W_E, None, transposed=True)
    unpack(W_E)
    _close(got, x, W_E.T, None)
