"""The scaling law L(N, D) = E + A / N^α + B / D^β, fitted from training runs.

N is the parameter count, D the number of training tokens, L the loss in nats per token.
Fitting follows the Chinchilla paper's third approach: with A = e^a, B = e^b, E = e^e,

    log L̂(N, D) = LSE(a − α log N, b − β log D, e),

minimise Σ_i Huber_δ(log L̂(N_i, D_i) − log L_i) with L-BFGS from the best points of a grid of
starting values and keep the best optimum. Confidence intervals come from refitting on bootstrap resamples of the
runs. For a compute budget C ≈ 6 N D (:mod:`~glassgpt.scaling.compute`), the loss-optimal
allocation is

    N_opt(C) = G (C/6)^(β/(α+β)),   D_opt(C) = G⁻¹ (C/6)^(α/(α+β)),   G = (αA / (βB))^(1/(α+β)).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax

from glassgpt.errors import GlassError
from glassgpt.scaling.compute import FLOPS_PER_PARAM_TOKEN

PARAMS = ("E", "A", "B", "alpha", "beta")
MIN_RUNS = 5  # five free parameters


@dataclass(frozen=True)
class ScalingLaw:
    """A fitted L(N, D) = E + A/N^α + B/D^β, with bootstrap samples of (E, A, B, α, β).

    >>> law = ScalingLaw(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)
    >>> round(float(law.predict(1e9, 2e10)), 3)
    2.584
    """

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    samples: NDArray[np.float64] | None = field(default=None, repr=False, compare=False)
    huber_delta: float = 1e-3

    def predict(self, n_params: ArrayLike, n_tokens: ArrayLike) -> NDArray[np.float64]:
        """L(N, D) for arrays (or scalars) N and D."""
        return _law(self.params, np.asarray(n_params, float), np.asarray(n_tokens, float))

    @property
    def params(self) -> NDArray[np.float64]:
        return np.array([self.E, self.A, self.B, self.alpha, self.beta])

    def interval(
        self, n_params: ArrayLike, n_tokens: ArrayLike, level: float = 0.9
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The central ``level`` interval of L(N, D) over the bootstrap fits."""
        if self.samples is None or len(self.samples) < 2:
            raise GlassError("this scaling law has no bootstrap samples; fit with bootstrap > 1")
        n = np.asarray(n_params, float)
        d = np.asarray(n_tokens, float)
        preds = np.stack([_law(p, n, d) for p in self.samples])
        lo, hi = np.quantile(preds, [(1 - level) / 2, (1 + level) / 2], axis=0)
        return lo, hi

    def param_intervals(self, level: float = 0.9) -> dict[str, tuple[float, float]]:
        """The central ``level`` bootstrap interval of each of E, A, B, α, β."""
        if self.samples is None or len(self.samples) < 2:
            raise GlassError("this scaling law has no bootstrap samples; fit with bootstrap > 1")
        q = np.quantile(self.samples, [(1 - level) / 2, (1 + level) / 2], axis=0)
        return {name: (float(q[0, i]), float(q[1, i])) for i, name in enumerate(PARAMS)}

    def compute_optimal(self, flops: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(N_opt, D_opt) minimising L(N, D) subject to 6 N D = C.

        >>> law = ScalingLaw(E=1.0, A=1.0, B=1.0, alpha=0.5, beta=0.5)
        >>> [float(x) for x in law.compute_optimal(6e8)]
        [10000.0, 10000.0]
        """
        c6 = np.asarray(flops, float) / FLOPS_PER_PARAM_TOKEN
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1.0 / (a + b))
        return g * c6 ** (b / (a + b)), c6 ** (a / (a + b)) / g

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: float(v) for name, v in zip(PARAMS, self.params)}
        out["huber_delta"] = self.huber_delta
        if self.samples is not None:
            out["samples"] = self.samples.tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalingLaw:
        try:
            samples = data.get("samples")
            return cls(
                **{name: float(data[name]) for name in PARAMS},
                samples=None if samples is None else np.asarray(samples, float),
                huber_delta=float(data.get("huber_delta", 1e-3)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise GlassError(f"not a scaling-law record: {e}") from None


def _law(p: NDArray[np.float64], n: NDArray[np.float64], d: NDArray[np.float64]) -> Any:
    e, a, b, alpha, beta = p
    return e + a / n**alpha + b / d**beta


def _objective(
    theta: NDArray[np.float64],
    log_n: NDArray[np.float64],
    log_d: NDArray[np.float64],
    log_l: NDArray[np.float64],
    delta: float,
) -> tuple[float, NDArray[np.float64]]:
    """Σ Huber_δ(LSE(a − α log N, b − β log D, e) − log L) and its gradient in θ = (a, b, e, α, β)."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # [3, R]
    r = logsumexp(terms, axis=0) - log_l  # [R]
    small = np.abs(r) <= delta
    loss = np.where(small, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta)).sum()
    dr = np.where(small, r, delta * np.sign(r))  # dHuber/dr
    w = softmax(terms, axis=0) * dr  # d(LSE)/d(term) · dHuber/dr
    grad = np.array(
        [w[0].sum(), w[1].sum(), w[2].sum(), -(w[0] * log_n).sum(), -(w[1] * log_d).sum()]
    )
    return float(loss), grad


