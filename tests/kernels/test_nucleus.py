"""Top-p's drop mask by the compiled kernel (``kernels/_nucleus.h``: a histogram of the values'
bits and a sort of the few values near the cut) against two oracles: PyTorch's stable sort
and cumsum (``sample.filters.sorted_drop``, the fallback), and the definition written in
NumPy (a stable argsort, a float64 cumsum rounded to float32, the mass before each token in
float32). Bit for bit, over generated rows: ties, zeros, −inf logits, flat and peaked rows,
p near 0, near 1 and exactly at a token's mass, V from 2 to 50,257; with the AVX2 passes
and with the portable loops forced."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgpt import kernels
from glassgpt.sample.filters import draw, sorted_drop, top_k_filter, top_p_drop, top_p_filter

ext = pytest.importorskip(
    "glassgpt.kernels._rowwise", reason="the C extension is not built (no compiler at install)"
)


@pytest.fixture(params=[False, True], ids=["fast", "portable"])
def portable(request: pytest.FixtureRequest):
    ext.use_portable(request.param)
    yield request.param
    ext.use_portable(False)


def numpy_drop(probs: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The definition: each row sorted descending, ties in index order; the mass before a
    token is float32(Σ of the sorted values through it, in float64) − the token (float32
    arithmetic); dropped where that is ≥ p_b (float32)."""
    drop = np.zeros(probs.shape, dtype=bool)
    for b, row in enumerate(probs):
        order = np.argsort(-row, kind="stable")
        s = row[order]
        before = np.cumsum(s.astype(np.float64)).astype(np.float32) - s
        drop[b, order] = before >= np.float32(p[b])
    return drop


def kernel_drop(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    drop = kernels.top_p_drop(probs, p)
    assert drop is not None, "the kernel refused probabilities"
    return drop


def logits_row(kind: str, V: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "flat":  # random weights: the nucleus spans most of the vocabulary
        z = rng.normal(size=V) * 0.5
    elif kind == "peaked":
        z = rng.normal(size=V) * 8
    elif kind == "ties":  # few distinct values: tie groups straddle the cut
        z = rng.integers(-3, 3, size=V).astype(np.float64)
    elif kind == "one":  # one token with all the mass, the rest underflow to 0
        z = np.full(V, -200.0)
        z[rng.integers(V)] = 0.0
    else:  # "masked": −inf logits (a top-k or a padded vocabulary before): zeros
        z = rng.normal(size=V) * 2
        z[rng.random(V) < 0.6] = -np.inf
        z[rng.integers(V)] = 0.0
    return z.astype(np.float32)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    V=st.one_of(st.integers(2, 400), st.sampled_from([1000, 4099, 50257])),
    kinds=st.lists(
        st.sampled_from(["flat", "peaked", "ties", "one", "masked"]), min_size=1, max_size=4
    ),
    p_kind=st.sampled_from(["any", "near 0", "near 1", "at a mass", "2 (off)"]),
    seed=st.integers(0, 2**31),
    fast=st.booleans(),
)
def test_drop_mask_is_pytorchs_sort_and_the_definition(V, kinds, p_kind, seed, fast) -> None:
    rng = np.random.default_rng(seed)
    z = torch.from_numpy(np.stack([logits_row(k, V, rng) for k in kinds]))
    probs = torch.softmax(z, dim=-1)
    B = len(kinds)
    if p_kind == "any":
        p = rng.random(B)
    elif p_kind == "near 0":
        p = rng.random(B) * 1e-6
    elif p_kind == "near 1":
        p = 1 - rng.integers(1, 64, size=B) * 2.0**-24
    elif p_kind == "2 (off)":
        p = np.full(B, 2.0)
    else:  # exactly the mass before some token: the ≥ decides
        full = numpy_drop(probs.numpy(), np.full(B, 2.0))  # (nothing dropped)
        assert not full.any()
        p = np.empty(B)
        for b, row in enumerate(probs.numpy()):
            s = np.sort(row)[::-1]
            before = np.cumsum(s.astype(np.float64)).astype(np.float32) - s
            p[b] = before[rng.integers(V)]
    pt = torch.from_numpy(p.astype(np.float32))
    ext.use_portable(not fast)
    try:
        got = kernel_drop(probs, pt)
        filled = kernels.top_p_fill(z, probs, pt)
    finally:
        ext.use_portable(False)
    want = sorted_drop(probs, pt)
    assert torch.equal(got, want)
    assert np.array_equal(got.numpy(), numpy_drop(probs.numpy(), p.astype(np.float32)))
    # the fill in the kernel's pass: masked_fill's bits (−inf logits and all)
    assert filled is not None
    assert torch.equal(filled.view(torch.int32), z.masked_fill(want, -torch.inf).view(torch.int32))


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.sampled_from([0.0, -0.0, 1e-45, 2.0**-30, 2.0**-29, 1e-3, 0.1, 0.25, 0.5, 0.7, 1.0]),
        min_size=1,
        max_size=60,
    ),
    p=st.floats(0.0, 1.2),
)
def test_any_nonnegative_values_are_pytorchs_sort(values: list[float], p: float) -> None:
    """Not only a softmax's rows: exact ties, −0 beside 0, subnormals, values either side of
    2^-29 (where float64 partial sums stop being exact), totals of 1.5 and more (which the
    kernel sorts whole)."""
    probs = torch.tensor([values], dtype=torch.float32)
    pt = torch.tensor([p], dtype=torch.float32)
    got = kernel_drop(probs, pt)
    assert torch.equal(got, sorted_drop(probs, pt))
    assert np.array_equal(got.numpy(), numpy_drop(probs.numpy(), pt.numpy()))


