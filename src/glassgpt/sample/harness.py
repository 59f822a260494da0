"""Scoring continuations for benchmarks: log p(cont | ctx) = Σ_j log softmax(f_θ(ctx ‖ cont_<j))_{cont_j}.

    logprob(ctx, cont) = Σ_{j<m} log p(cont_j | ctx, cont_<j)          m = len(cont)
    greedy(ctx, cont)  = ∀ j: argmax_v p(v | ctx, cont_<j) = cont_j
    rolling(text)      = Σ over windows of logprob(window ctx, window cont)

This is what lm-evaluation-harness asks of a model (``loglikelihood`` and
``loglikelihood_rolling``), computed on glassgpt's own KV cache, in two passes per batch:

1. *prefill*: the distinct contexts of the batch, left-padded into one [G, Tc] tensor, fill
   a KV cache; only the last position is unembedded (``last_only``): it predicts cont_0.
2. *continue*: the cache rows are copied once per continuation of their context
   (``index_select`` over the batch), and the continuations' first m − 1 tokens,
   right-padded into [R, Tk], are run on top of it; they predict cont_1 … cont_{m−1}. Their
   final residuals (``ln_final.out``) are unembedded at the real positions alone.

A multiple-choice item (one context, k endings) thus encodes its context once instead of k
times, and the vocabulary projection (the largest matrix of a small model) runs only where a
log-probability is read: once per context and once per continuation token, never on padding.
Right padding never changes a real position (attention is causal); left padding is hidden by
the cache's mask.

Requests are sorted longest first and packed into batches of at most ``batch_size``
continuations whose padded lengths fit in n_ctx. A request longer than the context is cut
from the left as the harness's HF backend cuts it: the model reads the last n_ctx tokens of
ctx ‖ cont[:-1] (so a continuation of up to n_ctx tokens is scored whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.model.gpt import GPT
from glassgpt.sample.cache import KVCache
from glassgpt.sample.generation import left_pad


def fit_context(ctx: Sequence[int], cont: Sequence[int], n_ctx: int) -> list[int]:
    """The part of ``ctx`` the model reads before ``cont``: ctx ‖ cont keeps its last
    n_ctx + 1 tokens (the last is only predicted), and at least one context token.

    >>> fit_context([1, 2, 3, 4], [5, 6], n_ctx=4)
    [2, 3, 4]
    >>> fit_context([1, 2], [3], n_ctx=8)
    [1, 2]
    """
    if not ctx:
        raise GlassError("a request with an empty context (lm-eval gives the prefix token)")
    if not cont:
        raise GlassError("a request with an empty continuation: nothing to score")
    if len(cont) > n_ctx:
        raise GlassError(f"a continuation of {len(cont)} tokens is longer than n_ctx={n_ctx}")
    keep = n_ctx + 1 - len(cont)
    return list(ctx[-keep:])


def rolling_windows(
    ids: Sequence[int], prefix: int, n_ctx: int
) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) windows that predict every token of ``ids`` exactly once.

    The first window predicts ids[0:n_ctx] after ``prefix``; each later one predicts the
    next ≤ n_ctx tokens after the n_ctx + 1 − m tokens just before them (m of its own), so
    every window but the first reads a full context.

    >>> rolling_windows([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], prefix=99, n_ctx=4)
    [([99], [0, 1, 2, 3]), ([3], [4, 5, 6, 7]), ([5, 6, 7], [8, 9])]
    >>> rolling_windows([], prefix=99, n_ctx=4)
    []
    """
    ids = list(ids)
    if not ids:
        return []
    windows = [([prefix], ids[:n_ctx])]
    for start in range(n_ctx, len(ids), n_ctx):
        end = min(start + n_ctx, len(ids))
        windows.append((ids[end - n_ctx - 1 : start], ids[start:end]))
    return windows


@dataclass(frozen=True)
class _Group:
    """One context and the continuations scored after it (indices into the requests)."""

    ctx: tuple[int, ...]
    members: tuple[int, ...]
    longest: int  # the longest continuation, in tokens


def _groups(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]], n_ctx: int, batch_size: int
) -> list[_Group]:
    """Requests grouped by the context the model reads, longest first; a group holds at
    most ``batch_size`` continuations (a larger one is split, re-reading its context)."""
    by_ctx: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, cont) in enumerate(requests):
        by_ctx.setdefault(tuple(fit_context(ctx, cont, n_ctx)), []).append(i)
    out = []
    for ctx, members in by_ctx.items():
        members.sort(key=lambda i: -len(requests[i][1]))
        for s in range(0, len(members), batch_size):
            part = tuple(members[s : s + batch_size])
            out.append(_Group(ctx, part, len(requests[part[0]][1])))
    out.sort(key=lambda g: (-(len(g.ctx) + g.longest), g.ctx))
    return out


def _batches(groups: list[_Group], n_ctx: int, batch_size: int) -> list[list[_Group]]:
    """Consecutive groups packed while the continuations number ≤ batch_size and the padded
    context + continuation fits n_ctx (groups come longest first)."""
    out: list[list[_Group]] = []
    rows = ctx_len = cont_len = 0
    for g in groups:
        c, k = max(ctx_len, len(g.ctx)), max(cont_len, g.longest)
        if out and rows + len(g.members) <= batch_size and c + k - 1 <= n_ctx:
            out[-1].append(g)
            rows, ctx_len, cont_len = rows + len(g.members), c, k
        else:
            out.append([g])
            rows, ctx_len, cont_len = len(g.members), len(g.ctx), g.longest
    return out


