"""The KV cache: every layer's keys and values for the positions already seen.

Attention at position t needs q_t and the keys and values of positions 0..t. These depend
only on tokens ≤ their own position (causality), so once computed they never change:

    K_l[:, :, :n] , V_l[:, :, :n]       cached, [B, G, n, d_head] per layer l
    step with T new tokens:  K_l[:, :, n:n+T] = x_new W_K (+ b_K, RoPE at positions n..n+T−1)
                             z = softmax(q_new K_l[:, :, :n+T]ᵀ / √d_head + M) V_l[:, :, :n+T]

so feeding the tokens one step at a time gives the same logits as recomputing the whole
sequence, at the cost of one position per step instead of n. Learned and sinusoidal
positions are read at n..n+T−1, RoPE rotates by those positions, ``none`` needs nothing.

The tensors are allocated once, [B, G, capacity, d_head] per layer (G = n_kv_heads key/value
heads), and written in place.
A left-padded batch (prompts of different lengths) gives each row ``pad[b]`` leading pad
slots: row b's token at column c has position c − pad[b], and no query attends to a pad key
(a pad query attends only to itself, which keeps its softmax finite; its output is unused).

``GPT.forward(tokens, cache=cache)`` drives it through ``begin``/``layers``/``end`` (the
members of ``glassgpt.model.cache.KVCacheProtocol``, which this class implements).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.kernels import cache_dtype, huge_page_zeros, write_kv
from glassgpt.model.config import GPTConfig
from glassgpt.model.gpt import GPT


class CacheError(GlassError, ValueError):
    """A cache that does not fit the tokens given to it (batch size, padding)."""


class CacheFullError(CacheError):
    """More tokens than the cache (at most the model's context) can hold."""


class _LayerKV:
    """Layer ``l``'s view of the cache, as ``Attention.forward(..., kv=)`` expects."""

    __slots__ = ("cache", "k", "v")

    def __init__(self, cache: KVCache, k: Tensor, v: Tensor) -> None:
        self.cache, self.k, self.v = cache, k, v  # k, v [B, G, capacity, d_head]

    @property
    def offset(self) -> int:
        return self.cache.length

    @property
    def mask(self) -> Tensor | None:
        return self.cache.mask

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's k, v [B, G, T, d_head] at n..n+T−1; return all of them [B, G, n+T, d_head]."""
        n, T = self.cache.length, k.shape[2]
        write_kv(self.k, self.v, k, v, n)  # self.k[:, :, n : n + T] = k, the same for v
        return self.k.narrow(2, 0, n + T), self.v.narrow(2, 0, n + T)


class KVCache:
    """Keys and values of ``n_layers`` layers for up to ``capacity`` positions of a batch.

    >>> from glassgpt.model import GPT
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> tokens = torch.tensor([[1, 2, 3, 4]])
    >>> cache = KVCache.for_model(model, batch_size=1)
    >>> first = model(tokens[:, :3], cache=cache)          # positions 0..2
    >>> last = model(tokens[:, 3:], cache=cache)           # position 3, attending to 0..3
    >>> cache.length, bool(torch.allclose(last[0, -1], model(tokens)[0, -1], atol=1e-6))
    (4, True)
    """

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int,
        capacity: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        pad: Sequence[int] | Tensor | None = None,
        last_only: bool = False,
    ) -> None:
        capacity = config.n_ctx if capacity is None else capacity
        if not 1 <= capacity <= config.n_ctx:
            raise CacheFullError(
                f"cache capacity must be in [1, n_ctx={config.n_ctx}], got {capacity}"
            )
        if batch_size < 1:
            raise CacheError(f"cache batch_size must be ≥ 1, got {batch_size}")
        G, dh = config.kv_heads, config.d_head  # key/value heads (n_kv_heads)
        assert dh is not None
        self.config, self.batch_size, self.capacity = config, batch_size, capacity
        self.last_only = last_only  # GPT.forward then unembeds only the last position
        self.length = 0  # positions cached so far
        self.mask: Tensor | None = None  # this step's [B, 1, T, n+T] (padded batches only)
        shape = (batch_size, G, capacity, dh)
        self.layers = [
            _LayerKV(self, huge_page_zeros(shape, dtype, device),
                     huge_page_zeros(shape, dtype, device))
            for _ in range(config.n_layers)
        ]  # fmt: skip
        self.pad: Tensor | None = None  # [B] leading pad slots per row (None: no padding)
        self._set_pad(pad)

    @classmethod
    def for_model(cls, model: GPT, batch_size: int, capacity: int | None = None,
                  **kw: object) -> KVCache:  # fmt: skip
        """A cache on the model's device, in its dtype (float32 for bf16 on a CPU without bf16
        arithmetic: ``glassgpt.kernels.bf16.cache_dtype``)."""
        p = next(model.parameters())
        dtype = cache_dtype(p.dtype, p.device)
        return cls(model.config, batch_size, capacity, dtype=dtype, device=p.device, **kw)  # type: ignore[arg-type]

    def begin(self, B: int, T: int) -> int | Tensor:
        """Start a step of T tokens: check room, set the mask; return the first position
        (or per-row positions [B, T] in a padded batch)."""
        n = self.length
        if self.batch_size != B:
            raise CacheError(f"cache holds a batch of {self.batch_size}, got tokens of batch {B}")
        if n + T > self.capacity:
            raise CacheFullError(
                f"{n} cached + {T} new positions exceed the cache capacity {self.capacity} "
                f"(model context n_ctx={self.config.n_ctx})"
            )
        if self.pad is None:
            self.mask = None
            return n
        q = torch.arange(n, n + T, device=self.pad.device)  # absolute columns of the queries
        k = torch.arange(n + T, device=self.pad.device)
        causal = k[None, :] <= q[:, None]  # [T, n+T]
        own = k[None, :] == q[:, None]
        ok = self._key_ok[:, None, : n + T] | own[None]  # [B, T, n+T]: real keys, or itself
        self.mask = (ok & causal[None]).unsqueeze(1)  # [B, 1, T, n+T]
        return (q[None, :] - self.pad[:, None]).clamp_(min=0)  # [B, T] positions

    def end(self, T: int) -> None:
        """The step's T positions are now cached."""
        self.length += T

    def reset(self, pad: Sequence[int] | Tensor | None = None) -> None:
        """Forget every position (keeping the memory), with new left-pad counts if given."""
        self.length, self.mask = 0, None
        self._set_pad(pad)

    def _set_pad(self, pad: Sequence[int] | Tensor | None) -> None:
        self.pad = None
        if pad is None:
            return
        device = self.layers[0].k.device if self.layers else None
        p = torch.as_tensor(pad, dtype=torch.long, device=device)
        B, cap = self.batch_size, self.capacity
        if p.shape != (B,) or bool((p < 0).any()) or bool((p >= cap).any()):
            raise CacheError(f"pad must be {B} counts in [0, {cap}), got {p.tolist()}")
        if bool(p.any()):
            self.pad = p
            self._key_ok = torch.arange(cap, device=device)[None, :] >= p[:, None]  # [B, cap]
