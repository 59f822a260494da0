"""The patched runs of a sweep, batched: each row is f(x_corrupted | a_cell ← a_cell(x_clean)).

A row patched at layer l, first changing position p, equals the corrupted run below l and
before p (causality). So a batch of rows sharing p computes positions p … s − 1 only, each row
joining at its own layer from the corrupted residual stream there, with the corrupted keys and
values at positions < p as a KV prefix (RoPE at its offset); s = T, or r + 1 when the metric
reads position r alone (later positions cannot reach it). With such a metric the last block
runs twice: its keys and values at p … r − 1 (the block stops there: its attention output and
MLP at those positions reach nothing read), then position r alone; a row joining the last
block above its keys and values (at q, pattern, z or later) takes the corrupted ones. The
logits are then those of position r alone, scored by ``metric.at``. Otherwise the logits are
the corrupted ones before p and the recomputed ones from p on, scored by the metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from glassgpt.inspect.cache import run_with_cache
from glassgpt.inspect.metrics import Metric, MetricFn, score_runs
from glassgpt.model import GPT
from glassgpt.model.gpt import Block
from glassgpt.model.hooks import HookFn
from glassgpt.model.layers import softcap
from glassgpt.train.inputs import available_memory

MEMORY_FRACTION = 0.25  # of the free memory (CPU: MemAvailable; CUDA: free device memory)
KV_INPUTS = ("resid_pre", "attn.k", "attn.v")  # sites that change a block's keys and values


@dataclass(frozen=True)
class Cell:
    """One patched run: the layer, the index of the patch in the activation (no batch
    axis), and the first position it changes (None: it changes nothing)."""

    layer: int
    index: tuple[Any, ...]
    start: int | None


class CorruptedRun:
    """The base run: logits [B, T, n_vocab]; per layer, the residual stream entering the block
    [B, T, d_model], keys and values [B, G, T, d_head] and the patched site's activation."""

    def __init__(self, model: GPT, tokens: Tensor, site_name: str) -> None:
        names = {"resid_pre", "attn.k", "attn.v", site_name}
        logits, cache = run_with_cache(model, tokens, sorted(names))
        L = model.config.n_layers
        self.tokens, self.logits = tokens, logits
        self.resid = [cache[f"blocks.{layer}.resid_pre"] for layer in range(L)]
        self.k = [cache[f"blocks.{layer}.attn.k"].transpose(1, 2) for layer in range(L)]
        self.v = [cache[f"blocks.{layer}.attn.v"].transpose(1, 2) for layer in range(L)]
        self.site = [cache[f"blocks.{layer}.{site_name}"] for layer in range(L)]


def read_position(metric: MetricFn, T: int) -> int | None:
    """The one position in [0, T) whose logits ``metric`` reads (None: it may read any)."""
    if not isinstance(metric, Metric) or metric.at is None or metric.pos is None:
        return None
    pos = metric.pos
    return pos % T if -T <= pos < T else None  # (out of range: the metric says so itself)


class _PrefixKV:
    """A layer's KV cache: the keys and values of the positions before ``offset``, then the
    new ones (the LayerKV protocol)."""

    def __init__(self, k: Tensor, v: Tensor, offset: int) -> None:
        self.offset, self.mask = offset, None
        self._k, self._v = k, v  # [rows·B, G, offset, d_head]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return torch.cat([self._k, k], 2), torch.cat([self._v, v], 2)


class _Stop(Exception):
    """Raised by the hook on a block's values once its keys and values are kept."""


