"""The cross-layer transcoder's side of ``glassgpt sae train --arch clt`` (the loop is
glassgpt.features.training's): every layer's MLP input and output read in one forward pass,
their per-layer scales, the CLT's loss and its measurements.

    batch      u [b, L, d_model] (blocks.l.mlp.in), y [b, L, d_model] (blocks.l.mlp_out)
    scales     u_l ← s_l u_l, y_l ← t_l y_l with E‖s_l u_l‖² = E‖t_l y_l‖² = d_model: every
               layer weighs alike in the summed loss; folded into the saved CLT (CLT.rescaled)
    FVU_l      Σ‖y_l − ŷ_l‖² / Σ‖y_l − ȳ_l‖²;  FVU = Σ_l (numerator) / Σ_l (denominator)
    L0_l       active features of layer l per token;  L0 = Σ_l L0_l
    CE loss recovered  (L_zero − L_clt) / (L_zero − L_clean): every MLP output replaced by the
               CLT's prediction at once (the features of layer l read the spliced model's
               u_l), against every MLP output zeroed
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.clt import CONFIG_FILE as CLT_FILE
from glassgpt.features.metrics import DENSE, measure, recovered
from glassgpt.features.sites import mlp_input, mlp_source
from glassgpt.features.training import fit_scale, geometric_median, unit_scale
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn


class _Enough(Exception):
    """Raised at the last MLP output: the unembedding is not needed."""


def check_clt(clt: CLT, model: GPT) -> None:
    """One line naming both shapes when the CLT does not read this model."""
    cfg, m = clt.cfg, model.config
    if m.attn_only:
        raise GlassError("this model is attention-only: it has no MLP for a CLT to replace")
    if (cfg.n_layers, cfg.d_model) != (m.n_layers, m.d_model):
        raise GlassError(
            f"the CLT reads {cfg.n_layers} layers of d_model={cfg.d_model}, but this model has "
            f"{m.n_layers} layers of d_model={m.d_model}"
        )


@torch.no_grad()
def read_layers(model: GPT, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(u, y) [B, T, L, d_model]: every layer's MLP input and output on ``tokens``."""
    L = model.config.n_layers
    got: dict[str, Tensor] = {}
    last = f"blocks.{L - 1}.mlp_out"

    def keep(t: Tensor, name: str) -> None:
        got[name] = t
        if name == last:
            raise _Enough

    hooks: dict[str, HookFn] = {}
    for l in range(L):
        hooks[mlp_source(model, l)] = keep
        hooks[f"blocks.{l}.mlp_out"] = keep
    try:
        with model.hooks(hooks):
            model(tokens)
    except _Enough:
        pass
    u = torch.stack([mlp_input(model, l, got[mlp_source(model, l)]) for l in range(L)], -2)
    y = torch.stack([got[f"blocks.{l}.mlp_out"] for l in range(L)], -2)
    return u, y


def splice_hooks(model: GPT, clt: CLT) -> dict[str, HookFn]:
    """{name: hook} that put the CLT's prediction in place of every MLP output: layer l's
    features encode the spliced model's own u_l, and ŷ_l sums the writes of layers ≤ l."""
    check_clt(clt, model)
    acts: dict[int, Tensor] = {}
    layer_of = {mlp_source(model, l): l for l in range(clt.cfg.n_layers)}

    def encode(t: Tensor, name: str) -> None:
        l = layer_of[name]
        acts[l] = clt.encode(mlp_input(model, l, t), l)

    def predict(t: Tensor, name: str) -> Tensor:
        l = int(name.split(".")[1])
        y = clt.b_dec[l] + sum(acts[s] @ clt.decoder(s, l) for s in range(l + 1))
        return y.reshape(t.shape).to(t.dtype)

    hooks: dict[str, HookFn] = dict.fromkeys(layer_of, encode)
    hooks.update({f"blocks.{l}.mlp_out": predict for l in range(clt.cfg.n_layers)})
    return hooks


@torch.no_grad()
def evaluate_clt(
    model: GPT, clt: CLT, batches: Iterable[tuple[Tensor, Tensor]], *, dense: float = DENSE
) -> dict[str, Any]:
    """The metrics of the module docstring over token batches (x, y) [B, T]: ``l0``,
    ``l0_layers``, ``fvu``, ``fvu_layers``, ``mse``, ``ce_clean``, ``ce_sae`` (the CLT's),
    ``ce_zero``, ``ce_recovered``, ``dead_fraction``, ``dense_fraction``, ``tokens``."""
    check_clt(clt, model)
    was = clt.training
    clt.eval()
    L, S = clt.cfg.n_layers, clt.cfg.d_sae
    fires = torch.zeros(L, S, dtype=torch.float64)
    err, sum_y2 = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64)
    sum_y = torch.zeros(L, clt.cfg.d_model, dtype=torch.float64)
    ce = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0}
    n = 0
    zero = {f"blocks.{l}.mlp_out": lambda t, _n: torch.zeros_like(t) for l in range(L)}
    try:
        for x, targets in batches:
            u, y = read_layers(model, x)
            u, y = u.flatten(0, 1), y.flatten(0, 1).double()  # [N, L, d]
            y_hat, acts = clt(u)
            fires += (acts != 0).sum(0).double().cpu()
            err += (y - y_hat.double()).pow(2).sum((0, 2)).cpu()
            sum_y += y.sum(0).cpu()
            sum_y2 += y.pow(2).sum((0, 2)).cpu()
            m = u.shape[0]
            ce["ce_clean"] += float(model(x, targets=targets)[1]) * m
            with model.hooks(splice_hooks(model, clt)):
                ce["ce_sae"] += float(model(x, targets=targets)[1]) * m
            with model.hooks(zero):
                ce["ce_zero"] += float(model(x, targets=targets)[1]) * m
            n += m
    finally:
        clt.train(was)
    if n == 0:
        raise GlassError("no tokens to evaluate the CLT on")
    var = sum_y2 - sum_y.pow(2).sum(-1) / n  # Σ‖y_l − ȳ_l‖² per layer
    density = fires / n
    out: dict[str, Any] = {key: value / n for key, value in ce.items()}
    out.update(
        l0=float(fires.sum()) / n,
        l0_layers=(fires.sum(-1) / n).tolist(),
        fvu=float(err.sum() / var.sum()) if var.sum() > 0 else float("nan"),
        fvu_layers=[float(e / v) if v > 0 else float("nan") for e, v in zip(err, var)],
        mse=float(err.sum()) / n,
        ce_recovered=recovered(out["ce_clean"], out["ce_sae"], out["ce_zero"]),
        dead_fraction=float((density == 0).double().mean()),
        dense_fraction=float((density > dense).double().mean()),
        tokens=n,
    )
    return out


