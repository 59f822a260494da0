"""Checkpoints of a sharded (``train.parallel=fsdp``) run: the weights whole, the optimizer as shards.

    model.safetensors   θ = [θ⁽⁰⁾; …; θ⁽ᵂ⁻¹⁾], gathered onto rank 0's CPU and written once: the
                        same file as a DDP run's, which every reader (``sample``, ``inspect``,
                        ``export``, ``--init-from``) opens in one process
    optimizer/          AdamW's (t, m⁽ʳ⁾, v⁽ʳ⁾) for each rank r's shard, written by every rank
                        through ``torch.distributed.checkpoint`` (DCP): ``.metadata`` and one
                        ``.distcp`` file per rank

DCP records where each shard lies in its whole tensor, so optimizer state saved by N ranks is
re-sliced into M ranks' shards on load, or into whole tensors in one process (a DDP or
single-process resume). Every rank writes its shards into ``ckpt/.tmp-shards-step_S/`` on the
shared run folder; rank 0 then moves that folder into the checkpoint it writes atomically
(:func:`glassgpt.checkpoint.write_checkpoint`'s ``folders``), whose ``state.json`` lists each
shard file's checksum. A DDP checkpoint (``optimizer.safetensors``, by parameter name) resumes
under FSDP too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from glassgpt import checkpoint as ckpt
from glassgpt.train.optim import load_optimizer_tensors
from glassgpt.train.parallel import is_sharded

SHARDS = "optimizer"  # the checkpoint's subfolder of optimizer shards


def _options(**kwargs: Any) -> Any:
    return StateDictOptions(**kwargs)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict: gathered onto rank 0's CPU under FSDP (every rank must call it;
    the others get ``{}``), else ``model.state_dict()``."""
    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


def load_full_model(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a whole state dict; under FSDP each rank keeps its shard of it.

    Each whole tensor is cut as the sharded model's own ``state_dict()`` holds that entry, and
    ``load_state_dict`` then takes them through the model's hooks (GPT's W_Q, W_K, W_V fuse
    into W_QKV shard by shard) as it takes whole ones.
    """
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    layout = model.state_dict()  # the names and placements of this model's entries
    cut: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        ref = layout.get(key)
        if isinstance(ref, DTensor) and tuple(ref.shape) == tuple(value.shape):
            value = value.to(device=ref.to_local().device, dtype=ref.dtype)
            # every rank holds the whole tensor: each cuts its own shard, without a collective
            value = distribute_tensor(value, ref.device_mesh, ref.placements, src_data_rank=None)
        cut[key] = value
    model.load_state_dict(cut)


def staging(ckpt_root: Path, step: int) -> Path:
    """Where every rank writes step ``step``'s optimizer shards before rank 0 moves them."""
    return Path(ckpt_root) / f".tmp-shards-step_{step:06d}"


def save_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank: its shards of the optimizer state into ``folder`` (DCP; a collective)."""
    dcp.save(get_optimizer_state_dict(model, optimizer), checkpoint_id=folder)


def has_shards(checkpoint: ckpt.Checkpoint) -> bool:
    """Whether ``checkpoint`` holds its optimizer state as DCP shards."""
    return any(name.startswith(SHARDS + "/") for name in checkpoint.state.get("files", {}))


def load_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank (or one process): the optimizer state saved by :func:`save_optimizer_shards`
    on any number of ranks, re-sliced to this model's parameters (sharded or whole)."""
    state = get_optimizer_state_dict(model, optimizer)  # the layout to fill: keys and shards
    try:
        dcp.load(state, checkpoint_id=folder)
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ckpt.CheckpointError(f"{folder}: optimizer shards do not fit: {first}") from None
    set_optimizer_state_dict(model, optimizer, state)


def load_named_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: Mapping[str, torch.Tensor],
    groups: list[dict[str, Any]],
) -> None:
    """A DDP checkpoint's optimizer (``{"<param name>.<key>": tensor}``, whole tensors) into a
    sharded model's optimizer: each moment is cut as its parameter is, each rank keeping its
    shard (every rank read the whole file), then loaded by name as a DDP run loads it."""
    params = dict(model.named_parameters())
    cut: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        name = key.rpartition(".")[0]
        p = params.get(name)
        if isinstance(p, DTensor) and tuple(value.shape) == tuple(p.shape):
            value = value.to(device=p.to_local().device)
            value = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)
        cut[key] = value
    load_optimizer_tensors(optimizer, cut, groups)
