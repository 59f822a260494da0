"""Weights in memory backed by 2 MiB pages, for products that stream them.

A decoding step reads every weight once, front to back. With the usual 4 KiB pages that is
a page-table walk (a TLB miss) for every 4 KiB read, which the memory system cannot hide
entirely.

Linux gives an anonymous mapping transparent huge pages where it is advised to
(``MADV_HUGEPAGE``, which takes effect with the system's THP setting ``madvise`` or
``always``); :func:`huge_page_copy` copies a tensor into such a mapping, aligned to 2 MiB,
with only its whole 2 MiB pages advised: the tail stays on 4 KiB pages, so the copy takes
no more memory than an ordinary one (GPT-2 small's inference copy: 830 MB either way).
Elsewhere (other systems, ``never``, tensors under 2 MiB) the copy is an ordinary one: the
values are the same either way, only the speed differs.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch
from torch import Tensor

HUGE_PAGE = 2 << 20


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
    one under 2 MiB or where the system has no such advice), for a caller to fill in place.

    >>> huge_page_empty((3, 4), torch.float32).shape
    torch.Size([3, 4])
    """
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advise is None:
        return torch.empty(shape, dtype=dtype)
    size = nbytes + HUGE_PAGE  # room to start at a 2 MiB boundary
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    offset = -base % HUGE_PAGE
    whole = nbytes // HUGE_PAGE * HUGE_PAGE  # the tail stays on 4 KiB pages: no page half used
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: 4 KiB ones
        buf.madvise(advise, offset, whole)  # before the first touch: faults get 2 MiB pages
    # the tensor keeps ``buf`` alive; the mapping is unmapped when the tensor is freed
    return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset).view(shape)