def _fit_once(
    log_n: NDArray[np.float64],
    log_d: NDArray[np.float64],
    log_l: NDArray[np.float64],
    inits: Sequence[Sequence[float]],
    delta: float,
    n_starts: int = 16,
) -> NDArray[np.float64]:
    best_val, best = np.inf, None
    bounds = [(None, None), (None, None), (None, None), (0.0, 3.0), (0.0, 3.0)]
    if len(inits) > n_starts:  # run L-BFGS from the best grid points only
        values = [_objective(np.asarray(x, float), log_n, log_d, log_l, delta)[0] for x in inits]
        inits = [inits[i] for i in np.argsort(values)[:n_starts]]
    for init in inits:
        res = minimize(
            _objective,
            np.asarray(init, float),
            args=(log_n, log_d, log_l, delta),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
        )
        if np.isfinite(res.fun) and res.fun < best_val:
            best_val, best = res.fun, res.x
    assert best is not None  # inits is non-empty and the objective is finite
    a, b, e, alpha, beta = best
    return np.array([np.exp(e), np.exp(a), np.exp(b), alpha, beta])


def default_inits() -> list[tuple[float, float, float, float, float]]:
    """The grid of starting points (a, b, e, α, β), as in the Chinchilla fit."""
    grid = itertools.product(
        (0.0, 5.0, 10.0, 20.0),  # a = log A
        (0.0, 5.0, 10.0, 20.0),  # b = log B
        (-1.0, 0.0, 1.0),  # e = log E
        (0.1, 0.5, 1.0),  # α
        (0.1, 0.5, 1.0),  # β
    )
    return list(grid)


def fit_scaling_law(
    n_params: ArrayLike,
    n_tokens: ArrayLike,
    losses: ArrayLike,
    *,
    bootstrap: int = 0,
    huber_delta: float = 1e-3,
    seed: int = 0,
    inits: Sequence[Sequence[float]] | None = None,
) -> ScalingLaw:
    """Fit L(N, D) = E + A/N^α + B/D^β to runs (N_i, D_i, L_i); ``bootstrap`` resamples give CIs.

    Needs at least 5 runs (one per free parameter), all with N, D > 0 and finite L > 0.
    """
    n = np.asarray(n_params, float).ravel()
    d = np.asarray(n_tokens, float).ravel()
    loss = np.asarray(losses, float).ravel()
    if not (len(n) == len(d) == len(loss)):
        raise GlassError("n_params, n_tokens and losses must have the same length")
    if len(n) < MIN_RUNS:
        raise GlassError(
            f"too few runs to fit L(N, D): got {len(n)}, need at least {MIN_RUNS} "
            "(five free parameters E, A, B, alpha, beta); more runs at several N and D help"
        )
    if np.any(n <= 0) or np.any(d <= 0) or not np.all(np.isfinite(loss)) or np.any(loss <= 0):
        raise GlassError("every run needs N > 0, D > 0 and a finite loss > 0")
    grid = list(inits) if inits is not None else default_inits()
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
    best = _fit_once(log_n, log_d, log_l, grid, huber_delta)
    samples = None
    if bootstrap > 1:
        rng = np.random.default_rng(seed)
        # Start each resample's fit from the full-data optimum plus a small grid around it.
        e0, a0, b0, al0, be0 = best
        start = [np.log(a0), np.log(b0), np.log(e0), al0, be0]
        local = [start, [start[0] + 2, start[1] + 2, start[2], al0 * 1.3, be0 * 1.3]]
        fits = []
        for _ in range(bootstrap):
            idx = rng.integers(0, len(n), len(n))
            fits.append(_fit_once(log_n[idx], log_d[idx], log_l[idx], local, huber_delta))
        samples = np.stack(fits)
    return ScalingLaw(*map(float, best), samples=samples, huber_delta=huber_delta)


def predict_loss(
    law: ScalingLaw, n_params: ArrayLike, n_tokens: ArrayLike, level: float = 0.9
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None, NDArray[np.float64] | None]:
    """(L̂, lower, upper): the law's prediction and, when it has bootstrap samples, an interval."""
    mid = law.predict(n_params, n_tokens)
    if law.samples is None or len(law.samples) < 2:
        return mid, None, None
    lo, hi = law.interval(n_params, n_tokens, level)
    return mid, lo, hi
