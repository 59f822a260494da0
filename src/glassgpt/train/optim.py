"""AdamW with decay on matrices only, and the warmup + decay learning-rate schedule.

AdamW (Loshchilov & Hutter), for each parameter θ with gradient g at step t:

    m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
    θ ← θ − η_t (m̂ / (√v̂ + ε) + λ θ)      m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)

with λ = ``weight_decay`` for matrices (every parameter of dimension ≥ 2: W_E, W_Q, W_O,
W_in, …) and λ = 0 for vectors (biases, norm weights), and η_t = :func:`lr_at`. PyTorch's
fused kernel is used where the parameters' device supports it, else the foreach one; on a
CPU :class:`AdamW` calls it once per group with one step count per group.
Optimizer state is saved by parameter name (:func:`optimizer_tensors`), so a checkpoint
does not depend on the order in which parameters were registered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from glassgpt import kernels
from glassgpt.errors import GlassError
from glassgpt.model.attention import fuse_legacy_names, fuse_qkv
from glassgpt.train.adamw import AdamW
from glassgpt.train.config import TrainConfig
from glassgpt.train.muon import MuonAdamW, is_hidden_matrix


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then decay.

    >>> cfg = TrainConfig(max_steps=100, lr=1.0, min_lr=0.0, warmup_steps=9)
    >>> [round(lr_at(s, cfg), 3) for s in (0, 8, 9, 50, 99, 100, 500)]
    [0.1, 0.9, 1.0, 0.577, 0.0, 0.0, 0.0]
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if cfg.schedule == "constant":
        return cfg.lr
    decay = cfg.total_decay_steps
    if step >= decay:
        return cfg.min_lr
    span = max(1, decay - cfg.warmup_steps)
    progress = (step - cfg.warmup_steps) / span  # in [0, 1)
    if cfg.schedule == "linear":
        coeff = 1.0 - progress
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices (decayed) and vectors/scalars (not), in a fixed order.

    Each group also carries the parameters' names (``"names"``) so that optimizer state can
    be saved by name.
    """
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append((name, p))
    return [
        {
            "params": [p for _, p in decay],
            "names": [n for n, _ in decay],
            "weight_decay": weight_decay,
        },
        {
            "params": [p for _, p in no_decay],
            "names": [n for n, _ in no_decay],
            "weight_decay": 0.0,
        },
    ]


def fused_available(device: torch.device) -> bool:
    """Whether PyTorch's fused AdamW kernel runs on ``device`` (CUDA, and CPU since 2.4)."""
    try:
        probe = nn.Parameter(torch.zeros(1, device=device))
        AdamW([probe], fused=True)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> AdamW:
    """AdamW over :func:`param_groups` with ``cfg``'s betas, eps and weight decay; with
    ``cfg.optimizer == "muon"``, the blocks' matrices move to a third group that takes the
    Muon update (:class:`glassgpt.train.muon.MuonAdamW`), its learning rate ``lr_scale`` =
    muon_lr / lr times the schedule's.

    >>> m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    >>> opt = build_optimizer(m, TrainConfig(weight_decay=0.1))
    >>> [(g["names"], g["weight_decay"]) for g in opt.param_groups]
    [(['0.weight'], 0.1), (['0.bias', '1.weight', '1.bias'], 0.0)]
    """
    groups = param_groups(model, cfg.weight_decay)
    device = next(model.parameters()).device
    kind = {"fused": True} if fused_available(device) else {"foreach": True}
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        return AdamW(groups, lr=lr_at(0, cfg), betas=betas, eps=cfg.eps, **kind)
    params = dict(model.named_parameters())

    hidden = [n for n in groups[0]["names"] if is_hidden_matrix(n, params[n])]
    groups[0] = {
        **groups[0],
        "params": [params[n] for n in groups[0]["names"] if n not in hidden],
        "names": [n for n in groups[0]["names"] if n not in hidden],
    }
    scale = (cfg.muon_lr if cfg.muon_lr is not None else cfg.lr) / cfg.lr
    muon = {"params": [params[n] for n in hidden], "names": hidden, "muon": True}
    muon |= {"weight_decay": cfg.weight_decay, "momentum": cfg.muon_momentum, "lr_scale": scale,
             "ns_steps": cfg.muon_ns_steps}  # fmt: skip
    opt = MuonAdamW([*groups, muon], lr=lr_at(0, cfg), betas=betas, eps=cfg.eps, **kind)
    set_lr(opt, lr_at(0, cfg))
    return opt


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's learning rate: ``lr`` times the group's ``lr_scale`` (default 1)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    """AdamW's state as ``{"<param name>.<key>": tensor}`` plus its groups' hyperparameters."""
    names = [n for g in opt.param_groups for n in g["names"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    tensors: dict[str, torch.Tensor] = {}
    for name, p in zip(names, params):
        for key, value in opt.state.get(p, {}).items():
            value = torch.as_tensor(value)  # a step count may be a group's shared tensor
            tensors[f"{name}.{key}"] = value.clone() if value.ndim == 0 else value
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return tensors, groups


def load_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], groups: list
) -> None:
    """Inverse of :func:`optimizer_tensors` (parameters matched by name)."""
    current = [g["names"] for g in opt.param_groups]
    if [g["names"] for g in groups] != current:
        groups, tensors = _fused_qkv_state(groups, tensors)
    if [g["names"] for g in groups] != current:
        raise GlassError("the checkpoint's optimizer holds different parameters")
    by_name: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, _, field = key.rpartition(".")  # optimizer state keys have no dots
        by_name.setdefault(name, {})[field] = value
    names = [n for g in opt.param_groups for n in g["names"]]
    state = {i: by_name[n] for i, n in enumerate(names) if n in by_name}
    saved_groups = []
    index = 0
    for g in groups:
        n = len(g["names"])
        g = dict(g)
        g["betas"] = tuple(g["betas"])
        saved_groups.append({**g, "params": list(range(index, index + n))})
        index += n
    opt.load_state_dict({"state": state, "param_groups": saved_groups})