class CLTFit:
    """A CLT as the trainer fits it (the module docstring; the interface of
    glassgpt.features.sae_fit's SAEFit)."""

    folder, config_file = "clt", CLT_FILE

    def __init__(self, cfg: CLTConfig, *, seed: int, device: torch.device) -> None:
        self.cfg = cfg
        self.site = read_layers
        self.module = CLT(cfg, seed=seed).to(device).train()
        self.n_latents = cfg.n_layers * cfg.d_sae
        self.scale_x = [1.0] * cfg.n_layers
        self.scale_y = [1.0] * cfg.n_layers

    def init(self, x: Tensor, y: Tensor | None, iters: int) -> None:
        """The per-layer scales; b_dec[l] ← the geometric median of the sample's y_l; W_enc ←
        s W_enc with s the scale that fits the first predictions best (sae_fit's SAEFit)."""
        assert y is not None
        L = self.cfg.n_layers
        self.scale_x = [unit_scale(x[:, l]) for l in range(L)]
        self.scale_y = [unit_scale(y[:, l]) for l in range(L)]
        x, y = self.scaled(x, y)
        assert y is not None
        clt = self.module
        with torch.no_grad():
            for l in range(L):
                clt.b_dec[l].copy_(geometric_median(y[:, l], iters))
            was = clt.training
            clt.eval()
            y_hat = clt(x)[0] - clt.b_dec
            clt.train(was)
            clt.W_enc.mul_(fit_scale(y - clt.b_dec, y_hat))

    def scaled(self, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
        sx = torch.tensor(self.scale_x, dtype=x.dtype, device=x.device)[:, None]
        sy = torch.tensor(self.scale_y, dtype=x.dtype, device=x.device)[:, None]
        return x * sx, (y * sy if y is not None else None)

    def scales(self) -> dict[str, Any]:
        return {"scale_x": self.scale_x, "scale_y": self.scale_y}

    def load_scales(self, state: Mapping[str, Any]) -> None:
        self.scale_x = [float(v) for v in state["scale_x"]]
        self.scale_y = [float(v) for v in state["scale_y"]]

    def terms(self, x: Tensor, y: Tensor | None, dead: Tensor) -> dict[str, Any]:
        assert y is not None
        out = self.module.loss(x, y)
        return {**out, "aux": out["mse"].new_zeros(()), "acts": out["acts"].flatten(-2),
                "layer_acts": out["acts"], "target": y}  # fmt: skip

    def after_backward(self) -> None:
        """Nothing: a CLT's decoders are free (the tanh penalty reads their norms)."""

    def after_step(self) -> None:
        """Nothing (as :meth:`after_backward`)."""

    def stats(self, terms: Mapping[str, Any]) -> dict[str, Any]:
        """A batch's FVU (all layers pooled), per-layer FVU and per-layer active features."""
        y, y_hat = terms["target"], terms["y_hat"].detach()
        err = (y - y_hat).pow(2).sum((0, 2))
        var = (y - y.mean(0)).pow(2).sum((0, 2))
        fvu = [float(e / v) if v > 0 else 0.0 for e, v in zip(err, var)]
        nonzero = (terms["layer_acts"] != 0).sum((0, 2)).double().tolist()
        total = float(err.sum() / var.sum()) if var.sum() > 0 else 0.0
        return {"fvu": total, "fvu_layers": fvu, "nonzero_layers": nonzero}

    def record(self, sums: Mapping[str, Any], n: int, tokens: int) -> dict[str, Any]:
        L = self.cfg.n_layers
        return {"fvu_layers": [v / n for v in sums.get("fvu_layers") or [0.0] * L],
                "l0_layers": [v / tokens for v in sums.get("nonzero_layers") or [0.0] * L]}  # fmt: skip

    def raw(self) -> CLT:
        """The CLT on the model's own activations (the per-layer scales folded in)."""
        return self.module.rescaled(torch.tensor(self.scale_x), torch.tensor(self.scale_y))

    def evaluate(self, model: GPT, batches: Any, *, dense: float) -> dict[str, Any]:
        return evaluate_clt(model, self.raw(), batches, dense=dense)

    def measure(self, model: GPT, stream: Any, **kw: Any) -> dict[str, Any]:
        return measure(model, self.raw(), stream, how=evaluate_clt, **kw)

    def save(self, folder: Path, extra: dict[str, Any]) -> Path:
        return self.raw().save(folder, extra=extra)
