"""From a sweep's results to a fitted law, held-out errors, predictions and plots.

Held-out validation: the runs with the ``holdout`` largest values of N are left out of the
fit and predicted from the law fitted on the rest; the relative error
(L̂ − L) / L of each is reported. That is the test a law must pass to be used before training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from matplotlib.figure import Figure

from glassgpt.errors import GlassError
from glassgpt.model.accounting import count_parameters
from glassgpt.scaling.compute import training_flops
from glassgpt.scaling.law import ScalingLaw, fit_scaling_law
from glassgpt.storage import atomic_write
from glassgpt.train.config import load_run_config

NKind = Literal["non_embedding", "total"]


@dataclass(frozen=True)
class FitReport:
    law: ScalingLaw
    n_kind: str
    fitted: list[dict[str, Any]]  # runs used in the fit, each with "pred"
    held_out: list[dict[str, Any]]  # runs predicted before seeing them, each with "pred", "rel_err"

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law.to_dict(),
            "n_kind": self.n_kind,
            "fitted": self.fitted,
            "held_out": self.held_out,
        }

    def summary(self, level: float = 0.9) -> str:
        law = self.law
        lines = [
            f"L(N, D) = E + A/N^alpha + B/D^beta  (N = {self.n_kind} parameters, "
            f"{len(self.fitted)} runs fitted)"
        ]
        cis = law.param_intervals(level) if law.samples is not None else {}
        for name in ("E", "A", "B", "alpha", "beta"):
            ci = cis.get(name)
            tail = f"   [{ci[0]:.4g}, {ci[1]:.4g}] ({level:.0%} bootstrap)" if ci else ""
            lines.append(f"  {name:5s} = {getattr(law, name):.4g}{tail}")
        for r in self.held_out:
            lines.append(
                f"  held out {r['name']}: predicted {r['pred']:.4f}, actual {r['val_loss']:.4f}, "
                f"error {100 * r['rel_err']:+.2f}%"
            )
        if self.held_out:
            mean = float(np.mean([abs(r["rel_err"]) for r in self.held_out]))
            lines.append(f"  mean |error| on held-out runs: {100 * mean:.2f}%")
        return "\n".join(lines)


def _n(result: dict[str, Any], n_kind: str) -> float:
    return float(result["n_params_non_embedding" if n_kind == "non_embedding" else "n_params"])


def fit_results(
    results: Sequence[dict[str, Any]],
    *,
    n_kind: NKind = "non_embedding",
    holdout: int = 0,
    bootstrap: int = 200,
    seed: int = 0,
) -> FitReport:
    """Fit L(N, D) to sweep results, leaving out the runs of the ``holdout`` largest N values."""
    if n_kind not in ("non_embedding", "total"):
        raise GlassError(f"n_kind must be non_embedding or total, got {n_kind!r}")
    rows = [dict(r, config=None) for r in results if r.get("val_loss") is not None]
    sizes = sorted({_n(r, n_kind) for r in rows})
    if holdout < 0 or holdout >= len(sizes):
        raise GlassError(
            f"--holdout {holdout}: the sweep has {len(sizes)} distinct model sizes; hold out "
            "fewer than that"
        )
    cut = sizes[-holdout] if holdout else np.inf
    fit_rows = [r for r in rows if _n(r, n_kind) < cut]
    test_rows = [r for r in rows if _n(r, n_kind) >= cut]
    law = fit_scaling_law(
        [_n(r, n_kind) for r in fit_rows],
        [r["tokens"] for r in fit_rows],
        [r["val_loss"] for r in fit_rows],
        bootstrap=bootstrap,
        seed=seed,
    )
    for r in (*fit_rows, *test_rows):
        r["pred"] = float(law.predict(_n(r, n_kind), r["tokens"]))
        r["rel_err"] = (r["pred"] - r["val_loss"]) / r["val_loss"]
    return FitReport(law, n_kind, fit_rows, test_rows)


def save_report(report: FitReport, out: str | Path) -> Path:
    path = Path(out) / "law.json"
    atomic_write(path, json.dumps(report.to_dict(), indent=1).encode("utf-8"))
    return path


def load_law(path: str | Path) -> tuple[ScalingLaw, str]:
    """(law, n_kind) from a ``law.json`` written by ``glassgpt scaling fit`` (file or folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "law.json"
    if not p.is_file():
        raise GlassError(f"no fitted law at {p}; run `glassgpt scaling fit DIR` first")
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GlassError(f"{p}: unreadable law file ({e})") from None
    return ScalingLaw.from_dict(data.get("law", {})), str(data.get("n_kind", "non_embedding"))


def plot_report(report: FitReport, out: str | Path) -> list[Path]:
    """loss_vs_n.png (per D, with the law), loss_vs_flops.png (with the frontier), residuals.png."""
    out = Path(out)
    law, rows = report.law, [*report.fitted, *report.held_out]
    paths = []
    n_all = np.array([_n(r, report.n_kind) for r in rows])
    d_all = np.array([r["tokens"] for r in rows], float)
    loss = np.array([r["val_loss"] for r in rows])
    held = np.array([r in report.held_out for r in rows])

    fig = Figure(figsize=(6, 4))  # no pyplot: no global state
    ax = fig.subplots()
    grid_n = np.geomspace(n_all.min() / 1.5, n_all.max() * 1.5, 100)
    for i, d in enumerate(sorted(set(d_all))):
        sel = d_all == d
        color = f"C{i % 10}"
        ax.scatter(n_all[sel & ~held], loss[sel & ~held], color=color, label=f"D = {d:.3g}")
        ax.scatter(n_all[sel & held], loss[sel & held], color=color, marker="*", s=120)
        ax.plot(grid_n, law.predict(grid_n, d), color=color, lw=1)
    ax.set(xscale="log", xlabel=f"N ({report.n_kind} parameters)", ylabel="validation loss")
    ax.set_title("loss vs N (stars: held out, predicted by the fit)")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "loss_vs_n.png"))

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    flops = training_flops(n_all, d_all)
    ax.scatter(flops[~held], loss[~held], label="fitted runs")
    ax.scatter(flops[held], loss[held], marker="*", s=120, label="held out")
    grid_c = np.geomspace(flops.min() / 2, flops.max() * 4, 100)
    n_opt, d_opt = law.compute_optimal(grid_c)
    ax.plot(grid_c, law.predict(n_opt, d_opt), "k-", lw=1, label="compute-optimal frontier")
    ax.set(xscale="log", xlabel="training FLOPs ≈ 6ND", ylabel="validation loss")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "loss_vs_flops.png"))

    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    rel = np.array([r["rel_err"] for r in rows]) * 100
    ax.axhline(0, color="k", lw=0.5)
    ax.scatter(flops[~held], rel[~held], label="fitted runs")
    ax.scatter(flops[held], rel[held], marker="*", s=120, label="held out")
    ax.set(xscale="log", xlabel="training FLOPs", ylabel="(L̂ − L)/L, %")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "residuals.png"))
    return paths


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # Agg, chosen by the file type
    return path


