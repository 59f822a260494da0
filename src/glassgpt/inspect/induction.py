"""The induction circuit, end to end: find it, read it from the weights, then intervene on it.

On a random sequence r₀ … r_{n−1} repeated once, an induction head at query position n + i
(token r_i) attends to position i + 1, the token after the earlier copy of r_i, and copies
r_{i+1}: its key at i + 1 must know that the PREVIOUS token was r_i, which a layer-0
previous-token head writes there (K-composition):

    key_{i+1} = (x_{i+1} + Σ_h A⁰_h[i+1, ·] x W_V⁰ W_O⁰) W_K¹,   A⁰_prev[i+1, i] ≈ 1

The study measures, on one model:

1. head scores (``glassgpt.inspect.heads``): the best induction head (layer ≥ 1) and the best
   previous-token head in a layer before it;
2. composition scores (``glassgpt.inspect.circuits``): Q, K and V composition of that pair,
   against the same scores of freshly initialised models of the same shape (random matrices);
3. activation patching of every head's output z (``glassgpt.inspect.patching``), all
   positions and position by position;
4. path patching from the previous-token head to the induction head's q, k and v;
5. ablation (``glassgpt.inspect.ablation``): the loss on the repeated half with the pair
   removed, and with only the pair kept.

Patching compares a CLEAN run, r r, with a CORRUPTED one in which the odd positions
1, 3, 5, … of the first half hold other tokens (never in r). For a query r_i with i odd, the
key the induction head needs is i + 1: its token r_{i+1} is the same in both runs, but its
previous token is not. Only the previous-token information is wrong there, so both the
induction head (downstream) and the previous-token head (upstream, through the keys) can
restore the prediction. The metric is the mean log-probability of r_{i+1} at those queries,
normalised to 0 on the corrupted run and 1 on the clean one. (Corrupting a whole first half
would change the tokens the induction head copies as well, so no upstream head could help.)

:func:`run_induction_study` writes each figure as a PNG and every number in ``results.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.ablation import run_ablated
from glassgpt.inspect.cache import evaluating, run_with_cache
from glassgpt.inspect.circuits import composition_scores
from glassgpt.inspect.figures import to_png
from glassgpt.inspect.heads import SCORES, head_scores
from glassgpt.inspect.lens import per_token_loss
from glassgpt.inspect.metrics import Metric, normalised
from glassgpt.inspect.paths import FINAL, Head, Receiver, path_patch, path_patch_heads
from glassgpt.model import GPT, GPTConfig
from glassgpt.storage import atomic_write

HeadIndex = tuple[int, int]


# -- the prompts --------------------------------------------------------------------------


def induction_prompts(
    n_vocab: int, seq_len: int, batch: int = 16, *, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """(clean, corrupted), each [batch, 2 · seq_len]: clean is r r with r of distinct ids;
    corrupted replaces the odd positions 1, 3, … of the first half by ids not in r.

    >>> clean, corrupted = induction_prompts(20, 4, batch=1, seed=0)
    >>> bool((clean[:, :4] == clean[:, 4:]).all()), (clean != corrupted)[0].tolist()
    (True, [False, True, False, True, False, False, False, False])
    """
    n_odd = seq_len // 2
    if seq_len < 4 or batch < 1 or seq_len + n_odd > n_vocab:
        raise GlassError(
            f"induction prompts need 4 ≤ seq_len and seq_len + seq_len // 2 ≤ n_vocab distinct "
            f"ids; got seq_len={seq_len}, n_vocab={n_vocab}, batch={batch}"
        )
    gen = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(n_vocab, generator=gen) for _ in range(batch)])
    r, other = perms[:, :seq_len], perms[:, seq_len : seq_len + n_odd]  # disjoint ids
    clean = torch.cat([r, r], dim=1)
    corrupted = clean.clone()
    corrupted[:, 1:seq_len:2] = other[:, : len(range(1, seq_len, 2))]
    return clean, corrupted


def query_positions(seq_len: int) -> list[int]:
    """Positions n + i (i odd, i + 1 < n) whose next token r_{i+1} only induction predicts.

    >>> query_positions(8)
    [9, 11, 13]
    """
    return [seq_len + i for i in range(1, seq_len - 1, 2)]


def target_logprob(tokens: Tensor, positions: Sequence[int]) -> Metric:
    """m = mean over prompts b and positions t of log softmax(z_t)[tokens[b, t + 1]].

    >>> z = torch.zeros(1, 3, 4)
    >>> round(float(target_logprob(torch.tensor([[0, 1, 2]]), [1])(z)), 4)  # log(1/4)
    -1.3863
    """
    pos = torch.as_tensor(list(positions), dtype=torch.long)
    targets = tokens[:, pos + 1]  # [B, P]

    def batched(logits: Tensor) -> Tensor:
        z = logits if logits.dtype == torch.float64 else logits.float()
        logp = z[:, :, pos].log_softmax(-1)  # [N, B, P, V]
        index = targets.to(z.device)[None, ..., None].expand(*logp.shape[:3], 1)
        return logp.gather(-1, index)[..., 0].mean((1, 2))

    return Metric(batched, f"logprob of the next token at {len(pos)} induction queries")


def half_losses(loss: Tensor, seq_len: int) -> tuple[float, float]:
    """(first, second): mean per-token loss [B, 2n − 1] predicting tokens 1..n−1 and n+1..2n−1."""
    return float(loss[:, : seq_len - 1].mean()), float(loss[:, seq_len:].mean())


# -- the pair of heads --------------------------------------------------------------------


def find_pair(scores: Any) -> tuple[HeadIndex, HeadIndex]:
    """(previous-token head, induction head): the best induction head in a layer ≥ 1 and the
    best previous-token head in a layer before it."""
    ind = scores.induction.clone()
    if ind.shape[0] < 2:
        raise GlassError("an induction circuit needs at least 2 layers; the model has 1")
    ind[0] = -math.inf
    l2, h2 = divmod(int(torch.argmax(ind)), ind.shape[1])
    prev = scores.previous_token[:l2]
    l1, h1 = divmod(int(torch.argmax(prev)), prev.shape[1])
    return (l1, h1), (l2, h2)


def random_composition(config: GPTConfig, n_models: int = 8, seed: int = 0) -> dict[str, Tensor]:
    """Composition scores of every pair l₁ < l₂ in ``n_models`` freshly initialised models of
    ``config``: the baseline of random matrices, {kind: [n_models · pairs]}."""
    out: dict[str, list[Tensor]] = {k: [] for k in "qkv"}
    with torch.random.fork_rng(devices=[]):
        for i in range(n_models):
            torch.manual_seed(seed + i)
            model = GPT(config.replace(dropout=0.0))
            for kind in "qkv":
                s = composition_scores(model, kind)  # type: ignore[arg-type]
                out[kind].append(s[s.isfinite()].flatten())
    return {k: torch.cat(v) for k, v in out.items()}


# -- figures ------------------------------------------------------------------------------


def _matrix(
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
        ax.add_patch(_box(i, j))
    ax.set_xticks(range(len(cols)), list(cols), fontsize=8)
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.set_title(title, fontsize=10)
    return im


def _box(i: int, j: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.44, i - 0.44), 0.88, 0.88, fill=False, edgecolor="red", linewidth=2.5)


def scores_figure(scores: Any, pair: tuple[HeadIndex, HeadIndex]) -> bytes:
    """Previous-token and induction scores [L, H], the pair outlined."""
    L, H = scores.induction.shape
    fig = Figure(figsize=(3.0 + 1.4 * H, 1.4 + 0.55 * L), layout="constrained")
    fig.suptitle(
        "head scores on repeated random tokens (attention on the expected key)", fontsize=10
    )
    heads, layers = [f"head {h}" for h in range(H)], [f"layer {layer}" for layer in range(L)]
    for k, (name, mark) in enumerate([("previous_token", pair[0]), ("induction", pair[1])]):
        ax = fig.add_subplot(1, 2, k + 1)
        im = _matrix(
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


def composition_figure(
    k_block: Tensor, comp: dict[str, Any], pair: tuple[HeadIndex, HeadIndex]
) -> bytes:
    """K-composition of every layer-l₁ head into every layer-l₂ head; the pair's Q/K/V
    composition beside other pairs' and random matrices' (mean ± 2 std)."""
    (l1, h1), (l2, h2) = pair
    H = k_block.shape[0]
    fig = Figure(figsize=(4.0 + 1.2 * H, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 2, 1)
    im = _matrix(
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
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
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


def patching_figure(heads: Tensor, keys: Tensor, pair: tuple[HeadIndex, HeadIndex]) -> bytes:
    """Activation patching of each head's output z and keys k at every position [L, H]."""
    L, H = heads.shape
    fig = Figure(figsize=(3.0 + 1.4 * H, 1.6 + 0.55 * L), layout="constrained")
    fig.suptitle(
        "activation patching: clean → corrupted run, metric recovered\n(0 = corrupted, 1 = clean)",
        fontsize=10,
    )
    heads_l, layers = [f"head {h}" for h in range(H)], [f"layer {layer}" for layer in range(L)]
    lim = max(1.0, float(heads.abs().max()), float(keys.abs().max()))
    for k, (m, title) in enumerate([(heads, "head output z"), (keys, "head keys k")]):
        ax = fig.add_subplot(1, 2, k + 1)
        im = _matrix(ax, m, title, layers, heads_l, list(pair), -lim, lim, cmap="RdBu")
    fig.colorbar(im, ax=fig.axes, fraction=0.04)
    return to_png(fig)


