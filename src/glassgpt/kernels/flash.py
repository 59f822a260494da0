"""z = softmax(q kᵀ/√d_head + M) v with the causal M (M[i, j] = −∞ for j > i) and its
gradients, by glassgpt's kernel ``glassgpt.kernels._flash`` (float32, CPU):

    dv = Pᵀ dz,  dS = P ∘ (dz vᵀ − Δ),  Δ_i = Σ_d dz_id z_id,  dq = dS k/√d,  dk = dSᵀ q/√d

with P kept from the forward where it is small (``policy.keeps_probabilities``: T up to 4 d_head, so that it
at most doubles what autograd keeps for the attention), else recomputed as exp(S − lse) from
the row log-sum-exps the forward keeps, so that autograd keeps q, k, v, z and lse as
PyTorch's fused kernel does. Keeping P saves one product of the backward's five and its
exps, for one more write in the forward. At a small model's heads (d_head 32, T 64-256)
PyTorch's CPU flash kernel runs its small products far below the core's multiply-add rate;
this one holds each (batch, head)'s q, k and v in the caches
and computes the products in register tiles (``kernels/_tile.h``). z comes back as a
[B, H, T, d_head] view of a [B, T, H, d_head] buffer, the layout the output projection
reads; the gradients likewise.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from glassgpt.kernels.extensions import extension
from glassgpt.kernels.policy import keeps_probabilities, kept_p_width

_flash = extension("_flash")  # not built (no C compiler at install): PyTorch's kernel everywhere


def takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel takes q, k, v: float32 CPU tensors of one [B, H, T, d_head] shape
    (queries and keys at the same positions). Under ``torch.compile`` the attention door
    (``glassgpt.kernels.attention_door``) calls it as the custom operator of
    ``glassgpt.kernels.custom_ops``, once registered, and never eagerly."""
    if _flash is None:
        return False
    if not (q.dtype is k.dtype is v.dtype is torch.float32) or q.ndim != 4:
        return False
    return q.shape == k.shape == v.shape and q.is_cpu and k.is_cpu and v.is_cpu


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ/√d_head + M) v for q, k, v [B, H, T, d_head] (any strides; ``takes``
    holds), differentiable in each; without autograd the forward alone (no lse kept)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        qkv = packed_base(q, k, v)
        if qkv is not None:
            return CausalAttentionQKV.apply(qkv, *q.shape)
        return CausalAttention.apply(q, k, v)
    return forward(q, k, v, keep_lse=False)[0]


def packed_base(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The one tensor qkv (contiguous, B·T·3·H·d_head values, as the QKV projection returns
    it) whose [B, T, 3, H, d_head] view q, k and v are, read as [B, H, T, d_head]; else None.

    Autograd then sends the gradients straight to qkv in one buffer, [dq | dk | dv] per
    position, instead of stacking dq, dk and dv and copying the stack into qkv's layout.
    Only for the three outputs of one unbind (the model's path with no hooks on q, k, v), so
    that no hook on their gradients is skipped."""
    node = q.grad_fn
    if node is None or node is not k.grad_fn or node is not v.grad_fn:
        return None
    if node.name() != "UnbindBackward0" or q._backward_hooks or k._backward_hooks:
        return None
    base = q._base
    if base is None or k._base is not base or v._base is not base or not base.is_contiguous():
        return None
    B, H, T, D = q.shape
    if base.numel() != B * T * 3 * H * D or not base.requires_grad:
        return None
    strides = (T * 3 * H * D, D, 3 * H * D, 1)
    if not (q.stride() == k.stride() == v.stride() == strides):
        return None
    offset = base.storage_offset()
    starts = (q.storage_offset(), k.storage_offset(), v.storage_offset())
    return base if starts == (offset, offset + H * D, offset + 2 * H * D) else None


def _qkv_views(qkv: Tensor, B: int, H: int, T: int, D: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [B, H, T, D] as views of qkv (contiguous, [B, T, 3, H, D] values)."""
    q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


def _bthd(like: Tensor) -> Tensor:
    """An empty [B, T, H, D] float32 buffer, returned as its [B, H, T, D] view."""
    B, H, T, D = like.shape
    return torch.empty(B, T, H, D, dtype=torch.float32).transpose(1, 2)


def forward(
    q: Tensor, k: Tensor, v: Tensor, *, keep_lse: bool = True, keep_p: bool = False
) -> tuple[Tensor, Tensor]:
    """z [B, H, T, D] (a view of [B, T, H, D]) and what the backward needs: P [B, H, T, T
    rounded up to 16] (rows zero past their last key) with ``keep_p``, else the row
    log-sum-exps lse [B, H, T] (an empty tensor without ``keep_lse``)."""
    assert _flash is not None
    B, H, T, D = q.shape
    z = _bthd(q)
    kept = torch.empty((B, H, T, kept_p_width(T)) if keep_p else (B, H, T if keep_lse else 0))
    lse, P = (0, kept.data_ptr()) if keep_p else (kept.data_ptr() if keep_lse else 0, 0)
    strides = (*q.stride(), *k.stride(), *v.stride(), *z.stride())
    _flash.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), z.data_ptr(), lse, P,
                   B, H, T, D, strides, torch.get_num_threads())  # fmt: skip
    return z, kept


