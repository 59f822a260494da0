"""The SAE's side of ``glassgpt sae train`` (the loop is glassgpt.features.training's): the
site its batches are read from, the scales that normalise them, its loss and measurements."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from glassgpt.features.metrics import evaluate, measure
from glassgpt.features.sae import CONFIG_FILE, SAE, BatchTopK, SAEConfig
from glassgpt.features.sites import Site
from glassgpt.features.training import fit_scale, geometric_median, unit_scale, update_threshold


class SAEFit:
    """An SAE (or a per-layer transcoder) as the trainer fits it: the site its batches are
    read from, the scales x ← s x, y ← s_y y, its loss and its measurements."""

    folder, config_file = "sae", CONFIG_FILE

    def __init__(self, cfg: SAEConfig, *, seed: int, device: torch.device) -> None:
        self.cfg = cfg
        self.site = Site(cfg.hook, cfg.d_in, cfg.out_hook, cfg.d_out)
        self.module = SAE(cfg, seed=seed).to(device).train()
        self.n_latents = cfg.d_sae
        self.scale_x, self.scale_y = 1.0, 1.0  # x ← s x so that E‖s x‖² = d (set at init)

    def init(self, x: torch.Tensor, y: torch.Tensor | None, iters: int) -> None:
        """The scales; b_dec ← the geometric median of the sample's targets; then W_enc ← s
        W_enc (:func:`fit_scale`, exact for topk and relu, whose ŷ − b_dec is linear in s while
        b_enc = 0): unit-norm directions otherwise overshoot at first."""
        self.scale_x = unit_scale(x)
        self.scale_y = unit_scale(y) if y is not None else self.scale_x
        x, y = self.scaled(x, y)
        target = y if y is not None else x
        sae = self.module
        with torch.no_grad():
            sae.b_dec.copy_(geometric_median(target, iters))
            was = sae.training
            sae.eval()
            y_hat = sae(x)[0] - sae.b_dec
            sae.train(was)
            sae.W_enc.mul_(fit_scale(target - sae.b_dec, y_hat))

    def scaled(
        self, x: torch.Tensor, y: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x * self.scale_x, (y * self.scale_y if y is not None else None)

    def scales(self) -> dict[str, Any]:
        return {"scale_x": self.scale_x, "scale_y": self.scale_y}

    def load_scales(self, state: Mapping[str, Any]) -> None:
        self.scale_x, self.scale_y = float(state["scale_x"]), float(state["scale_y"])

    def terms(self, x: torch.Tensor, y: torch.Tensor | None, dead: torch.Tensor) -> dict[str, Any]:
        """The loss's terms (``mse``, ``sparsity``, ``aux``), the codes ``acts`` [b, latents],
        the reconstruction ``y_hat`` of ``target``."""
        terms = self.module.loss(x, y, dead=dead)
        if isinstance(self.module, BatchTopK):  # θ for evaluation: the trainer's running mean
            update_threshold(self.module, terms["least"])
        return {**terms, "y_hat": terms["x_hat"], "target": x if y is None else y}

    def after_backward(self) -> None:
        self.module.remove_parallel_grad()

    def after_step(self) -> None:
        self.module.normalize_decoder()

    def stats(self, terms: Mapping[str, Any]) -> dict[str, Any]:
        """What the log sums over a batch: its FVU."""
        target = terms["target"]
        var = (target - target.mean(0)).pow(2).sum()
        err = (target - terms["y_hat"]).pow(2).sum()
        return {"fvu": float(err / var) if var > 0 else 0.0}

    def record(self, sums: Mapping[str, Any], n: int, tokens: int) -> dict[str, Any]:
        """The log's fields beyond the shared ones (none for an SAE)."""
        return {}

    def raw(self) -> SAE:
        """The SAE on the model's own activations (the normalising scales folded in)."""
        return self.module.rescaled(self.scale_x, self.scale_y)

    def evaluate(self, model: Any, batches: Any, *, dense: float) -> dict[str, Any]:
        return evaluate(model, self.raw(), batches, dense=dense)

    def measure(self, model: Any, stream: Any, **kw: Any) -> dict[str, Any]:
        return measure(model, self.raw(), stream, **kw)

    def save(self, folder: Path, extra: dict[str, Any]) -> Path:
        return self.raw().save(folder, extra=extra)
