"""glassgpt's float32 CPU training kernels as PyTorch custom operators, for ``torch.compile``.

    glassgpt::linear(x, W, b)          y = x W + b (oneDNN), and xᵀ where ∂W will want it
    glassgpt::linear_backward(...)     ∂x = g Wᵀ, ∂W = xᵀ g, ∂b = Σ_rows g
    glassgpt::causal_attention(q, k, v)            z = softmax(q kᵀ/√d + M) v, M causal
    glassgpt::causal_attention_backward(...)       dq, dk, dv

Eagerly, the seams call these kernels through ``torch.autograd.Function``s
(``glassgpt.kernels.onednn``, ``glassgpt.kernels.flash``), which dynamo cannot trace: they
hand raw addresses to compiled code. Under ``torch.compile`` the seams therefore fell back to
PyTorch's own kernels, and a compiled float32 training step on a CPU was slower than the
eager one (inductor's products go through MKL, its attention through PyTorch's CPU flash
kernel). Registered as
custom operators (``torch.library.custom_op``, with a fake implementation that gives each
output's shape and strides, and the gradient formula by ``register_autograd``), the kernels
stay opaque calls inside the compiled graph, and inductor fuses what lies between them (the
norms, the GELU, the residual sums). Each operator computes exactly what the eager seam does,
by the same functions.

:func:`register` defines them, once per process; the trainer calls it before it compiles
a model on a CPU (``train.compile=true``), and so may anyone who compiles a glassgpt model
themselves. Until then the seams keep PyTorch's kernels under ``torch.compile``, and importing
this module costs nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassgpt.kernels import flash, onednn, rowwise
from glassgpt.kernels.policy import keeps_probabilities, kept_p_width

_OPS: dict[str, Any] = {}


def registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return bool(_OPS)


def register() -> None:
    """Define the operators (idempotent)."""
    if _OPS:
        return

    # -- y = x W + b ------------------------------------------------------------------------
    @torch.library.custom_op("glassgpt::linear", mutates_args=())
    def linear_op(
        x: Tensor, W: Tensor, b: Tensor | None, transposed: bool, keep_t: bool
    ) -> tuple[Tensor, Tensor]:
        """(y [rows, d_out], xᵀ [d_in, rows] where ``keep_t``, else an empty tensor)."""
        y = onednn._mm(x, W if transposed else W.T, b)
        if not keep_t:
            return y, x.new_empty(0)
        x_t = rowwise.transposed(x)
        return y, (x.T.contiguous() if x_t is None else x_t)

    @linear_op.register_fake
    def _(x: Tensor, W: Tensor, b: Tensor | None, transposed: bool, keep_t: bool):
        d_out = W.shape[0] if transposed else W.shape[1]
        kept = x.new_empty(x.shape[1], x.shape[0]) if keep_t else x.new_empty(0)
        return x.new_empty(x.shape[0], d_out), kept

    @torch.library.custom_op("glassgpt::linear_backward", mutates_args=())
    def linear_backward_op(
        g: Tensor, kept: Tensor, W: Tensor, transposed: bool, x_transposed: bool,
        need_x: bool, need_W: bool, need_b: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """(∂x, ∂W, ∂b), an empty tensor for each one not asked for."""
        grads = onednn.gradients(g, kept, W, transposed, x_transposed, need_x, need_W, need_b)
        return tuple(g.new_empty(0) if t is None else t.contiguous() for t in grads)  # type: ignore[return-value]

    @linear_backward_op.register_fake
    def _(g, kept, W, transposed, x_transposed, need_x, need_W, need_b):
        rows = g.shape[0]
        d_in = W.shape[1] if transposed else W.shape[0]
        dx = g.new_empty(rows, d_in) if need_x else g.new_empty(0)
        dW = W.new_empty(W.shape) if need_W else g.new_empty(0)
        db = g.new_empty(g.shape[1]) if need_b else g.new_empty(0)
        return dx, dW, db

    def linear_setup(ctx, inputs, output) -> None:
        x, W, b, transposed, keep_t = inputs
        ctx.save_for_backward(output[1] if keep_t else x, W)
        ctx.transposed, ctx.keep_t, ctx.has_bias = transposed, keep_t, b is not None

    def linear_grad(ctx, g: Tensor, _g_kept: Tensor):
        kept, W = ctx.saved_tensors
        need_x, need_W = ctx.needs_input_grad[:2]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        dx, dW, db = linear_backward_op(
            g.contiguous(), kept, W, ctx.transposed, ctx.keep_t, need_x, need_W, need_b
        )
        return (dx if need_x else None, dW if need_W else None, db if need_b else None,
                None, None)  # fmt: skip

    linear_op.register_autograd(linear_grad, setup_context=linear_setup)

    # -- z = softmax(q kᵀ/√d + M) v ---------------------------------------------------------
    def bthd(like: Tensor) -> Tensor:  # [B, H, T, D] view of a [B, T, H, D] buffer
        B, H, T, D = like.shape
        return like.new_empty(B, T, H, D).transpose(1, 2)

    @torch.library.custom_op("glassgpt::causal_attention", mutates_args=())
    def causal_op(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(z, what the backward needs: P or the row log-sum-exps, as the eager seam keeps)."""
        return flash.forward(q, k, v, keep_p=keeps_probabilities(*q.shape[-2:]))

    @causal_op.register_fake
    def _(q: Tensor, k: Tensor, v: Tensor):
        B, H, T, D = q.shape
        P = keeps_probabilities(T, D)
        return bthd(q), q.new_empty((B, H, T, kept_p_width(T)) if P else (B, H, T))

    @torch.library.custom_op("glassgpt::causal_attention_backward", mutates_args=())
    def causal_backward_op(
        q: Tensor, k: Tensor, v: Tensor, z: Tensor, kept: Tensor, dz: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return flash.backward(q, k, v, z, kept, dz)

    @causal_backward_op.register_fake
    def _(q, k, v, z, kept, dz):
        return bthd(q), bthd(q), bthd(q)

    def causal_setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:3], *output)

    def causal_grad(ctx, dz: Tensor, _d_kept: Tensor):
        q, k, v, z, kept = ctx.saved_tensors
        return causal_backward_op(q, k, v, z, kept, dz.float())

    causal_op.register_autograd(causal_grad, setup_context=causal_setup)

    _OPS.update(linear=linear_op, causal=causal_op)


def linear(x: Tensor, W: Tensor, b: Tensor | None, transposed: bool) -> Tensor:
    """x W + b ([..., d_out]) by ``glassgpt::linear``; W 2-D, [d_in, d_out] or, ``transposed``,
    [d_out, d_in]. Keeps xᵀ for ∂W where the eager seam does (d_in < d_out)."""
    x2 = x.reshape(-1, x.shape[-1])
    d_out = W.shape[0] if transposed else W.shape[1]
    keep_t = (
        torch.is_grad_enabled() and W.requires_grad and onednn.keeps_transpose(x2.shape[1], d_out)
    )
    y, _ = _OPS["linear"](x2, W, b, transposed, keep_t)
    return y.view(*x.shape[:-1], d_out)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """z [B, H, T, d_head] by ``glassgpt::causal_attention``."""
    return _OPS["causal"](q, k, v)[0]
