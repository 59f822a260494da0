"""Per-row sampling (glassgpt.sample.rows): each row's distribution against a NumPy
transcription of the docs with that row's own settings; the counter-based uniforms against
SplitMix64 in NumPy uint64 (and its published first output); and a hypothesis-generated mix
of settings and seeds sampled as one batch equals each row sampled alone, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt import kernels
from glassgpt.errors import ConfigError
from glassgpt.sample.filters import SamplingConfig, apply_penalties, probabilities, sorted_drop
from glassgpt.sample.rows import FREQ, PRES, REP, Rows, _mix, _penalties, _top_p, uniforms

GAMMA = np.uint64(0x9E3779B97F4A7C15)


def np_mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def test_mix_is_splitmix64() -> None:
    """SplitMix64 from state 0 first outputs 0xE220A8397B1DCDAF (Vigna's reference code)."""
    got = int(_mix(torch.tensor([int(GAMMA) - (1 << 64)]))[0]) % (1 << 64)
    assert got == 0xE220A8397B1DCDAF


@given(
    seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20),
    counter=st.integers(0, 2**40),
)
def test_uniforms_match_numpy_uint64(seeds: list[int], counter: int) -> None:
    s = torch.tensor(seeds)
    n = torch.full_like(s, counter)
    with np.errstate(over="ignore"):
        state = np_mix(np.array(seeds, dtype=np.int64).view(np.uint64))
        want = (np_mix(state + np.uint64(counter + 1) * GAMMA) >> np.uint64(11)) * 2.0**-53
    assert uniforms(s, n).tolist() == want.tolist()


def reference(z: np.ndarray, cfg: SamplingConfig, counts: np.ndarray) -> np.ndarray:
    """One row's distribution as filters' docstring states it, token by token in float64."""
    z = z.astype(np.float64).copy()
    for i in range(len(z)):
        if counts[i] > 0:
            z[i] = z[i] / cfg.repetition_penalty if z[i] > 0 else z[i] * cfg.repetition_penalty
            z[i] -= cfg.presence_penalty
        z[i] -= cfg.frequency_penalty * counts[i]
    for i, beta in cfg.logit_bias:
        z[i] += beta
    if cfg.temperature == 0:
        return np.eye(len(z))[int(np.argmax(z))]
    z = z / cfg.temperature
    keep = np.ones(len(z), bool)
    if cfg.top_k is not None:
        keep &= z >= np.sort(z)[::-1][min(cfg.top_k, len(z)) - 1]
    p = np.exp(z - z[keep].max()) * keep
    p /= p.sum()
    if cfg.top_p is not None:
        mass, kept = 0.0, np.zeros(len(z), bool)
        for i in np.argsort(-p, kind="stable"):
            if mass >= cfg.top_p:
                break
            kept[i], mass = keep[i], mass + p[i]
        keep &= kept
        p = p * keep / (p * keep).sum()
    if cfg.min_p is not None:
        keep &= p >= cfg.min_p * p.max()
        p = p * keep / (p * keep).sum()
    return p


V = 12
config = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.none() | st.integers(1, V + 2),
    top_p=st.none() | st.sampled_from([0.3, 0.8, 1.0]),
    min_p=st.none() | st.sampled_from([0.05, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8]),
    frequency_penalty=st.sampled_from([0.0, 0.4, -0.3]),
    presence_penalty=st.sampled_from([0.0, 0.7, -0.5]),
    logit_bias=st.dictionaries(
        st.integers(0, V - 1), st.sampled_from([-100.0, -2.0, 3.0]), max_size=3
    ),
)


