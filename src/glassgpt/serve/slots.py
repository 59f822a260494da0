"""A KV cache of fixed slots, one sequence per slot, each with its own length.

Continuous batching decodes every active sequence in one forward step, although each has
seen a different number of tokens. Slot b holds its sequence's keys and values at columns
0..n_b−1; a decode step of one token per row writes row b's new k, v at column n_b and
lets its query see exactly the columns j ≤ n_b:

    K_l[b, :, n_b] = k_new[b],   V_l[b, :, n_b] = v_new[b]
    z_b = softmax(q_b K_l[b, :, :n_b+1]ᵀ / √d_head) V_l[b, :, :n_b+1]

and the token's position is n_b (``begin`` returns the per-row positions). Each layer's view
hands attention the per-row offsets n_b (``offset``), which glassgpt's decoding kernel reads
row by row (it never reads a key past a row's own); other kernels turn them into the mask
j ≤ n_b over the first max_b n_b + 1 columns. So row b computes what it would compute
alone, up to float rounding. On a CPU the writes at the columns n_b and the lengths' step
are compiled calls that read n_b when they run, which lets a step be replayed
(``glassgpt.sample.replay``).

The active sequences always fill slots 0..B−1 (a departing sequence's slot is refilled by
the last one), so a step reads views, never gathers. A new sequence is prefilled on its own
(``glassgpt.sample.cache.KVCache``, exactly as ``generate`` prefills) and its keys and
values are copied into a free slot by :meth:`SlotCache.load`.

The memory, [slots, n_kv_heads, C, d_head] per layer for k and for v, is allocated and
touched once, so serving does not grow the process after start-up. C is the server's context
(:func:`served_context`), at most the model's n_ctx: a Llama 3.2 config's n_ctx of 131072
would ask for gigabytes per slot.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassgpt.console import say
from glassgpt.errors import GlassError
from glassgpt.kernels import advance, cache_dtype, huge_page_zeros, write_kv_rows
from glassgpt.sample.cache import KVCache

DEFAULT_CONTEXT = 4096  # the served context when none is asked for (if n_ctx is longer)
MEMORY_SHARE = 0.5  # of the memory available at start-up, the most the slots may take


def slot_bytes(config: Any, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one slot's keys and values per position: 2 · n_layers · n_kv_heads · d_head ·
    the element size."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layers * config.kv_heads * config.d_head * itemsize


def available_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes free for the slots on ``device`` now (None: not known); on a CPU, Linux's
    MemAvailable (free memory and the page cache it can reclaim)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError):
        pass
    return None


def served_context(
    config: Any,
    slots: int,
    requested: int | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    available: int | None = None,
) -> int:
    """C, the positions each of ``slots`` slots holds: ``requested`` (at most n_ctx), else
    min(n_ctx, DEFAULT_CONTEXT) shrunk to what MEMORY_SHARE of ``available`` bytes holds.

    >>> from glassgpt.model import GPTConfig
    >>> llama = GPTConfig(n_vocab=10, n_ctx=131072, d_model=64, n_layers=2, n_heads=4)
    >>> served_context(llama, 16), served_context(llama, 16, 512)
    (4096, 512)
    >>> served_context(llama, 16, available=16 * slot_bytes(llama) * 2000)  # holds 1000
    1000
    >>> served_context(llama.replace(n_ctx=64), 16)
    64
    >>> served_context(llama.replace(n_ctx=64), 16, 65)
    Traceback (most recent call last):
    ...
    glassgpt.errors.GlassError: --max-context 65: longer than the model's n_ctx=64
    """
    if requested is not None:
        if requested < 1:
            raise GlassError(f"--max-context: must be ≥ 1, got {requested}")
        if requested > config.n_ctx:
            raise GlassError(f"--max-context {requested}: longer than the model's n_ctx={config.n_ctx}")  # fmt: skip
        return requested
    context = min(config.n_ctx, DEFAULT_CONTEXT)
    if available is not None:
        fits = int(MEMORY_SHARE * available) // (slots * slot_bytes(config, dtype))
        if fits < 1:
            raise GlassError(f"{slots} KV slots of one position do not fit in the memory available; serve with fewer --max-batch")  # fmt: skip
        context = min(context, fits)
    if context < config.n_ctx:
        gib = slots * context * slot_bytes(config, dtype) / 2**30
        say(f"serving a context of {context} positions of the model's n_ctx={config.n_ctx} "
            f"({slots} KV slots, {gib:.2g} GiB; --max-context N to change)")  # fmt: skip
    return context


class _SlotLayer:
    """Layer l's view, as ``Attention.forward(..., kv=)`` expects (offset, mask, update)."""

    __slots__ = ("cache", "k", "v")

    def __init__(self, cache: SlotCache, k: Tensor, v: Tensor) -> None:
        self.cache, self.k, self.v = cache, k, v  # [slots, G, n_ctx, d_head]

    @property
    def offset(self) -> Tensor:
        return self.cache.step_lengths  # [B]: row b's query sits at position n_b

    @property
    def mask(self) -> Tensor | None:
        return None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write row b's k, v [B, G, 1, d_head] at column n_b; return [B, G, n_ctx, d_head]
        views (attention reads row b's first n_b + 1 columns)."""
        c = self.cache
        B = k.shape[0]
        if not write_kv_rows(self.k, self.v, k, v, c.step_lengths):
            rows = c.rows[:B]
            self.k[rows, :, c.step_lengths] = k[:, :, 0].to(self.k.dtype)  # (bf16 in float32)
            self.v[rows, :, c.step_lengths] = v[:, :, 0].to(self.v.dtype)
        return self.k[:B], self.v[:B]


class SlotCache:
    """``slots`` sequences of up to ``capacity`` positions (default n_ctx); ``lengths[b]``
    positions cached in slot b.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> from glassgpt.sample.cache import KVCache
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)).eval()
    >>> slots = SlotCache.for_model(model, slots=2)
    >>> for b, prompt in enumerate([[1, 2, 3], [4]]):
    ...     pre = KVCache.for_model(model, 1, len(prompt))
    ...     _ = model(torch.tensor([prompt]), cache=pre)
    ...     slots.load(b, pre)
    >>> step = model(torch.tensor([[5], [6]]), cache=slots)      # one token per row
    >>> alone = model(torch.tensor([[4, 6]]))[0, -1]
    >>> slots.lengths.tolist(), bool(torch.allclose(step[1, -1], alone, atol=1e-5))
    ([4, 2], True)
    """

    last_only = True  # GPT.forward unembeds only the new position
    per_row_lengths = True  # each row at its own position (``glassgpt.sample.replay``)

    def __init__(
        self,
        config: Any,
        slots: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        capacity: int | None = None,
    ) -> None:
        G, dh = config.kv_heads, config.d_head  # key/value heads (n_kv_heads)
        capacity = config.n_ctx if capacity is None else capacity  # C ≤ n_ctx positions
        shape = (slots, G, capacity, dh)
        self.config, self.slots, self.capacity = config, slots, capacity
        self.layers = []
        for _ in range(config.n_layers):
            k = huge_page_zeros(shape, dtype, device)  # touched now, on 2 MiB pages
            v = huge_page_zeros(shape, dtype, device)
            self.layers.append(_SlotLayer(self, k, v))
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        # the same memory through NumPy on a CPU: the scheduler reads n_b between steps
        # without a PyTorch operation (each costs microseconds and a hand-off of the GIL)
        self._host = self.lengths.numpy() if self.lengths.is_cpu else None
        self.rows = torch.arange(slots, device=device)
        self.step_lengths = self.lengths[:0]

    @classmethod
    def for_model(cls, model: Any, slots: int, capacity: int | None = None) -> SlotCache:
        p = next(model.parameters())
        return cls(model.config, slots, dtype=cache_dtype(p.dtype, p.device), device=p.device,
                   capacity=capacity)  # fmt: skip

    def lengths_of(self, B: int) -> list[int]:
        """n_b of slots 0..B−1."""
        return (self._host[:B] if self._host is not None else self.lengths[:B]).tolist()

    def prompt_cache(self, slot: int, model: Any, rows: int = 1) -> KVCache:
        """Slots ``slot``..``slot + rows − 1`` as an empty ``rows``-row ``KVCache`` of
        ``capacity`` positions, for prompts encoded straight into the slots' memory (no cache
        allocated, zeroed and copied per admission); its keys and values are those a new
        ``KVCache`` would hold (a prompt reads columns 0..n+T−1 only). :meth:`admit` then
        starts each slot's sequence."""
        cache = KVCache.for_model(model, rows, 1, last_only=True)  # (a one-position shell)
        for shell, mine in zip(cache.layers, self.layers, strict=True):
            shell.k, shell.v = mine.k[slot : slot + rows], mine.v[slot : slot + rows]
        cache.capacity = self.capacity
        return cache

    def admit(self, slot: int, prompt: KVCache) -> None:
        """Slot ``slot`` holds the ``prompt_cache(slot)`` it was handed, encoded."""
        self.lengths[slot] = prompt.length

    def load(self, slot: int, prefill: Any) -> None:
        """Copy a one-row cache (``KVCache`` after its prefill) into ``slot``."""
        n = prefill.length
        for mine, theirs in zip(self.layers, prefill.layers, strict=True):
            mine.k[slot, :, :n] = theirs.k[0, :, :n]
            mine.v[slot, :, :n] = theirs.v[0, :, :n]
        self.lengths[slot] = n

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s sequence into slot ``dst`` (to keep the active slots contiguous)."""
        n = int(self.lengths[src])
        for layer in self.layers:
            layer.k[dst, :, :n] = layer.k[src, :, :n]
            layer.v[dst, :, :n] = layer.v[src, :, :n]
        self.lengths[dst] = n

    def begin(self, B: int, T: int) -> Tensor:
        """A decode step of one token for slots 0..B−1: the positions [B, 1]."""
        if T != 1:
            raise ValueError(f"a slot cache decodes one token per row, got {T}")
        lengths = self.lengths[:B]
        if bool((lengths >= self.capacity).any()):
            raise ValueError(f"a slot is full (n_ctx={self.capacity})")
        self.step_lengths = lengths  # a view: the layers read n_b from it
        return lengths[:, None].clone()  # positions [B, 1]

    def end(self, T: int) -> None:
        advance(self.lengths, self.step_lengths.shape[0], T)  # lengths[:B] += T
