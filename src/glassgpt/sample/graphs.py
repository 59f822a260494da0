"""Decoding from a CUDA graph: one replay per generated token instead of ~15 launches a layer.

At batch 1 a decoding step is many small kernels, and the GPU spends the step waiting for
the host to launch them (``bench/generate.py`` measures the gain). A CUDA graph records
the step once and replays it with one launch. A replay has fixed shapes and addresses, so
the step must keep its shape while the sequence grows. :class:`StaticKVCache` does that: a
step writes its key and value at column n, held in a device tensor, and attends over the
whole capacity through a mask that admits keys j ≤ n outside the row's pad slots,

    z = softmax(q Kᵀ/√d_head + M) V,   M[b, j] = 0 if pad[b] ≤ j ≤ n else −∞,

which equals attention over the first n + 1 keys (a masked key gets weight exp(−∞) = 0).
Prompts (T > 1) run eagerly through the ordinary :class:`KVCache` path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from glassgpt.model.gpt import GPT
from glassgpt.sample.cache import CacheFullError, KVCache, _LayerKV


class _StaticLayerKV(_LayerKV):
    __slots__ = ()

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        cache = self.cache
        if not isinstance(cache, StaticKVCache) or not cache.static:
            return super().update(k, v)
        column = cache.col.view(1)
        self.k.index_copy_(2, column, k)  # k [B, H, 1, d_head] at column n
        self.v.index_copy_(2, column, v)
        return self.k, self.v  # every column; the mask hides those past n


class StaticKVCache(KVCache):
    """A :class:`KVCache` whose one-token steps keep their shapes (see the module docstring).

    ``col`` mirrors ``length`` on the device; ``static`` selects the fixed-shape step.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> cache = StaticKVCache.for_model(model, batch_size=1)
    >>> _ = model(torch.tensor([[1, 2, 3]]), cache=cache)
    >>> cache.static = True
    >>> last = model(torch.tensor([[4]]), cache=cache)
    >>> bool(torch.allclose(last[0, -1], model(torch.tensor([[1, 2, 3, 4]]))[0, -1], atol=1e-6))
    True
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        device = self.layers[0].k.device
        self.layers = [_StaticLayerKV(self, layer.k, layer.v) for layer in self.layers]
        self.static = False
        self.col = torch.zeros((), dtype=torch.long, device=device)
        self._columns = torch.arange(self.capacity, device=device)
        self._pad_row = torch.zeros(self.batch_size, dtype=torch.long, device=device)
        self._copy_pad()

    def begin(self, B: int, T: int) -> int | Tensor:
        if not self.static:
            return super().begin(B, T)
        if T != 1 or self.batch_size != B:
            raise CacheFullError(
                f"a static step takes [{self.batch_size}, 1] tokens, got [{B}, {T}]"
            )
        seen = (self._columns[None, :] <= self.col) & (
            self._columns[None, :] >= self._pad_row[:, None]
        )
        self.mask = seen[:, None, None, :]  # [B, 1, 1, capacity]
        return (self.col - self._pad_row)[:, None]  # [B, 1] positions

    def end(self, T: int) -> None:
        super().end(T)
        self.col += T

    def reset(self, pad: Sequence[int] | Tensor | None = None) -> None:
        super().reset(pad)
        self.col.zero_()  # in place: a captured graph reads these tensors
        self._copy_pad()

    def _copy_pad(self) -> None:
        self._pad_row.copy_(self.pad if self.pad is not None else torch.zeros_like(self._pad_row))


class GraphedStep:
    """``model(tokens [B, 1], cache=cache)`` → logits [B, 1, n_vocab], replayed from a CUDA
    graph recorded at construction (after two warm-up runs whose cache writes are undone).

    The logits tensor is the graph's own output buffer: it is overwritten by the next call.
    """

    def __init__(self, model: GPT, cache: StaticKVCache) -> None:
        self.cache = cache
        device = cache.col.device
        self.tokens = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=device)
        length, col = cache.length, cache.col.clone()
        training = model.training
        model.eval()
        cache.static = True
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(2):  # kernels chosen, workspaces allocated, weights cached
                    model(self.tokens, cache=cache)
                    cache.length = length
                    cache.col.copy_(col)
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(self.graph):
                logits = model(self.tokens, cache=cache)
            assert isinstance(logits, Tensor)
            self.logits = logits
        finally:
            cache.static = False
            cache.length = length
            cache.col.copy_(col)
            if training:
                model.train()

    def __call__(self, tokens: Tensor) -> Tensor:
        cache = self.cache
        if cache.length + 1 > cache.capacity:
            raise CacheFullError(f"the cache of {cache.capacity} positions is full")
        self.tokens.copy_(tokens)
        self.graph.replay()
        cache.length += 1  # the graph advanced cache.col
        return self.logits
