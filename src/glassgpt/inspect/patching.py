"""Activation patching: the metric of the corrupted run with one clean activation put in.

    value[cell] = m( f(x_corrupted | a_cell ← a_cell(x_clean)) )

for every cell of a sweep: a layer × position of the residual stream or a sublayer's output
(``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``), a layer × head
(× position) of a head's ``z`` (its output), ``q``, ``k``, ``v`` or attention ``pattern``
(× destination (× source) position). The names, argument order and output shapes are
TransformerLens 4.3's (``get_act_patch_resid_pre(model, corrupted_tokens, clean_cache,
patching_metric)``…), so a notebook ports by changing its import; ``clean_cache`` is
glassgpt's :class:`~glassgpt.inspect.cache.ActivationCache` and ``patching_metric`` any
function of the logits [B, T, n_vocab] → 0-d (a :class:`~glassgpt.inspect.metrics.Metric`
scores many runs in one call).

What the code adds: a sweep is not one forward per cell. A patch at layer l that first
changes position p changes nothing below l and nothing before p (causality), so each
patched run starts from the corrupted residual stream at layer l, computes positions
p … T − 1 only, reads the corrupted run's keys and values at positions < p (a KV prefix,
RoPE at its offset), and takes the corrupted logits at positions < p. Cells sharing p run
as one batch, whose rows join at their own layer; batches are split to fit memory. A cell
whose clean and corrupted values are equal is the corrupted run itself. A metric that reads
one position r (``metric.pos``; ``logit_diff``, ``logprob``) stops the runs at r, runs the
last block at r alone and gets the logits at r alone (of its ids alone, ``metric.ids``):
see ``glassgpt.inspect.patch_rows``. The values equal an explicit loop of
``run_with_hooks(model, corrupted, {name: patch_hook(...)})``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import ActivationCache, as_batch, evaluating
from glassgpt.inspect.metrics import MetricFn, score_runs
from glassgpt.inspect.patch_rows import (
    Cell,
    CorruptedRun,
    read_position,
    rows_that_fit,
    run_rows,
)
from glassgpt.model import GPT

# site → (name inside a block, axis of the position in the activation without its batch axis)
SITES: dict[str, tuple[str, int]] = {
    "resid_pre": ("resid_pre", 0),
    "resid_mid": ("resid_mid", 0),
    "resid_post": ("resid_post", 0),
    "attn_out": ("attn_out", 0),
    "mlp_out": ("mlp_out", 0),
    "z": ("attn.z", 0),
    "q": ("attn.q", 0),
    "k": ("attn.k", 0),
    "v": ("attn.v", 0),
    "pattern": ("attn.pattern", 1),
}
HEAD_SITES = ("z", "q", "k", "v", "pattern")
# by → the axes of the result after the layer, for vector sites / head vectors / the pattern
BYS: dict[str, tuple[str, ...]] = {
    "layer": (),
    "layer_pos": ("pos",),
    "layer_head": ("head",),
    "layer_pos_head": ("pos", "head"),
    "layer_head_pos": ("head", "pos"),
    "layer_head_dest_src": ("head", "dest", "src"),
}
_ALLOWED = {
    "vector": ("layer", "layer_pos"),
    "head": ("layer", "layer_head", "layer_pos_head", "layer_head_pos"),
    "pattern": ("layer", "layer_head", "layer_pos_head", "layer_head_pos", "layer_head_dest_src"),
}


def activation_patch(
    model: GPT,
    corrupted_tokens: Tensor | Sequence[int],
    clean_cache: ActivationCache,
    metric: MetricFn,
    site: str,
    *,
    by: str = "layer_pos",
    batch_size: int | None = None,
) -> Tensor:
    """The metric of the corrupted run with ``site`` patched from ``clean_cache``, cell by cell.

    ``site``: resid_pre, resid_mid, resid_post, attn_out, mlp_out (vectors [B, T, d_model]),
    z, q, k, v (head vectors [B, T, H, d_head]) or pattern ([B, H, T_dest, T_src]).
    ``by`` names the result's axes in order: ``layer`` [L] (the whole activation),
    ``layer_pos`` [L, T], ``layer_head`` [L, H], ``layer_pos_head`` [L, T, H],
    ``layer_head_pos`` [L, H, T] (T the destination for the pattern),
    ``layer_head_dest_src`` [L, H, T, T] (pattern only); for k and v the head axis counts
    the G = n_kv_heads key/value heads (a grouped-query model's k and v are per group, each
    read by H/G query heads). ``batch_size``: patched runs per
    batch (default: as many as fit in a quarter of the free memory).

    >>> from glassgpt.model import GPTConfig
    >>> from glassgpt.inspect.cache import run_with_cache
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> _, clean = run_with_cache(model, [1, 2, 3], ["resid_pre"])
    >>> activation_patch(model, [1, 5, 3], clean, lambda z: z[0, -1, 0], "resid_pre").shape
    torch.Size([2, 3])
    """
    if site not in SITES:
        raise GlassError(f"unknown patching site {site!r}; one of {', '.join(SITES)}")
    kind = "pattern" if site == "pattern" else "head" if site in HEAD_SITES else "vector"
    if by not in _ALLOWED[kind]:
        raise GlassError(
            f"by={by!r} does not apply to {site!r}; one of {', '.join(_ALLOWED[kind])}"
        )
    if site == "mlp_out" and model.config.attn_only:
        raise GlassError("site 'mlp_out': this model is attention-only (it has no MLP)")
    if site == "resid_mid" and model.config.parallel_residual:
        raise GlassError(
            "site 'resid_mid': this model's blocks are parallel (x + Attn(N₁x) + MLP(N₂x)), "
            "so there is no residual stream between attention and MLP; patch resid_pre"
        )
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise GlassError(f"batch_size must be a positive integer, got {batch_size!r}")
    tokens = as_batch(model, corrupted_tokens)
    name, pos_axis = SITES[site]
    L = model.config.n_layers
    clean = [_cached(clean_cache, f"blocks.{layer}.{name}", site) for layer in range(L)]
    _check_lengths(clean[0], tokens, pos_axis)
    with evaluating(model), torch.no_grad():
        run = CorruptedRun(model, tokens, name)
        heads = model.config.kv_heads if site in ("k", "v") else model.config.n_heads
        shape, cells = _cells(by, L, heads, tokens.shape[1], clean, run.site, pos_axis)
        values = _sweep(model, run, cells, name, pos_axis, clean, metric, batch_size)
    return values.reshape(shape)


def _cached(cache: ActivationCache, name: str, site: str) -> Tensor:
    if not isinstance(cache, ActivationCache):
        raise GlassError(f"clean_cache must be an ActivationCache, got {type(cache).__name__}")
    if name not in set(cache):  # (the cache raises its own error on a miss)
        wanted = SITES[site][0]
        raise GlassError(
            f"clean_cache lacks {name!r}: cache it with "
            f"run_with_cache(model, clean_tokens, names=[{wanted!r}])"
        )
    return cache[name]


def _check_lengths(clean: Tensor, tokens: Tensor, pos_axis: int) -> None:
    T_clean, T = clean.shape[pos_axis + 1], tokens.shape[1]
    if T_clean != T:
        raise GlassError(
            f"the clean prompt has {T_clean} tokens and the corrupted one {T}: "
            "patching needs prompts of the same length"
        )
    if clean.shape[0] != tokens.shape[0]:
        raise GlassError(
            f"the clean cache holds {clean.shape[0]} prompts and the corrupted tokens "
            f"{tokens.shape[0]}: patching needs the same number"
        )


def _cells(
    by: str, L: int, H: int, T: int, clean: list[Tensor], corrupt: list[Tensor], pos_axis: int
) -> tuple[tuple[int, ...], list[Cell]]:
    """The result's shape and its cells in row-major order, each with its first changed position."""
    axes = BYS[by]
    sizes = {"pos": T, "head": H, "dest": T, "src": T}
    shape = (L, *(sizes[a] for a in axes))
    cells: list[Cell] = []
    for layer in range(L):
        changed = clean[layer] != corrupt[layer]  # bool, the activation's shape
        for idx in _product([sizes[a] for a in axes]):
            where = dict(zip(axes, idx, strict=True))
            index = _index(where, pos_axis)
            cells.append(Cell(layer, index, _first_change(changed, index, pos_axis)))
    return shape, cells


