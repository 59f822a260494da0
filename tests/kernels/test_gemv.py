"""glassgpt's own small-batch product y = x W + b (``glassgpt.kernels._gemv``): every shape,
thread count and bias case against the float64 product, behind the seam for packed weights
(live and copied layouts), and the seam without it. With bfloat16 weights
(``gemv_rows_bf16``: W bf16, x, b, y float32) against the float64 product of the same bf16
values, behind the seam on CPUs without native bf16 (a bf16 GPT's logits against float64 of
its own weights), and oneDNN's packed product kept where the CPU has bf16 arithmetic."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import bf16, dense, is_packed, matmul, pack, unpack
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample import generate

_gemv = pytest.importorskip(
    "glassgpt.kernels._gemv", reason="the C extension is not built (no compiler at install)"
)


def _rows(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, threads: int) -> torch.Tensor:
    M, K = x.shape
    y = torch.full((M, W.shape[1]), float("nan"))  # every element must be written
    b_ptr = 0 if b is None else b.data_ptr()
    kernel = _gemv.gemv_rows_bf16 if W.dtype == torch.bfloat16 else _gemv.gemv_rows
    kernel(x.data_ptr(), W.data_ptr(), b_ptr, y.data_ptr(), M, K, W.shape[1], threads)
    return y


def _close(got: torch.Tensor, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> None:
    """got = x W + b up to float32 sums (W's bf16 values are exact in float64)."""
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


def test_pacing_does_not_judge_the_retry_after_a_solo_window() -> None:
    """``_parallel.h``'s pacing, fed parallel runs on a clock of the test's own
    (``pace_run``): a slow run with nothing paying before begins a solo window, one among
    paying runs does not, and the first run after a window (its workers slept through it:
    waking them makes it slow) begins the next only if it lost more than a millisecond (a
    time slice of a held core), else the runs after it judge. On main that retry was judged
    as any run, so each retry, slow by its wake-up, began the next window, doubling up to a
    second."""
    own, slow, paying = 10_000, 200_000, 11_000  # ns: the caller's part, two runs' times
    clock = [time.monotonic_ns() + 10**12]  # far past now: the windows it begins end at once

    def run(took: int, gap: int = 20_000) -> bool:
        start = clock[0] + gap
        clock[0] = start + took
        return _gemv.pace_run(start, start + took, own, 2)

    try:
        _gemv.solo_for(0)  # a fresh average
        assert not any(run(paying) for _ in range(20))
        assert not run(slow)  # a late join now and then keeps the threads
        assert not any(run(paying) for _ in range(4))
        _gemv.solo_for(0)
        assert run(slow)  # nothing paying before: a held core
        assert not run(slow, gap=2 * 10**9)  # the retry, after the window (at most 1 s)
        assert not any(run(paying) for _ in range(8))
        _gemv.solo_for(0)
        assert run(slow) and not run(slow, gap=2 * 10**9)
        assert run(slow)  # a held core still: the run after the retry begins the next
        assert run(3_000_000, gap=2 * 10**9)  # a retry that lost a time slice begins one too
    finally:
        _gemv.solo_for(0)


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
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 32, 40, 65])  # 65: past both, F.linear
def test_packed_weight_takes_the_kernel_up_to_small_batch(
    transposed: bool, rows: int, monkeypatch
) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 96, generator=gen)  # [..., d_in], a 3-D x
    W = torch.randn(96, 130, generator=gen)  # [d_in, d_out]
    b = torch.randn(130, generator=gen)
    stored = W.T.contiguous() if transposed else W
    calls = []
    rows_kernel, panels_kernel = _gemv.gemv_rows, _gemv.gemv_panels
    monkeypatch.setattr(dense._gemv, "gemv_rows", lambda *a: calls.append(a[4]) or rows_kernel(*a))
    monkeypatch.setattr(
        dense._gemv, "gemv_panels", lambda *a: calls.append("panels") or panels_kernel(*a)
    )
    assert pack(stored, transposed=transposed)
    with torch.no_grad():
        got = matmul(x, stored, b, transposed=transposed)
    unpack(stored)
    assert got.shape == (rows, 1, 130)
    _close(got.view(rows, 130), x.view(rows, 96), W, b)
    # the panel copy for as many rows as the panels take (in blocks of them up to
    # PANEL_BLOCK_ROWS where they take several), else the rows of W (the tied unembedding's: a
    # row-major copy) up to SMALL_BATCH, else F.linear
    top = _gemv.panels_rows()
    if rows <= top or (top > 1 and rows <= dense.PANEL_BLOCK_ROWS):
        want = ["panels"] * -(-rows // top)
    else:
        want = [] if rows > dense.SMALL_BATCH else [rows]
    assert calls == want


def _panels(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, threads: int) -> torch.Tensor:
    (M, K), N = x.shape, W.shape[1]
    P = dense.panels(W)
    y = torch.full((M, N), float("nan"))  # every element must be written
    _gemv.gemv_panels(x.data_ptr(), P.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
                      M, K, N, threads)  # fmt: skip
    return y


@settings(max_examples=60, deadline=None)
@given(
    M=st.integers(1, 32),
    K=st.integers(1, 300),
    N=st.integers(1, 700),  # partial last panels, fewer panels than threads
    threads=st.sampled_from([1, 2, 3]),
    bias=st.booleans(),
    kernel=st.sampled_from(["widest", "avx2", "portable"]),
    seed=st.integers(0, 2**31),
)
def test_panels_kernel_is_x_w_plus_b(
    M: int, K: int, N: int, threads: int, bias: bool, kernel: str, seed: int
) -> None:
    """Every row count the panels take here (1; up to 32 with AVX-512F, six at a time and
    the rest), the AVX2 panels (one row) and the portable loop."""
    gen = torch.Generator().manual_seed(seed)
    W, b = torch.randn(K, N, generator=gen), torch.randn(N, generator=gen) if bias else None
    try:
        _gemv.use_portable(kernel == "portable")
        _gemv.wide_registers(kernel == "widest")
        x = torch.randn(min(M, _gemv.panels_rows()), K, generator=gen)
        got = _panels(x, W, b, threads)
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)
    _close(got, x, W, b)


