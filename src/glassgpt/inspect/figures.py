"""Figures of the inspect report, each rendered to PNG bytes (matplotlib, Agg, no pyplot state).

- attention patterns: one panel per head, pattern[q, k] (rows: queries, columns: keys);
- logit lens grid: layer × position, coloured by the probability of the actual next token,
  each cell labelled with that layer's top prediction;
- attribution bars: the parts of one logit, largest |contribution| first;
- heat maps: circuits restricted to tokens, head scores, composition scores;
- the induction study's panels (``induction_*_figure``): head scores, composition, activation
  and path patching, ablation, each with the study's pair of heads outlined.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from glassgpt.tokenizer.display import visible

MAX_TICKS = 48  # axes with more labels than this are drawn without them
DPI = 90  # the PNGs' resolution; the report shows them at their own size (1 px : 1 px)
TICK_PT = 9  # tick labels: 9 pt at DPI is 11 px, readable (7 pt was about 5 px of x-height)
TEXT_PT = 8  # numbers and tokens written inside cells
TICK_STEP_IN = 0.17  # inches between neighbouring tick labels of TICK_PT (no overlap)
HeadPair = tuple[tuple[int, int], tuple[int, int]]  # (previous-token head, induction head)


def token_label(text: str, width: int = 10) -> str:
    """A token's text on an axis: :func:`glassgpt.tokenizer.display.visible`, cut to ``width``.

    >>> token_label(" the"), token_label("x" * 20, width=5)
    ('␣the', 'xxxx…')
    """
    return visible(text, width)


def to_png(fig: Figure) -> bytes:
    """Render ``fig`` as PNG bytes."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _np(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, float)


def _ticks(ax, labels_x: Sequence[str] | None, labels_y: Sequence[str] | None) -> None:  # type: ignore[no-untyped-def]
    if labels_x is not None and len(labels_x) <= MAX_TICKS:
        ax.set_xticks(range(len(labels_x)), labels_x, rotation=90, fontsize=TICK_PT)
    if labels_y is not None and len(labels_y) <= MAX_TICKS:
        ax.set_yticks(range(len(labels_y)), labels_y, fontsize=TICK_PT)


