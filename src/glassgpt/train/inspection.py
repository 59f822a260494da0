"""Inspection over training: the probe of :mod:`glassgpt.model.probes` every
``train.inspect_every`` steps, and ``circuits.png``, its scores beside the loss curve.

At step s the metrics line gains, for every layer l and head h,

    previous_token/LlHh, duplicate_token/LlHh, induction/LlHh   (on repeated random tokens)
    lens_loss/Ll     cross-entropy of the residual after block l, unembedded (on a val batch)
    attn_entropy/Ll  mean entropy of block l's attention patterns (on the same batch, nats)

The repeated tokens are :func:`glassgpt.inspect.head_scores`'s own defaults (8 sequences of
n = min(n_ctx // 2, 32) ids, seed 0), so the scores logged at step s equal ``head_scores`` of
the checkpoint of step s. The val batch is the first ``INSPECT_ROWS`` windows of the val split,
at most ``INSPECT_LEN`` tokens long (fixed over the run, so the curves compare like with like).

Olsson et al. (2022) saw induction heads form in a phase change: the induction score of some
layer-≥1 head jumps within a few hundred steps, while the loss curve shows a bump. The plot
marks the inspection where the best head's induction score rose most.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib
import torch
from matplotlib.figure import Figure

from glassgpt.data import iter_eval_batches
from glassgpt.model.probes import probe, repeated_random_tokens
from glassgpt.storage import atomic_write
from glassgpt.train.metrics import read_metrics

INSPECT_ROWS = 8  # val windows for the lens losses and entropies
INSPECT_LEN = 256  # their length, at most
TAB = [
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
]  # tab10 without its grey, which marks the heads not named
HEAD_KEY = re.compile(r"^(previous_token|duplicate_token|induction)/L(\d+)H(\d+)$")
LAYER_KEY = re.compile(r"^(lens_loss|attn_entropy)/L(\d+)$")


def inspector(cfg: Any, run_data: Any, device: torch.device) -> Callable[..., Mapping[str, float]]:
    """``inspect(model, step)`` for the trainer: the floats of :func:`glassgpt.model.probes.probe`
    on this run's fixed inputs (moved to ``device`` once)."""
    n = min(cfg.model.n_ctx // 2, 32)
    repeated = repeated_random_tokens(cfg.model.n_vocab, n, 8, seed=0).to(device)
    x, y = next(
        iter_eval_batches(
            run_data.data,
            "val",
            batch_size=INSPECT_ROWS,
            seq_len=min(cfg.seq_len, INSPECT_LEN),
            max_batches=1,
        )
    )
    x, y = x.to(device), y.to(device)

    def run(model: Any, step: int) -> Mapping[str, float]:
        return probe(model, repeated, x, y)

    return run


def inspect_every(cfg: Any) -> int:
    """Steps between inspections of this run (0: none; a context too short for the repeated
    sequences, n_ctx < 4, has none)."""
    return cfg.inspect_every if cfg.model.n_ctx >= 4 else 0


def inspection_series(
    records: list[dict[str, Any]],
) -> dict[str, dict[Any, list[tuple[int, float]]]]:
    """``{score: {(layer, head) or layer: [(step, value), …]}}`` from metrics records.

    >>> recs = [{"step": 5, "induction/L1H0": 0.5, "lens_loss/L0": 3.0, "loss": 2.0}]
    >>> inspection_series(recs)
    {'induction': {(1, 0): [(5, 0.5)]}, 'lens_loss': {0: [(5, 3.0)]}}
    """
    out: dict[str, dict[Any, list[tuple[int, float]]]] = {}
    for r in records:
        for key, value in r.items():
            if value is None:
                continue
            m = HEAD_KEY.match(key)
            if m:
                where: Any = (int(m[2]), int(m[3]))
            else:
                m = LAYER_KEY.match(key)
                if not m:
                    continue
                where = int(m[2])
            out.setdefault(m[1], {}).setdefault(where, []).append((r["step"], float(value)))
    return out


def phase_change(series: Mapping[Any, list[tuple[int, float]]]) -> int | None:
    """The step at which the best head's score rose most since the inspection before (None: it
    never rose by 0.1 between two inspections).

    >>> phase_change({(1, 0): [(100, 0.05), (200, 0.1), (300, 0.6), (400, 0.7)]})
    300
    """
    by_step: dict[int, float] = {}
    for points in series.values():
        for step, value in points:
            by_step[step] = max(by_step.get(step, -math.inf), value)
    steps = sorted(by_step)
    rises = [(by_step[b] - by_step[a], b) for a, b in itertools.pairwise(steps)]
    best = max(rises, default=(0.0, None))
    return best[1] if best[0] >= 0.1 else None


TITLES = {
    "induction": "induction score per head",
    "previous_token": "previous-token score per head",
    "duplicate_token": "duplicate-token score per head",
    "lens_loss": "logit-lens loss after each layer",
    "attn_entropy": "mean attention entropy per layer",
}


def plot_inspection(metrics: str | Path, output: str | Path) -> Path | None:
    """Draw the loss and every inspected score against the step into ``output`` (PNG); None when
    ``metrics`` has no inspection."""
    records = read_metrics(metrics)
    series = inspection_series(records)
    if not series:
        return None
    fig = Figure(figsize=(15, 8))  # no pyplot: no global figure, no backend chosen
    axes = fig.subplots(2, 3, sharex=True)
    ax = axes[0, 0]
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", lw=1.5, ms=3, label="val loss")
    ax.set_title("loss")
    ax.set_ylabel("cross-entropy (nats / token)")
    if train or val:
        ax.legend()
    bump = phase_change(series.get("induction", {}))
    panels = ["induction", "previous_token", "duplicate_token", "lens_loss", "attn_entropy"]
    layers = 1 + max(
        (k[0] if isinstance(k, tuple) else k) for s in series.values() for k in s
    )  # fmt: skip
    colors = matplotlib.colormaps["viridis" if layers > 2 else "tab10"]
    heads = 1 + max((k[1] for s in series.values() for k in s if isinstance(k, tuple)), default=0)
    for ax, name in zip(axes.flat[1:], panels):
        lines = series.get(name, {})
        finals = sorted(lines, key=lambda k: lines[k][-1][1], reverse=True)
        top4 = [k for k in finals if isinstance(k, tuple)][:4]  # heads named in the legend
        for k in sorted(lines):
            layer = k[0] if isinstance(k, tuple) else k
            label = f"L{k[0]}H{k[1]}" if isinstance(k, tuple) else f"layer {k}"
            top = not isinstance(k, tuple) or k in top4
            if isinstance(k, tuple):  # a head keeps its colour in every panel; unnamed: grey
                color = TAB[(k[0] * heads + k[1]) % len(TAB)] if top else "0.6"
            else:
                color = colors(layer / max(layers - 1, 1)) if layers > 2 else colors(layer)
            ax.plot(*zip(*lines[k]), "o-" if top else "-", ms=2.5, lw=1.6 if top else 0.6,
                    alpha=1.0 if top else 0.35, color=color, label=label if top else None)  # fmt: skip
        ax.set_title(TITLES[name])
        if name in ("induction", "previous_token", "duplicate_token"):
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("mean attention weight")
        elif name == "lens_loss":
            ax.set_ylabel("cross-entropy (nats / token)")
        else:
            ax.set_ylabel("entropy (nats)")
        if lines:
            ax.legend(fontsize=8, loc="best")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if bump is not None:
            ax.axvline(bump, color="tab:red", ls="--", lw=0.8, alpha=0.7)
    if bump is not None:
        axes[0, 1].annotate(f"step {bump}", (bump, 0.95), xytext=(4, 0),
                            textcoords="offset points", color="tab:red", fontsize=9)  # fmt: skip
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(f"{Path(metrics).parent.name}: circuits over training")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    output = Path(output)
    atomic_write(output, buf.getvalue())
    return output
