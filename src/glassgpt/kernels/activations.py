"""GPT-2's tanh GELU, ½ x (1 + tanh(u)) with u = √(2/π) (x + 0.044715 x³), by the fastest form.

Since ½ (1 + tanh(u)) = σ(2u) exactly, the same function is

    gelu_tanh(x) = x σ(c₀ (x + c₁ x³)),   c₀ = 2√(2/π), c₁ = 0.044715,
    gelu_tanh'(x) = s + x s (1 − s) c₀ (1 + 3 c₁ x²),   s = σ(c₀ (x + c₁ x³)).

On x86 CPUs PyTorch's fused tanh-GELU kernels (forward and backward) are slower than its
exact erf GELU, because its vectorised tanh is slow; its sigmoid is not. The σ form above,
in a handful of PyTorch's vectorised elementwise ops, is faster than each fused kernel.
It differs from ``F.gelu(x, approximate="tanh")`` only in rounding (a few float32 ulps).

``gelu_tanh`` picks, for a CPU tensor without autocast:
- a decoding step's few float32 rows (no autograd): glassgpt's own one-thread kernel
  (``glassgpt.kernels.rowwise``);
- any other contiguous float32 tensor: glassgpt's parallel kernel for the σ form, with its
  derivative d in the same pass where autograd needs one, keeping d for a backward of
  g ⊙ d (:class:`CompiledGELU`);
- under ``torch.compile``, at any size, the plain expression, which inductor fuses into one
  loop (its own tanh is as slow);
- float64, or float32 without the compiled kernels, from ``MIN_ELEMENTS`` elements: the σ
  form in PyTorch's ops (:class:`SigmoidGELU`);
- bf16 on a CPU without bf16 arithmetic: the same kernel on a float32 copy, rounded back;
and ``F.gelu`` elsewhere (GPUs, other bf16, autocast, small tensors without the compiled
kernels).
The exact GELU x Φ(x) (:func:`gelu_exact`) takes the same parallel kernel for contiguous
float32 CPU tensors, ``F.gelu`` elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from glassgpt.kernels import bf16, rowwise

C0 = 2.0 * math.sqrt(2.0 / math.pi)
C1 = 0.044715
# Below this many elements (eager) the fused kernel's single call wins.
MIN_ELEMENTS = 1 << 14


def use_sigmoid_form(x: Tensor) -> bool:
    """Whether ``gelu_tanh(x)`` takes the σ form: a float32/float64 CPU tensor, no autocast."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    return not torch.is_autocast_enabled("cpu")


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), by the kernel that is fastest for ``x``."""
    if rowwise.few_rows(x):
        return rowwise.gelu_tanh(x)
    if _bf16_via_float32(x):
        return CompiledGELU.apply(x.float()).to(torch.bfloat16)
    if not use_sigmoid_form(x):
        return F.gelu(x, approximate="tanh")
    if torch.compiler.is_compiling():  # the expression, for inductor to fuse (and derive)
        return x * torch.sigmoid(x * (C0 + (C0 * C1) * (x * x)))
    if rowwise.whole_ok(x):
        return CompiledGELU.apply(x)
    if x.numel() < MIN_ELEMENTS:
        return F.gelu(x, approximate="tanh")
    return SigmoidGELU.apply(x)


def _gate(x: Tensor) -> Tensor:
    """s = σ(c₀ (x + c₁ x³)) = σ(x (c₀ + c₀c₁ x²)), a new tensor."""
    u = torch.addcmul(_scalar(C0, x), x, x, value=C0 * C1)  # c₀ + c₀c₁ x²
    return u.mul_(x).sigmoid_()


def _scalar(value: float, like: Tensor) -> Tensor:
    return torch.tensor(value, dtype=like.dtype, device=like.device)


class SigmoidGELU(torch.autograd.Function):
    """y = x s, s = σ(c₀ (x + c₁ x³)); ∂x = g (s + x s (1 − s) c₀ (1 + 3 c₁ x²))."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        s = _gate(x)
        ctx.save_for_backward(x, s)  # s kept: recomputing it costs a third of the backward
        return x * s

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> Tensor:
        x, s = ctx.saved_tensors
        d = torch.addcmul(_scalar(C0, x), x, x, value=3.0 * C0 * C1)  # c₀ (1 + 3 c₁ x²)
        d.mul_(x).mul_(torch.addcmul(s, s, s, value=-1.0))  # times x s (1 − s)
        return d.add_(s).mul_(g)


class CompiledGELU(torch.autograd.Function):
    """y = x s and ∂x = g d, d = s + x s (1 − s) c₀ (1 + 3 c₁ x²), s = σ(c₀ (x + c₁ x³)), by
    glassgpt's kernels: where x needs a gradient the forward computes y and d in one pass and
    keeps d (``glassgpt.kernels.rowwise.gelu_slope``; as many values as x, which it need not
    keep) and the backward is g ⊙ d; else y alone (``gelu_many``)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        if not ctx.needs_input_grad[0]:
            return rowwise.gelu_many(x)
        y, d = rowwise.gelu_slope(x)
        ctx.save_for_backward(d)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> Tensor:
        (d,) = ctx.saved_tensors
        return g * d


def silu(x: Tensor) -> Tensor:
    """x σ(x) (SwiGLU's gate): glassgpt's kernel for a decoding step's few float32 rows
    (``glassgpt.kernels.rowwise``, a few ulps from PyTorch's), ``F.silu`` otherwise."""
    y = rowwise.silu(x)
    return F.silu(x) if y is None else y


def gelu_exact(x: Tensor) -> Tensor:
    """The exact GELU x Φ(x) = ½ x (1 + erf(x/√2)): glassgpt's kernel for a contiguous float32
    CPU tensor without autocast (:class:`CompiledExactGELU`), ``F.gelu`` otherwise."""
    if use_sigmoid_form(x) and rowwise.whole_ok(x):
        return CompiledExactGELU.apply(x)
    if _bf16_via_float32(x):
        return CompiledExactGELU.apply(x.float()).to(torch.bfloat16)
    return F.gelu(x)


def _bf16_via_float32(x: Tensor) -> bool:
    """Whether a bf16 GELU takes the float32 kernel on a float32 copy, rounded back to bf16:
    on a CPU without bf16 arithmetic (``glassgpt.kernels.bf16``), where PyTorch's bf16 GELU
    is slow. ``F.gelu`` on bf16 also computes in float32 and
    rounds once, so the two differ only in float32 rounding before that."""
    if x.dtype is not torch.bfloat16 or not x.is_cpu or not x.is_contiguous():
        return False
    if not rowwise.built() or torch.compiler.is_compiling():
        return False
    return not bf16.native()


class CompiledExactGELU(torch.autograd.Function):
    """y = x Φ(x) and ∂x = g (Φ(x) + x φ(x)), φ the standard normal density, each in one pass
    by glassgpt's kernel (Φ by erf to within 1.5e-7); only x is kept."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return rowwise.gelu_many(x, exact=True)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return rowwise.gelu_many(x, g, exact=True)