@pytest.mark.parametrize("d_out", [1, 63, 64, 65, 200, 256])
def test_panels_are_w_by_64_outputs_padded_with_zeros(d_out: int) -> None:
    W = torch.randn(7, d_out, generator=torch.Generator().manual_seed(d_out))
    padded = torch.cat([W, torch.zeros(7, -d_out % 64)], dim=1)  # [7, 64 n]
    want = torch.stack([padded[:, 64 * p : 64 * (p + 1)] for p in range(padded.shape[1] // 64)])
    for P in (dense.panels(W), dense.panels(W, out=torch.full(want.shape, float("nan")))):
        assert P.is_contiguous() and torch.equal(P, want)


@pytest.mark.skipif(_gemv.panels_rows() < 2, reason="the panels take one row on this CPU")
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("K, N", [(384, 1152), (1536, 384), (70, 65)])
def test_every_row_count_of_the_panels_gives_each_row_its_own_product(
    half: bool, K: int, N: int
) -> None:
    """1 to panels_rows() rows in one call (a pass over a panel for six rows, then the next
    six from the cache): each row's outputs are bit for bit that row's product alone, so a
    row read or written in another's place, a row left out of a pass or summed twice, or a
    sum out of k order fails it, for 1-3 threads (panels shared by slices of 16 outputs);
    no row past M is written; and the rows alone are near float64."""
    gen = torch.Generator().manual_seed(K + N + half)
    top = _gemv.panels_rows()
    W, b = torch.randn(K, N, generator=gen), torch.randn(N, generator=gen)
    W = W.to(torch.bfloat16) if half else W
    P, x = dense.panels(W), torch.randn(top, K, generator=gen)
    kernel = _gemv.gemv_panels_bf16 if half else _gemv.gemv_panels

    def product(M: int, threads: int) -> torch.Tensor:
        y = torch.full((top + 1, N), -7.0)  # rows past M keep it
        kernel(x.data_ptr(), P.data_ptr(), b.data_ptr(), y.data_ptr(), M, K, N, threads)
        assert torch.equal(y[M:], torch.full((top + 1 - M, N), -7.0)), (M, threads)
        return y[:M]

    alone = []
    for m in range(top):  # row m as the only row of a call
        y = torch.empty(1, N)
        kernel(x[m].data_ptr(), P.data_ptr(), b.data_ptr(), y.data_ptr(), 1, K, N, 1)
        alone.append(y)
    want = torch.cat(alone)
    for M in range(1, top + 1):
        for threads in (1, 2, 3):
            assert torch.equal(product(M, threads), want[:M]), (M, threads)
    _close(want, x, W, b)


def test_panels_kernel_rejects_more_rows_than_it_takes() -> None:
    M = _gemv.panels_rows() + 1
    x = torch.zeros(M, 64)
    with pytest.raises(ValueError, match=f"M <= {M - 1}"):
        _gemv.gemv_panels(x.data_ptr(), x.data_ptr(), 0, x.data_ptr(), M, 64, 64, 1)


@pytest.mark.parametrize("K, N", [(768, 2304), (3072, 768)])
def test_panels_kernel_at_model_shapes_sums_in_order(K: int, N: int) -> None:
    """Each output sums over k in order on one thread: the same bits for any thread count,
    and float32 sums as close to float64 as the rows form's."""
    gen = torch.Generator().manual_seed(K)
    x, W, b = torch.randn(1, K, generator=gen), torch.randn(K, N, generator=gen), torch.randn(N)
    one = _panels(x, W, b, 1)
    assert torch.equal(one, _panels(x, W, b, 2)) and torch.equal(one, _panels(x, W, b, 3))
    _close(one, x, W, b)


@pytest.mark.parametrize("kernel", ["widest", "avx2", "portable"])
@pytest.mark.parametrize("K, N", [(576, 576), (576, 960), (1536, 576), (64, 1000)])
def test_panels_shared_by_two_threads_give_the_one_thread_sums(kernel: str, K: int, N: int) -> None:
    """SmolLM2's odd panel counts (9, 15 panels; 1000 outputs end in a partial panel): the
    threads split a panel between them by slices of 16 outputs, and every output is still
    summed over k in order, bit for bit the one-thread result, near the float64 product."""
    gen = torch.Generator().manual_seed(N)
    W, b = torch.randn(K, N, generator=gen), torch.randn(N, generator=gen)
    try:
        _gemv.use_portable(kernel == "portable")
        _gemv.wide_registers(kernel == "widest")
        for M in sorted({1, 3, _gemv.panels_rows()}):
            x = torch.randn(min(M, _gemv.panels_rows()), K, generator=gen)
            one = _panels(x, W, b, 1)
            for threads in (2, 3, 4):
                assert torch.equal(_panels(x, W, b, threads), one), (M, threads)
            _close(one, x, W, b)
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)


def test_panel_copy_only_while_memory_allows(monkeypatch) -> None:
    """No panel copy past its share of the memory available: the live W's rows serve."""
    gen = torch.Generator().manual_seed(5)
    x, W, b = torch.randn(1, 96, generator=gen), torch.randn(96, 130, generator=gen), None
    need = 96 * 192 * 4  # two panels of 64 outputs
    monkeypatch.setattr(dense, "_available_memory", lambda: need / dense.PANEL_MEMORY_SHARE - 1)
    assert dense._panel_copy(W) is None
    calls = []
    real = _gemv.gemv_rows
    monkeypatch.setattr(dense._gemv, "gemv_rows", lambda *a: calls.append(a[4]) or real(*a))
    assert pack(W)
    with torch.no_grad():
        got = matmul(x, W, b)
    unpack(W)
    assert calls == [1]
    _close(got, x, W, b)
    monkeypatch.setattr(dense, "_available_memory", lambda: need / dense.PANEL_MEMORY_SHARE)
    P = dense._panel_copy(W)
    assert P is not None and P.shape == (3, 96, 64) and torch.equal(P, dense.panels(W))


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


# ------------------------------------------------------------------ bfloat16 weights --


@settings(max_examples=40, deadline=None)
@given(
    M=st.integers(1, 32),
    K=st.integers(1, 200).map(lambda k: k | 1),  # odd: every tail of the 8- and 4-row steps
    N=st.integers(1, 1300).map(lambda n: n | 1),  # odd, past 512: the column chunks and tails
    threads=st.sampled_from([1, 2, 3]),
    bias=st.booleans(),
    portable=st.booleans(),  # the plain C loops
    seed=st.integers(0, 2**31),
)
def test_bf16_rows_kernel_is_x_w_plus_b(
    portable: bool, M: int, K: int, N: int, threads: int, bias: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    W = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    b = torch.randn(N, generator=gen) if bias else None
    try:
        assert _gemv.use_portable(portable) == ("portable" if portable else _gemv.kernel())
        got = _rows(x, W, b, threads)
    finally:
        _gemv.use_portable(False)
    _close(got, x, W, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M", [1, 8, 32])
def test_bf16_rows_kernel_at_a_model_shape(threads: int, M: int) -> None:
    gen = torch.Generator().manual_seed(M)
    x, b = torch.randn(M, 768, generator=gen), torch.randn(2304, generator=gen)
    W = torch.randn(768, 2304, generator=gen).to(torch.bfloat16)
    _close(_rows(x, W, b, threads), x, W, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_io_kernel_is_the_float32_kernel_rounded(threads: int, bias: bool) -> None:
    """``gemv_rows_bf16_io`` (bf16 x, b and y) gives bit for bit what ``gemv_rows_bf16`` on
    float32 copies gives, rounded to bf16 by PyTorch (nearest, ties to even), NaN and
    infinities included."""
    gen = torch.Generator().manual_seed(7 + threads)
    M, K, N = 5, 300, 1031
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    W = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    b = (torch.randn(N, generator=gen) * 3).to(torch.bfloat16) if bias else None
    x[0, 0], x[1, 3] = float("inf"), float("nan")  # rows 0 and 1 overflow and NaN
    want = _rows(x.float(), W, None if b is None else b.float(), threads).to(torch.bfloat16)
    got = torch.empty(M, N, dtype=torch.bfloat16)
    b_ptr = 0 if b is None else b.data_ptr()
    _gemv.gemv_rows_bf16_io(x.data_ptr(), W.data_ptr(), b_ptr, got.data_ptr(), M, K, N, threads)
    assert torch.equal(got[2:], want[2:])
    assert torch.equal(got[:2].isnan(), want[:2].isnan())
    assert torch.equal(got[:2].nan_to_num(), want[:2].nan_to_num())


@pytest.fixture
def no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A CPU without bf16 arithmetic; returns the M of each bf16 ``_gemv`` call."""
    monkeypatch.setattr(bf16, "native", lambda: False)
    calls: list[int] = []
    for name in ("gemv_rows_bf16", "gemv_rows_bf16_io", "gemv_panels_bf16", "gemv_panels_bf16_io"):
        real, tag = getattr(_gemv, name), "panels" if "panels" in name else None
        spy = lambda *a, real=real, tag=tag: calls.append(tag or a[4]) or real(*a)  # noqa: E731
        monkeypatch.setattr(dense._gemv, name, spy)
    # a replayed step's fused calls (glassgpt.kernels.fusion): bf16 panels where `half`,
    # one product (a residual sum after it) or two (SwiGLU's)
    for name, half, products in (("gemv_panels_add", 8, 1), ("gemv_panels_glu", 11, 2)):
        real = getattr(_gemv, name)
        spy = lambda *a, real=real, h=half, n=products: (  # noqa: E731
            calls.extend(["panels"] * n if a[h] else []) or real(*a)
        )
        monkeypatch.setattr(dense._gemv, name, spy)
    return calls


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 32, 40])  # 40: past SMALL_BATCH, the float32 product
@pytest.mark.parametrize("bias", [False, True])
def test_packed_bf16_weight_streams_up_to_small_batch(
    no_native_bf16: list[int], transposed: bool, rows: int, bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, 97, generator=gen).to(torch.bfloat16)  # [..., d_in], a 3-D x
    W = torch.randn(97, 131, generator=gen).to(torch.bfloat16)  # [d_in, d_out]
    b = torch.randn(131, generator=gen).to(torch.bfloat16) if bias else None
    stored = W.T.contiguous() if transposed else W
    assert pack(stored, transposed=transposed)
    with torch.no_grad():
        got = matmul(x, stored, b, transposed=transposed)
    unpack(stored)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 1, 131)
    want = x.view(rows, 97).double() @ W.double() + (0.0 if b is None else b.double())
    # float32 sums, then one rounding to bf16 (8-bit mantissa: relative error ≤ 2⁻⁹)
    torch.testing.assert_close(got.view(rows, 131).double(), want, rtol=2**-8, atol=1e-4)
    # the bf16 panel copy for as many rows as the panels take, else the rows of W
    panels = rows <= _gemv.panels_rows()
    want = [] if rows > dense.SMALL_BATCH else ["panels"] if panels else [rows]
    assert no_native_bf16 == want


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("activations", [torch.bfloat16, torch.float32])
def test_cpu_with_native_bf16_takes_the_panels_for_their_rows_and_pytorch_past_them(
    monkeypatch: pytest.MonkeyPatch, transposed: bool, activations: torch.dtype
) -> None:
    """On a CPU with bf16 arithmetic a packed bf16 weight keeps no packed copy but its panels,
    made at its first decoding step (one token a row), not at packing nor for a prompt:
    those rows read them (bf16 x, or float32 x: bf16 weights under float32 activations,
    y float32), more rows PyTorch's bf16 product of W itself; float32 x (a decoding copy's)
    makes them at its prompt and reads them for every row count up to PANEL_PROMPT_ROWS, a
    few rows a call; never the rows kernels, never oneDNN's packed copy."""
    monkeypatch.setattr(bf16, "native", lambda: True)
    made, calls = [], []
    real = dense._panel_copy
    monkeypatch.setattr(dense, "_panel_copy", lambda W: made.append(W.shape) or real(W))
    monkeypatch.setattr(dense, "_onednn_packed", lambda W: pytest.fail("a oneDNN copy"))
    monkeypatch.setattr(dense._gemv, "gemv_rows_bf16", lambda *a: calls.append("rows"))
    monkeypatch.setattr(dense._gemv, "gemv_rows_bf16_io", lambda *a: calls.append("rows"))
    for name in ("gemv_panels_bf16", "gemv_panels_bf16_io"):
        panels = getattr(_gemv, name)
        spy = lambda *a, p=panels, n=name: calls.append((n, a[4])) or p(*a)  # noqa: E731
        monkeypatch.setattr(dense._gemv, name, spy)
    W = torch.randn(64, 48).to(torch.bfloat16)  # [d_in, d_out]
    stored = W.T.contiguous() if transposed else W
    assert pack(stored, transposed=transposed)
    assert made == []  # nothing at packing
    top = _gemv.panels_rows()  # bf16 x: up to IO_PANEL_ROWS, PyTorch's bf16 products past it
    top = top if activations == torch.float32 else min(top, dense.IO_PANEL_ROWS)
    with torch.no_grad():  # a short prompt (one row of tokens)
        prompt = matmul(torch.randn(1, top, 64).to(activations), stored, transposed=transposed)
    assert prompt.shape == (1, top, 48)
    if activations == torch.bfloat16:  # the model's own: PyTorch's product, no panels
        assert made == [] and calls == []
    else:  # a decoding copy's: the panels, made now (its steps follow)
        assert made == [(64, 48)] and calls == [("gemv_panels_bf16", top)]
    kernel = "gemv_panels_bf16_io" if activations == torch.bfloat16 else "gemv_panels_bf16"
    for rows in (top + 1, 40, 1, top):
        x = torch.randn(rows, 64).to(activations)
        with torch.no_grad():
            got = matmul(x, stored, transposed=transposed)
        assert got.dtype == activations
        want = x.double() @ W.double()
        tol = 2**-7 if activations == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    unpack(stored)
    assert made == [(64, 48)]
    if activations == torch.bfloat16:
        assert calls == [(kernel, 1), (kernel, top)]
    else:  # every row on the panels, a block of at most `top` rows a call
        assert {k for k, _ in calls} == {kernel} and all(m <= top for _, m in calls)
        assert sum(m for _, m in calls) == top + (top + 1) + 40 + 1 + top


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kernel", ["widest", "avx2", "portable"])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_panels_are_the_float32_panels_rounded(threads: int, kernel: str, bias: bool) -> None:
    """``gemv_panels_bf16_io`` (bf16 P, x, b and y) gives bit for bit what ``gemv_panels`` on
    float32 copies gives, rounded to bf16 (nearest, ties to even): each weight is widened
    exactly and summed in the same order. Every row count the panels take here, a partial
    last panel, NaN and infinity included."""
    gen = torch.Generator().manual_seed(11 + threads)
    K, N = 300, 200
    W = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    b = (torch.randn(N, generator=gen) * 3).to(torch.bfloat16) if bias else None
    try:
        _gemv.use_portable(kernel == "portable")
        _gemv.wide_registers(kernel == "widest")
        for M in range(1, _gemv.panels_rows() + 1):
            x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
            x[0, 0] = float("inf")
            if M > 1:
                x[1, 3] = float("nan")
            want = _panels(x.float(), W.float(), None if b is None else b.float(), threads)
            want = want.to(torch.bfloat16)
            P = dense.panels(W)
            assert P.dtype == torch.bfloat16
            got = torch.empty(M, N, dtype=torch.bfloat16)
            b_ptr = 0 if b is None else b.data_ptr()
            _gemv.gemv_panels_bf16_io(x.data_ptr(), P.data_ptr(), b_ptr, got.data_ptr(), M, K, N,
                                      threads)  # fmt: skip
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)


@settings(max_examples=25, deadline=None)
@given(
    M=st.integers(1, 8),
    K=st.integers(1, 200),
    N=st.integers(1, 400),  # 1, 2 or 3 slices of a panel shared between parts, from any slice
    threads=st.sampled_from([1, 2, 3, 5]),
    bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
@pytest.mark.parametrize("kernel", ["widest", "avx2", "portable"])
def test_bf16_panels_are_the_float32_panels_of_the_widened_weights(
    M: int, K: int, N: int, threads: int, bias: bool, kernel: str, seed: int
) -> None:
    """``gemv_panels_bf16`` (bf16 P; x, b and y float32) gives bit for bit, unrounded, what
    ``gemv_panels`` gives on the weights widened to float32: the AVX-512F kernel widens two
    slices at a time and keeps the sums by parity, the others one slice at a time, and each
    output is the same multiply-adds over k in order either way, NaN and infinity included."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    W[0, 0] = float("-inf")
    b = torch.randn(N, generator=gen) if bias else None
    try:
        _gemv.use_portable(kernel == "portable")
        _gemv.wide_registers(kernel == "widest")
        x = torch.randn(min(M, _gemv.panels_rows()), K, generator=gen)
        if x.shape[0] > 1:  # (a NaN in the only row would make every output NaN)
            x[-1, -1] = float("nan")
        want = _panels(x, W.float(), b, threads)
        P = dense.panels(W)
        got = torch.full_like(want, 7.0)
        _gemv.gemv_panels_bf16(x.data_ptr(), P.data_ptr(), 0 if b is None else b.data_ptr(),
                               got.data_ptr(), x.shape[0], K, N, threads)  # fmt: skip
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    rows = x.shape[0] - 1 if x.shape[0] > 1 else 1  # those that the NaN does not reach
    if N > 1:  # and the columns that -inf does not
        _close(got[:rows, 1:], x[:rows], W[:, 1:].float(), None if b is None else b[1:])


@pytest.mark.skipif(
    not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo to read flags from"
)
def test_native_bf16_answers_what_torch_says() -> None:
    """The flags Linux lists (glassgpt's answer) against PyTorch's own CPU detection."""
    cpu = torch.cpu
    flags = [
        getattr(cpu, n, lambda: False)()
        for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    assert bf16.native() == any(flags)


@pytest.mark.parametrize("tie", [True, False])
def test_bf16_gpt_on_the_kernel_matches_float64_of_its_weights(
    no_native_bf16: list[int], tie: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 activations in the model's own forward; its decoding (generate: the decoding
    copy, float32 activations over the same bf16 weights) on the panels."""
    from glassgpt.model import precision

    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)  # (tiny: bf16 all the same)
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=101, n_ctx=48, d_model=48, n_layers=2, n_heads=4, bias=True,
                    tie_embeddings=tie)  # fmt: skip
    bf = cast(GPT(cfg).eval(), torch.bfloat16)
    ref = copy.deepcopy(bf).double()  # the same bf16-valued weights, float64 arithmetic
    tokens = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    for rows in (tokens[:1, :9], tokens):  # 9 rows of x on the kernel; 40 past SMALL_BATCH
        with torch.no_grad():
            got, want = bf(rows).double(), ref(rows)
        # bf16 activations: each of ~10 roundings per layer is ≤ 2⁻⁹ relative
        assert (got - want).abs().max().item() <= 0.015 * want.abs().max().item()
    assert 9 in no_native_bf16
    ids = generate(bf, tokens[0, :5].tolist(), max_new_tokens=10, temperature=0)
    # 9 decoding steps, 9 products each, from the bf16 panels (which take one row anywhere)
    assert no_native_bf16.count("panels") >= 9 * 9
    with torch.no_grad():
        want = ref(torch.tensor([tokens[0, :5].tolist() + ids]))[0, 4:-1]
    best = want.max(dim=-1).values
    chosen = want.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    # each greedy id is float64's argmax, or within bf16's error of it (a near tie)
    assert ((best - chosen) <= 0.015 * want.abs().max()).all()


@pytest.mark.parametrize("native", [True, False])
def test_float32_x_of_a_bf16_weight_past_the_panels_prompt_rows(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Float32 x against a packed bf16 W for more rows than PANEL_PROMPT_ROWS: a float32
    product of widened copies, float32 y, equal to float64 of the bf16 values."""
    monkeypatch.setattr(bf16, "native", lambda: native)
    W = torch.randn(64, 48).to(torch.bfloat16)
    assert pack(W)
    x = torch.randn(dense.PANEL_PROMPT_ROWS + 3, 64)
    with torch.no_grad():
        got = matmul(x, W)
    unpack(W)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), x.double() @ W.double(), rtol=1e-5, atol=1e-5)
