"""The norms over the last axis (d values, ε = eps), by the fastest kernel for the input:

    LayerNorm(x) = (x − μ(x)) · s(x) ⊙ w + b,   s(x) = 1/√(σ²(x) + ε)   (σ² biased)
    RMSNorm(x)   = x · s(x) ⊙ w,                s(x) = 1/√(mean(x²) + ε)

A decoding step's few float32 rows take glassgpt's own kernel (``glassgpt.kernels.rowwise``,
without PyTorch's per-call set-up), as do its q and k heads (QK-norm), read in place. In training (autograd on), an RMS norm of contiguous
float32 CPU tensors takes :class:`CompiledNorm`, glassgpt's kernels for its forward and
backward: ``F.rms_norm`` is a composite of several ops on a CPU. The same kernels compute the
layer norm (``centred``), but there PyTorch's fused kernels were as fast or faster (the
Python of an autograd Function costs what the kernel saves), so ``F.layer_norm`` keeps it.
The kernels differ only in rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from glassgpt.kernels import rowwise


def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float) -> Tensor:
    """(x − μ) · s ⊙ w + b over the last axis of x [..., d] (w, b [d]; b None: no bias)."""
    if rowwise.few_rows(x, w, b):
        return rowwise.norm(x, w, b, eps, centred=True)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x · s ⊙ w over the last axis of x [..., d] (w [d])."""
    if rowwise.few_rows(x, w):
        return rowwise.norm(x, w, None, eps, centred=False)
    if rowwise.few_heads(x, w):  # a decoding step's q or k heads (QK-norm)
        return rowwise.norm_heads(x, w, eps)
    if _trains(x, w, None):
        return CompiledNorm.apply(x, w, None, eps, False)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _trains(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """Whether autograd records the norm and glassgpt's training kernels take its tensors."""
    if not torch.is_grad_enabled():
        return False
    if not (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return False
    return rowwise.trains_norm(x, w, b)


class CompiledNorm(torch.autograd.Function):
    """y = (x − μ) s ⊙ w + b (``centred``) or x s ⊙ w, s = 1/√(mean((x − μ)²) + ε); keeps x, w
    and the row statistics μ, s (as PyTorch's layer norm keeps its mean and rstd)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None, eps: float, centred: bool) -> Tensor:
        y, stats = rowwise.norm_train(x, w, b, eps, centred=centred)
        ctx.save_for_backward(x, w, stats)
        ctx.centred, ctx.bias = centred, b is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor, Tensor | None, None, None]:
        x, w, stats = ctx.saved_tensors
        if g.dtype is not torch.float32:
            g = g.float()
        dx, dw, db = rowwise.norm_train_backward(x, w, stats, g, centred=ctx.centred, bias=ctx.bias)
        return dx, dw, db, None, None
