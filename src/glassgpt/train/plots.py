"""Loss curves from ``metrics.jsonl``: training loss L(s) and validation loss L_val(s) against
optimizer step s (log-scaled loss axis), with the learning rate η(s) below, as one PNG.
"""

from __future__ import annotations

from pathlib import Path

from glassgpt.train.metrics import read_metrics


def plot_metrics(metrics: str | Path, output: str | Path) -> Path:
    """Draw ``metrics`` (a metrics.jsonl) into ``output`` (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    records = read_metrics(metrics)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    lr = [(r["step"], r["lr"]) for r in records if r.get("lr") is not None]
    fig, (ax, ax_lr) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", lw=1.5, ms=3, label="val loss")
        best = min(val, key=lambda p: p[1])
        ax.annotate(f"{best[1]:.3f}", best, textcoords="offset points", xytext=(0, 8))
    ax.set_ylabel("cross-entropy (nats / token)")
    if train or val:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
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
    plt.close(fig)
    return output