def backward(
    q: Tensor, k: Tensor, v: Tensor, z: Tensor, kept: Tensor, dz: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv [B, H, T, D] (views of [B, T, H, D]) for the gradient dz of z; ``kept`` is
    what :func:`forward` kept (P or the row log-sum-exps)."""
    dq, dk, dv = _bthd(q), _bthd(q), _bthd(q)
    _backward_into(q, k, v, z, kept, dz, dq, dk, dv)
    return dq, dk, dv


def _backward_into(
    q: Tensor, k: Tensor, v: Tensor, z: Tensor, kept: Tensor, dz: Tensor,
    dq: Tensor, dk: Tensor, dv: Tensor,
) -> None:  # fmt: skip
    """:func:`backward`, writing into the given dq, dk, dv [B, H, T, D] (any strides)."""
    assert _flash is not None
    B, H, T, D = q.shape
    tensors = (q, k, v, z, dz, dq, dk, dv)
    strides = tuple(s for t in tensors for s in t.stride())
    lse, P = (0, kept.data_ptr()) if kept.ndim == 4 else (kept.data_ptr(), 0)
    _flash.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), z.data_ptr(), lse, P,
                    dz.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), B, H, T, D,
                    strides, torch.get_num_threads())  # fmt: skip


class CausalAttention(torch.autograd.Function):
    """z = softmax(q kᵀ/√d + M) v, M causal; keeps q, k, v, z and P or the row log-sum-exps."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        z, kept = forward(q, k, v, keep_p=keeps_probabilities(*q.shape[-2:]))
        ctx.save_for_backward(q, k, v, z, kept)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, dz: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, z, kept = ctx.saved_tensors
        if dz.dtype is not torch.float32:
            dz = dz.float()
        return backward(q, k, v, z, kept, dz)


class CausalAttentionQKV(torch.autograd.Function):
    """:class:`CausalAttention` of the q, k, v packed in qkv ([B, T, 3, H, d] values); its gradient
    comes back in qkv's layout, each of dq, dk and dv written in place there by the kernel."""

    @staticmethod
    def forward(ctx, qkv: Tensor, B: int, H: int, T: int, D: int) -> Tensor:
        z, kept = forward(*_qkv_views(qkv, B, H, T, D), keep_p=keeps_probabilities(T, D))
        ctx.save_for_backward(qkv, z, kept)
        ctx.shape = B, H, T, D
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, dz: Tensor) -> tuple[Tensor, None, None, None, None]:
        qkv, z, kept = ctx.saved_tensors
        if dz.dtype is not torch.float32:
            dz = dz.float()
        dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        views = _qkv_views(qkv, *ctx.shape), _qkv_views(dqkv, *ctx.shape)
        _backward_into(*views[0], z, kept, dz, *views[1])
        return dqkv, None, None, None, None