@settings(deadline=None, max_examples=40)
@given(cfgs=st.lists(config, min_size=1, max_size=6), seed=st.integers(0, 2**31))
def test_each_rows_distribution_is_the_reference_with_its_own_settings(
    cfgs: list[SamplingConfig], seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(len(cfgs), V, generator=gen, dtype=torch.float64).float()
    histories = [torch.randint(0, V, (5,), generator=gen).tolist() for _ in cfgs]
    rows = Rows(len(cfgs), V)
    for b, (cfg, h) in enumerate(zip(cfgs, histories)):
        rows.set(b, cfg, seed=b, history=h)
    got = rows.probabilities(z).double().numpy()
    for b, (cfg, h) in enumerate(zip(cfgs, histories)):
        counts = np.bincount(h, minlength=V)
        np.testing.assert_allclose(got[b], reference(z[b].numpy(), cfg, counts), atol=2e-6)


@settings(deadline=None, max_examples=50)
@given(
    cfgs=st.lists(config, min_size=1, max_size=8),
    seeds=st.lists(st.integers(-(2**70), 2**70), min_size=8, max_size=8),
    n_vocab=st.integers(2, 300) | st.just(1100),  # 1100 > SMALL: rows gathered per filter
    data=st.integers(0, 2**31),
    broken=st.integers(-1, 7),
)
def test_rows_sampled_together_equal_each_row_alone(
    cfgs: list[SamplingConfig], seeds: list[int], n_vocab: int, data: int, broken: int
) -> None:
    """Rows of mixed settings and seeds sampled as one batch get the ids (and end in the
    state) each gets sampled alone, four steps in a row, counts and counters advancing; a row
    whose logits are all NaN gets ok False and disturbs no other."""
    B = len(cfgs)
    cfgs = [c.__class__(**{**c.__dict__, "logit_bias": [(i % n_vocab, x) for i, x in c.logit_bias]})
            for c in cfgs]  # fmt: skip
    gen = torch.Generator().manual_seed(data)
    histories = [torch.randint(0, n_vocab, (4,), generator=gen).tolist() for _ in range(B)]
    together = Rows(B + 2, n_vocab)  # spare rows: a batch need not fill the sampler
    alone = [Rows(1, n_vocab) for _ in range(B)]
    for b in range(B):
        together.set(b + 1, cfgs[b], seeds[b], histories[b])
        alone[b].set(0, cfgs[b], seeds[b], histories[b])
    for _ in range(4):
        logits = 3 * torch.randn(B, n_vocab, generator=gen)
        if 0 <= broken < B:
            logits[broken] = float("nan")
        ids, ok = together.sample(logits, start=1)
        for b in range(B):
            want, want_ok = alone[b].sample(logits[b : b + 1])
            assert bool(ok[b]) == bool(want_ok[0]) == (b != broken)
            if b != broken:
                assert int(ids[b]) == int(want[0])
            assert int(together.drawn[b + 1]) == int(alone[b].drawn[0])
            if together.counts is not None and alone[b].counts is not None:
                assert torch.equal(together.counts[b + 1], alone[b].counts[0])


@pytest.mark.parametrize("path", ["kernel", "fallback"])
@pytest.mark.parametrize("scale", [0.5, 4.0])  # flat: top-p sorts; peaked: cut among the largest
def test_top_p_on_a_large_vocabulary_is_the_reference_and_row_independent(
    scale: float, path: str
) -> None:
    """Top-p by the compiled kernel, and without it (PyTorch's sort): the reference, row by
    row, alone or batched."""
    with kernels.hidden(*(["_rowwise"] if path == "fallback" else [])):
        _top_p_large_vocabulary(scale)


def _top_p_large_vocabulary(scale: float) -> None:
    V, gen = 1500, torch.Generator().manual_seed(2)
    cfgs = [
        SamplingConfig(top_p=p, temperature=t) for p, t in [(0.5, 1.0), (0.9, 0.7), (0.99, 1.3)]
    ]
    cfgs += [SamplingConfig(top_p=0.8, top_k=700), SamplingConfig(temperature=0.0)]
    cfgs += [SamplingConfig(min_p=0.05, temperature=0.8), SamplingConfig(top_k=3, min_p=0.2)]
    z = scale * torch.randn(len(cfgs), V, generator=gen, dtype=torch.float64).float()
    z[1] *= 8  # one row peaked whatever the scale, beside flat ones
    rows = Rows(len(cfgs), V)
    for b, cfg in enumerate(cfgs):
        rows.set(b, cfg, seed=b)
    got = rows.probabilities(z).double().numpy()
    for b, cfg in enumerate(cfgs):
        want = reference(z[b].numpy(), cfg, np.zeros(V))
        np.testing.assert_allclose(got[b], want, atol=2e-6)
        alone = Rows(1, V)
        alone.set(0, cfg, seed=b)
        assert torch.equal(rows.probabilities(z)[b], alone.probabilities(z[b : b + 1])[0])
    ids, _ = rows.sample(z)
    for b, cfg in enumerate(cfgs):
        alone = Rows(1, V)
        alone.set(0, cfg, seed=b)
        assert int(ids[b]) == int(alone.sample(z[b : b + 1])[0][0])


@pytest.mark.parametrize("path", ["kernel", "fallback"])
@pytest.mark.parametrize("group", [200, 1500])
def test_ties_at_the_cut_are_cut_as_the_filter_cuts_them(group: int, path: str) -> None:
    """A group of equal largest logits that the cut falls inside keeps its lowest ids in
    ``Rows`` (the server, ``generate``), as in the one-setting filter (``filters``: a stable
    sort): with the kernel, and without it."""
    V, gen = 3000, torch.Generator().manual_seed(0)
    z = torch.randn(2, V, generator=gen) - 6
    z[:, torch.randperm(V, generator=gen)[:group]] = 0.0
    cfg = SamplingConfig(top_p=0.5)
    with kernels.hidden(*(["_rowwise"] if path == "fallback" else [])):
        rows = Rows(2, V)
        rows.set(0, cfg, seed=0)
        rows.set(1, SamplingConfig(top_p=0.5, temperature=0.9), seed=1)
        got = rows.probabilities(z)
        assert torch.equal(got[0], probabilities(z[:1], cfg)[0])
        assert torch.equal(
            got[1], probabilities(z[1:], SamplingConfig(top_p=0.5, temperature=0.9))[0]
        )


NUCLEUS = 256  # the rank below which the test puts p exactly at a token's mass


@settings(max_examples=40, deadline=None)
@given(
    V=st.integers(2 * NUCLEUS + 1, 1200),
    scale=st.sampled_from([0.5, 4.0, 12.0]),
    levels=st.sampled_from([0, 3]),  # 3: logits of few values, ties everywhere
    at_a_mass=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_top_p_without_the_kernel_is_the_sort(V, scale, levels, at_a_mass, seed) -> None:
    """Without the kernel, top-p in ``Rows`` drops what the sort drops, p at random or exactly
    the mass before some token."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(3, V)) * scale
    z = torch.from_numpy(np.round(z / scale * levels) if levels else z).float()
    probs = torch.softmax(z, dim=-1)
    p = torch.from_numpy(rng.random(3).astype(np.float32))
    if at_a_mass:
        s = probs.sort(-1, descending=True).values
        before = s.cumsum(-1) - s
        p = before[torch.arange(3), torch.from_numpy(rng.integers(0, NUCLEUS, size=3))]
    want = z.masked_fill(sorted_drop(probs, p), -torch.inf)
    with kernels.hidden("_rowwise"):
        assert torch.equal(_top_p(z, p), want)


@settings(max_examples=40, deadline=None)
@given(
    rep=st.lists(st.sampled_from([1.0, 1.1, 0.7]), min_size=4, max_size=4),
    freq=st.lists(st.sampled_from([0.0, 0.3, -0.4]), min_size=4, max_size=4),
    pres=st.lists(st.sampled_from([0.0, 0.5, -1.0]), min_size=4, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_penalties_are_the_filters_bits(rep, freq, pres, seed) -> None:
    """The server's penalties (on the seen ids alone while f, a ≥ 0; every id otherwise) give
    each row the bits of ``filters.apply_penalties`` with that row's settings (``glassgpt
    sample``), ±0, ±inf and NaN logits included."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(4, 300, generator=gen) * 3
    z[:, :6] = torch.tensor([0.0, -0.0, torch.inf, -torch.inf, torch.nan, 1e-40])
    counts = (torch.rand(4, 300, generator=gen) < 0.2) * torch.randint(
        1, 4, (4, 300), generator=gen
    )
    counts[:, :6] = torch.tensor([1, 1, 1, 2, 1, 0])
    counts[:, 300 // 2 : 300 // 2 + 6] = 0  # −0 … unseen
    z[:, 300 // 2 : 300 // 2 + 6] = torch.tensor(
        [0.0, -0.0, torch.inf, -torch.inf, torch.nan, -1.0]
    )
    t = torch.tensor
    got = _penalties(z, counts.float(), t(rep), t(freq), t(pres), REP | FREQ | PRES)
    for b in range(4):
        want = apply_penalties(z[b : b + 1], counts[b : b + 1], rep[b], freq[b], pres[b])
        assert torch.equal(got[b].view(torch.int32), want[0].view(torch.int32))


def test_moved_rows_keep_their_stream() -> None:
    """A row moved to another slot (the server refilling a freed one) draws what it would
    have drawn where it was."""
    cfg = SamplingConfig(temperature=1.0, presence_penalty=0.5, logit_bias={1: 2.0})
    z = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    a, b = Rows(3, 50), Rows(1, 50)
    a.set(2, cfg, 99, [1, 2, 3])
    b.set(0, cfg, 99, [1, 2, 3])
    first = a.sample(z, start=2)[0], b.sample(z)[0]
    a.move(2, 0)
    assert first[0].tolist() == first[1].tolist()
    assert a.sample(z)[0].tolist() == b.sample(z)[0].tolist()


def test_seeded_draws_follow_the_distribution_across_steps() -> None:
    """One seed's stream over many steps: the draws' histogram fits p (chi-square), so the
    counter stream, and not only the seed stream, is uniform."""
    from scipy import stats

    p = np.array([0.5, 0.25, 0.125, 0.125])
    rows = Rows(1, 4)
    rows.set(0, SamplingConfig(), seed=7)
    z = torch.log(torch.tensor(p, dtype=torch.float32))[None]
    ids = [int(rows.sample(z)[0][0]) for _ in range(4000)]
    observed = np.bincount(ids, minlength=4)
    assert stats.chisquare(observed, 4000 * p).pvalue > 1e-3


def test_a_bias_id_past_the_vocabulary_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^logit_bias: token id 10 is out of range"):
        Rows(1, 10).set(0, SamplingConfig(logit_bias={10: 1.0}), seed=0)
