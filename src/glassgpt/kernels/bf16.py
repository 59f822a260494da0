"""bf16 autocast products on CPUs without bf16 arithmetic, computed in float32:

    y = round_bf16(round_bf16(x) round_bf16(W) + round_bf16(b))

which is what CPU autocast's bf16 ``F.linear`` computes: its inputs rounded to bf16, each
product of two bf16 values exact in float32, the sums in float32, the output rounded to
bf16. A CPU with AVX-512 BF16 or AMX runs that product natively; on one without (AVX2, or
AVX-512 without its BF16 extension) PyTorch's bf16 product falls back to a slow path, many
times slower than its float32 one. There
the seam (``glassgpt.kernels.dense``) computes the same function with float32 products of
the bf16-rounded values (:class:`Bf16Linear`). The gradients follow autocast's too:

    ∂x = round_bf16(g W̃ᵀ),  ∂W = round_bf16(x̃ᵀ g),  ∂b = round_bf16(Σ_rows g)

(x̃, W̃ the bf16-rounded inputs, g the incoming bf16 gradient), each handed back in its
input's dtype, as autocast's casts do. Only the order of the float32 sums differs from the
native kernel. Autograd keeps x̃ and W̃ in bf16, as autocast does.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from glassgpt.kernels.policy import native_bf16

BF16 = torch.bfloat16


def cache_dtype(dtype: torch.dtype, device: torch.device | str | None = None) -> torch.dtype:
    """The dtype in which a KV cache keeps the keys and values of a ``dtype`` model on
    ``device``: float32 for bf16 on a CPU without bf16 arithmetic, else ``dtype``. There bf16
    attention computes on float32 copies of q, k and v; a float32 cache holds the bf16 values
    exactly (the same logits, bit for bit) and spares copying every cached key and value at
    every step, at twice the
    cache's memory."""
    cpu = device is None or torch.device(device).type == "cpu"
    return torch.float32 if dtype == BF16 and cpu and not native() else dtype


def emulated(x: Tensor) -> bool:
    """Whether a product of x under the current autocast is a bf16 one that this module
    computes (CPU autocast to bf16 on, a CPU without bf16 arithmetic, float32/bf16 x, not
    under ``torch.compile``)."""
    if not x.is_cpu or not torch.is_autocast_enabled("cpu"):
        return False
    if torch.get_autocast_dtype("cpu") != BF16 or x.dtype not in (torch.float32, BF16):
        return False
    return not torch.compiler.is_compiling() and not native()


def native() -> bool:
    """Whether this CPU multiplies bf16 natively (``glassgpt.kernels.policy.native_bf16``;
    looked up at each call, so that tests can patch it here)."""
    return native_bf16()


def linear(x: Tensor, W: Tensor, b: Tensor | None = None, *, transposed: bool = False) -> Tensor:
    """round_bf16(x̃ W̃ + b̃) (x̃ W̃ᵀ + b̃ when ``transposed``) for x [..., d_in], 2-D W, by
    float32 products; bf16 out, differentiable in x, W and b (:class:`Bf16Linear`)."""
    return Bf16Linear.apply(x, W, b, transposed)


class Bf16Linear(torch.autograd.Function):
    """y = round_bf16(x̃ W̃ + b̃) in float32 products, gradients as autocast's (module doc)."""

    @staticmethod
    def forward(ctx, x: Tensor, W: Tensor, b: Tensor | None, transposed: bool) -> Tensor:
        with torch.autocast("cpu", enabled=False):
            xb, Wb = x.to(BF16), W.to(BF16)
            W32 = Wb.float()
            bias = None if b is None else b.to(BF16).float()
            y = torch.nn.functional.linear(xb.float(), W32 if transposed else W32.T, bias)
        ctx.save_for_backward(xb, Wb)
        ctx.transposed, ctx.has_bias = transposed, b is not None
        ctx.dtypes = (x.dtype, W.dtype, None if b is None else b.dtype)
        return y.to(BF16)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):  # type: ignore[override]
        xb, Wb = ctx.saved_tensors
        x_dtype, W_dtype, b_dtype = ctx.dtypes
        with torch.autocast("cpu", enabled=False):
            g32 = g.to(BF16).float()
            g2 = g32.reshape(-1, g32.shape[-1])  # [rows, d_out]
            x2 = xb.reshape(-1, xb.shape[-1]).float()  # [rows, d_in]
            W32 = Wb.float()  # [d_out, d_in] if transposed else [d_in, d_out]
            dx = dW = db = None
            if ctx.needs_input_grad[0]:
                dx = (g32 @ W32 if ctx.transposed else g32 @ W32.T).to(BF16).to(x_dtype)
            if ctx.needs_input_grad[1]:
                dW = g2.T @ x2 if ctx.transposed else x2.T @ g2
                dW = dW.to(BF16).to(W_dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = g2.sum(0).to(BF16).to(b_dtype)
        return dx, dW, db, None
