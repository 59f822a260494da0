"""The next-token distribution: filters against a NumPy transcription, and the sampler's
empirical distribution against softmax(z/T) after filtering (chi-square, fixed seed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from glassgpt.errors import ConfigError
from glassgpt.sample.filters import SamplingConfig, draw, next_token_logits, probabilities
from glassgpt.sample.rows import uniforms


def reference(
    z: np.ndarray,
    T: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    counts: np.ndarray | None = None,
    rep: float = 1.0,
    freq: float = 0.0,
) -> np.ndarray:
    """The distribution as the docs state it, one token at a time in float64."""
    z = z.astype(np.float64).copy()
    if counts is not None:
        for i in range(len(z)):
            if counts[i] > 0 and rep != 1.0:
                z[i] = z[i] / rep if z[i] > 0 else z[i] * rep
            z[i] -= freq * counts[i]
    z = z / T
    keep = np.ones(len(z), bool)
    if top_k is not None:
        kth = np.sort(z)[::-1][min(top_k, len(z)) - 1]
        keep &= z >= kth
    p = np.exp(z - z[keep].max()) * keep
    p /= p.sum()
    if top_p is not None:
        mass, kept = 0.0, np.zeros(len(z), bool)
        for i in np.argsort(-p, kind="stable"):
            if mass >= top_p:
                break
            kept[i] = keep[i]
            mass += p[i]
        keep &= kept
        p = p * keep / (p * keep).sum()
    if min_p is not None:
        keep &= p >= min_p * p.max()
        p = p * keep / (p * keep).sum()
    return p


Z = np.array([1.3, -0.2, 2.1, 0.4, 0.0, -1.7, 1.9, 0.8, -0.5, 1.1])
CASES = [
    {"T": 1.0},
    {"T": 0.7, "top_k": 5},
    {"T": 1.3, "top_p": 0.8},
    {"T": 0.9, "top_k": 6, "top_p": 0.9},
    {"T": 1.0, "min_p": 0.2},
    {"T": 2.0, "top_k": 8, "top_p": 0.95, "min_p": 0.1},
]


def cfg_of(case: dict) -> SamplingConfig:
    return SamplingConfig(
        temperature=case["T"],
        top_k=case.get("top_k"),
        top_p=case.get("top_p"),
        min_p=case.get("min_p"),
        repetition_penalty=case.get("rep", 1.0),
        frequency_penalty=case.get("freq", 0.0),
    )


@pytest.mark.parametrize("case", CASES)
def test_probabilities_match_the_reference(case: dict) -> None:
    got = probabilities(torch.tensor(Z, dtype=torch.float32)[None], cfg_of(case))[0].double()
    want = reference(Z, case["T"], case.get("top_k"), case.get("top_p"), case.get("min_p"))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_samples_follow_the_filtered_softmax(case: dict) -> None:
    """Chi-square goodness of fit of 20,000 draws (fixed seeds) to the filtered softmax."""
    N = 20_000
    z = next_token_logits(torch.tensor(Z, dtype=torch.float32)[None], cfg_of(case))
    u = uniforms(torch.arange(1000, 1000 + N), torch.zeros(N, dtype=torch.long))
    ids = draw(z.expand(N, -1), u)
    observed = np.bincount(ids.numpy(), minlength=len(Z))
    want = reference(Z, case["T"], case.get("top_k"), case.get("top_p"), case.get("min_p"))
    assert observed[want == 0].sum() == 0  # filtered tokens never appear
    live = want > 0
    chi2 = stats.chisquare(observed[live], N * want[live])
    assert chi2.pvalue > 1e-3, (observed, N * want)
    # and the test has power: the unfiltered softmax(z) is rejected when a filter is active
    plain = reference(Z, 1.0)
    if not np.allclose(plain, want):
        assert stats.chisquare(observed, N * plain).pvalue < 1e-6


def test_penalties_match_the_reference() -> None:
    counts = np.array([0, 2, 1, 0, 3, 0, 1, 0, 0, 5])
    cfg = SamplingConfig(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.4)
    got = probabilities(
        torch.tensor(Z, dtype=torch.float32)[None], cfg, torch.tensor(counts)[None]
    )[0]
    want = reference(Z, 0.8, counts=counts, rep=1.3, freq=0.4)
    np.testing.assert_allclose(got.double().numpy(), want, atol=1e-6)


def test_temperature_zero_is_greedy_and_small_temperature_approaches_it() -> None:
    z = torch.tensor(Z, dtype=torch.float32)[None]
    greedy = probabilities(z, SamplingConfig(temperature=0))[0]
    assert greedy.tolist() == [float(i == int(np.argmax(Z))) for i in range(len(Z))]
    cold = probabilities(z, SamplingConfig(temperature=0.01))[0]
    assert cold[int(np.argmax(Z))] > 1 - 1e-6


@given(
    z=st.lists(st.floats(-20, 20), min_size=2, max_size=40),
    p=st.floats(0.01, 1.0),
)
def test_top_p_keeps_the_smallest_sufficient_prefix(z: list[float], p: float) -> None:
    logits = torch.tensor(z, dtype=torch.float64)[None]
    kept = torch.isfinite(next_token_logits(logits, SamplingConfig(top_p=p)))[0]
    probs = torch.softmax(logits, -1)[0]
    assert kept.any()
    # every kept token is at least as likely as every dropped one (up to float32 rounding)
    if (~kept).any():
        assert probs[kept].min() >= probs[~kept].max() - 1e-6
    # the kept mass reaches p (up to rounding), and dropping the least likely kept token
    # would not (the prefix is the shortest)
    mass = float(probs[kept].sum())
    assert mass >= p - 1e-6 or bool(kept.all())
    smallest = float(probs[kept].min())
    assert mass - smallest < p + 1e-6


@given(z=st.lists(st.floats(-20, 20), min_size=1, max_size=40), k=st.integers(1, 50))
def test_top_k_keeps_k_unless_ties(z: list[float], k: int) -> None:
    logits = torch.tensor(z)[None]
    kept = torch.isfinite(next_token_logits(logits, SamplingConfig(top_k=k)))[0]
    n = int(kept.sum())
    assert n >= min(k, len(z))
    if len(set(logits[0].tolist())) == len(z):  # distinct in float32: no ties
        assert n == min(k, len(z))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_k", 0),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("min_p", -0.5),
        ("repetition_penalty", 0.0),
        ("frequency_penalty", math.inf),
        ("presence_penalty", math.nan),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {3: math.inf}),
        ("logit_bias", {"a": 1.0}),
    ],
)
def test_bad_values_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        SamplingConfig(**{field: value})
