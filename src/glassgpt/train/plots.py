"""Loss curves from ``metrics.jsonl``: training loss L(s) and validation loss L_val(s) against
optimizer step s (log-scaled loss axis), with the learning rate η(s) below, as one PNG.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

from glassgpt.train.metrics import read_metrics

NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


def log_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Labelled ticks for a log axis over [lo, hi]: round values (1, 1.2, 1.5, 2, … × 10^k),
    at most ``most`` of them, evenly spread in log space, the ends always covered.

    >>> log_ticks(1.2, 4.5)
    [1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0]
    >>> log_ticks(0.9, 11.0, most=5)
    [0.8, 1.5, 3.0, 6.0, 12.0]
    """
    lo, hi = min(lo, hi), max(lo, hi)
    if not (lo > 0 and math.isfinite(hi)):
        return []
    values = [
        round(m * 10.0**k, 10)
        for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        for m in NICE
    ]
    below = max([v for v in values if v <= lo], default=values[0])
    above = min([v for v in values if v >= hi], default=values[-1])
    inside = [v for v in values if below <= v <= above]
    if len(inside) <= most:
        return inside
    step = (len(inside) - 1) / (most - 1)
    return [inside[round(i * step)] for i in range(most)]


def plot_metrics(metrics: str | Path, output: str | Path) -> Path:
    """Draw ``metrics`` (a metrics.jsonl) into ``output`` (PNG)."""
    records = read_metrics(metrics)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    lr = [(r["step"], r["lr"]) for r in records if r.get("lr") is not None]
    fig = Figure(figsize=(8, 6))  # no pyplot: no global figure, no backend chosen
    ax, ax_lr = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", lw=1.5, ms=3, label="val loss")
        best = min(val, key=lambda p: p[1])
        ax.annotate(f"{best[1]:.3f}", best, textcoords="offset points", xytext=(0, 8))
    ax.set_ylabel("cross-entropy (nats / token)")
    if train or val:
        ax.set_yscale("log")
        values = [v for _, v in train + val if v > 0 and math.isfinite(v)]
        if values:  # round, labelled ticks over the whole range (log's own skip below 10)
            ticks = log_ticks(min(values), max(values))
            ax.yaxis.set_major_locator(FixedLocator(ticks))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(ticks[0], ticks[-1])
        ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{Path(metrics).parent.name}: loss")
    if lr:
        ax_lr.plot(*zip(*lr), lw=1, color="tab:gray")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(True, alpha=0.3)
    fig.tight_layout()
    output = Path(output)
    fig.savefig(output, dpi=110)
    return output
