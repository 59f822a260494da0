"""Checks on device data that must not stall the device: ids in range.

Reading ids back from a GPU would make the host wait for it on every forward, so there the
check is a device-side assertion whose error surfaces at the next synchronisation (callers
with host ids, sampling and training data, check them before they are copied). A
data-dependent check would also split a compiled graph: compiled callers skip it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def id_out_of_range(ids: Tensor, low: int, high: int, what: str) -> int | None:
    """An id of ``ids`` outside [low, high) (the smallest if one is too low, else the
    largest), or None: all in range, or checked on the device without waiting."""
    if not ids.numel() or torch.compiler.is_compiling():
        return None
    lo, hi = torch.aminmax(ids)
    if ids.device.type == "cuda":
        torch._assert_async(
            (lo >= low) & (hi < high), f"{what}: an id is out of range [{low}, {high})"
        )
        return None
    lo_i, hi_i = int(lo), int(hi)
    if lo_i < low:
        return lo_i
    return hi_i if hi_i >= high else None
