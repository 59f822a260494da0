"""Compare a sweep's grid points across seeds: mean and standard error of a metric per point.

Runs are grouped by their overrides without ``seed`` (or by one key, ``--by``); for the n runs
of a point with metric values m₁..mₙ,

    mean = (1/n) Σ mᵢ
    SE   = s / √n,   s² = (1/(n − 1)) Σ (mᵢ − mean)²     (undefined for n = 1)

and the means of N (parameters), D (tokens) and wall time ride along. Keys that take one value
over the whole sweep are left out of the point labels. Writes ``comparison.md`` (the table)
and ``comparison.png`` (metric against the points, ±1 SE bars).

>>> rows = [{"overrides": {"a": 1, "seed": s}, "val_bpb": v, "n_params": 10, "tokens": 5,
...          "wall_s": 1.0} for s, v in enumerate([1.0, 2.0, 3.0])]
>>> (c,) = compare_results(rows, by="a").points
>>> (c.label, c.n, c.mean, round(c.se, 4))
('a=1', 3, 2.0, 0.5774)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from glassgpt.errors import GlassError
from glassgpt.scaling.sweep import load_results
from glassgpt.storage import atomic_write

METRICS = ("val_bpb", "val_loss", "best_val_loss")


@dataclass(frozen=True)
class Point:
    """One grid point: its key values, its seeds' metric values and their summary."""

    key: tuple[tuple[str, Any], ...]
    values: tuple[float, ...]
    n_params: float
    tokens: float
    wall_s: float | None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in self.key) or "(all runs)"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return _mean(self.values)

    @property
    def se(self) -> float:
        """Sample standard deviation / √n; NaN for a single run."""
        if self.n < 2:
            return math.nan
        m = self.mean
        var = math.fsum((v - m) ** 2 for v in self.values) / (self.n - 1)
        return math.sqrt(var / self.n)


@dataclass(frozen=True)
class Comparison:
    metric: str
    keys: tuple[str, ...]
    points: list[Point] = field(default_factory=list)

    def markdown(self) -> str:
        head = ["point", "n", f"{self.metric} mean", "SE", "N total", "tokens", "wall s"]
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for p in self.points:
            cells = [
                p.label,
                str(p.n),
                f"{p.mean:.4f}",
                "n/a" if math.isnan(p.se) else f"{p.se:.4f}",
                f"{p.n_params:,.0f}",
                f"{p.tokens:,.0f}",
                "" if p.wall_s is None else f"{p.wall_s:.0f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def compare_results(
    results: Sequence[dict[str, Any]], *, by: str | None = None, metric: str = "val_bpb"
) -> Comparison:
    """Group runs by grid point (every override but ``seed``, or only ``by``) and summarise."""
    if metric not in METRICS:
        raise GlassError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if not results:
        raise GlassError("no results to compare")
    for r in results:
        if not isinstance(r.get("overrides"), dict):
            raise GlassError(f"run {r.get('name', '?')}: its result records no grid overrides")
    all_keys = sorted({k for r in results for k in r["overrides"] if k != "seed"})
    if by is not None:
        if by not in all_keys:
            raise GlassError(f"unknown key {by!r}; the sweep's keys: {', '.join(all_keys)}")
        keys = [by]
    else:  # the keys that vary: a fixed override says nothing about a point
        keys = [k for k in all_keys if len({_hashable(r["overrides"].get(k)) for r in results}) > 1]
    groups: dict[tuple[tuple[str, Any], ...], list[dict[str, Any]]] = {}
    for r in results:
        value = r.get(metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise GlassError(f"run {r.get('name', '?')}: no {metric} in its result")
        key = tuple((k, _hashable(r["overrides"].get(k))) for k in keys)
        groups.setdefault(key, []).append(r)
    points = []
    for key, runs in groups.items():
        walls = [r["wall_s"] for r in runs if isinstance(r.get("wall_s"), (int, float))]
        points.append(
            Point(
                key=key,
                values=tuple(float(r[metric]) for r in runs),
                n_params=_mean([float(r.get("n_params") or 0) for r in runs]),
                tokens=_mean([float(r.get("tokens") or 0) for r in runs]),
                wall_s=_mean(walls) if walls else None,
            )
        )
    points.sort(key=lambda p: tuple(_order(v) for _, v in p.key))
    return Comparison(metric, tuple(keys), points)


def plot_comparison(comparison: Comparison, path: str | Path) -> Path:
    """The metric of each point with ±1 SE error bars (points on a categorical axis)."""
    path = Path(path)
    pts = comparison.points
    xs = range(len(pts))
    se = [0.0 if math.isnan(p.se) else p.se for p in pts]
    fig = Figure(figsize=(max(5.0, 1.1 * len(pts) + 2), 4))  # no pyplot: no global state
    ax = fig.subplots()
    ax.errorbar(xs, [p.mean for p in pts], yerr=se, fmt="o-", capsize=4)
    if len(comparison.keys) == 1:
        labels = [_fmt(p.key[0][1]) for p in pts]
        ax.set_xlabel(comparison.keys[0])
    else:
        labels = [p.label.replace(", ", "\n") for p in pts]
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel(f"{comparison.metric} (mean ± SE)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # Agg, chosen by the file type
    return path


def compare_sweep(
    sweep: str | Path, *, by: str | None = None, metric: str = "val_bpb"
) -> tuple[Comparison, Path, Path]:
    """Compare a sweep folder's finished runs; write ``comparison.md`` and ``comparison.png``."""
    sweep = Path(sweep)
    comparison = compare_results(load_results(sweep), by=by, metric=metric)
    md = sweep / "comparison.md"
    atomic_write(md, comparison.markdown().encode("utf-8"))
    return comparison, md, plot_comparison(comparison, sweep / "comparison.png")


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _order(v: Any) -> tuple[int, Any]:
    """Numbers in numeric order, before anything else in string order."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, v)
    return (1, str(v))


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)