def _repeat_rows(cache: KVCache, rows: Tensor, capacity: int) -> KVCache:
    """A cache of len(rows) rows, row r a copy of ``cache``'s row rows[r] (its positions and
    padding), with room for ``capacity`` positions."""
    layer0 = cache.layers[0].k if cache.layers else None
    dtype = layer0.dtype if layer0 is not None else torch.float32
    device = layer0.device if layer0 is not None else None
    pad = cache.pad[rows] if cache.pad is not None else None
    out = KVCache(cache.config, len(rows), capacity, dtype=dtype, device=device, pad=pad)
    n = cache.length
    for src, dst in zip(cache.layers, out.layers, strict=True):
        dst.k[:, :, :n] = src.k.index_select(0, rows)[:, :, :n]
        dst.v[:, :, :n] = src.v.index_select(0, rows)[:, :, :n]
    out.length = n
    return out


def _log_probs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """(log softmax [N, V] in float32, argmax [N]) of logits [N, V]."""
    z = logits.float()
    return z - z.logsumexp(-1, keepdim=True), z.argmax(-1)


def _logits_at(model: GPT, x: Tensor, cache: KVCache, where: Tensor) -> Tensor:
    """logits [P, V] of the positions ``where`` [B, T] of tokens x [B, T] run on ``cache``:
    the final residual is read at ln_final.out, the unembedding then runs on those rows
    alone (a model without a final norm unembeds every position)."""
    if model.ln_final is None:
        return model(x, cache=cache)[where]
    seen: dict[str, Tensor] = {}

    def keep(h: Tensor, name: str) -> Tensor:
        seen[name] = h
        return h[:, :0]  # nothing left to unembed

    with model.hooks({"ln_final.out": keep}):
        model(x, cache=cache)
    h = seen["ln_final.out"][where]  # [P, d_model]
    return model.unembed(h[None], model.embed.W_E)[0]


@torch.inference_mode()
def _score_batch(
    model: GPT, requests: Sequence[tuple[Sequence[int], Sequence[int]]], batch: list[_Group]
) -> list[tuple[int, float, bool]]:
    """(request index, log-probability, greedy) of every continuation in ``batch``."""
    param = next(model.parameters())
    device = param.device
    tokens, pads = left_pad([g.ctx for g in batch], device)  # [G, Tc]
    Tc = tokens.shape[1]
    cache = KVCache.for_model(model, len(batch), Tc, pad=pads, last_only=True)
    first = model(tokens, cache=cache)[:, -1]  # [G, V]: the logits that predict cont_0
    index = [i for g in batch for i in g.members]
    owner = torch.tensor([b for b, g in enumerate(batch) for _ in g.members], device=device)
    conts = [list(requests[i][1]) for i in index]
    m = max(len(c) for c in conts)
    target = torch.tensor([c + [0] * (m - len(c)) for c in conts], device=device)  # [R, m]
    lengths = torch.tensor([len(c) for c in conts], device=device)
    mask = torch.arange(m, device=device)[None, :] < lengths[:, None]  # [R, m]
    lp0, top0 = _log_probs(first)  # per context, then per continuation:
    total = lp0.index_select(0, owner).gather(1, target[:, :1])[:, 0].double()  # [R]
    exact = top0[owner] == target[:, 0]
    if m > 1:
        rest = _repeat_rows(cache, owner, Tc + m - 1)
        x = torch.where(mask[:, 1:], target[:, :-1], 0)  # cont[:-1], right-padded [R, m − 1]
        where = mask[:, 1:]  # the real positions: only these are unembedded
        logits = _logits_at(model, x, rest, where)  # [P, V]: predicts cont_1 … cont_{m−1}
        lp, top = _log_probs(logits)
        t = target[:, 1:][where]  # [P]
        row = torch.arange(len(conts), device=device)[:, None].expand_as(where)[where]  # [P]
        total.index_add_(0, row, lp.gather(1, t[:, None])[:, 0].double())
        exact &= torch.zeros_like(exact).index_add_(0, row, top != t) == 0
    return list(zip(index, total.tolist(), exact.tolist(), strict=True))


def score(
    model: GPT,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = 32,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(log p(cont | ctx), whether greedy decoding gives cont) for each (ctx, cont) pair of
    token ids, in the requests' order; ``progress(n)`` hears each batch's n requests.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=16, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> (lp, _), = score(model, [([1, 2], [3, 4])])
    >>> ref = model(torch.tensor([[1, 2, 3]])).log_softmax(-1)[0]
    >>> abs(lp - float(ref[1, 3] + ref[2, 4])) < 1e-5
    True
    """
    if batch_size < 1:
        raise GlassError(f"--batch-size: must be ≥ 1, got {batch_size}")
    n_ctx = model.config.n_ctx
    out: list[tuple[float, bool] | None] = [None] * len(requests)
    training = model.training
    model.eval()
    try:
        for batch in _batches(_groups(requests, n_ctx, batch_size), n_ctx, batch_size):
            done = _score_batch(model, requests, batch)
            for i, lp, greedy in done:
                out[i] = (lp, bool(greedy))
            if progress is not None:
                progress(len(done))
    finally:
        model.train(training)
    return out  # type: ignore[return-value]
