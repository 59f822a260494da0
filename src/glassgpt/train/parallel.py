"""Data parallelism over W ranks: replicated parameters (DDP) or fully sharded ones (FSDP2).

Both take the same step. With rank r's gradient g_r of its share of the global batch,

    DDP:   every rank holds θ, ∇θ and AdamW's (m, v);  g = (1/W) Σ_r g_r  (all-reduce)
    FSDP:  rank r holds the r-th dim-0 shard θ⁽ʳ⁾ of every parameter, its gradient and moments;
           a block's forward and backward all-gather θ = [θ⁽⁰⁾; …; θ⁽ᵂ⁻¹⁾] and free it again,
           and the backward reduce-scatters  g⁽ʳ⁾ = ((1/W) Σ_s g_s)⁽ʳ⁾,

so under FSDP each rank's AdamW updates its own shard: weights, gradients and optimizer state
per rank are 1/W of DDP's (``glassgpt describe --world-size W``), activations unchanged.
``train.parallel=fsdp`` shards each of the model's ``blocks`` and then the rest (PyTorch's
``fully_shard``), with a ``MixedPrecisionPolicy`` (bf16 compute, float32 gradient reduction)
where the run trains in bf16. Clipping needs the norm over every rank's shards,

    ‖g‖₂ = √(Σ_r Σ_p ‖g_p⁽ʳ⁾‖²),

which :func:`clip_sharded` takes with one all-reduce.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from glassgpt.errors import ConfigError
from glassgpt.train.config import TrainConfig
from glassgpt.train.distributed import DistContext


def torchrun_command(argv: Sequence[str] | None = None, nproc: int = 2) -> str:
    """The ``torchrun`` line that starts this ``glassgpt`` command on ``nproc`` processes.

    >>> torchrun_command(["glassgpt", "train", "--preset", "cpu-tiny"])
    'torchrun --nproc_per_node=2 -m glassgpt train --preset cpu-tiny'
    """
    args = list(sys.argv if argv is None else argv)[1:]
    return shlex.join(["torchrun", f"--nproc_per_node={nproc}", "-m", "glassgpt", *args])


def check_parallel(
    cfg: TrainConfig, ctx: DistContext, autocast_dtype: torch.dtype | None = None,
    argv: Sequence[str] | None = None,
) -> None:  # fmt: skip
    """Refuse, in one line, what ``train.parallel=fsdp`` cannot run: no process group, Muon
    (its orthogonalisation needs whole matrices), fp16 (its GradScaler is DDP's)."""
    if cfg.parallel != "fsdp":
        return
    if not ctx.enabled:
        raise ConfigError(
            "train.parallel",
            "fsdp shards the model over the processes of a process group, and this process "
            f"is alone; start it with torchrun: {torchrun_command(argv)}",
        )
    if cfg.optimizer == "muon":
        raise ConfigError(
            "train.optimizer", "muon orthogonalises whole matrices; with train.parallel=fsdp "
            "use train.optimizer=adamw, or train.parallel=ddp"
        )  # fmt: skip
    if autocast_dtype == torch.float16:
        raise ConfigError(
            "train.precision", "fsdp trains in bf16 or fp32, and this device has no bf16 "
            "(fp16 needs a gradient scaler); set train.precision=fp32, or train.parallel=ddp"
        )  # fmt: skip


def shard(model: nn.Module, ctx: DistContext, autocast_dtype: torch.dtype | None) -> nn.Module:
    """``fully_shard`` each module of ``model.blocks`` (where it has them), then ``model``
    itself (embeddings, final norm, unembedding), over the W ranks of ``ctx``; in place, and
    returned, with each rank's shards on its device (the model may come whole on the CPU).

    With ``autocast_dtype`` bf16, the gathered parameters are bf16 copies and the gradients are
    reduced in float32 (the sharded parameters and AdamW's state stay float32).
    """
    if autocast_dtype == torch.bfloat16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    # the root's parameters are needed again at once by the backward: kept gathered
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``fully_shard`` has sharded ``model``."""
    return isinstance(model, FSDPModule)


def gradient_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Around one micro-batch's backward: reduce the gradients only at the ``last`` one.

    ``model``: the DistributedDataParallel wrapper (``no_sync``) or the sharded model
    (``set_requires_gradient_sync``: unsharded gradients accumulate until the last).
    """
    if is_sharded(model):
        model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else model.no_sync()  # type: ignore[operator]


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def clip_sharded(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """g ← g · min(1, max_norm / (‖g‖₂ + 10⁻⁶)) with ‖g‖₂ over every rank's shards (the module
    docstring's sum, by one all-reduce); returns ‖g‖₂ (the same on every rank)."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    nonempty = [g for g in grads if g.numel()]
    if nonempty:
        norms = torch._foreach_norm([g.float() for g in nonempty], 2.0)
        squares = torch.stack(norms).square().sum()
    if dist.is_initialized():
        dist.all_reduce(squares, op=dist.ReduceOp.SUM)
    norm = squares.sqrt()
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    if nonempty:
        torch._foreach_mul_(nonempty, factor.to(nonempty[0].dtype))
    return norm