def attention_figure(pattern: Tensor, labels: Sequence[str], title: str) -> bytes:
    """Panels pattern[h] [T_q, T_k] for each head h of ``pattern`` [H, T, T]."""
    p = _np(pattern)
    H, T = p.shape[0], p.shape[-1]
    side = 2.2 + TICK_STEP_IN * T
    cols = max(1, min(H, 4, int(14.0 // side)))  # about the page's width, at most 4 panels
    rows = math.ceil(H / cols)
    fig = Figure(figsize=(side * cols, side * rows + 0.4), layout="constrained")
    fig.suptitle(title)
    for h in range(H):
        ax = fig.add_subplot(rows, cols, h + 1)
        ax.imshow(p[h], cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}", fontsize=10)
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
    fig = Figure(figsize=(2.5 + 0.8 * T, 1.4 + 0.45 * n), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(p, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    if T * n <= 1200:
        for i in range(n):
            for j in range(T):
                colour = "black" if p[i, j] > 0.6 else "white"
                ax.text(
                    j, i, top_labels[i][j], ha="center", va="center", fontsize=TEXT_PT, color=colour
                )
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
    fig = Figure(figsize=(7.5, 1.0 + 0.3 * len(vals)), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    colours = ["tab:blue" if x >= 0 else "tab:red" for x in vals]
    ax.barh(range(len(vals)), vals, color=colours)
    ax.set_yticks(range(len(vals)), labels, fontsize=TICK_PT)
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
    step = 0.42 if annotate else TICK_STEP_IN + 0.05  # room for "0.00" in a cell
    fig = Figure(
        figsize=(2.8 + min(step * c, 14.0), 1.6 + min(step * r, 14.0)), layout="constrained"
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
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=TEXT_PT)
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


# -- the induction study (glassgpt.inspect.induction): a pair of heads outlined in red --------


def _outlined_matrix(
    ax: Any,
    m: Tensor,
    title: str,
    rows: Sequence[str],
    cols: Sequence[str],
    marks: Sequence[tuple[int, int]] = (),
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
) -> Any:
    """An annotated matrix on ``ax``, each cell in ``marks`` outlined in red."""
    a = m.detach().float().cpu().numpy()
    im = ax.imshow(a, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    lo, hi = im.get_clim()
    if a.size <= 64:
        for (i, j), v in np.ndenumerate(a):
            x = (v - lo) / ((hi - lo) or 1.0)  # where v sits on the colour scale, 0..1
            light = abs(x - 0.5) < 0.3 if cmap == "RdBu" else x > 0.6
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=9,
                color="black" if light else "white",
            )
    for i, j in marks:
        ax.add_patch(_outline(i, j))
    ax.set_xticks(range(len(cols)), list(cols), fontsize=TICK_PT)
    ax.set_yticks(range(len(rows)), list(rows), fontsize=TICK_PT)
    ax.set_title(title, fontsize=10)
    return im


def _outline(i: int, j: int) -> Rectangle:
    return Rectangle((j - 0.44, i - 0.44), 0.88, 0.88, fill=False, edgecolor="red", linewidth=2.5)


def induction_scores_figure(scores: Any, pair: HeadPair) -> bytes:
    """Previous-token and induction scores [L, H], the pair outlined."""
    L, H = scores.induction.shape
    fig = Figure(figsize=(3.0 + 1.4 * H, 1.4 + 0.55 * L), layout="constrained")
    fig.suptitle(
        "head scores on repeated random tokens (attention on the expected key)", fontsize=10
    )
    heads, layers = [f"head {h}" for h in range(H)], [f"layer {layer}" for layer in range(L)]
    for k, (name, mark) in enumerate([("previous_token", pair[0]), ("induction", pair[1])]):
        ax = fig.add_subplot(1, 2, k + 1)
        im = _outlined_matrix(
            ax,
            getattr(scores, name),
            name.replace("_", "-"),
            layers,
            heads,
            [mark],
            vmin=0.0,
            vmax=1.0,
        )
    fig.colorbar(im, ax=fig.axes, fraction=0.04)
    return to_png(fig)


def induction_composition_figure(k_block: Tensor, comp: dict[str, Any], pair: HeadPair) -> bytes:
    """K-composition of every layer-l₁ head into every layer-l₂ head; the pair's Q/K/V
    composition beside other pairs' and random matrices' (mean ± 2 std)."""
    (l1, h1), (l2, h2) = pair
    H = k_block.shape[0]
    fig = Figure(figsize=(4.0 + 1.2 * H, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 2, 1)
    im = _outlined_matrix(
        ax,
        k_block,
        f"K-composition, layer {l1} → layer {l2}",
        [f"L{l1}H{h}" for h in range(H)],
        [f"L{l2}H{h}" for h in range(H)],
        [(h1, h2)],
    )
    ax.set_ylabel(f"writer (layer {l1})")
    ax.set_xlabel(f"reader of keys (layer {l2})")
    fig.colorbar(im, ax=ax, fraction=0.05)
    ax = fig.add_subplot(1, 2, 2)
    x = np.arange(3)
    pair_v = [comp[k]["pair"] for k in "qkv"]
    other = [comp[k]["other_pairs_mean"] for k in "qkv"]
    mean = np.array([comp[k]["random_mean"] for k in "qkv"])
    std = np.array([comp[k]["random_std"] for k in "qkv"])
    bars = ax.bar(x - 0.2, pair_v, 0.4, color="tab:red", label=f"L{l1}H{h1} → L{l2}H{h2}")
    ax.bar_label(bars, fmt="%.2f", fontsize=TEXT_PT)
    ax.bar(x + 0.2, other, 0.4, color="tab:grey", label="other pairs (mean)")
    ax.errorbar(
        x,
        mean,
        yerr=2 * std,
        fmt="_",
        color="black",
        markersize=30,
        capsize=0,
        label="random matrices (± 2 std)",
    )
    ax.set_xticks(x, ["Q", "K", "V"])
    ax.set_ylabel("composition score")
    ax.set_title("the pair's composition", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    return to_png(fig)


def induction_patching_figure(heads: Tensor, keys: Tensor, pair: HeadPair) -> bytes:
    """Activation patching of each head's output z and keys k at every position [L, H]."""
    L, H = heads.shape
    fig = Figure(figsize=(3.0 + 1.4 * H, 1.6 + 0.55 * L), layout="constrained")
    fig.suptitle(
        "activation patching: clean → corrupted run, metric recovered\n(0 = corrupted, 1 = clean)",
        fontsize=10,
    )
    head_labels, layers = [f"head {h}" for h in range(H)], [f"layer {layer}" for layer in range(L)]
    lim = max(1.0, float(heads.abs().max()), float(keys.abs().max()))
    for k, (m, title) in enumerate([(heads, "head output z"), (keys, "head keys k")]):
        ax = fig.add_subplot(1, 2, k + 1)
        im = _outlined_matrix(ax, m, title, layers, head_labels, list(pair), -lim, lim, cmap="RdBu")
    fig.colorbar(im, ax=fig.axes, fraction=0.04)
    return to_png(fig)


def induction_positions_figure(by_pos: Tensor, pair: HeadPair, seq_len: int) -> bytes:
    """The pair's output z patched one position at a time [T] each."""
    T = by_pos.shape[1]
    fig = Figure(figsize=(8.0, 3.4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    names = ("previous-token", "induction")
    for (layer, head), name, colour in zip(pair, names, ("tab:blue", "tab:red"), strict=True):
        ax.plot(
            range(T),
            by_pos[layer, :, head].tolist(),
            marker="o",
            markersize=3,
            color=colour,
            label=f"{name} head L{layer}H{head}",
        )
    ax.axvline(seq_len - 0.5, color="black", linewidth=0.8, linestyle="--")
    ax.text(seq_len - 0.5, ax.get_ylim()[1], " second copy →", va="top", fontsize=TEXT_PT)
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_xlabel("position patched (first copy: 0 … n−1; odd ones corrupted)")
    ax.set_ylabel("metric recovered")
    ax.set_title("activation patching of one position of one head's output", fontsize=10)
    ax.legend(fontsize=TEXT_PT)
    return to_png(fig)


def induction_ablation_figure(mean: dict[str, Any], zero: dict[str, Any], pair: HeadPair) -> bytes:
    """Loss on the first and the repeated half under each ablation (mean and zero)."""
    labels = ["full model", "pair ablated", "only the pair kept", "every head ablated"]
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    (l1, h1), (l2, h2) = pair
    fig.suptitle(
        f"loss on r r: first copy vs repeated copy; pair = L{l1}H{h1} + L{l2}H{h2}", fontsize=10
    )
    x = np.arange(len(labels))
    for k, (rows, how) in enumerate([(mean, "mean ablation"), (zero, "zero ablation")]):
        ax = fig.add_subplot(1, 2, k + 1, sharey=fig.axes[0] if k else None)
        first = [rows[label]["first_half"] for label in labels]
        second = [rows[label]["second_half"] for label in labels]
        ax.bar(x - 0.2, first, 0.4, color="tab:grey", label="first copy")
        bars = ax.bar(x + 0.2, second, 0.4, color="tab:red", label="repeated copy")
        kept = [f"{rows[label]['drop_kept']:.0%}" for label in labels]
        ax.bar_label(bars, kept, fontsize=TEXT_PT)
        ax.set_xticks(x, [label.replace(" ", "\n", 1) for label in labels], fontsize=TICK_PT)
        ax.set_title(f"{how} (label: share of the drop kept)", fontsize=9)
        if not k:
            ax.set_ylabel("loss (nats per token)")
            ax.legend(fontsize=TEXT_PT)
    return to_png(fig)


def induction_path_figure(p: dict[str, Any], pair: HeadPair) -> bytes:
    """Path patching from the previous-token head: into the induction head's q/k/v, into
    each layer-l₂ head's keys, into the logits directly."""
    (l1, h1), (l2, h2) = pair
    names = [f"L{l2}H{h2}.{kind}" for kind in "qkv"]
    values = [p[kind] for kind in "qkv"]
    colours = ["tab:red" if kind == "k" else "tab:grey" for kind in "qkv"]
    for h, v in enumerate(p["keys_of_each_head"]):
        if h != h2:
            names.append(f"L{l2}H{h}.k")
            values.append(v)
            colours.append("tab:blue")
    names.append("logits\n(direct)")
    values.append(p["final"])
    colours.append("tab:green")
    fig = Figure(figsize=(2.0 + 0.9 * len(names), 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    bars = ax.bar(range(len(names)), values, color=colours)
    ax.bar_label(bars, fmt="%.2f", fontsize=TEXT_PT)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(names)), names, fontsize=TICK_PT)
    ax.set_xlabel("receiver: the only input recomputed with the sender's clean output")
    ax.set_ylabel("metric recovered")
    ax.set_title(f"path patching from the previous-token head L{l1}H{h1}", fontsize=10)
    return to_png(fig)
