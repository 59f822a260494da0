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
from torch import Tensor

BLOCK = 16  # tokens per block
DEFAULT_BYTES = 256 * 2**20


class PrefixCache:
    """Blocks of prompt K/V keyed by their prefix, LRU within ``max_bytes``.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> from glassgpt.sample.cache import KVCache
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=16, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> prefix = PrefixCache(block=4)
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

    def __init__(self, block: int = BLOCK, max_bytes: int = DEFAULT_BYTES) -> None:
        self.block, self.max_bytes = block, max_bytes
        self.blocks: OrderedDict[bytes, tuple[Tensor, Tensor]] = OrderedDict()
        self.bytes = 0
        self.hits = 0  # prompts that found a cached prefix
        self.reused = 0  # positions loaded instead of encoded

    def __len__(self) -> int:
        return len(self.blocks)

    def keys(self, ids: Sequence[int], n_blocks: int) -> list[bytes]:
        """h_0 … h_{n_blocks−1} of ``ids``."""
        out, h, B = [], b"", self.block
        for i in range(n_blocks):
            block = array("q", ids[i * B : (i + 1) * B]).tobytes()
            h = hashlib.blake2b(h + block, digest_size=16).digest()
            out.append(h)
        return out

    def load(self, ids: Sequence[int], cache: Any) -> int:
        """Copy the longest cached prefix of ``ids`` (whole blocks, shorter than ``ids``)
        into the empty one-row ``cache`` (``KVCache``); the positions loaded."""
        found: list[bytes] = []
        for key in self.keys(ids, (len(ids) - 1) // self.block):
            if key not in self.blocks:
                break
            found.append(key)
        if not found:
            return 0
        self._touch(found)
        entries = [self.blocks[key] for key in found]
        n = len(found) * self.block
        k = torch.cat([e[0] for e in entries], dim=2)  # [L, G, n, d_head]
        v = torch.cat([e[1] for e in entries], dim=2)
        for layer, k_l, v_l in zip(cache.layers, k, v, strict=True):
            layer.k[0, :, :n] = k_l
            layer.v[0, :, :n] = v_l
        cache.length = n
        self.hits += 1
        self.reused += n
        return n

    def store(self, ids: Sequence[int], cache: Any) -> None:
        """Keep every whole block of ``ids`` (encoded in the one-row ``cache``) not yet kept."""
        if self.max_bytes <= 0:
            return
        B = self.block
        keys = self.keys(ids, min(len(ids), cache.length) // B)
        for i, key in enumerate(keys):
            if key in self.blocks:
                continue
            k = torch.stack([layer.k[0, :, i * B : (i + 1) * B] for layer in cache.layers])
            v = torch.stack([layer.v[0, :, i * B : (i + 1) * B] for layer in cache.layers])
            self.blocks[key] = (k, v)
            self.bytes += 2 * k.numel() * k.element_size()
            while self.bytes > self.max_bytes and self.blocks:
                old_k, _ = self.blocks.popitem(last=False)[1]
                self.bytes -= 2 * old_k.numel() * old_k.element_size()
        self._touch([key for key in keys if key in self.blocks])

    def _touch(self, keys: list[bytes]) -> None:
        """Mark a chain's blocks used, its first the most recently: eviction then takes a
        chain from its end (a block is useless once one before it is gone)."""
        for key in reversed(keys):
            self.blocks.move_to_end(key)

    def clear(self) -> None:
        self.blocks.clear()
        self.bytes = 0