def positions_figure(by_pos: Tensor, pair: tuple[HeadIndex, HeadIndex], seq_len: int) -> bytes:
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
    ax.text(seq_len - 0.5, ax.get_ylim()[1], " second copy →", va="top", fontsize=8)
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_xlabel("position patched (first copy: 0 … n−1; odd ones corrupted)")
    ax.set_ylabel("metric recovered")
    ax.set_title("activation patching of one position of one head's output", fontsize=10)
    ax.legend(fontsize=8)
    return to_png(fig)


def ablation_figure(
    mean: dict[str, Any], zero: dict[str, Any], pair: tuple[HeadIndex, HeadIndex]
) -> bytes:
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
        ax.bar_label(bars, kept, fontsize=8)
        ax.set_xticks(x, [label.replace(" ", "\n", 1) for label in labels], fontsize=8)
        ax.set_title(f"{how} (label: share of the drop kept)", fontsize=9)
        if not k:
            ax.set_ylabel("loss (nats per token)")
            ax.legend(fontsize=8)
    return to_png(fig)


def path_figure(p: dict[str, Any], pair: tuple[HeadIndex, HeadIndex]) -> bytes:
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
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("receiver: the only input recomputed with the sender's clean output")
    ax.set_ylabel("metric recovered")
    ax.set_title(f"path patching from the previous-token head L{l1}H{h1}", fontsize=10)
    return to_png(fig)


