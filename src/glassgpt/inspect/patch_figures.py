"""Figures of ``glassgpt patch``: one heat map per patching sweep, rendered to PNG bytes.

    cell (l, x) = m̂(corrupted run with the clean value of site x in layer l patched in)
    m̂ = (m − m_corrupted) / (m_clean − m_corrupted)      0: corrupted run, 1: clean run

Rows are layers (layer 0 at the top); columns are the prompt's positions, labelled with their
tokens (the clean and the corrupted token where they differ), or the heads of each layer.
The colour scale is red–white–blue, centred at 0 and symmetric, and reaches at least ±1, so
white means "no effect" and full blue "restores the clean run" in every figure alike.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from glassgpt.inspect.figures import MAX_TICKS, TEXT_PT, TICK_PT, _np, to_png, token_label


def position_labels(clean: Sequence[str], corrupted: Sequence[str], width: int = 8) -> list[str]:
    """One label per position: the token, or ``clean/corrupted`` where the prompts differ.

    >>> position_labels(["a", " Mary", "!"], ["a", " John", "!"])
    ['a', '␣Mary/␣John', '!']
    """
    return [
        token_label(a, width) if a == b else f"{token_label(a, width)}/{token_label(b, width)}"
        for a, b in zip(clean, corrupted, strict=True)
    ]


def patching_heatmap(
    values: Tensor | np.ndarray,
    title: str,
    *,
    col_labels: Sequence[str],
    xlabel: str,
    colorbar: str = "normalised metric (0 = corrupted, 1 = clean)",
    annotate: bool = True,
) -> bytes:
    """values [n_layers, n_cols] as a heat map with layers on y, a labelled colour bar."""
    m = _np(values)
    L, C = m.shape
    width = 3.4 + min(0.42 * C, 14.0)
    height = 1.9 + min(0.42 * L, 12.0)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    finite = m[np.isfinite(m)]
    lim = max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    im = ax.imshow(m, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    if annotate and L * C <= 300:
        for i in range(L):
            for j in range(C):
                if np.isfinite(m[i, j]):
                    colour = "white" if abs(m[i, j]) > 0.6 * lim else "black"
                    ax.text(
                        j,
                        i,
                        f"{m[i, j]:.2f}".replace("-0.00", "0.00"),
                        ha="center",
                        va="center",
                        fontsize=TEXT_PT,
                        color=colour,
                    )
    if C <= MAX_TICKS:
        wide = max((len(label) for label in col_labels), default=0) * C > 48
        ax.set_xticks(range(C), list(col_labels), rotation=90 if wide else 0, fontsize=TICK_PT)
    ax.set_yticks(range(L), [str(layer) for layer in range(L)], fontsize=TICK_PT)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    # each line of the title within the axes: about 11 characters an inch at 10 pt
    lines = [textwrap.fill(line, max(24, int((width - 1.3) * 11))) for line in title.split("\n")]
    ax.set_title("\n".join(lines), fontsize=10)
    bar = fig.colorbar(im, ax=ax, fraction=0.05)
    # the colour bar's label along its height: about 13 characters an inch at 9 pt
    bar.set_label(textwrap.fill(colorbar, max(16, int((height - 0.9) * 13))), fontsize=TICK_PT)
    return to_png(fig)
