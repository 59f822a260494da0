from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from glassgpt.errors import GlassError
from glassgpt.scaling import ScalingLaw, fit_scaling_law, predict_loss

TRUE = ScalingLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)  # Chinchilla's fit


def grid_runs(law: ScalingLaw, noise: float, seed: int = 0):
    n, d = np.meshgrid(np.logspace(6, 10, 7), np.logspace(8, 12, 7))
    n, d = n.ravel(), d.ravel()
    rng = np.random.default_rng(seed)
    loss = law.predict(n, d) * np.exp(noise * rng.standard_normal(n.shape))
    return n, d, loss


def test_recovers_known_parameters_without_noise() -> None:
    n, d, loss = grid_runs(TRUE, noise=0.0)
    law = fit_scaling_law(n, d, loss)
    np.testing.assert_allclose(law.params, TRUE.params, rtol=2e-3)


def test_recovers_known_parameters_with_noise_and_intervals_cover_truth() -> None:
    n, d, loss = grid_runs(TRUE, noise=0.003, seed=1)
    law = fit_scaling_law(n, d, loss, bootstrap=40, seed=0)
    assert pytest.approx(TRUE.E, rel=0.03) == law.E
    assert law.alpha == pytest.approx(TRUE.alpha, rel=0.1)
    assert law.beta == pytest.approx(TRUE.beta, rel=0.1)
    # Prediction far beyond the data: within 2 %.
    far = (3e10, 3e12)
    mid, lo, hi = predict_loss(law, *far)
    assert float(mid) == pytest.approx(float(TRUE.predict(*far)), rel=0.02)
    assert lo is not None and hi is not None and lo <= mid <= hi
    for name, (a, b) in law.param_intervals(0.99).items():
        assert a <= getattr(law, name) <= b, name


def test_compute_optimal_matches_numeric_minimum() -> None:
    for flops in (1e18, 1e21, 1e24):
        n_opt, d_opt = TRUE.compute_optimal(flops)
        assert 6 * n_opt * d_opt == pytest.approx(flops, rel=1e-9)
        res = minimize_scalar(
            lambda log_n, c=flops: float(TRUE.predict(np.exp(log_n), c / (6 * np.exp(log_n)))),
            bounds=(np.log(1e3), np.log(1e15)),
            method="bounded",
            options={"xatol": 1e-10},
        )
        assert float(np.log(n_opt)) == pytest.approx(res.x, abs=1e-3)


def test_round_trip_and_errors() -> None:
    n, d, loss = grid_runs(TRUE, noise=0.0)
    law = fit_scaling_law(n[:12], d[:12], loss[:12], bootstrap=3)
    again = ScalingLaw.from_dict(law.to_dict())
    np.testing.assert_array_equal(again.params, law.params)
    np.testing.assert_array_equal(again.samples, law.samples)
    with pytest.raises(GlassError, match="need at least 5"):
        fit_scaling_law([1e6] * 4, [1e9] * 4, [3.0] * 4)
    with pytest.raises(GlassError, match="finite loss"):
        fit_scaling_law([1e6] * 5, [1e9] * 5, [3.0, 3.0, np.nan, 3.0, 3.0])
    with pytest.raises(GlassError, match="no bootstrap"):
        TRUE.interval(1e6, 1e9)
    with pytest.raises(GlassError, match="not a scaling-law"):
        ScalingLaw.from_dict({"E": 1.0})