# -- the study ----------------------------------------------------------------------------


def run_induction_study(
    model: GPT,
    out_dir: str | Path,
    *,
    seq_len: int | None = None,
    batch: int = 16,
    seed: int = 0,
    n_random: int = 8,
) -> dict[str, Any]:
    """Measure the induction circuit of ``model``; write figures and ``results.json`` in
    ``out_dir``; return the results. ``seq_len``: n of the repeated sequences (default
    min(n_ctx // 2, 32))."""
    cfg = model.config
    n = min(cfg.n_ctx // 2, 32) if seq_len is None else seq_len
    if 2 * n > cfg.n_ctx:
        raise GlassError(f"seq_len={n} repeated is {2 * n} tokens, more than n_ctx={cfg.n_ctx}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean, corrupted = induction_prompts(cfg.n_vocab, n, batch, seed=seed)
    figures: dict[str, bytes] = {}
    results: dict[str, Any] = {
        "model": {
            k: getattr(cfg, k)
            for k in ("n_layers", "n_heads", "d_model", "d_head", "n_vocab", "n_ctx", "attn_only")
        },
        "prompts": {
            "seq_len": n,
            "batch": batch,
            "seed": seed,
            "query_positions": query_positions(n),
        },
    }
    with evaluating(model):
        # 1. head scores
        scores = head_scores(model, clean)
        pair = find_pair(scores)
        (l1, h1), (l2, h2) = pair
        results["heads"] = {"previous_token": [l1, h1], "induction": [l2, h2]}
        results["head_scores"] = {s: getattr(scores, s).tolist() for s in SCORES}
        figures["head-scores.png"] = scores_figure(scores, pair)

        # the loss on the repeated half
        loss = per_token_loss(model, clean)
        first, second = half_losses(loss, n)
        results["loss"] = {"first_half": first, "second_half": second}

        # 2. composition
        results["composition"] = composition_results(model, pair, n_random, seed, figures)

        # 3.–5. interventions
        with torch.no_grad():
            logits_clean, cache = run_with_cache(model, clean, ["z", "k"])
            logits_corrupted = model(corrupted)
        base = target_logprob(clean, query_positions(n))
        metric = normalised(base, logits_clean, logits_corrupted)
        gap = float(base(logits_clean) - base(logits_corrupted))
        results["patching_metric"] = {
            "clean_logprob": float(base(logits_clean)),
            "corrupted_logprob": float(base(logits_corrupted)),
            "gap": gap,  # nats; near 0: nothing to localise, the normalised values are noise
        }
        results["activation_patching"] = activation_patching(
            model, corrupted, cache, metric, pair, figures
        )
        results["path_patching"] = path_patching(model, clean, corrupted, metric, pair, figures)
        results["ablation"] = ablation(model, clean, pair, seed, figures)

    for name, png in figures.items():
        atomic_write(out / name, png)
    results["figures"] = sorted(figures)
    text = json.dumps(results, indent=1, allow_nan=True) + "\n"
    atomic_write(out / "results.json", text.encode("utf-8"))
    return results


def composition_results(
    model: GPT,
    pair: tuple[HeadIndex, HeadIndex],
    n_random: int,
    seed: int,
    figures: dict[str, bytes],
) -> dict[str, Any]:
    """Q/K/V composition of the pair and of every pair of heads, against random matrices."""
    (l1, h1), (l2, h2) = pair
    H = model.config.n_heads
    random = random_composition(model.config, n_random, seed)
    out: dict[str, Any] = {"n_random_models": n_random}
    for kind in "qkv":
        s = composition_scores(model, kind)  # type: ignore[arg-type]
        block = s[l1, :, l2, :]  # [H, H]: every head of l₁ into every head of l₂
        r = random[kind]
        others = torch.cat([block.flatten()[: h1 * H + h2], block.flatten()[h1 * H + h2 + 1 :]])
        out[kind] = {
            "pair": float(s[l1, h1, l2, h2]),
            "layer_block": block.tolist(),
            "other_pairs_mean": float(others.mean()) if others.numel() else math.nan,
            "random_mean": float(r.mean()),
            "random_std": float(r.std()),
            "random_max": float(r.max()),
        }
    k = composition_scores(model, "k")[l1, :, l2, :]
    figures["composition.png"] = composition_figure(k, out, pair)
    return out


def activation_patching(
    model: GPT,
    corrupted: Tensor,
    cache: Any,
    metric: Metric,
    pair: tuple[HeadIndex, HeadIndex],
    figures: dict[str, bytes],
) -> dict[str, Any]:
    """Patch each head's clean z (its output) into the corrupted run: at every position at
    once [L, H], and one position at a time [L, T, H]; each head's keys k likewise [L, H]."""
    (l1, h1), (l2, h2) = pair
    L, H = model.config.n_layers, model.config.n_heads
    n = corrupted.shape[1] // 2
    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
    by_pos = patching.get_act_patch_attn_head_out_by_pos(model, corrupted, cache, metric)
    keys = patching.get_act_patch_attn_head_k_all_pos(model, corrupted, cache, metric)
    flat = heads.flatten()
    order = torch.argsort(flat, descending=True)[:2].tolist()
    out = {
        "head_out_all_pos": heads.tolist(),
        "head_k_all_pos": keys.tolist(),
        "head_out_by_pos": by_pos.tolist(),
        "top_two_heads": [list(divmod(i, H)) for i in order],
        "pair": {"previous_token": float(heads[l1, h1]), "induction": float(heads[l2, h2])},
        "best_other_head": max(
            (float(heads[layer, head]), [layer, head])
            for layer in range(L)
            for head in range(H)
            if (layer, head) not in pair
        )[0]
        if L * H > 2
        else math.nan,
    }
    figures["patching-heads.png"] = patching_figure(heads, keys, pair)
    figures["patching-positions.png"] = positions_figure(by_pos, pair, n)
    return out


def path_patching(
    model: GPT,
    clean: Tensor,
    corrupted: Tensor,
    metric: Metric,
    pair: tuple[HeadIndex, HeadIndex],
    figures: dict[str, bytes],
) -> dict[str, Any]:
    """The previous-token head's clean output reaching only the induction head's q, k or v;
    only each layer-l₂ head's keys; only the final residual stream (its direct path)."""
    (l1, h1), (l2, h2) = pair
    sender = Head(l1, h1)

    def through(*receivers: Any) -> float:
        return float(path_patch(model, clean, corrupted, metric, sender, list(receivers)))

    out: dict[str, Any] = {kind: through(Receiver(l2, h2, kind)) for kind in "qkv"}
    out["keys_of_each_head"] = [through(Receiver(l2, h, "k")) for h in range(model.config.n_heads)]
    out["final"] = through(FINAL)
    senders = path_patch_heads(model, clean, corrupted, metric, [Receiver(l2, h2, "k")])
    out["each_sender_to_induction_keys"] = senders.tolist()
    figures["path-patching.png"] = path_figure(out, pair)
    return out


def ablation(
    model: GPT,
    clean: Tensor,
    pair: tuple[HeadIndex, HeadIndex],
    seed: int,
    figures: dict[str, bytes],
) -> dict[str, Any]:
    """The loss on each half of r r: the full model; the pair ablated; only the pair kept;
    every head ablated; each head ablated alone. Mean ablation over random (unrepeated)
    sequences of the same length, per position, and zero ablation."""
    L, H = model.config.n_layers, model.config.n_heads
    n = clean.shape[1] // 2
    gen = torch.Generator().manual_seed(seed + 1)
    reference = torch.randint(
        0, model.config.n_vocab, (4 * clean.shape[0], clean.shape[1]), generator=gen
    )
    pair_list = list(pair)
    conditions: dict[str, dict[str, Any]] = {
        "full model": {"heads": []},
        "pair ablated": {"heads": pair_list},
        "only the pair kept": {"heads": pair_list, "keep": True},
        "every head ablated": {"heads": [], "keep": True},
    }
    out: dict[str, Any] = {"reference": "random tokens, mean per position (how='mean')"}
    for how in ("mean", "zero"):
        rows: dict[str, Any] = {}
        for label, kw in conditions.items():
            logits = run_ablated(
                model, clean, how=how, reference=reference, mean_over="batch", **kw
            )
            first, second = half_losses(token_losses(logits, clean), n)
            rows[label] = {"first_half": first, "second_half": second, "drop": first - second}
        full = rows["full model"]["drop"]
        for row in rows.values():
            row["drop_kept"] = row["drop"] / full if full else math.nan
        single = torch.zeros(L, H)
        for layer in range(L):
            for head in range(H):
                logits = run_ablated(
                    model,
                    clean,
                    heads=[(layer, head)],
                    how=how,
                    reference=reference,
                    mean_over="batch",
                )
                first, second = half_losses(token_losses(logits, clean), n)
                single[layer, head] = (first - second) / full if full else math.nan
        rows["each head ablated alone: drop kept"] = single.tolist()
        out[how] = rows
    figures["ablation.png"] = ablation_figure(out["mean"], out["zero"], pair)
    return out


def token_losses(logits: Tensor, tokens: Tensor) -> Tensor:
    """[B, T − 1]: −log softmax(z_t)[tokens_{t+1}]."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    return -z[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]


# -- a model that has the circuit, in seconds ---------------------------------------------


def segment_batch(
    gen: torch.Generator, size: int, n_vocab: int, n_ctx: int
) -> tuple[Tensor, Tensor]:
    """[size, n_ctx] sequences: random tokens, then a segment of 2 … n_ctx/2 distinct tokens
    twice; targets are −1 (no loss) except inside the second copy, where only induction
    predicts the next token (the segment's length and place vary, so no offset does)."""
    xs, ys = [], []
    for _ in range(size):
        m = int(torch.randint(2, n_ctx // 2 + 1, (), generator=gen))
        seg = torch.randperm(n_vocab, generator=gen)[:m]
        x = torch.cat([torch.randint(0, n_vocab, (n_ctx - 2 * m,), generator=gen), seg, seg])
        y = torch.cat([x[1:], torch.tensor([-1])])
        y[: n_ctx - m] = -1
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


def train_synthetic(
    steps: int = 300, *, seed: int = 0, n_vocab: int = 32, n_ctx: int = 16, d_model: int = 64
) -> GPT:
    """A 2-layer, 2-head attention-only GPT trained on :func:`segment_batch` (AdamW, 32
    sequences a step; a few seconds on one core for 300 steps). Token and position
    embeddings start N(0, 1) and the unembedding is untied: from GPT-2's 0.02 the run sits
    on a plateau for thousands of steps."""
    cfg = GPTConfig(
        n_vocab=n_vocab,
        n_ctx=n_ctx,
        d_model=d_model,
        n_layers=2,
        n_heads=2,
        attn_only=True,
        tie_embeddings=False,
    )
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        model.embed.W_E.normal_(0.0, 1.0)
        model.pos_embed.W_P.normal_(0.0, 1.0)  # type: ignore[union-attr]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(steps):
        x, y = segment_batch(gen, 32, n_vocab, n_ctx)
        _, loss = model(x, targets=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()
