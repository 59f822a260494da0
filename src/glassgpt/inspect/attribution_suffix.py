"""Attribution patching of a prompt pair that shares a prefix, read at one position r:

    score(a_t) = ∂m/∂a_t |_corrupted · (a_t(clean) − a_t(corrupted))   = 0 for t < p and t > r

where p is the first position at which any clean prompt differs from its corrupted one. Below
p the two runs compute the same values (causality: a position sees only those before it), so
the difference is 0; past r nothing reaches the metric, so the gradient is 0. What is left:

1. the clean prompt at positions 0 … r, without autograd (the packed no-grad products),
   keeping every layer's keys and values and the sites' values;
2. the corrupted prompt at p … r alone, with autograd and the weights frozen, on the clean
   run's keys and values at 0 … p − 1 (the shared prefix: detached, since nothing at
   t ≥ p changes it);
3. in both, the last block at positions before r up to its keys and values only (its
   attention output and MLP there reach nothing read), then at r alone (the clean run
   stops at its last site there); the corrupted run's logits at r, of the metric's ids;
4. one backward pass from the metric to the corrupted run's recorded activations, over the
   rows p … r only.

Prompts that differ at position 0 have no prefix: steps 1–4 still apply. Why not the clean
and corrupted prompts as one batch (one read of each weight for both): the clean rows
would then be on the graph, and the backward pass computes them too; at a few dozen rows a
row costs about as much as the weight read saved (``bench/patching.py``, docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import cast

import torch
from torch import Tensor

from glassgpt.inspect.cache import HookFn
from glassgpt.inspect.metrics import Metric
from glassgpt.inspect.patch_rows import score_at
from glassgpt.model import GPT
from glassgpt.model.gpt import Block

Segments = dict[str, list[tuple[int, Tensor]]]  # name → [(first position, activation)]
Pairs = dict[str, list[tuple[int, Tensor, Tensor]]]  # name → [(first position, clean, corrupted)]


def first_difference(clean: Tensor, corrupted: Tensor) -> int:
    """The first position at which any clean prompt differs from its corrupted one (T: none).

    >>> first_difference(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 5, 3]]))
    1
    """
    differs = (clean != corrupted).any(0).nonzero()
    return int(differs[0]) if len(differs) else clean.shape[1]


def suffix_run(
    model: GPT, clean: Tensor, corrupted: Tensor, metric: Metric, names: list[str],
    hooks: Mapping[str, HookFn], read: int, start: int,
) -> tuple[Tensor, Pairs]:  # fmt: skip
    """(m(corrupted), {name: [(first position, clean [B, t, ...], corrupted [B, t, ...])]})
    for the block sites ``names`` (position axis 1), the corrupted values on the graph of
    m; the positions a name lacks score 0. The caller freezes the weights; start ≤ read
    (see the module docstring). ``hooks``: the aliases that put side computations on the
    path of the metric, and the root on ``embed``."""
    B = clean.shape[0]
    kept: list[tuple[Tensor, Tensor]] = []  # each layer's clean keys and values
    with torch.no_grad():
        _, clean_parts = _suffix(model, clean[:, : read + 1], 0, None, names, {}, kept)
    prefix = [(k[:, :, :start], v[:, :, :start]) for k, v in kept] if start else None
    with torch.enable_grad():
        x, parts = _suffix(model, corrupted[:, start : read + 1], start, prefix, names, hooks)
        assert x is not None
        if model.ln_final is not None:
            x = model.ln_final(x)
        value = score_at(model, x, metric, 1, B)[0]
    pairs: Pairs = {}
    for n in names:
        pairs[n] = [(lo, _within(clean_parts[n], lo, a.shape[1]), a) for lo, a in parts[n]]
    return value, pairs


def _within(segments: list[tuple[int, Tensor]], lo: int, n: int) -> Tensor:
    """Positions lo … lo + n − 1 of the one segment [B, t, ...] that holds them."""
    for first, a in segments:
        if first <= lo and lo + n <= first + a.shape[1]:
            return a[:, lo - first : lo - first + n]
    raise AssertionError(f"no recorded segment holds positions {lo} … {lo + n - 1}")


class _KV:
    """A layer's KV cache for one call at ``offset``: the prefix's keys and values [rows, G,
    offset, d_head] (None: nothing before), then the new ones, which it keeps in ``kept``
    when given; ``stop`` ends the forward pass there (nothing after them is needed)."""

    def __init__(
        self, prefix: tuple[Tensor, Tensor] | None, offset: int,
        kept: list[tuple[Tensor, Tensor]] | None = None, stop: bool = False,
    ) -> None:  # fmt: skip
        self.offset, self.mask = offset, None
        self._prefix, self._kept, self._stop = prefix, kept, stop

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self._kept is not None:
            self._kept.append((k, v))  # [rows, G, t, d_head]
        if self._stop:
            raise _Done
        if self._prefix is None:
            return k, v
        return torch.cat([self._prefix[0], k], 2), torch.cat([self._prefix[1], v], 2)


class _Cache:
    """The KVCacheProtocol (glassgpt.model.cache) over per-layer views, from ``offset``."""

    last_only = False

    def __init__(self, layers: list[_KV], offset: int) -> None:
        self.layers, self._offset = layers, offset

    def begin(self, B: int, T: int) -> int:
        return self._offset

    def end(self, T: int) -> None:
        pass


class _Done(Exception):
    """Stops a forward pass once what it was run for is kept."""


def _forward(model: GPT, tokens: Tensor, cache: _Cache) -> None:
    """``model(tokens, cache=cache)`` until a hook or a KV view stops it."""
    with suppress(_Done):
        model(tokens, cache=cache)


def _last_block(model: GPT, x: Tensor, kv: _KV) -> Tensor:
    """The last block on x [rows, t, d_model] at positions kv.offset … (RoPE there)."""
    L = model.config.n_layers
    block = cast(Block, model.blocks[L - 1])
    rotary = model.rotary
    if block.kind == "sliding" and model.rotary_local is not None:  # its own base (Gemma)
        rotary = model.rotary_local
    rope = None
    if rotary is not None:
        rope = rotary(x.shape[1], cast(int, kv.offset), dtype=x.dtype, device=x.device)
    return block(x, rope, kv)


def _suffix(
    model: GPT, tokens: Tensor, start: int, prefix: list[tuple[Tensor, Tensor]] | None,
    names: list[str], hooks: Mapping[str, HookFn], kept: list[tuple[Tensor, Tensor]] | None = None,
) -> tuple[Tensor | None, Segments]:  # fmt: skip
    """(the last block's output at the last position [rows, d_model], the recorded
    activations) of positions start … start + t − 1 of ``tokens`` [rows, t]. Given
    ``kept`` (the clean run), it receives each layer's new keys and values [rows, G, ≥ t − 1,
    d_head], and the run stops at its last site (no output)."""
    t = tokens.shape[1]
    L = model.config.n_layers
    last = f"blocks.{L - 1}."
    segments: Segments = {}
    entry: list[Tensor] = []

    def record(name: str, fn: HookFn | None, lo: int) -> HookFn:
        def hook(a: Tensor, _: str) -> Tensor | None:
            out = fn(a, name) if fn is not None else None
            segments.setdefault(name, []).append((lo, a if out is None else out))
            return out

        return hook

    def stop(a: Tensor, _: str) -> None:
        entry.append(a)
        raise _Done

    def hooked(lo: int, in_last: bool) -> dict[str, HookFn]:
        """The hooks of a call below the last block (and the stop at its input) or in it."""
        fns = {n: f for n, f in hooks.items() if n.startswith(last) == in_last}
        for n in names:
            if n.startswith(last) == in_last:
                fns[n] = record(n, hooks.get(n), lo)
        if not in_last:
            fns[f"{last}resid_pre"] = stop
        return fns

    views = [_KV(None if prefix is None else prefix[l], start, kept) for l in range(L)]
    with model.hooks(hooked(start, False)):
        _forward(model, tokens, _Cache(views, start))
    x = entry[0]  # [rows, t, d_model]: the last block's input
    before = None if prefix is None else prefix[-1]
    if t > 1:  # its keys and values at start … r − 1 first
        new: list[tuple[Tensor, Tensor]] = []
        with model.hooks(hooked(start, True)), suppress(_Done):
            _last_block(model, x[:, :-1], _KV(before, start, new, stop=True))
        k, v = new[0]
        if kept is not None:
            kept.append((k, v))
        before = (k, v) if before is None else (torch.cat([before[0], k], 2), torch.cat([before[1], v], 2))  # fmt: skip
    fns = hooked(start + t - 1, True)
    if kept is not None:  # nothing past the last site of the last block
        final = [n for n in model.hook_names() if n in fns and n in names][-1]
        fns[final] = _then(fns[final], _stop)
    with model.hooks(fns), suppress(_Done):
        return _last_block(model, x[:, -1:], _KV(before, start + t - 1))[:, 0], segments
    return None, segments


def _then(first: HookFn, then: HookFn) -> HookFn:
    """``first``, then ``then`` on what it returns (``first``'s result kept)."""

    def hook(a: Tensor, name: str) -> Tensor | None:
        out = first(a, name)
        then(a if out is None else out, name)
        return out

    return hook


def _stop(a: Tensor, name: str) -> None:
    raise _Done
