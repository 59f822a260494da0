"""Greedy decoding's bounded pick (``glassgpt.kernels.greedy``, ``kernels/_greedy.h``): the
ids equal the first argmax of the full panels product (``argmax_at``, the replayed step's
pick) for every int8 pass and every panel kernel, on hypothesis rows, on logits tied to the
last bit or an ulp apart, on flat logits (the full product), and with NaN or inf weights
(no pick, the full product in y for the sampler)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import UnembedInt8, argmax_at, dense, greedy_call, greedy_variant

_gemv = pytest.importorskip(
    "glassgpt.kernels._gemv", reason="the C extension is not built (no compiler at install)"
)


def _passes() -> list[str]:
    """The int8 passes this CPU runs (the best first)."""
    order = ["avx512", "avx2", "portable"]
    best = greedy_variant(None)
    return order[order.index(best) :]


PASSES = _passes()
KERNELS = ["widest", "avx2", "portable"]  # the panel kernels (as tests/kernels/test_gemv.py)


def _product(x: torch.Tensor, P: torch.Tensor, b: torch.Tensor | None, N: int, half: bool):
    """The recorded-call form of y = x W + b on panels P (and y)."""
    M, K = x.shape
    y = torch.full((M, N), float("nan"))
    fn = _gemv.gemv_panels_bf16 if half else _gemv.gemv_panels
    args = (x.data_ptr(), P.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(), M, K, N, 2)
    return (fn, args, ()), y


def _picks(
    x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, n_valid: int, *, half: bool = False,
    int8: str = "portable", kernel: str = "widest", max_panels: int | None = None,
) -> tuple[list[int] | None, list[int] | None, int, torch.Tensor]:  # fmt: skip
    """(the bounded pick, the full product's argmax_at, how, the bounded call's y), for the
    rows of x the panel ``kernel`` takes."""
    K, N = W.shape
    P = dense.panels(W.bfloat16() if half else W)
    pack = UnembedInt8(P.data_ptr(), K, N, half, 2)
    try:
        _gemv.use_portable(kernel == "portable")
        _gemv.wide_registers(kernel == "widest")
        greedy_variant(int8)
        x = x[: _gemv.panels_rows()].contiguous()
        call, y = _product(x, P, b, N, half)
        bounded, out = greedy_call(call, pack, n_valid, max_panels)
        bounded[0](*bounded[1])
        got_y = y.clone()
        call[0](*call[1])
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)
        greedy_variant(None)
    M = x.shape[0]
    want = argmax_at(y.data_ptr(), M, min(n_valid, N), N)
    how = int(out[M])
    return (None if how == 2 else out[:M].tolist()), want, how, got_y


@settings(max_examples=80, deadline=None)
@given(
    M=st.integers(1, 13),  # (past two blocks of six rows of the AVX-512F pass)
    K=st.integers(1, 96),
    N=st.integers(1, 400),
    cut=st.floats(0.01, 1.0),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    peaked=st.booleans(),
    bias=st.booleans(),
    half=st.booleans(),
    int8=st.sampled_from(PASSES),
    kernel=st.sampled_from(KERNELS),
    seed=st.integers(0, 2**31),
)
def test_the_bounded_pick_is_the_full_products_argmax(
    M, K, N, cut, scale, peaked, bias, half, int8, kernel, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(K, N, generator=gen) * scale
    x = torch.randn(M, K, generator=gen)
    if peaked:  # a trained model's logits: one row of W along x
        W[:, int(N * cut) % N] = x[0] * scale
    b = torch.randn(N, generator=gen) if bias else None
    n_valid = max(1, int(N * cut))
    got, want, how, _ = _picks(x, W, b, n_valid, half=half, int8=int8, kernel=kernel)
    assert want is not None
    assert got == want, (how, got, want)


@pytest.mark.parametrize("int8", PASSES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_logits_tied_to_the_last_bit_pick_the_first(int8: str, kernel: str) -> None:
    """Rows 700 and 70 of W_U equal (so their logits are bit-equal), the largest: the first
    of them, in two panels; a row one ulp above makes it the pick, one ulp below does not."""
    gen = torch.Generator().manual_seed(0)
    K, N = 64, 1000
    W = torch.randn(K, N, generator=gen) * 0.02
    x = torch.randn(1, K, generator=gen)
    W[:, 70] = W[:, 700] = x[0] / x.norm()
    got, want, how, _ = _picks(x, W, None, N, int8=int8, kernel=kernel)
    assert got == want == [70] and how == 0  # bounded: the candidates were few
    for step, pick in ((1, 300), (-1, 70)):  # one weight an ulp up (down): logits an ulp apart
        W2 = W.clone()
        W2[:, 300] = W[:, 70]
        k = int(x[0].abs().argmax())
        W2[k, 300] = torch.nextafter(W2[k, 300], W2[k, 300] + step * torch.sign(x[0, k]) * 1.0)
        got, want, how, _ = _picks(x, W2, None, N, int8=int8, kernel=kernel)
        assert got == want, (step, got, want, how)
        assert got[0] in (pick, 70)  # (an ulp of one weight may vanish in the sum's rounding)


def test_the_last_bit_decides_between_two_candidates_within_the_bound() -> None:
    """Many pairs of rows whose logits differ by a few ulps, far below the int8 error: the
    pick is the float32 product's each time, not the int8 copy's."""
    gen = torch.Generator().manual_seed(1)
    K, N, wins = 128, 512, 0
    for trial in range(40):
        W = torch.randn(K, N, generator=gen) * 0.01
        x = torch.randn(1, K, generator=gen)
        a, c = 5 + trial, 400 - trial
        W[:, a] = x[0] / x.norm()
        W[:, c] = W[:, a] + torch.randn(K, generator=gen) * 1e-7
        got, want, how, _ = _picks(x, W, None, N)
        assert got == want and how == 0
        wins += got == [c]
    assert 0 < wins < 40  # both sides won: the tie-break came from the exact values


@pytest.mark.parametrize("int8", PASSES)
def test_flat_logits_compute_the_full_product(int8: str) -> None:
    """Every row of W_U alike (a random model's flat logits): too many candidates, so the full
    product is computed into y, and the pick is still its argmax."""
    gen = torch.Generator().manual_seed(2)
    K, N = 64, 4096
    W = torch.randn(K, 1, generator=gen).expand(K, N) + 1e-6 * torch.randn(K, N, generator=gen)
    x = torch.randn(1, K, generator=gen)
    got, want, how, y = _picks(x, W.contiguous(), None, N, int8=int8)
    assert how == 1 and got == want
    P = dense.panels(W.contiguous())
    call, full = _product(x, P, None, N, False)
    call[0](*call[1])
    assert torch.equal(y, full)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_weight_gives_no_pick_and_the_full_product(bad: float) -> None:
    gen = torch.Generator().manual_seed(3)
    K, N = 32, 300
    W = torch.randn(K, N, generator=gen)
    x = torch.randn(1, K, generator=gen).abs()
    W[:, 250] = 1.0
    W[5, 250] = bad
    got, want, how, y = _picks(x, W, None, N)
    assert got is None and want is None and how == 2
    assert bool(y[0, 250].isnan() or y[0, 250].isinf())
    got, want, how, _ = _picks(x, W, None, 200)  # the bad row past n_valid: a pick
    assert got == want and want is not None


def test_a_nan_activation_gives_no_pick() -> None:
    gen = torch.Generator().manual_seed(4)
    W, x = torch.randn(16, 100, generator=gen), torch.randn(1, 16, generator=gen)
    x[0, 3] = float("nan")
    got, want, how, _ = _picks(x, W, None, 100)
    assert got is None and want is None and how == 2


def test_bad_sizes_are_refused() -> None:
    W = torch.randn(8, 70)
    P = dense.panels(W)
    call, _ = _product(torch.randn(1, 8), P, None, 70, False)
    pack = UnembedInt8(P.data_ptr(), 8, 70, False, 1)
    bounded, _ = greedy_call(call, pack, 70)
    args = list(bounded[1])
    args[11] = 0  # n_valid
    with pytest.raises(ValueError, match="n_valid"):
        bounded[0](*args)
    with pytest.raises(ValueError, match="not one this CPU runs"):
        greedy_variant("sse")


def _int8_argmax(x: torch.Tensor, W: torch.Tensor) -> int:
    """The argmax of the int8 copy's own logits (one scale per row of W_U, as greedy_pack
    rounds them), in float64."""
    s = W.abs().amax(0) / 127
    q = torch.round(W.double() / s.double()).clamp(-127, 127)
    return int((x.double() @ q * s.double()).argmax())


def test_rows_the_int8_copy_ranks_wrongly_are_picked_by_the_exact_values() -> None:
    """Two rows of W_U a quantization step apart, the larger logit's row rounded down: the
    int8 copy's own argmax is wrong in some trials, the pick never is (a bound too tight, or
    none, would keep only the int8 copy's best)."""
    gen = torch.Generator().manual_seed(5)
    K, N, wrong = 48, 256, 0
    for trial in range(60):
        W = torch.randn(K, N, generator=gen) * 0.01
        x = torch.randn(1, K, generator=gen)
        a, c = trial % 64, 128 + trial
        W[:, a] = x[0] / x.norm()
        step = W[:, a].abs().max() / 127
        W[:, c] = W[:, a] + (torch.rand(K, generator=gen) - 0.5) * step
        got, want, how, _ = _picks(x, W, None, N, max_panels=N)
        assert got == want and how == 0, (trial, got, want, how)
        wrong += _int8_argmax(x, W) != want[0]
    assert wrong > 0
