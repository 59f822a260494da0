"""Attribution patching: activation patching to first order, for every node at once (every
edge: ``glassgpt.inspect.edges``).

Node level (Nanda 2023, "Attribution patching"). Patching node a's clean value into the
corrupted run changes the metric by

    m(corrupted with a ← a_clean) − m(corrupted)  ≈  ∂m/∂a |_corrupted · (a_clean − a_corrupted)

(Taylor, error O(‖a_clean − a_corrupted‖²)). One run of the corrupted prompt with autograd
and one backward pass give ∂m/∂a for every node; the clean values come from a run of the
clean prompt without autograd (stopped at the last site) or from a clean cache.

Direction (as TransformerLens): the base run is the corrupted one, clean values are patched
in. Scores are in the model's dtype (a bfloat16 or float16 model's in float32: its gradients
and differences are multiplied and summed in float32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.attribution_suffix import Pairs, first_difference, suffix_run
from glassgpt.inspect.cache import (
    ActivationCache,
    HookFn,
    as_batch,
    evaluating,
    resolve_names,
    run_to_cache,
    run_with_cache,
)
from glassgpt.inspect.metrics import Metric
from glassgpt.inspect.patch_rows import read_position, score_at
from glassgpt.model import GPT

MetricFn = Callable[[Tensor], Tensor]
NODE_SITES = ("resid_pre", "attn.z", "mlp_out")
# Sites the fast path reads past (their hook sees a side computation): an alias returned by
# the hook puts the recorded tensor on the path to the logits, so it receives a gradient.
_ALIASED = ("attn.result", "attn.pattern", "attn.attn_scores", "scale")
# Sites scored per entry (a neuron, a query-key pair); the others sum their last axis, one
# feature vector (d_model, d_head, or the norm's scale [1]).
_PER_NEURON = ("mlp.pre", "mlp.pre_gate", "mlp.post")
_PER_PATTERN = ("attn.pattern", "attn.attn_scores")


def attribution_patch(
    model: GPT,
    clean_tokens: Tensor | Sequence[int],
    corrupted_tokens: Tensor | Sequence[int],
    metric: MetricFn,
    sites: Sequence[str] = NODE_SITES,
    *,
    clean_cache: ActivationCache | None = None,
) -> dict[str, Tensor]:
    """∂m/∂a |_corrupted · (a_clean − a_corrupted) for every node of each site, every layer.

    Summed over the prompts (the metric averages them) and over the feature axis:
    ``resid_pre``/``resid_mid``/``resid_post``/``attn_out``/``mlp_out``/``ln*.scale`` →
    [n_layers, T]; ``attn.q|k|v|z|result`` → [n_layers, T, n_heads] (k, v: n_kv_heads; all positions:
    ``.sum(1)`` → [n_layers, n_heads]); ``mlp.pre|post`` → [n_layers, T, d_mlp] (neurons);
    ``attn.pattern`` → [n_layers, n_heads, T_q, T_k]; sites outside the blocks (``embed``,
    ``ln_final.out``) → [T]. A site named with its layer (``blocks.1.attn.z``) is computed
    for every layer. Costs a forward pass of the clean prompt without autograd, stopped at
    the last site (none, given ``clean_cache``), one of the corrupted prompt with autograd,
    and one backward pass from the metric to the sites.

    Shared prefix: when the metric reads one position r (``logit_diff``, ``logprob``), no
    ``clean_cache`` is given and every site is in the blocks with positions on axis 1 (not
    ``attn.pattern``/``attn_scores``), the clean run covers positions 0 … r and the
    corrupted run starts at p, the first position where any clean prompt differs from its
    corrupted one (IOI's name swaps: the first name), reading the clean run's keys and
    values below p; the last block runs at r alone past its keys and values. Positions
    before p (equal values in both runs) and after r (no path to the metric) score 0, as
    they do in the full computation. Prompts that differ at position 0 share nothing; the
    same path then only skips what follows r. See ``glassgpt.inspect.attribution_suffix``.

    >>> from glassgpt.model import GPTConfig
    >>> from glassgpt.inspect.metrics import logit_diff
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> out = attribution_patch(model, [1, 2, 3], [1, 4, 3], logit_diff(5, 6))
    >>> {k: tuple(v.shape) for k, v in out.items()}
    {'resid_pre': (2, 3), 'attn.z': (2, 3, 2), 'mlp_out': (2, 3)}
    """
    clean, corrupted = _pair_batches(model, clean_tokens, corrupted_tokens)
    if tuple(sites) == NODE_SITES and model.config.attn_only:
        sites = NODE_SITES[:2]
    site_names = _sites(model, sites)
    names = [n for group in site_names.values() for n in group]
    aliases: dict[str, HookFn] = {n: _alias for n in names if n.endswith(_ALIASED)}
    aliases["embed"] = _root(aliases.get("embed"))
    read = read_position(metric, clean.shape[1])
    start = first_difference(clean, corrupted)
    if (
        clean_cache is None
        and read is not None
        and start <= read
        and all(n.startswith("blocks.") and not n.endswith(_PER_PATTERN) for n in names)
    ):
        with evaluating(model), _weights_frozen(model):
            value, pairs = suffix_run(
                model, clean, corrupted, cast(Metric, metric), names, aliases, read, start
            )
            return _scored(site_names, pairs, _scalar(value), clean.shape)
    with evaluating(model), _weights_frozen(model):
        if clean_cache is None:  # the clean values alone: no autograd, no unembedding
            clean_cache = run_to_cache(model, clean, names)
        value, cache = _corrupted_run(model, corrupted, names, aliases, metric)
        acts = [cache[n] for n in names]
        grads = dict(zip(names, _grads(value, acts), strict=True))
    out: dict[str, Tensor] = {}
    for site, group in site_names.items():
        per_layer = []
        for name in group:
            a_clean, a_corrupt, g = _cached(clean_cache, name), cache[name], grads[name]
            if a_clean.shape != a_corrupt.shape:
                raise GlassError(
                    f"the clean cache's {name!r} is {tuple(a_clean.shape)}, the corrupted "
                    f"run's {tuple(a_corrupt.shape)}"
                )
            dtype = _derived(g.dtype)
            diff = a_clean.detach().to(dtype) - a_corrupt.detach().to(dtype)
            if site in _PER_PATTERN:  # masked scores are −∞ in both runs
                diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
            per_layer.append(_reduce(site, g.to(dtype) * diff))
        stacked = torch.stack(per_layer)
        out[site] = stacked if group[0].startswith("blocks.") else stacked[0]
    return out


def _corrupted_run(
    model: GPT, corrupted: Tensor, names: list[str], hooks: dict[str, HookFn], metric: MetricFn
) -> tuple[Tensor, ActivationCache]:
    """(m(corrupted), its cache with autograd). A metric that reads one position's logits
    (``Metric.at``) gets them alone, from the last block's output there: the unembedding of
    the other positions, and its backward, are never computed."""
    read = read_position(metric, corrupted.shape[1])
    final = f"blocks.{model.config.n_layers - 1}.resid_post"
    order = model.hook_names()
    if read is None or any(order.index(n) > order.index(final) for n in names):
        logits, cache = run_with_cache(model, corrupted, names, hooks=hooks, detach=False, grad=True)  # fmt: skip
        return _scalar(metric(logits)), cache
    cache = run_to_cache(model, corrupted, [*names, final], hooks=hooks, detach=False, grad=True)
    with torch.enable_grad():
        x = cache[final][:, read]  # [B, d_model]
        if model.ln_final is not None:
            x = model.ln_final(x)
        value = score_at(model, x, cast(Metric, metric), 1, corrupted.shape[0])[0]
    return _scalar(value), cache


def _scored(
    site_names: dict[str, list[str]], pairs: Pairs, value: Tensor, shape: torch.Size
) -> dict[str, Tensor]:
    """The scores of :func:`attribution_patch` from a shared-prefix run's activations (clean
    rows first), 0 at the positions they lack."""
    T = shape[1]
    names = [n for group in site_names.values() for n in group]
    acts = [a for n in names for _, _, a in pairs[n]]
    grads = iter(_grads(value, acts))
    out: dict[str, Tensor] = {}
    for site, group in site_names.items():
        per_layer = []
        for name in group:
            scores: Tensor | None = None
            for lo, a_clean, a_corrupt in pairs[name]:
                g = next(grads)
                dtype = _derived(g.dtype)
                diff = a_clean.to(dtype) - a_corrupt.detach().to(dtype)
                part = _reduce(site, g.to(dtype) * diff)  # [t, ...]
                if scores is None:
                    scores = part.new_zeros(T, *part.shape[1:])
                scores[lo : lo + part.shape[0]] = part
            assert scores is not None
            per_layer.append(scores)
        out[site] = torch.stack(per_layer)
    return out


# -- helpers ---------------------------------------------------------------------------------
def _derived(dtype: torch.dtype) -> torch.dtype:
    """Scores of a half-precision model are formed in float32; others in the model's dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _alias(t: Tensor, name: str) -> Tensor:
    return t.view_as(t)


@contextmanager
def _weights_frozen(model: GPT) -> Iterator[None]:
    """The parameters without gradients for the block, so the backward pass computes ∂m/∂a
    for the activations only: no ∂m/∂W, which would read every weight matrix a second time."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _root(fn: HookFn | None) -> HookFn:
    """A hook on ``embed`` (after ``fn``, if any) that makes the embeddings the root of the
    autograd graph, the weights being frozen (:func:`_weights_frozen`)."""

    def hook(t: Tensor, name: str) -> Tensor:
        out = None if fn is None else fn(t, name)
        return (t if out is None else out).detach().requires_grad_(True)

    return hook


def _pair_batches(
    model: GPT, clean_tokens: Tensor | Sequence[int], corrupted_tokens: Tensor | Sequence[int]
) -> tuple[Tensor, Tensor]:
    clean, corrupted = as_batch(model, clean_tokens), as_batch(model, corrupted_tokens)
    if clean.shape != corrupted.shape:
        raise GlassError(
            f"clean tokens {tuple(clean.shape)} and corrupted tokens {tuple(corrupted.shape)} "
            "must have the same shape"
        )
    return clean, corrupted


def _sites(model: GPT, sites: Sequence[str]) -> dict[str, list[str]]:
    """{site: its names in every layer (or the one name outside the blocks)}."""
    if isinstance(sites, str):
        sites = [sites]
    out: dict[str, list[str]] = {}
    for name in resolve_names(model, list(sites)):
        parts = name.split(".")
        site = ".".join(parts[2:]) if parts[0] == "blocks" else name
        if site not in out:
            out[site] = resolve_names(model, site) if parts[0] == "blocks" else [name]
    return out


def _cached(cache: ActivationCache, name: str) -> Tensor:
    if name not in set(cache):
        raise GlassError(f"the clean cache lacks {name!r}: cache it (run_with_cache names)")
    return cache[name].detach()


def _scalar(value: Tensor) -> Tensor:
    if not isinstance(value, Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise GlassError(f"the metric must return one number (a 0-d tensor), got {shape}")
    if not value.requires_grad:
        raise GlassError("the metric's value does not depend on the logits through autograd")
    return value.reshape(())


def _grads(value: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    grads = torch.autograd.grad(value, inputs, allow_unused=True)
    return [torch.zeros_like(a) if g is None else g for a, g in zip(inputs, grads, strict=True)]


def _reduce(site: str, prod: Tensor) -> Tensor:
    """Σ over prompts (and the feature axis, where the site has one)."""
    prod = prod.sum(0)
    if site.endswith(_PER_NEURON) or site in _PER_PATTERN:
        return prod
    return prod.sum(-1)
