"""z = softmax(q kᵀ/√d_head + M) v with the causal M (M[i, j] = −∞ for j > i) and its
gradients, by glassgpt's kernel ``glassgpt.kernels._flash`` (float32, CPU):

    dv = Pᵀ dz,  dS = P ∘ (dz vᵀ − Δ),  Δ_i = Σ_d dz_id z_id,  dq = dS k/√d,  dk = dSᵀ q/√d

with P = exp(S − lse) recomputed from the row log-sum-exps the forward keeps, so that
autograd keeps q, k, v, z and lse as PyTorch's fused kernel does. At a small model's heads
(d_head 32, T 64-256) PyTorch's CPU flash kernel runs its small products at about a tenth of
the core's multiply-add rate; this one holds each (batch, head)'s q, k and v in the caches
and computes the products in register tiles (``kernels/_tile.h``). z comes back as a
[B, H, T, d_head] view of a [B, T, H, d_head] buffer, the layout the output projection
reads; the gradients likewise.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

try:
    from glassgpt.kernels import _flash
except ImportError:  # not built (no C compiler at install): PyTorch's kernel everywhere
    _flash = None


def takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel takes q, k, v: float32 CPU tensors of one [B, H, T, d_head] shape
    (queries and keys at the same positions), not under ``torch.compile``."""
    if _flash is None or torch.compiler.is_compiling():
        return False
    if not (q.dtype is k.dtype is v.dtype is torch.float32) or q.ndim != 4:
        return False
    return q.shape == k.shape == v.shape and q.is_cpu and k.is_cpu and v.is_cpu


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q kᵀ/√d_head + M) v for q, k, v [B, H, T, d_head] (any strides; ``takes``
    holds), differentiable in each; without autograd the forward alone (no lse kept)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return CausalAttention.apply(q, k, v)
    return forward(q, k, v, keep_lse=False)[0]


def _bthd(like: Tensor) -> Tensor:
    """An empty [B, T, H, D] float32 buffer, returned as its [B, H, T, D] view."""
    B, H, T, D = like.shape
    return torch.empty(B, T, H, D, dtype=torch.float32).transpose(1, 2)


def forward(q: Tensor, k: Tensor, v: Tensor, *, keep_lse: bool = True) -> tuple[Tensor, Tensor]:
    """z [B, H, T, D] (a view of [B, T, H, D]) and the row log-sum-exps lse [B, H, T] (an
    empty tensor without ``keep_lse``)."""
    assert _flash is not None
    B, H, T, D = q.shape
    z = _bthd(q)
    lse = torch.empty(B, H, T if keep_lse else 0, dtype=torch.float32)
    strides = (*q.stride(), *k.stride(), *v.stride(), *z.stride())
    _flash.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), z.data_ptr(),
                   lse.data_ptr() if keep_lse else 0, B, H, T, D, strides,
                   torch.get_num_threads())  # fmt: skip
    return z, lse


def backward(
    q: Tensor, k: Tensor, v: Tensor, z: Tensor, lse: Tensor, dz: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv [B, H, T, D] (views of [B, T, H, D]) for the gradient dz of z."""
    assert _flash is not None
    B, H, T, D = q.shape
    dq, dk, dv = _bthd(q), _bthd(q), _bthd(q)
    tensors = (q, k, v, z, dz, dq, dk, dv)
    strides = tuple(s for t in tensors for s in t.stride())
    _flash.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), z.data_ptr(), lse.data_ptr(),
                    dz.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), B, H, T, D,
                    strides, torch.get_num_threads())  # fmt: skip
    return dq, dk, dv


class CausalAttention(torch.autograd.Function):
    """z = softmax(q kᵀ/√d + M) v, M causal; keeps q, k, v, z and the row log-sum-exps."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        z, lse = forward(q, k, v)
        ctx.save_for_backward(q, k, v, z, lse)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, dz: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, z, lse = ctx.saved_tensors
        if dz.dtype is not torch.float32:
            dz = dz.float()
        return backward(q, k, v, z, lse, dz)
