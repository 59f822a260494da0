"""glassgpt.scaling: L(N, D) = E + A/N^α + B/D^β — sweeps, fits and predictions before training."""

from glassgpt.scaling.law import ScalingLaw, fit_scaling_law, predict_loss

__all__ = ["ScalingLaw", "fit_scaling_law", "predict_loss"]