def _product(sizes: list[int]) -> Iterator[tuple[int, ...]]:
    if not sizes:
        yield ()
        return
    for i in range(sizes[0]):
        for rest in _product(sizes[1:]):
            yield (i, *rest)


def _index(where: dict[str, int], pos_axis: int) -> tuple[Any, ...]:
    """The patched part of an activation (batch axis excluded) for one cell."""
    everything = slice(None)
    pos = where.get("pos", where.get("dest", everything))
    if pos_axis == 0:  # [T, ...] or [T, H, d_head]
        return (pos,) if "head" not in where else (pos, where["head"])
    head = where.get("head", everything)  # the pattern [H, T_dest, T_src]
    return (head, pos, where.get("src", everything))


def _first_change(changed: Tensor, index: tuple[Any, ...], pos_axis: int) -> int | None:
    """The first position whose patched values differ between the two runs (None: none)."""
    pos = index[pos_axis]
    widened = [slice(i, i + 1) if isinstance(i, int) else i for i in index]
    part = changed[(slice(None), *widened)]  # every axis kept: the position at pos_axis + 1
    hits = part.any(dim=[d for d in range(part.ndim) if d != pos_axis + 1])
    nz = torch.nonzero(hits)
    if nz.numel() == 0:
        return None
    return int(nz[0, 0]) + (pos if isinstance(pos, int) else 0)