def run_rows(
    model: GPT,
    run: CorruptedRun,
    rows: list[Cell],
    start: int,
    read: int | None,
    name: str,
    pos_axis: int,
    clean: list[Tensor],
    metric: MetricFn,
) -> Tensor:
    """One batch of patched runs from position ``start`` on (rows sorted by layer) → [rows]."""
    B, T = run.tokens.shape
    L = model.config.n_layers
    stop = T if read is None else read + 1
    x: Tensor | None = None
    for layer in range(rows[0].layer, L):
        new = [c for c in rows if c.layer == layer]
        if new:
            fresh = run.resid[layer][:, start:stop].repeat(len(new), 1, 1)  # [new·B, t, d_model]
            x = fresh if x is None else torch.cat([x, fresh])
        assert x is not None
        n = x.shape[0] // B
        patch = _Patch(new, n - len(new), B, name, pos_axis, clean[layer])
        if layer == L - 1 and read is not None and stop - start > 1:
            x = _last_block(model, run, x, start, stop, patch)
        else:
            prefix = (_rows(run.k[layer][:, :, :start], n), _rows(run.v[layer][:, :, :start], n))
            x = _block(model, layer, x, start, prefix, patch.hooks(layer, start, stop))
    assert x is not None
    if model.ln_final is not None:
        x = model.ln_final(x)
    n = len(rows)
    if read is not None:
        return score_at(model, x[:, -1], cast(Metric, metric), n, B)
    part = softcap(model.unembed(x, model.embed.W_E), model.config.final_softcap)  # [n·B, t, V]
    before = run.logits[None, :, :start].expand(n, -1, -1, -1)  # [n, B, start, n_vocab]
    logits = torch.cat([before, part.view(n, B, T - start, -1)], 2)  # [n, B, T, n_vocab]
    return score_runs(metric, logits)


def score_at(model: GPT, x: Tensor, metric: Metric, n: int, B: int) -> Tensor:
    """The metric from the final residual at its position, x [n·B, d_model] → [n]: the logits
    of the ids it reads alone (the others left 0), or all of them."""
    assert metric.at is not None
    ids, cap, V = metric.ids, model.config.final_softcap, model.config.n_vocab
    if ids is not None and (int(ids.min()) < 0 or int(ids.max()) >= V):
        ids = None  # (the metric names the bad id itself)
    if ids is None:
        z = softcap(model.unembed(x, model.embed.W_E), cap)  # [n·B, n_vocab]
    else:
        ids = ids.to(x.device)
        b_U = model.unembed.b_U
        part = x @ model.W_U[:, ids] + (0 if b_U is None else b_U[ids])  # [n·B, ids]
        z = x.new_zeros(x.shape[0], V)
        z[:, ids] = softcap(part, cap)
    return metric.at(z.view(n, B, -1))


def _rows(t: Tensor, n: int) -> Tensor:
    """[B, ...] repeated for n rows → [n·B, ...]."""
    return t.repeat(n, *([1] * (t.ndim - 1)))


def _block(
    model: GPT, layer: int, x: Tensor, offset: int, prefix: tuple[Tensor, Tensor],
    hooks: Mapping[str, HookFn],
) -> Tensor:  # fmt: skip
    """Block ``layer`` on x [rows·B, t, d_model] at positions offset … offset + t − 1."""
    block = cast(Block, model.blocks[layer])
    rotary = model.rotary
    if block.kind == "sliding" and model.rotary_local is not None:  # its own base (Gemma)
        rotary = model.rotary_local
    rope = None
    if rotary is not None:
        rope = rotary(x.shape[1], offset, dtype=x.dtype, device=x.device)
    kv = _PrefixKV(*prefix, offset)
    with model.hooks(hooks):
        return block(x, rope, kv)


def _last_block(
    model: GPT, run: CorruptedRun, x: Tensor, start: int, stop: int, patch: _Patch
) -> Tensor:  # fmt: skip
    """The last block at position stop − 1 alone [rows·B, 1, d_model]: its keys and values at
    start … stop − 2 first (the rows that joined below, or at a site that changes them)."""
    layer = model.config.n_layers - 1
    B = run.tokens.shape[0]
    n = x.shape[0] // B
    m = n if patch.name in KV_INPUTS else patch.first  # rows whose keys/values change here
    k_old, v_old = run.k[layer][:, :, : stop - 1], run.v[layer][:, :, : stop - 1]
    keys, values = [_rows(k_old, n - m)], [_rows(v_old, n - m)]
    if m:
        kept: dict[str, Tensor] = {}
        hooks = dict(patch.hooks(layer, start, stop - 1)) if m == n else {}
        for site in ("attn.k", "attn.v"):
            hooks[f"blocks.{layer}.{site}"] = _keeper(
                kept, site, hooks.get(f"blocks.{layer}.{site}")
            )
        prefix = (_rows(k_old[:, :, :start], m), _rows(v_old[:, :, :start], m))
        with suppress(_Stop):
            _block(model, layer, x[: m * B, :-1], start, prefix, hooks)
        keys.insert(0, torch.cat([prefix[0], kept["attn.k"].transpose(1, 2)], 2))
        values.insert(0, torch.cat([prefix[1], kept["attn.v"].transpose(1, 2)], 2))
    prefix = (torch.cat(keys), torch.cat(values))  # [n·B, G, stop − 1, d_head]
    return _block(model, layer, x[:, -1:], stop - 1, prefix, patch.hooks(layer, stop - 1, stop))


