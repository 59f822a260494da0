"""Data-parallel training across processes and machines (PyTorch DistributedDataParallel).

With W processes each holding a replica θ and its own shard of the global batch B = ∪_r B_r
(|B_r| = |B|/W), the gradient of the global mean loss is the mean of the per-rank gradients,

    ∇ L(B) = (1/W) Σ_r ∇ L(B_r),

which DDP computes by an all-reduce during the backward pass; every replica then takes the
same AdamW step. ``torchrun`` sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
MASTER_ADDR/PORT; this module reads them, picks the backend (NCCL on GPUs, gloo on CPUs),
the device of each rank, and the CPU threads per rank (cores // local processes). A process
that torchrun started joins a process group even when W = 1, so that a one-GPU torchrun
launch runs the same NCCL and DDP code as a larger one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from glassgpt.devices import available_devices
from glassgpt.errors import ConfigError, GlassError


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: its rank among ``world_size`` and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    launched: bool | None = None  # in a process group (torchrun); None: whether W > 1

    @property
    def enabled(self) -> bool:
        """Whether this process is in a process group (collectives, DDP)."""
        return self.world_size > 1 if self.launched is None else self.launched

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, writes metrics and checkpoints."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise GlassError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_device(preference: str, local_rank: int = 0) -> torch.device:
    """``auto`` → the local rank's GPU if CUDA is available, else the CPU."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "mps":
        if "mps" not in available_devices():
            raise ConfigError("train.device", "'mps' asked for, but this machine has "
                              f"{', '.join(available_devices())}")  # fmt: skip
        return torch.device("mps")
    if preference.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                "train.device", f"{preference!r} asked for, but no CUDA GPU is usable"
            )
        if preference == "cuda":
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        index = int(preference.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(
                "train.device", f"{preference!r}: only {torch.cuda.device_count()} GPUs visible"
            )
        return torch.device("cuda", index)
    return torch.device("cpu")


# glibc's mallopt(3) parameters (<malloc.h>) and the values the trainer sets on CPUs.
M_TRIM_THRESHOLD = -1  # free memory above this at the top of the heap goes back to the kernel
M_MMAP_THRESHOLD = -3  # blocks of this size or more get their own mmap, unmapped on free
KEEP_BLOCKS_UP_TO = 32 << 20  # 32 MiB: activation buffers of the models trained on CPUs
TRIM_ABOVE = 1 << 30  # 1 GiB


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks of up to 32 MiB instead of returning them.

    The CPU trainer's allocator setting, applied by ``glassgpt train`` on CPU devices right
    after :func:`init_distributed` (and by ``bench/train.py``), never by importing or by
    setting up a process group. Why: a training step on a CPU frees and reallocates the same
    activation buffers every step; glibc hands blocks at or above its mmap threshold back to
    the kernel on free, so each step page-faults them in again (in a small model that was
    ~20% of the step, much of it system time). Raising ``M_MMAP_THRESHOLD`` to
    ``KEEP_BLOCKS_UP_TO`` and ``M_TRIM_THRESHOLD`` to ``TRIM_ABOVE`` (the knobs behind
    ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``) keeps them in the heap, as the
    jemalloc/tcmalloc advice in PyTorch's performance guide does. Process-wide; returns
    whether it applied (False off glibc Linux).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, KEEP_BLOCKS_UP_TO) and libc.mallopt(
            M_TRIM_THRESHOLD, TRIM_ABOVE
        )
    except (OSError, AttributeError):
        return False
    return bool(ok)


def setup_cuda(device: torch.device, tf32: bool = True) -> None:
    """Make ``device`` current; ``tf32``: float32 matrix products and convolutions may use
    TF32 tensor cores (10-bit mantissa inputs, float32 accumulation), as training on GPUs
    usually does. Process-wide; sampling and inspection never call this."""
    torch.cuda.set_device(device if device.index is not None else torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher of its protocol) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def init_distributed(
    device_preference: str = "auto", threads: int | None = None, *, tf32: bool = True
) -> DistContext:
    """Read torchrun's environment, join its process group, set device and threads.

    The allocator is left alone: on CPUs the caller decides about :func:`keep_freed_memory`.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size if world_size > 1 else 1)
    device = resolve_device(device_preference, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(threads, local_world_size))
    else:
        setup_cuda(device, tf32)
    launched = world_size > 1 or launched_by_torchrun()
    if launched and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"backend": backend}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return DistContext(rank, world_size, local_rank, local_world_size, device, launched)


def cpu_threads(threads: int | None, local_world_size: int = 1) -> int:
    """Threads per process: ``train.threads``, else ``OMP_NUM_THREADS``, else cores // local
    processes. (Under torchrun, which sets ``OMP_NUM_THREADS=1`` for every process of a
    multi-process launch unless told otherwise, the variable is left to torchrun's rule.)

    >>> os.environ["OMP_NUM_THREADS"] = "1"; cpu_threads(None), cpu_threads(3)
    (1, 3)
    >>> del os.environ["OMP_NUM_THREADS"]
    """
    if threads:
        return threads
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp and not launched_by_torchrun():
        try:
            value = int(omp.split(",")[0])
        except ValueError:
            raise ConfigError(
                "OMP_NUM_THREADS", f"must be a positive integer, got {omp!r}"
            ) from None
        if value < 1:
            raise ConfigError("OMP_NUM_THREADS", f"must be a positive integer, got {omp!r}")
        return value
    cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def backend(ctx: DistContext) -> str | None:
    """The process group's backend (``nccl``, ``gloo``), or None outside one."""
    return str(dist.get_backend()) if ctx.enabled and dist.is_initialized() else None


def device_name(device: torch.device) -> str:
    """The GPU's name (``NVIDIA H100 80GB HBM3``), or ``cpu``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def all_reduce_mean(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The mean of ``t`` over ranks (``t`` itself when not distributed)."""
    if not ctx.enabled:
        return t
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / ctx.world_size


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True if ``flag`` is true on any rank (every rank gets the same answer)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not ctx.enabled:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