def _sweep(
    model: GPT,
    run: CorruptedRun,
    cells: list[Cell],
    name: str,
    pos_axis: int,
    clean: list[Tensor],
    metric: MetricFn,
    batch_size: int | None,
) -> Tensor:
    """Every cell's metric [n_cells]: cells that change nothing the metric reads score the
    corrupted run, the others run in batches of equal first position."""
    base = score_runs(metric, run.logits[None])[0]
    values = [base] * len(cells)
    B, T = run.tokens.shape
    read = read_position(metric, T)
    groups: dict[int, list[int]] = {}
    for i, cell in enumerate(cells):
        if cell.start is not None and (read is None or cell.start <= read):
            groups.setdefault(cell.start, []).append(i)
    stop = T if read is None else read + 1
    for start, members in sorted(groups.items()):
        members.sort(key=lambda i: cells[i].layer)
        size = batch_size or rows_that_fit(model, B, T, stop - start, None if read is None else 1)
        for lo in range(0, len(members), size):
            chunk = members[lo : lo + size]
            scores = run_rows(model, run, [cells[i] for i in chunk], start, read, name, pos_axis,
                              clean, metric)  # fmt: skip
            for i, s in zip(chunk, scores, strict=True):
                values[i] = s
    return torch.stack(values)


# -- TransformerLens's names ---------------------------------------------------------------


def _tl(site: str, by: str, doc: str) -> Callable[..., Tensor]:
    def patch(
        model: GPT,
        corrupted_tokens: Tensor,
        clean_cache: ActivationCache,
        patching_metric: MetricFn,
        *,
        batch_size: int | None = None,
    ) -> Tensor:
        return activation_patch(model, corrupted_tokens, clean_cache, patching_metric, site,
                                by=by, batch_size=batch_size)  # fmt: skip

    patch.__doc__ = doc + f"\n\n    ``activation_patch(..., {site!r}, by={by!r})``."
    return patch


def _named(**fns: Callable[..., Tensor]) -> None:
    for name, fn in fns.items():
        fn.__name__ = fn.__qualname__ = name


