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

:func:`run_induction_study` writes each figure as a PNG (drawn by the ``induction_*_figure``
functions of :mod:`glassgpt.inspect.figures`) and every number in ``results.json``. A model
that has the circuit in a few hundred steps: :func:`glassgpt.train.synthetic.train_synthetic`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.ablation import run_ablated
from glassgpt.inspect.cache import evaluating, run_with_cache
from glassgpt.inspect.circuits import composition_scores
from glassgpt.inspect.figures import (
    induction_ablation_figure,
    induction_composition_figure,
    induction_patching_figure,
    induction_path_figure,
    induction_positions_figure,
    induction_scores_figure,
)
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
        logp = z[:, :, pos].log_softmax(-1)  # [N, B, P, n_vocab]
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
        figures["head-scores.png"] = induction_scores_figure(scores, pair)

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


def summary(r: dict[str, Any]) -> str:
    """A few lines of :func:`run_induction_study`'s results: the pair, its scores and what
    each intervention found."""
    (l1, h1), (l2, h2) = r["heads"]["previous_token"], r["heads"]["induction"]
    k = r["composition"]["k"]
    lines = [
        f"previous-token head L{l1}H{h1} (score {r['head_scores']['previous_token'][l1][h1]:.2f}), "
        f"induction head L{l2}H{h2} (score {r['head_scores']['induction'][l2][h2]:.2f})",
        f"loss on r r: first copy {r['loss']['first_half']:.2f}, repeated copy "
        f"{r['loss']['second_half']:.2f} nats",
        f"K-composition L{l1}H{h1} → L{l2}H{h2}: {k['pair']:.3f} (random matrices "
        f"{k['random_mean']:.3f} ± {k['random_std']:.3f})",
    ]
    gap = r["patching_metric"]["gap"]
    if gap < 1.0:
        lines.append(
            f"note: the clean run predicts the repeated tokens only {gap:.2f} nats better than "
            "the corrupted one: there is little induction to localise, and the normalised "
            "patching and ablation shares below are dominated by noise"
        )
    a = r["activation_patching"]
    if "pair" in a:
        lines.append(
            f"activation patching (z, all positions): previous-token {a['pair']['previous_token']:.2f}, "
            f"induction {a['pair']['induction']:.2f}, best other head {a['best_other_head']:.2f}"
        )
    p = r["path_patching"]
    if "k" in p:
        lines.append(
            f"path patching L{l1}H{h1} → L{l2}H{h2}: q {p['q']:.2f}, k {p['k']:.2f}, v {p['v']:.2f}"
        )
    b = r["ablation"].get("mean")
    if b:
        lines.append(
            "share of the in-context loss drop kept (mean ablation): pair ablated "
            f"{b['pair ablated']['drop_kept']:.0%}, only the pair kept "
            f"{b['only the pair kept']['drop_kept']:.0%}"
        )
    return "\n".join(lines)


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
    figures["composition.png"] = induction_composition_figure(k, out, pair)
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
    figures["patching-heads.png"] = induction_patching_figure(heads, keys, pair)
    figures["patching-positions.png"] = induction_positions_figure(by_pos, pair, n)
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
    figures["path-patching.png"] = induction_path_figure(out, pair)
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
    figures["ablation.png"] = induction_ablation_figure(out["mean"], out["zero"], pair)
    return out


def token_losses(logits: Tensor, tokens: Tensor) -> Tensor:
    """[B, T − 1]: −log softmax(z_t)[tokens_{t+1}]."""
    z = logits if logits.dtype == torch.float64 else logits.float()
    return -z[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