def test_ties_at_the_cut_keep_the_lower_ids(portable: bool) -> None:
    """A tie group straddling the cut keeps its lowest ids, as the stable sort does: 20 ids
    of 1/20 each (equal bits), shuffled among zeros; p = 0.5 keeps exactly 10 of them (the
    mass before the 11th is 0.5), the 10 lowest. An unstable sort keeps others."""
    V = 5000
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(V, size=20, replace=False))
    probs = torch.zeros(1, V)
    probs[0, ids] = 0.05
    for p in (0.5, 0.33, 0.95):
        drop = kernel_drop(probs, torch.tensor([p]))
        kept = np.flatnonzero(~drop[0].numpy())
        s = np.full(20, 0.05, np.float32)  # the group, sorted: how many have mass before < p
        n = int(np.sum(np.cumsum(s.astype(np.float64)).astype(np.float32) - s < np.float32(p)))
        assert kept.tolist() == ids[:n].tolist()
        assert torch.equal(drop, sorted_drop(probs, torch.tensor([p])))
    # a flat row of GPT-2's width, every value tied: the cut falls inside the group
    flat = torch.softmax(torch.zeros(2, 50257), dim=-1)
    drop = kernel_drop(flat, torch.tensor([0.9, 0.3]))
    assert torch.equal(drop, sorted_drop(flat, torch.tensor([0.9, 0.3])))
    assert not drop[0, : int(0.9 * 50257) - 2].any() and drop[0, int(0.9 * 50257) + 2 :].all()


def test_a_nan_row_keeps_everything_as_the_sort_does() -> None:
    """softmax of a row of −inf is NaN: the sort puts NaN first, so every cumsum is NaN and
    nothing is ≥ p; the other rows as usual."""
    z = torch.randn(3, 700)
    z[1] = -torch.inf
    probs = torch.softmax(z, dim=-1)
    p = torch.tensor([0.5, 0.5, 0.5])
    drop = kernel_drop(probs, p)
    assert torch.equal(drop, sorted_drop(probs, p)) and not drop[1].any() and drop[0].any()


def test_what_the_kernel_refuses_goes_to_pytorch() -> None:
    """Negative or infinite values (not probabilities), float64, another shape: None from the
    door; ``filters.top_p_drop`` then sorts."""
    p = torch.tensor([0.5])
    for bad in (torch.tensor([[0.5, -0.25, 0.75]]), torch.tensor([[0.5, torch.inf, 0.1]])):
        assert kernels.top_p_drop(bad, p) is None
        assert torch.equal(top_p_drop(bad, p), sorted_drop(bad, p))
    x = torch.softmax(torch.randn(1, 50), -1)
    assert kernels.top_p_drop(x.double(), p.double()) is None
    assert kernels.top_p_drop(x, p.double()) is None
    assert kernels.top_p_drop(x[0], p) is None
    assert kernels.top_p_drop(torch.softmax(torch.randn(50, 2), -1).t(), p) is None  # strided
    assert kernels.top_p_fill(torch.zeros(1, 49), x, p) is None  # z not probs' shape
    assert kernels.top_p_fill(torch.zeros(1, 50).double(), x, p) is None


def old_top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """``top_p_filter`` as it was: PyTorch's sort, compared with the Python float p."""
    probs = torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1) - sorted_p
    drop = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before >= p)
    return logits.masked_fill(drop, float("-inf"))


