"""Weights in memory backed by 2 MiB pages, for products that stream them.

A decoding step reads every weight once, front to back. With the usual 4 KiB pages that is
a page-table walk (a TLB miss) for every 4 KiB read, which the memory system cannot hide
entirely.

Linux gives an anonymous mapping transparent huge pages where it is advised to
(``MADV_HUGEPAGE``, which takes effect with the system's THP setting ``madvise`` or
``always``); :func:`huge_page_copy` copies a tensor into such memory:

- a tensor of ``SHARED_MAX`` or more gets a mapping of its own, aligned to 2 MiB, with only
  its whole 2 MiB pages advised: the tail stays on 4 KiB pages, so the copy takes no more
  memory than an ordinary one (GPT-2 small's inference copy: 830 MB either way);
- a smaller one (from ``SHARED_MIN``) is carved from a shared mapping (a slab of ``SLAB``
  bytes, all of it advised), next to the ones carved before it: a thin model's matrices
  (SmolLM2-135M's are 0.66-3.5 MB) are each under or barely over 2 MiB, and on 4 KiB pages
  its 150 products a step read 22-26 GB/s where the same bytes on 2 MiB pages read 29-33
  (one thread, CPU time, ``bench/step_profile.py``'s neighbours). A slab's pages are
  faulted in as its tensors are written, so it takes what they hold, rounded up to 2 MiB;
  it is unmapped when the last tensor carved from it is freed (each tensor keeps its slab
  alive, the allocator only refers to the newest one, weakly).

Elsewhere (other systems, ``never``, tensors under ``SHARED_MIN``) the copy is an ordinary
one: the values are the same either way, only the speed differs.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import threading
import weakref

import torch
from torch import Tensor

HUGE_PAGE = 2 << 20
SHARED_MIN = 64 << 10  # smaller tensors: a few 4 KiB pages, nothing to gain
SHARED_MAX = 8 << 20  # from this size a tensor gets a mapping of its own
SLAB = 32 << 20  # a shared mapping's size (a multiple of HUGE_PAGE)
ALIGN = 4096  # each carved tensor starts on a 4 KiB boundary


def huge_page_copy(t: Tensor) -> Tensor:
    """A contiguous copy of the CPU tensor ``t``, in memory advised for 2 MiB pages.

    >>> t = torch.arange(6.0).view(2, 3)
    >>> c = huge_page_copy(t)
    >>> torch.equal(c, t), c.is_contiguous(), c.data_ptr() != t.data_ptr()
    (True, True, True)
    """
    if t.device.type != "cpu":
        return t.clone(memory_format=torch.contiguous_format)
    return huge_page_empty(t.shape, t.dtype).copy_(t)


def huge_page_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
    """An uninitialised contiguous CPU tensor in memory advised for 2 MiB pages (an ordinary
    one under ``SHARED_MIN`` or where the system has no such advice), for a caller to fill in
    place; from ``SHARED_MIN`` to ``SHARED_MAX`` carved from a shared slab (module docstring).

    >>> huge_page_empty((3, 4), torch.float32).shape
    torch.Size([3, 4])
    """
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if nbytes < SHARED_MIN or _ADVICE is None:
        return torch.empty(shape, dtype=dtype)
    if nbytes < SHARED_MAX:
        buf, offset = _carve(nbytes)
    else:
        whole = nbytes // HUGE_PAGE * HUGE_PAGE  # the tail on 4 KiB pages: no page half used
        buf, offset = _mapping(nbytes, whole)
    # the tensor keeps ``buf`` alive; the mapping is unmapped when its last tensor is freed
    return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset).view(shape)


def huge_page_zeros(
    shape: tuple[int, ...] | torch.Size,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> Tensor:
    """Zeros of ``shape`` on ``device``, touched now; on a CPU in memory advised for 2 MiB
    pages (:func:`huge_page_empty`). For a KV cache: a decoding step's attention reads each
    (row, head)'s keys and values in short runs (12-20 KB at 32-96 cached positions) 64 KB
    or more apart, which on 4 KiB pages pays a page-table walk nearly every run.

    >>> huge_page_zeros((2, 3), torch.float32).sum().item()
    0.0
    """
    if torch.device("cpu" if device is None else device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return huge_page_empty(shape, dtype).zero_()


_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)


def _mapping(nbytes: int, advised: int) -> tuple[mmap.mmap, int]:
    """A new anonymous mapping of at least ``nbytes`` and the offset in it of its first 2 MiB
    boundary, from which ``advised`` bytes are advised for 2 MiB pages."""
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    offset = -base % HUGE_PAGE
    if advised:
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages: 4 KiB
            buf.madvise(_ADVICE, offset, advised)  # before the first touch: 2 MiB faults
    return buf, offset


_slab_lock = threading.Lock()
_slab: tuple[weakref.ref, int, int] | None = None  # the newest slab: its mapping, next, end


def _carve(nbytes: int) -> tuple[mmap.mmap, int]:
    """``nbytes`` (under ``SHARED_MAX``) of the newest slab, or of a new one where it has no
    room left or is gone: the slab and the offset of the bytes in it."""
    global _slab
    with _slab_lock:
        buf = _slab[0]() if _slab is not None else None
        if buf is None or _slab[1] + nbytes > _slab[2]:  # type: ignore[index]
            buf, start = _mapping(SLAB, SLAB)
            _slab = (weakref.ref(buf), start, start + SLAB)
        start = _slab[1]
        _slab = (_slab[0], start + -(-nbytes // ALIGN) * ALIGN, _slab[2])
    return buf, start