def predict_for_config(
    law_path: str | Path,
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    tokens: float | None = None,
    flops: float | None = None,
    level: float = 0.9,
) -> str:
    """The predicted validation loss of a run config before training it, as printable lines."""
    law, n_kind = load_law(law_path)
    cfg = load_run_config(preset=preset, config_file=config_file, overrides=overrides)
    n = count_parameters(cfg.model, non_embedding=n_kind == "non_embedding")
    if tokens is None:
        seq_len = cfg.train.seq_len or cfg.model.n_ctx
        tokens = float(cfg.train.max_steps * cfg.train.batch_size * seq_len)
    if tokens <= 0:
        raise GlassError(f"--tokens must be positive, got {tokens:g}")
    mid = float(law.predict(n, tokens))
    line = f"predicted val loss {mid:.4f} for N = {n:,} ({n_kind}), D = {tokens:,.0f} tokens"
    if law.samples is not None and len(law.samples) > 1:
        lo, hi = law.interval(n, tokens, level)
        line += f"; {level:.0%} interval [{float(lo):.4f}, {float(hi):.4f}]"
    lines = [line]
    if flops is not None:
        n_opt, d_opt = law.compute_optimal(flops)
        lines.append(
            f"compute-optimal for C = {flops:.3g} FLOPs: N = {float(n_opt):,.0f}, "
            f"D = {float(d_opt):,.0f}, loss {float(law.predict(n_opt, d_opt)):.4f}"
        )
    return "\n".join(lines)
