"""Where a training step runs: precision, compilation, and the device's clock.

- :func:`resolve_precision`: the autocast dtype of ``train.precision`` on a device, and
  whether fp16 needs a GradScaler; :func:`resolve_compile`: ``train.compile``'s default.
- :func:`stamp` / :func:`seconds_between`: moments on the device's own clock (CUDA events
  on a GPU), so a step read late is still timed right.
- :class:`PendingStep`: a launched step whose loss may still be on the device.
"""

from __future__ import annotations

import math
import shutil
import time
from typing import Any

import torch

from glassgpt.errors import ConfigError


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (Linux: the avx512_bf16 or amx_bf16 flag)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split()
                    return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        pass
    return False


def resolve_precision(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for float32, whether a GradScaler is needed).

    ``auto``: bf16 on GPUs that have it, fp16 + GradScaler on older GPUs; on CPUs bf16 where
    the processor multiplies bf16 natively (AVX512-BF16 or AMX), else fp32.

    >>> resolve_precision("bf16", torch.device("cpu"))
    (torch.bfloat16, False)
    """
    cuda = device.type == "cuda"
    if precision == "auto":
        if not cuda:
            return (torch.bfloat16, False) if cpu_has_bf16() else (None, False)
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if precision == "fp32":
        return None, False
    if precision == "bf16":
        if cuda and not torch.cuda.is_bf16_supported():
            raise ConfigError("train.precision", "this GPU has no bf16; use fp16 or fp32")
        return torch.bfloat16, False
    if not cuda:
        raise ConfigError("train.precision", "fp16 needs a GPU; on a CPU use bf16 or fp32")
    return torch.float16, True


Stamp = float | torch.cuda.Event  # a moment: time.perf_counter(), or a timing CUDA event


def stamp(device: torch.device) -> Stamp:
    """Now on ``device``'s clock: a recorded timing event on a GPU (when the work queued so
    far is done), the host's time elsewhere."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def seconds_between(a: Stamp, b: Stamp) -> float:
    """Seconds from stamp ``a`` to stamp ``b`` (both finished)."""
    if isinstance(a, float) or isinstance(b, float):
        return float(b) - float(a)  # type: ignore[arg-type]
    return a.elapsed_time(b) / 1e3


class PendingStep:
    """A launched optimizer step whose loss and gradient norm may still be on the device."""

    def __init__(self, record: dict[str, Any], values: torch.Tensor) -> None:
        self.record = record  # step, lr, tokens: known on the host at launch
        self._values = values  # [loss, grad_norm]
        self.done: Stamp | None = None  # when the device finished the step
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self.done = stamp(values.device)
            self._values = host

    def result(self) -> dict[str, Any]:
        """The step's metrics, waiting for the device if it has not finished the step."""
        if isinstance(self.done, torch.cuda.Event):
            self.done.synchronize()
        else:
            self.done = time.perf_counter()
        loss, norm = self._values.tolist()
        return {**self.record, "loss": loss, "grad_norm": None if math.isnan(norm) else norm}


def resolve_compile(compile: bool | None, device: torch.device) -> bool:
    """``train.compile``: None compiles on CUDA devices (where a C compiler is present)."""
    if compile is None:
        return device.type == "cuda" and shutil.which("cc") is not None
    if compile and shutil.which("c++" if device.type == "cpu" else "cc") is None:
        raise ConfigError("train.compile", f"torch.compile on {device.type} needs a C compiler")
    return compile
