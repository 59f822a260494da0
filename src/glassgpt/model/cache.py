"""What ``GPT.forward(tokens, cache=…)`` asks of a KV cache: a typed protocol, no storage.

A cache holds every layer's keys and values for the positions already seen (those of
earlier tokens never change: causality), so a step with T new tokens computes only their
rows. ``glassgpt.sample.cache.KVCache`` is the implementation; any object with these
members works. One step:

    offset = cache.begin(B, T)        first position (int), or per-row positions [B, T]
    for each layer l:  cache.layers[l].offset, .mask, .update(k, v)   (inside attention)
    cache.end(T)                      the T positions are now cached
    cache.last_only                   unembed only the last position (decoding)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class LayerKV(Protocol):
    """One layer's view of a KV cache, as ``Attention.forward(..., kv=)`` uses it."""

    @property
    def offset(self) -> int | Tensor:
        """Positions cached before this step: one count, or each row's [B] (int64) where the
        rows have seen different numbers of positions (keys past a row's own are not read)."""
        ...

    @property
    def mask(self) -> Tensor | None:
        """Bool [B, 1, T_q, offset + T_q] (True = may attend), or None: causal."""
        ...

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's k, v [B, H, T, d_head]; return all keys and values
        [B, H, offset + T, d_head], these included."""
        ...


@runtime_checkable
class KVCacheProtocol(Protocol):
    """A whole model's KV cache, as ``GPT.forward`` drives it."""

    @property
    def last_only(self) -> bool:
        """Whether the model should unembed only the last position (logits [B, 1, n_vocab])."""
        ...

    @property
    def layers(self) -> Sequence[LayerKV]:
        """One view per layer, in order."""
        ...

    def begin(self, B: int, T: int) -> int | Tensor:
        """Start a step of T new tokens for a batch of B: the first position (int), or
        per-row positions [B, T] (a left-padded batch)."""
        ...

    def end(self, T: int) -> None:
        """The step's T positions are now cached."""
        ...