@pytest.mark.parametrize("p_kind", ["0.9", "0.95", "1 - 1e-9", "just above a mass"])
def test_top_p_filter_is_what_it_was_with_and_without_the_kernel(p_kind, portable) -> None:
    """``top_p_filter`` (``filters.probabilities``) with the kernel, and with the extension
    hidden, equals the filter as it was (its sort, the Python float p). "just above
    a mass": p a float64 a quarter of a float32 ulp above the mass before some token, which
    PyTorch's comparison rounds to that mass (so the token is dropped); float64 logits compare
    it unrounded."""
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(3, 2, 3000, generator=gen) * torch.tensor([0.3, 3.0, 12.0])[:, None, None]
    z[0, 1, :1000] = 0.0  # a tie group
    if p_kind == "just above a mass":
        s = np.sort(torch.softmax(z[1, 0], -1).numpy())[::-1]
        before = np.cumsum(s.astype(np.float64)).astype(np.float32) - s
        mass = float(before[7])
        p = mass + float(np.spacing(np.float32(mass))) / 4
        assert np.float32(p) == np.float32(mass) and p > mass
    else:
        p = float(p_kind) if p_kind != "1 - 1e-9" else 1 - 1e-9
    want = old_top_p_filter(z, p)
    assert torch.equal(top_p_filter(z, p), want)
    with kernels.hidden("_rowwise"):
        assert torch.equal(top_p_filter(z, p), want)
    assert torch.equal(top_p_filter(z.double(), p), old_top_p_filter(z.double(), p))


@settings(max_examples=60, deadline=None)
@given(
    V=st.integers(1, 300),
    special=st.sampled_from(["none", "nan", "inf", "-inf row", "±0 max"]),
    m=st.lists(st.sampled_from([0.0, 1e-30, 0.05, 0.5, 1.0]), min_size=3, max_size=3),
    seed=st.integers(0, 2**31),
)
def test_min_p_fill_is_the_masked_fill(V, special, m, seed) -> None:
    """min-p's one compiled pass gives ``z.masked_fill(z − z.max() < log m, −inf)``'s bits:
    m = 0 (log 0 = −inf) fills nothing, a NaN anywhere in a row fills nothing there (its
    maximum is NaN), ±inf and a row of −inf as PyTorch's arithmetic has them."""
    rng = np.random.default_rng(seed)
    z = torch.from_numpy(rng.normal(size=(3, V)).astype(np.float32) * 4)
    i = int(rng.integers(V))
    if special == "nan":
        z[1, i] = torch.nan
    elif special == "inf":
        z[1, i] = torch.inf
    elif special == "-inf row":
        z[2] = -torch.inf
    elif special == "±0 max":
        z[0] = -z[0].abs()
        z[0, i], z[0, (i + 1) % V] = -0.0, 0.0
    log_m = torch.log(torch.tensor(m))
    want = z.masked_fill(z - z.max(dim=-1, keepdim=True).values < log_m[:, None], -torch.inf)
    got = kernels.min_p_fill(z, log_m)
    assert got is not None
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert kernels.min_p_fill(z.double(), log_m) is None
    assert kernels.min_p_fill(z.t(), log_m) is None