def _fused_qkv_state(
    groups: list, tensors: Mapping[str, torch.Tensor]
) -> tuple[list, dict[str, torch.Tensor]]:
    """A checkpoint from before W_Q, W_K, W_V became views of W_QKV: the same state with
    each triple's moments fused as the parameters are (``glassgpt.model.attention``)."""
    out = dict(tensors)
    for key in list(tensors):
        stem, _, rest = key.partition(".attn.")
        leaf, _, field = rest.partition(".")
        if leaf not in ("W_Q", "b_Q"):
            continue
        names = [f"{stem}.attn.{leaf[0]}_{m}.{field}" for m in "QKV"]
        if not all(n in tensors for n in names):
            continue
        parts = [out.pop(n) for n in names]
        fused = parts[0] if parts[0].ndim == 0 else fuse_qkv(parts)
        out[f"{stem}.attn.{leaf[0]}_QKV.{field}"] = fused
    return [{**g, "names": fuse_legacy_names(list(g["names"]))} for g in groups], out


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """g ← g · min(1, max_norm / (‖g‖₂ + 10⁻⁶)) over all gradients together; returns ‖g‖₂.

    ``clip_grad_norm_``'s rule. On a CPU, where reading the norm costs nothing, the gradients
    are multiplied only when the factor is below 1 (multiplying by 1 changes no value, and
    cost about 1% of a small model's step); on a GPU always, so that the host never waits.
    Contiguous float32 gradients on a CPU take glassgpt's kernels (``kernels.sum_squares``,
    ``kernels.scale_``): ‖g‖₂² summed in float64 in one pass over all of them, and one pass
    to scale them, where PyTorch makes a call per tensor. The norm is then the float32 rounding of
    the float64 one, where PyTorch's sums float32 norms, so the two can differ in the last
    bit, and the clipped gradients by as much."""
    grads = [p.grad for p in params if p.grad is not None]
    squares = kernels.sum_squares(grads)  # float32 CPU gradients: one pass for all
    if squares is not None:
        norm = math.sqrt(squares)
        if not norm + 1e-6 <= max_norm:  # NaN: as torch does
            kernels.scale_(grads, min(max_norm / (norm + 1e-6), 1.0))
        return torch.tensor(norm, dtype=torch.float32)
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if norm.device.type != "cpu" or not float(norm) + 1e-6 <= max_norm:  # NaN: as torch does
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm
