"""Named activations of one forward pass, and hooks that read or replace them.

    logits, cache = run_with_cache(model, tokens, names)      cache[name] = the activation
    logits = run_with_hooks(model, tokens, {name: fn})       fn(tensor, name) → tensor | None

Everything rides on the model's own hooks (``glassgpt.model.hooks``): the forward pass is the
one that trains and samples, so a cached value is exactly the value the model used, and a
replacing hook (activation patching) changes exactly what follows from it. Nothing is
recorded unless asked, and values the fast path never builds (attention pattern, per-head
results, norm scales) are computed only when named.

Names are the model's (``model.hook_names()``); a query may also be a site without its layer
(``"pattern"``, ``"attn.z"``, ``"resid_post"``: every layer) or a shell pattern
(``"blocks.1.*"``). The model's training/eval mode is left as it is: call ``model.eval()``
first for deterministic activations (the inspect functions do that themselves).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT

HookFn = Callable[[Tensor, str], "Tensor | None"]
NameQuery = str | Iterable[str] | None


def resolve_names(model: GPT, names: NameQuery) -> list[str]:
    """The activation names a query selects, in computation order; unknown queries raise.

    None selects every activation. A query matches a name equal to it, a name ending in
    ``"." + query`` (a site in every layer), or a shell pattern (``*``, ``?``, ``[...]``).
    """
    valid = model.hook_names()
    if names is None:
        return valid
    queries = [names] if isinstance(names, str) else list(names)
    chosen: set[str] = set()
    for query in queries:
        if not isinstance(query, str) or not query:
            raise ConfigError("names", f"activation names must be non-empty strings, got {query!r}")
        hits = [n for n in valid if n == query or n.endswith("." + query)]
        if not hits and any(c in query for c in "*?["):
            hits = fnmatch.filter(valid, query)
        if not hits:
            raise ConfigError(
                "names",
                f"unknown activation {query!r} for this model "
                f"(e.g. {', '.join(valid[:3])}, ...; see model.hook_names())",
            )
        chosen.update(hits)
    return [n for n in valid if n in chosen]


def as_batch(model: GPT, tokens: Tensor | Sequence[int]) -> Tensor:
    """Tokens as an int64 [B, T] tensor on the model's device ([T] becomes [1, T]).

    The model itself checks the ids and the length against n_ctx.
    """
    if not isinstance(tokens, Tensor):
        try:
            tokens = torch.as_tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as e:
            raise GlassError(f"tokens must be a sequence of integer ids: {e}") from None
    if tokens.ndim == 1:
        tokens = tokens[None]
    device = next(model.parameters()).device
    return tokens.to(device=device)


class ActivationCache(Mapping[str, Tensor]):
    """Activations by name, as recorded by :func:`run_with_cache`.

    ``cache[name]`` is the tensor; ``cache[site, layer]`` is ``cache[f"blocks.{layer}.{site}"]``
    (``cache["pattern", 0]``); ``cache.stack(site)`` stacks a site over layers → [n_layers, ...].
    """

    def __init__(self, activations: Mapping[str, Tensor], n_layers: int) -> None:
        self._acts = dict(activations)
        self.n_layers = n_layers

    def __getitem__(self, key: str | tuple[str, int]) -> Tensor:
        if isinstance(key, tuple):
            site, layer = key
            if not 0 <= layer < self.n_layers:
                raise GlassError(f"layer {layer} is out of range (the model has {self.n_layers})")
            key = f"blocks.{layer}.{_site(site)}"
        try:
            return self._acts[key]
        except KeyError:
            raise GlassError(
                f"activation {key!r} is not in this cache (it holds {len(self._acts)}: "
                f"{', '.join(list(self._acts)[:4])}{', ...' if len(self._acts) > 4 else ''})"
            ) from None

    def __contains__(self, key: object) -> bool:  # (Mapping's would raise on a miss)
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
            key = f"blocks.{key[1]}.{_site(key[0])}"
        return key in self._acts

    def __iter__(self) -> Iterator[str]:
        return iter(self._acts)

    def __len__(self) -> int:
        return len(self._acts)

    def stack(self, site: str) -> Tensor:
        """The site in every layer, stacked: [n_layers, *shape]."""
        return torch.stack([self[site, layer] for layer in range(self.n_layers)])

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {', '.join(list(self)[:4])}...)"


_SHORT_SITES = {
    "q": "attn.q",
    "k": "attn.k",
    "v": "attn.v",
    "z": "attn.z",
    "attn_scores": "attn.attn_scores",
    "pattern": "attn.pattern",
    "result": "attn.result",
}


def _site(site: str) -> str:
    return _SHORT_SITES.get(site, site)


def run_with_cache(
    model: GPT,
    tokens: Tensor | Sequence[int],
    names: NameQuery = None,
    *,
    hooks: Mapping[str, HookFn] | None = None,
    detach: bool = True,
    grad: bool = False,
) -> tuple[Tensor, ActivationCache]:
    """Run ``model`` on ``tokens`` and record the named activations.

    ``names``: see :func:`resolve_names` (None: all). ``hooks``: replacing hooks applied
    before recording (the cache then holds the replaced value). ``grad``: keep autograd on
    (e.g. for attribution by gradients); ``detach`` then decides whether cached tensors keep
    their graph. Returns (logits [B, T, n_vocab], cache); tokens [T] count as [1, T].

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> logits, cache = run_with_cache(model, [1, 2, 3], ["pattern", "resid_post"])
    >>> list(cache)
    ['blocks.0.attn.pattern', 'blocks.0.resid_post', 'blocks.1.attn.pattern', 'blocks.1.resid_post']
    >>> cache["pattern", 1].shape, cache.stack("resid_post").shape
    (torch.Size([1, 2, 3, 3]), torch.Size([2, 1, 3, 8]))
    """
    batch = as_batch(model, tokens)
    wanted = resolve_names(model, names)
    with torch.set_grad_enabled(grad):
        logits, store = _recorded(model, batch, wanted, hooks, detach, stop=False)
    assert isinstance(logits, Tensor)
    ordered = {n: store[n] for n in wanted if n in store}
    return logits, ActivationCache(ordered, model.config.n_layers)


def run_to_cache(
    model: GPT,
    tokens: Tensor | Sequence[int],
    names: NameQuery,
    *,
    hooks: Mapping[str, HookFn] | None = None,
    detach: bool = True,
    grad: bool = False,
) -> ActivationCache:
    """:func:`run_with_cache` without the logits: the forward pass stops as soon as every
    named activation is recorded, so nothing after the last of them is computed (the rest of
    the blocks, the unembedding).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> list(run_to_cache(model, [1, 2, 3], ["blocks.0.attn.z", "blocks.0.mlp_out"]))
    ['blocks.0.attn.z', 'blocks.0.mlp_out']
    """
    batch = as_batch(model, tokens)
    wanted = resolve_names(model, names)
    with torch.set_grad_enabled(grad):
        _, store = _recorded(model, batch, wanted, hooks, detach, stop=True)
    ordered = {n: store[n] for n in wanted if n in store}
    return ActivationCache(ordered, model.config.n_layers)


class _AllRecorded(Exception):
    """Raised by the recording hook once every wanted activation is kept (run_to_cache)."""


def _recorded(
    model: GPT, batch: Tensor, wanted: list[str], hooks: Mapping[str, HookFn] | None,
    detach: bool, *, stop: bool,
) -> tuple[Tensor | None, dict[str, Tensor]]:  # fmt: skip
    """(logits, or None when stopped early; {name: activation}) of one forward pass."""
    replacing = _resolve_hooks(model, hooks)
    store: dict[str, Tensor] = {}
    left = set(wanted)

    def record(name: str, fn: HookFn | None) -> HookFn:
        def hook(t: Tensor, _: str) -> Tensor | None:
            out = fn(t, name) if fn is not None else None
            value = t if out is None else out
            store[name] = value.detach() if detach else value
            left.discard(name)
            if stop and not left:
                raise _AllRecorded
            return out

        return hook

    fns: dict[str, HookFn] = dict(replacing)
    for name in wanted:
        fns[name] = record(name, replacing.get(name))
    try:
        with model.hooks(fns):
            return model(batch), store
    except _AllRecorded:
        return None, store


def run_with_hooks(
    model: GPT,
    tokens: Tensor | Sequence[int],
    hooks: Mapping[str, HookFn],
    *,
    grad: bool = False,
) -> Tensor:
    """Logits [B, T, n_vocab] with ``hooks`` attached (keys resolved as in :func:`resolve_names`)."""
    batch = as_batch(model, tokens)
    with torch.set_grad_enabled(grad), model.hooks(_resolve_hooks(model, hooks)):
        logits = model(batch)
    assert isinstance(logits, Tensor)
    return logits


def _resolve_hooks(model: GPT, hooks: Mapping[str, HookFn] | None) -> dict[str, HookFn]:
    out: dict[str, HookFn] = {}
    for query, fn in (hooks or {}).items():
        if not callable(fn):
            raise ConfigError("hooks", f"the hook for {query!r} is not callable")
        for name in resolve_names(model, query):
            if name in out:
                raise ConfigError("hooks", f"{name!r} is selected by two hook queries")
            out[name] = fn
    return out


def patch_hook(source: Tensor, index: Any = ...) -> HookFn:
    """A hook that puts ``source[index]`` in place of ``activation[index]`` (activation patching).

    ``index`` selects what is patched: ``...`` (all), ``(slice(None), 3)`` (position 3 of a
    [B, T, ...] activation), ``(slice(None), slice(None), 2)`` (head 2 of q/k/v/z/result).

    >>> hook = patch_hook(torch.ones(1, 3, 2), (slice(None), 1))
    >>> hook(torch.zeros(1, 3, 2), "x")[0].tolist()
    [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    """

    def hook(t: Tensor, name: str) -> Tensor:
        if source.shape != t.shape:
            raise GlassError(
                f"patch for {name!r}: source shape {tuple(source.shape)} != "
                f"activation shape {tuple(t.shape)}"
            )
        out = t.clone()
        out[index] = source[index].to(dtype=t.dtype, device=t.device)
        return out

    return hook


@contextmanager
def evaluating(model: GPT) -> Iterator[GPT]:
    """``model`` in eval mode (no dropout) for the block; its mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