def _keeper(kept: dict[str, Tensor], site: str, patch: HookFn | None) -> HookFn:
    """A hook keeping the (patched) keys or values; the one on the values stops the block."""

    def hook(t: Tensor, name: str) -> Tensor:
        out = t if patch is None else cast(Tensor, patch(t, name))
        kept[site] = out  # [rows·B, t, G, d_head]
        if site == "attn.v":
            raise _Stop
        return out

    return hook


class _Patch:
    """The patch of the rows joining at a layer: ``source`` (the clean activation) put into
    rows first, first + 1, … (one per new cell, B prompts each) at each cell's index."""

    def __init__(
        self, new: list[Cell], first: int, B: int, name: str, pos_axis: int, source: Tensor
    ) -> None:  # fmt: skip
        self.new, self.first, self.B, self.name = new, first, B, name
        self.pos_axis, self.source = pos_axis, source

    def hooks(self, layer: int, lo: int, hi: int) -> dict[str, HookFn]:
        """The hook for a call computing positions lo … hi − 1 (none without new rows)."""
        return {f"blocks.{layer}.{self.name}": self._hook(lo, hi)} if self.new else {}

    def _hook(self, lo: int, hi: int) -> HookFn:
        pos_axis, B = self.pos_axis, self.B
        source = self.source.narrow(pos_axis + 1, lo, hi - lo)  # [B, ..., hi − lo, ...]
        if pos_axis == 1:  # the pattern [B, H, dest, src]: the keys seen are 0 … hi − 1
            source = source[..., :hi]
        plan: list[tuple[slice, tuple[Any, ...]]] = []
        for r, cell in enumerate(self.new):
            index = list(cell.index)
            pos = index[pos_axis]
            if isinstance(pos, int):
                if not lo <= pos < hi:
                    continue  # (a position this call does not compute)
                index[pos_axis] = pos - lo
            if pos_axis == 1 and isinstance(index[2], int) and index[2] >= hi:
                continue  # a key after every query here: masked in both runs
            plan.append((slice((self.first + r) * B, (self.first + r + 1) * B), tuple(index)))

        def hook(act: Tensor, _: str) -> Tensor:
            out = act.clone()
            for rows, index in plan:
                out[(rows, *index)] = source[(slice(None), *index)]
            return out

        return hook


def rows_that_fit(model: GPT, B: int, T: int, t: int, logit_positions: int | None = None) -> int:
    """Patched runs per batch under the memory budget, from an estimate of one run's bytes:
    its logits (``logit_positions``, default all T, and the t recomputed) and a block's
    activations at t positions (q, k, v, z, the MLP's hidden layer, the scores and pattern,
    a few residuals)."""
    c = model.config
    d_mlp = 0 if c.attn_only else cast(int, c.d_mlp)
    ref = model.embed.W_E
    kept = T if logit_positions is None else logit_positions
    per_position = 2 * c.n_vocab + 3 * d_mlp + 12 * c.d_model + 3 * c.n_heads * T
    row = B * (kept * c.n_vocab + t * per_position) * ref.element_size()
    free = available_memory(ref.device) or 2**30  # (unknown: assume 1 GiB)
    return max(1, int(free * MEMORY_FRACTION) // row)