get_act_patch_resid_pre = _tl("resid_pre", "layer_pos", "The residual stream entering each block, by layer × position → [L, T].")  # fmt: skip
get_act_patch_resid_mid = _tl("resid_mid", "layer_pos", "The residual stream between attention and MLP → [L, T].")  # fmt: skip
get_act_patch_attn_out = _tl("attn_out", "layer_pos", "Each attention layer's output → [L, T].")  # fmt: skip
get_act_patch_mlp_out = _tl("mlp_out", "layer_pos", "Each MLP's output → [L, T].")
get_act_patch_attn_head_out_by_pos = _tl("z", "layer_pos_head", "Each head's output z by position → [L, T, H].")  # fmt: skip
get_act_patch_attn_head_q_by_pos = _tl("q", "layer_pos_head", "Each head's queries by position → [L, T, H].")  # fmt: skip
get_act_patch_attn_head_k_by_pos = _tl("k", "layer_pos_head", "Each key/value head's keys by position → [L, T, G].")  # fmt: skip
get_act_patch_attn_head_v_by_pos = _tl("v", "layer_pos_head", "Each key/value head's values by position → [L, T, G].")  # fmt: skip
get_act_patch_attn_head_pattern_by_pos = _tl("pattern", "layer_head_pos", "Each head's pattern by destination → [L, H, T].")  # fmt: skip
get_act_patch_attn_head_pattern_dest_src_pos = _tl("pattern", "layer_head_dest_src", "Each head's pattern entry → [L, H, T, T].")  # fmt: skip
get_act_patch_attn_head_out_all_pos = _tl("z", "layer_head", "Each head's output z at every position → [L, H].")  # fmt: skip
get_act_patch_attn_head_q_all_pos = _tl("q", "layer_head", "Each head's queries at every position → [L, H].")  # fmt: skip
get_act_patch_attn_head_k_all_pos = _tl("k", "layer_head", "Each key/value head's keys at every position → [L, G].")  # fmt: skip
get_act_patch_attn_head_v_all_pos = _tl("v", "layer_head", "Each key/value head's values at every position → [L, G].")  # fmt: skip
get_act_patch_attn_head_pattern_all_pos = _tl("pattern", "layer_head", "Each head's whole pattern → [L, H].")  # fmt: skip


def get_act_patch_block_every(
    model: GPT, corrupted_tokens: Tensor, clean_cache: ActivationCache, metric: MetricFn,
    *, batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """resid_pre, attn_out and mlp_out by layer × position, stacked → [3, L, T]."""
    sites = ("resid_pre", "attn_out", "mlp_out")
    return torch.stack([activation_patch(model, corrupted_tokens, clean_cache, metric, s,
                                         by="layer_pos", batch_size=batch_size) for s in sites])  # fmt: skip


def get_act_patch_attn_head_all_pos_every(
    model: GPT, corrupted_tokens: Tensor, clean_cache: ActivationCache, metric: MetricFn,
    *, batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """Each head's output, queries, keys, values and pattern at every position → [5, L, H]
    (grouped-query: head h's keys and values are its group's, the group's value repeated)."""
    return torch.stack([_per_query_head(model, s, activation_patch(
        model, corrupted_tokens, clean_cache, metric, s, by="layer_head", batch_size=batch_size))
        for s in HEAD_SITES])  # fmt: skip


def get_act_patch_attn_head_by_pos_every(
    model: GPT, corrupted_tokens: Tensor, clean_cache: ActivationCache, metric: MetricFn,
    *, batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """Each head's output, queries, keys, values (by position) and pattern (by destination)
    → [5, L, T, H] (grouped-query: as in get_act_patch_attn_head_all_pos_every)."""
    return torch.stack([_per_query_head(model, s, activation_patch(
        model, corrupted_tokens, clean_cache, metric, s, by="layer_pos_head",
        batch_size=batch_size)) for s in HEAD_SITES])  # fmt: skip


def _per_query_head(model: GPT, site: str, values: Tensor) -> Tensor:
    """k or v values over the G key/value heads (last axis) repeated for the H/G query heads
    that read each; other sites as they are."""
    if site not in ("k", "v"):
        return values
    return values.repeat_interleave(model.config.n_heads // model.config.kv_heads, -1)


_named(**{n: f for n, f in list(globals().items()) if n.startswith("get_act_patch_") and f.__name__ == "patch"})  # fmt: skip