def topk_fill_torch(z: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``sample.rows._top_k``'s PyTorch form: the k_b-th of ``torch.topk``'s values, the fill
    below it (a row with k_b outside (0, V) kept)."""
    V = z.shape[-1]
    on = (k > 0) & (k < V)
    k_max = int(torch.where(on, k, 0).max())
    if k_max == 0:
        return z.clone()
    kth = torch.topk(z, k_max, dim=-1).values.gather(-1, (k.clamp(1, k_max) - 1)[:, None])
    return z.masked_fill(z < torch.where(on[:, None], kth, -torch.inf), -torch.inf)


def numpy_kth(row: np.ndarray, k: int) -> np.float32:
    """The definition: NaN above +inf, then the values descending; the k-th of them."""
    nan = np.isnan(row)
    rest = np.sort(row[~nan])[::-1]
    return np.float32(np.nan) if k <= nan.sum() else rest[k - 1 - nan.sum()]


def topk_row(kind: str, V: int, rng: np.random.Generator) -> np.ndarray:
    if kind in ("flat", "peaked", "ties", "one", "masked"):
        return logits_row(kind, V, rng)
    z = rng.normal(size=V).astype(np.float32)
    if kind == "nan":  # NaNs (either sign bit) count as the largest values, as in torch.topk
        at = rng.random(V) < 0.1
        z[at] = np.where(rng.random(int(at.sum())) < 0.5, np.float32(np.nan), -np.float32(np.nan))
    elif kind == "±0":  # zeros of both signs, ties among them around the k-th
        z = rng.choice(np.array([-0.0, 0.0, 1.0, -1.0], np.float32), size=V)
    elif kind == "inf":
        z[rng.random(V) < 0.2] = rng.choice(np.array([np.inf, -np.inf], np.float32))
    elif kind == "close":  # values a few ulps apart: the low bits decide
        z = (np.float32(1.5) + rng.integers(0, 600, size=V) * np.float32(2.0**-23)).astype(
            np.float32
        )
    return z


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    V=st.one_of(st.integers(1, 400), st.sampled_from([1000, 4099, 50257])),
    kinds=st.lists(
        st.sampled_from(["flat", "peaked", "ties", "one", "masked", "nan", "±0", "inf", "close"]),
        min_size=1,
        max_size=4,
    ),
    ks=st.lists(
        st.sampled_from(["0", "1", "small", "any", "V-1", "V", "past V"]), min_size=4, max_size=4
    ),
    seed=st.integers(0, 2**31),
    fast=st.booleans(),
)
def test_top_k_fill_is_torch_topks_threshold_and_the_definition(V, kinds, ks, seed, fast) -> None:
    """top-k's compiled fill gives the bits of the fill below ``torch.topk``'s k_b-th value,
    and that value is the definition's (NaN largest, ties by value): ties, ±0, ±inf, NaN,
    values an ulp apart, k at 0, 1, V − 1, V and past V (kept whole)."""
    rng = np.random.default_rng(seed)
    z = torch.from_numpy(np.stack([topk_row(kind, V, rng) for kind in kinds]))
    pick = {"0": 0, "1": 1, "small": int(rng.integers(1, 41)), "any": int(rng.integers(1, V + 1)),
            "V-1": V - 1, "V": V, "past V": V + 7}  # fmt: skip
    k = torch.tensor([pick[ks[b % len(ks)]] for b in range(len(kinds))])
    ext.use_portable(not fast)
    try:
        got = kernels.top_k_fill(z, k)
    finally:
        ext.use_portable(False)
    assert got is not None
    want = topk_fill_torch(z, k)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    for b, row in enumerate(z.numpy()):
        kb = int(k[b])
        if 0 < kb < V:  # torch.topk's ids are kept as they were; the one-setting filter agrees
            top = torch.topk(z[b], kb).indices
            assert torch.equal(got[b, top].view(torch.int32), z[b, top].view(torch.int32))
            assert torch.equal(top_k_filter(z[b : b + 1], kb).view(torch.int32),
                               got[b : b + 1].view(torch.int32))  # fmt: skip
            with kernels.hidden("_rowwise"):
                alone = top_k_filter(z[b : b + 1], kb)
            assert torch.equal(alone.view(torch.int32), got[b : b + 1].view(torch.int32))
        t = numpy_kth(row, kb) if 0 < kb < V else np.float32(-np.inf)
        with np.errstate(invalid="ignore"):
            mine = np.where(row < t, np.float32(-np.inf), row)
        assert np.array_equal(got[b].numpy().view(np.int32), mine.view(np.int32))


def test_top_k_fill_refuses_what_it_does_not_take() -> None:
    """float64, int32 k, a strided z or a k of another length: None (PyTorch's topk then)."""
    z = torch.randn(2, 50)
    k = torch.tensor([3, 5])
    assert kernels.top_k_fill(z.double(), k) is None
    assert kernels.top_k_fill(z, k.int()) is None
    assert kernels.top_k_fill(torch.randn(50, 2).t(), k) is None
    assert kernels.top_k_fill(z, k[:1]) is None
    with kernels.hidden("_rowwise"):
        assert kernels.top_k_fill(z, k) is None


def draw_torch(z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``filters.draw`` by PyTorch's operations alone (the kernel hidden)."""
    with kernels.hidden("_rowwise"):
        return draw(z, u)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    V=st.one_of(st.integers(1, 300), st.sampled_from([4099, 50257])),
    kinds=st.lists(
        st.sampled_from(["flat", "peaked", "ties", "one", "masked", "tail", "nan"]),
        min_size=1,
        max_size=5,
    ),
    u_kind=st.sampled_from(["any", "0", "1 − 2⁻⁵³", "at a mass"]),
    seed=st.integers(0, 2**31),
)
def test_draw_rows_is_pytorchs_search_and_fallback(V, kinds, u_kind, seed) -> None:
    """The compiled rest of ``filters.draw`` (after its softmax and cumsum) gives PyTorch's ids:
    u at 0, just below 1 (x rounds up to the total, past the last id with mass: the fallback),
    exactly at a cumulative mass (right=True goes past it), ties, rows whose tail has no mass,
    and a NaN row (softmax of +inf), whose search ends where PyTorch's binary search does."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind in kinds:
        if kind == "tail":  # the last ids at −inf: no mass where x = total lands
            z = rng.normal(size=V).astype(np.float32)
            z[V // 2 :] = -np.inf
            z[0] = 0.0
        elif kind == "nan":
            z = rng.normal(size=V).astype(np.float32)
            z[int(rng.integers(V))] = np.inf
        else:
            z = logits_row(kind, V, rng) if V > 1 else np.zeros(1, np.float32)
        rows.append(z)
    zt = torch.from_numpy(np.stack(rows))
    B = len(rows)
    if u_kind == "any":
        u = rng.random(B)
    elif u_kind == "0":
        u = np.zeros(B)
    elif u_kind == "1 − 2⁻⁵³":
        u = np.full(B, 1 - 2.0**-53)
    else:  # u · total is exactly some token's cumulative mass
        cdf = torch.softmax(zt.double(), -1).cumsum(-1).numpy()
        u = np.array([cdf[b, int(rng.integers(V))] / cdf[b, -1] for b in range(B)])
        u = np.nan_to_num(u)
    ut = torch.from_numpy(u)
    got = draw(zt, ut)
    want = draw_torch(zt, ut)
    assert torch.equal(got, want)
    probs = torch.softmax(zt.double(), -1)
    assert kernels.draw_rows(probs, probs.cumsum(-1), ut) is not None  # (the kernel took them)
    fine = ~torch.isnan(probs).any(-1)
    for b in np.flatnonzero(fine.numpy()):  # the definition, where the row is a distribution
        p = probs[b].numpy()
        c = np.cumsum(p)
        i = min(int(np.searchsorted(c, u[b] * c[-1], side="right")), V - 1)
        if p[i] == 0:
            i = int(np.flatnonzero(p > 0)[-1])
        assert int(got[b]) == i


def test_draw_rows_refuses_what_it_does_not_take() -> None:
    probs = torch.softmax(torch.randn(2, 9, dtype=torch.float64), -1)
    u = torch.tensor([0.3, 0.6], dtype=torch.float64)
    assert kernels.draw_rows(probs.float(), probs.cumsum(-1), u) is None
    assert kernels.draw_rows(probs, probs.cumsum(-1), u.float()) is None
    assert kernels.draw_rows(probs, probs.cumsum(-1)[:, :8], u) is None
    assert kernels.draw_rows(probs.t().contiguous().t(), probs.cumsum(-1), u) is None


@settings(max_examples=80, deadline=None)
@given(
    V=st.integers(1, 70),
    rows=st.lists(
        st.sampled_from(["normal", "-inf", "inf", "nan", "mixed", "last"]), min_size=1, max_size=6
    ),
    seed=st.integers(0, 2**31),
)
def test_finite_rows_is_isfinite_any(V, rows, seed) -> None:
    """Rows of −inf, +inf, NaN (of both signs), a mix, one finite value last: each row's
    ``torch.isfinite(z).any(-1)`` and whether all rows have one."""
    rng = np.random.default_rng(seed)
    specials = np.array([np.inf, -np.inf, np.nan, -np.float32(np.nan)], np.float32)
    z = rng.normal(size=(len(rows), V)).astype(np.float32)
    for b, kind in enumerate(rows):
        if kind in ("-inf", "inf", "nan"):
            z[b] = {"-inf": -np.inf, "inf": np.inf, "nan": np.nan}[kind]
        elif kind == "mixed":
            z[b] = rng.choice(specials, size=V)
        elif kind == "last":
            z[b, :-1] = rng.choice(specials, size=V - 1)
    zt = torch.from_numpy(z)
    found = kernels.finite_rows(zt)
    assert found is not None
    want = torch.isfinite(zt).any(-1)
    assert torch.equal(found[0], want) and found[1] == bool(want.all())
    strided = torch.randn(3, 4).t()
    assert kernels.finite_rows(zt.double()) is None and kernels.finite_rows(strided) is None
