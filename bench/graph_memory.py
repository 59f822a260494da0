"""This process's resident memory from /proc/self/status (Linux), for both sides of
``bench/graphs.py`` (circuit-tracer's runs in its own interpreter, so stdlib alone).

VmHWM, not ``ru_maxrss``: a child started by fork and exec inherits its parent's ru_maxrss,
so a parent that built a larger CLT would set every side's peak.
"""

from __future__ import annotations

import re
from pathlib import Path


def status_mib(field: str) -> float:
    """``VmHWM`` (the peak resident set) or ``VmRSS`` (the current one), in MiB."""
    found = re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())
    if found is None:
        raise SystemExit(f"no {field} in /proc/self/status")
    return int(found[1]) / 1024


def reset_peak() -> float:
    """VmHWM ← the current resident set (clear_refs 5); returns that resident set, MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_mib("VmRSS")
