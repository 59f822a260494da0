"""Figures of the inspect report, each rendered to PNG bytes (matplotlib, Agg, no pyplot state).

- attention patterns: one panel per head, pattern[q, k] (rows: queries, columns: keys);
- logit lens grid: layer × position, coloured by the probability of the actual next token,
  each cell labelled with that layer's top prediction;
- attribution bars: the parts of one logit, largest |contribution| first;
- heat maps: circuits restricted to tokens, head scores, composition scores.
"""

from __future__ import annotations

import io
import math
import unicodedata
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

MAX_TICKS = 48  # axes with more labels than this are drawn without them


def token_label(text: str, width: int = 10) -> str:
    """A token's text made visible on an axis: spaces as ␣, controls escaped, long ones cut.

    >>> token_label(" the"), token_label("a\\nb"), token_label("x" * 20, width=5)
    ('␣the', 'a\\\\nb', 'xxxx…')
    """
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif unicodedata.category(ch)[0] == "C":
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    label = "".join(out) or "∅"
    return label if len(label) <= width else label[: width - 1] + "…"


def to_png(fig: Figure) -> bytes:
    """Render ``fig`` as PNG bytes."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def _np(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, float)


def _ticks(ax, labels_x: Sequence[str] | None, labels_y: Sequence[str] | None) -> None:  # type: ignore[no-untyped-def]
    if labels_x is not None and len(labels_x) <= MAX_TICKS:
        ax.set_xticks(range(len(labels_x)), labels_x, rotation=90, fontsize=7)
    if labels_y is not None and len(labels_y) <= MAX_TICKS:
        ax.set_yticks(range(len(labels_y)), labels_y, fontsize=7)


def attention_figure(pattern: Tensor, labels: Sequence[str], title: str) -> bytes:
    """Panels pattern[h] [T_q, T_k] for each head h of ``pattern`` [H, T, T]."""
    p = _np(pattern)
    H, T = p.shape[0], p.shape[-1]
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    side = 2.2 + 0.12 * T
    fig = Figure(figsize=(side * cols, side * rows + 0.4), layout="constrained")
    fig.suptitle(title)
    for h in range(H):
        ax = fig.add_subplot(rows, cols, h + 1)
        ax.imshow(p[h], cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=9)
        last_row = h + cols >= H
        _ticks(ax, labels if last_row else None, labels if h % cols == 0 else None)
        if not last_row:
            ax.set_xticks([])
        if h % cols:
            ax.set_yticks([])
    return to_png(fig)


def logit_lens_figure(
    prob: Tensor,
    top_labels: Sequence[Sequence[str]],
    row_names: Sequence[str],
    col_labels: Sequence[str],
) -> bytes:
    """prob [n_rows, T] (probability of the actual next token) with top-1 labels per cell."""
    p = _np(prob)
    n, T = p.shape
    fig = Figure(figsize=(2.5 + 0.75 * T, 1.2 + 0.42 * n), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(p, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    if T * n <= 1200:
        for i in range(n):
            for j in range(T):
                colour = "black" if p[i, j] > 0.6 else "white"
                ax.text(j, i, top_labels[i][j], ha="center", va="center", fontsize=6, color=colour)
    _ticks(ax, col_labels, row_names)
    ax.set_xlabel("position (input token)")
    ax.set_title("logit lens: p(actual next token); text = top prediction")
    fig.colorbar(im, ax=ax, fraction=0.03)
    return to_png(fig)


def attribution_figure(names: Sequence[str], values: Tensor, title: str, top: int = 24) -> bytes:
    """Horizontal bars of the ``top`` largest |values| (the rest summed into one bar)."""
    v = _np(values)
    order = np.argsort(-np.abs(v))
    keep = list(order[:top])
    labels = [names[i] for i in keep]
    vals = [float(v[i]) for i in keep]
    if len(order) > top:
        labels.append(f"{len(order) - top} others")
        vals.append(float(v[order[top:]].sum()))
    fig = Figure(figsize=(7.5, 1.0 + 0.28 * len(vals)), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    colours = ["tab:blue" if x >= 0 else "tab:red" for x in vals]
    ax.barh(range(len(vals)), vals, color=colours)
    ax.set_yticks(range(len(vals)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel("contribution to the logit")
    ax.set_title(title, fontsize=10)
    return to_png(fig)


def heatmap_figure(
    matrix: Tensor | np.ndarray,
    title: str,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    *,
    xlabel: str = "",
    ylabel: str = "",
    diverging: bool = True,
    annotate: bool = False,
) -> bytes:
    """One matrix as a heat map; ``diverging`` centres a red–blue scale on 0; NaN cells blank."""
    m = _np(matrix)
    r, c = m.shape
    fig = Figure(
        figsize=(2.8 + min(0.32 * c, 12.0), 1.6 + min(0.3 * r, 12.0)), layout="constrained"
    )
    ax = fig.add_subplot(1, 1, 1)
    finite = m[np.isfinite(m)]
    if diverging:
        lim = float(np.abs(finite).max()) if finite.size else 1.0
        im = ax.imshow(m, cmap="RdBu", vmin=-lim or -1, vmax=lim or 1, aspect="auto")
    else:
        im = ax.imshow(m, cmap="viridis", aspect="auto")
    if annotate and r * c <= 400:
        for i in range(r):
            for j in range(c):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6)
    _ticks(ax, col_labels, row_labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    return to_png(fig)


def loss_figure(loss: Tensor, labels: Sequence[str]) -> bytes:
    """Bars of the per-token loss; label t is the token being predicted."""
    v = _np(loss)
    fig = Figure(figsize=(2.5 + 0.3 * len(v), 3.0), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(len(v)), v, color="tab:purple")
    _ticks(ax, labels, None)
    ax.set_ylabel("−log p (nats)")
    ax.set_title("per-token loss (label: the token predicted)", fontsize=10)
    return to_png(fig)
