"""Prefix caching: the keys and values of a prompt's leading blocks, kept for later prompts
that begin with the same tokens (a shared system prompt is encoded once).

Keys and values at position p depend only on the tokens 0..p (causality; a sliding window
narrows what a query reads, never what a key is), so a prompt that begins with the same
b·B tokens as an earlier one has the same first b·B columns in every layer's cache. Prompts
are cut into blocks of B tokens; block i is keyed by

    h_i = blake2b(h_{i−1} ‖ ids of block i),   h_{−1} = ""

so a key names the whole prefix up to its block's end. A new prompt takes the blocks whose
keys are cached, in order, leaving at least one token to encode (its logits are needed);
its prefill then encodes only the rest, at positions n.., attending to the loaded columns.
The result is the full prefill's up to float rounding (a matmul over fewer rows), as a
batched step is the single one's. A block is [n_layers, G, B, d_head] for k and for v
(G = n_kv_heads); blocks are evicted least recently used beyond ``max_bytes``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from glassgpt.kernels import cache_dtype

BLOCK = 16  # tokens per block
DEFAULT_BYTES = 256 * 2**20  # the most the server gives the pool (serve.scheduler)


class PrefixCache:
    """Blocks of prompt K/V keyed by their prefix, LRU within ``max_bytes``: a pool of
    [n_blocks, L, 2, G, B, d_head] allocated and touched at start (serving does not grow
    the process; 0 bytes: no caching).

    >>> from glassgpt.model import GPT, GPTConfig
    >>> from glassgpt.sample.cache import KVCache
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=16, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> prefix = PrefixCache.for_model(model, block=4)
    >>> def prefill(ids):
    ...     cache = KVCache.for_model(model, 1, len(ids))
    ...     n = prefix.load(ids, cache)
    ...     logits = model(torch.tensor([ids[n:]]), cache=cache)[0, -1]
    ...     prefix.store(ids, cache)
    ...     return n, logits
    >>> n0, full = prefill([1, 2, 3, 4, 5, 6, 7, 8, 9])
    >>> n1, cached = prefill([1, 2, 3, 4, 5, 6, 7, 8, 9])
    >>> n0, n1, len(prefix), bool(torch.allclose(full, cached, atol=1e-6))
    (0, 8, 2, True)
    """

    def __init__(
        self,
        config: Any,
        *,
        block: int = BLOCK,
        max_bytes: int = DEFAULT_BYTES,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        L, G, dh = config.n_layers, config.kv_heads, config.d_head
        self.block = block
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.block_bytes = L * 2 * G * block * dh * itemsize
        n = max(0, max_bytes // self.block_bytes)
        self.pool = torch.empty((n, L, 2, G, block, dh), dtype=dtype, device=device).zero_()
        self.free = list(range(n - 1, -1, -1))  # pool rows not in use
        self.blocks: OrderedDict[bytes, int] = OrderedDict()  # key → pool row, LRU first
        self.hits = 0  # prompts that found a cached prefix
        self.reused = 0  # positions loaded instead of encoded

    @classmethod
    def for_model(cls, model: Any, **kw: Any) -> PrefixCache:
        """A pool on the model's device, in its KV cache's dtype."""
        p = next(model.parameters())
        return cls(model.config, dtype=cache_dtype(p.dtype, p.device), device=p.device, **kw)

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def bytes(self) -> int:
        """The bytes of the blocks held now."""
        return len(self.blocks) * self.block_bytes

    def keys(self, ids: Sequence[int], n_blocks: int) -> list[bytes]:
        """h_0 … h_{n_blocks−1} of ``ids``."""
        out, h, B = [], b"", self.block
        for i in range(n_blocks):
            block = array("q", ids[i * B : (i + 1) * B]).tobytes()
            h = hashlib.blake2b(h + block, digest_size=16).digest()
            out.append(h)
        return out

    def _found(self, ids: Sequence[int]) -> list[bytes]:
        """The keys of the longest cached prefix of ``ids`` (whole blocks, shorter than ``ids``)."""
        found: list[bytes] = []
        for key in self.keys(ids, (len(ids) - 1) // self.block):
            if key not in self.blocks:
                break
            found.append(key)
        return found

    def match(self, ids: Sequence[int]) -> int:
        """The positions :meth:`load` would load for ``ids`` now (nothing is touched)."""
        return len(self._found(ids)) * self.block

    def load(self, ids: Sequence[int], cache: Any) -> int:
        """Copy the longest cached prefix of ``ids`` (whole blocks, shorter than ``ids``)
        into the empty one-row ``cache`` (``KVCache``); the positions loaded."""
        found = self._found(ids)
        if not found:
            return 0
        self._touch(found)
        n = len(found) * self.block
        rows = torch.tensor([self.blocks[key] for key in found], device=self.pool.device)
        kv = self.pool[rows]  # [b, L, 2, G, B, d_head]
        kv = kv.permute(1, 2, 3, 0, 4, 5).reshape(*kv.shape[1:4], n, kv.shape[-1])
        for layer, kv_l in zip(cache.layers, kv, strict=True):  # kv_l [2, G, n, d_head]
            layer.k[0, :, :n] = kv_l[0]
            layer.v[0, :, :n] = kv_l[1]
        cache.length = n
        self.hits += 1
        self.reused += n
        return n

    def store(self, ids: Sequence[int], cache: Any) -> None:
        """Keep every whole block of ``ids`` (encoded in the one-row ``cache``) not yet kept."""
        if not len(self.pool):
            return
        B = self.block
        keys = self.keys(ids, min(len(ids), cache.length) // B)
        self._touch([key for key in keys if key in self.blocks])
        mine, kept = set(keys), []
        for i, key in enumerate(keys):
            if key not in self.blocks:
                if not self.free:
                    oldest = next(iter(self.blocks))
                    if oldest in mine:  # the pool holds less than this prompt
                        break
                    self.free.append(self.blocks.pop(oldest))
                row = self.free.pop()
                for l, layer in enumerate(cache.layers):
                    self.pool[row, l, 0] = layer.k[0, :, i * B : (i + 1) * B]
                    self.pool[row, l, 1] = layer.v[0, :, i * B : (i + 1) * B]
                self.blocks[key] = row
            kept.append(key)
        self._touch(kept)

    def _touch(self, keys: list[bytes]) -> None:
        """Mark a chain's blocks used, its first the most recently: eviction then takes a
        chain from its end (a block is useless once one before it is gone)."""
        for key in reversed(keys):
            self.blocks.move_to_end(key)
