"""y = x W + b, and its gradients ∂x = g Wᵀ, ∂W = xᵀ g, ∂b = Σ_rows g, through oneDNN on CPUs.

On x86 CPUs PyTorch runs float32 ``F.linear`` and ``matmul`` through MKL's sgemm, which on
some processors (AMD EPYC with AVX-512 among them) reaches less than half the speed of
oneDNN's float32 kernels on the skinny products of a GPT (rows = batch × tokens, columns a
few hundred). On CPUs without AVX-512 it is the other way round: on an AVX2-only AMD EPYC
MKL was faster on every product of a training step at nanoGPT's CPU shapes (768 rows, one
thread: forward 2-10%, ∂x 1-4%, ∂W 8-30%, where oneDNN also copies a transposed operand),
and the whole step 11-12% faster; so oneDNN is taken only where PyTorch dispatches its
AVX-512 kernels (``ONEDNN_PREFERRED``). PyTorch ships oneDNN and exposes its linear kernel as
``torch.ops.mkldnn._linear_pointwise`` on ordinary dense tensors, with no autograd formula.
``OneDNNLinear`` supplies one: the forward and both gradient products go to oneDNN, the
bias gradient is a column sum. The results are the same float32 products (each output is a
float32 dot product, summed in a different order), so it is a kernel choice, not an
approximation; ``use_onednn`` decides when it applies. Without autograd (inference) the
rows are padded to one of a few counts an octave (``bucket_rows``), which bounds the memory
oneDNN keeps per shape.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from glassgpt.kernels import rowwise


def _find_kernel():
    try:
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None


_KERNEL = _find_kernel()


def _has_avx512() -> bool:
    """Whether PyTorch runs its CPU kernels with AVX-512 here (its own CPU detection)."""
    try:
        return torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")
    except (AttributeError, RuntimeError):
        return False


ONEDNN_PREFERRED = _has_avx512()  # MKL's float32 products won on the AVX2 CPUs measured

# Below about 2 M multiply-adds per product (one row, or a few rows of a narrow layer) MKL's
# lower call overhead wins; above it oneDNN was faster in our measurements.
MIN_MACS = 1 << 21


def _mm(a: Tensor, b_t: Tensor, bias: Tensor | None = None) -> Tensor:
    """a b_tᵀ (+ bias) for 2-D a [M, K] and b_t [N, K], either possibly a transposed view."""
    return _KERNEL(a, b_t, bias, "none", [], "")


def use_onednn(x: Tensor, W: Tensor, *, compiling: bool = False) -> bool:
    """Whether x W (W read as 2-D [d_in, d_out] or [d_out, d_in]) should run in oneDNN:
    float32 on an AVX-512 CPU, outside autocast, more than one row, big enough; outside
    torch.compile, or (``compiling``) inside it, through ``glassgpt.kernels.custom_ops``."""
    if _KERNEL is None or not ONEDNN_PREFERRED:
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    if W.dtype != torch.float32 or x.ndim < 2 or x.shape[-1] == 0:
        return False
    if not torch.backends.mkldnn.enabled or torch.is_autocast_enabled("cpu"):
        return False
    if torch.compiler.is_compiling() != compiling:
        return False
    rows = x.numel() // x.shape[-1]
    return rows > 1 and rows * W.numel() >= MIN_MACS


class OneDNNLinear(torch.autograd.Function):
    """y = x W + b for W [d_in, d_out] (``transposed=False``) or x Wᵀ + b for W [d_out, d_in];
    y comes back 2-D [rows, d_out] (see :func:`linear`).

    ∂W = xᵀ g needs a transposed operand: oneDNN copies a transposed first operand with
    PyTorch's strided copy, so the narrower of xᵀ and gᵀ is made by glassgpt's transposition
    (``rowwise.transposed``). Where that is xᵀ (d_in < d_out: W_QKV, W_in) the forward makes it,
    while x is still in the caches, and keeps it instead of x, which the backward does not
    otherwise read (faster than transposing the cold x in the backward). Two products of one x (a gated MLP's W_in and W_gate) share it
    (:func:`_kept_transpose`)."""

    @staticmethod
    def forward(ctx, x: Tensor, W: Tensor, b: Tensor | None, transposed: bool) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        W_t = W if transposed else W.T  # [d_out, d_in], the kernel's layout
        y = _mm(x2, W_t, b)
        x_t = None
        if ctx.needs_input_grad[1] and keeps_transpose(x2.shape[1], W_t.shape[0]):
            x_t = _kept_transpose(x, x2)
        ctx.save_for_backward(x2 if x_t is None else x_t, W)
        ctx.x_transposed = x_t is not None
        ctx.transposed = transposed
        ctx.x_shape = x.shape
        ctx.has_bias = b is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        kept, W = ctx.saved_tensors
        grad_x, grad_W, grad_b = gradients(
            g.reshape(-1, g.shape[-1]), kept, W, ctx.transposed, ctx.x_transposed,
            *ctx.needs_input_grad[:2], ctx.has_bias and ctx.needs_input_grad[2],
        )  # fmt: skip
        return None if grad_x is None else grad_x.view(ctx.x_shape), grad_W, grad_b, None


def keeps_transpose(d_in: int, d_out: int) -> bool:
    """Whether the forward of a product [rows, d_in] → [rows, d_out] makes and keeps xᵀ for
    ∂W = xᵀ g: where xᵀ is ∂W's narrower operand (d_in < d_out; see :class:`OneDNNLinear`)."""
    return d_in < d_out


def gradients(
    g2: Tensor, kept: Tensor, W: Tensor, transposed: bool, x_transposed: bool,
    need_x: bool, need_W: bool, need_b: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """∂x [rows, d_in], ∂W (laid out like W) and ∂b of y = x W + b (x Wᵀ + b when
    ``transposed``) for g2 = ∂y [rows, d_out], from ``kept``: x [rows, d_in], or xᵀ [d_in,
    rows] where ``x_transposed``; None for each one not asked for."""
    grad_x = grad_W = grad_b = None
    if need_x:  # ∂x = g Wᵀ (row-vector W [d_in, d_out])
        W_in_out = W.T if transposed else W  # [d_in, d_out] as the kernel's [N, K]
        grad_x = _mm(g2, W_in_out)
    if need_W:  # ∂W = xᵀ g, laid out like W
        if x_transposed:  # xᵀ [d_in, rows] from the forward
            x_first, prod = True, _mm(kept, g2.T)
        else:
            # The kernel copies a transposed first operand (PyTorch's strided copy) and
            # reads a transposed second one in place: the first is the narrower of xᵀ and
            # gᵀ, made by glassgpt's transposition where it is built (faster than PyTorch's).
            x2 = kept
            x_first = x2.shape[1] <= g2.shape[1]
            first, second = (x2, g2) if x_first else (g2, x2)
            first_t = rowwise.transposed(first)
            prod = _mm(first.T if first_t is None else first_t, second.T)  # xᵀ g or gᵀ x
        grad_W = prod.T if x_first == transposed else prod
        if not grad_W.is_contiguous() and W.is_contiguous():  # as W: AccumulateGrad
            laid_out = rowwise.transposed(prod)  # would copy it, slower than this
            grad_W = grad_W if laid_out is None else laid_out
    if need_b:
        grad_b = g2.sum(0)
    return grad_x, grad_W, grad_b


# The last input the forward transposed (held weakly, with its version) and a weak reference
# to its transpose: a second product of the same unchanged x (a gated MLP's W_gate after
# W_in) reuses it.
_LAST_TRANSPOSE: tuple[weakref.ref, int, weakref.ref] | None = None


def _kept_transpose(x: Tensor, x2: Tensor) -> Tensor | None:
    """x2ᵀ [d_in, rows] for x2, the 2-D view of x (``rowwise.transposed``; None where it does
    not take x2): the one made for this same x just before where x is unchanged and that
    transpose still alive."""
    global _LAST_TRANSPOSE
    if x.is_inference():  # (no version counter: not shared)
        return rowwise.transposed(x2)
    last = _LAST_TRANSPOSE
    if last is not None and last[0]() is x and last[1] == x._version:
        x_t = last[2]()
        if x_t is not None:
            return x_t
    x_t = rowwise.transposed(x2)
    _LAST_TRANSPOSE = None if x_t is None else (weakref.ref(x), x._version, weakref.ref(x_t))
    return x_t


def linear(x: Tensor, W: Tensor, b: Tensor | None, transposed: bool) -> Tensor:
    """:class:`OneDNNLinear` with y shaped [..., d_out] like x. The Function returns y 2-D and
    the reshape happens outside it, so that y's views have the Function's output as their
    base (a view made inside a Function has an untracked base): the causal kernel finds the
    QKV projection's output that q, k and v are views of (``flash.packed_base``). Without
    autograd (no grad mode, or nothing that needs a gradient) the product alone."""
    needs_grad = x.requires_grad or W.requires_grad or (b is not None and b.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        y = OneDNNLinear.apply(x, W, b, transposed)
    else:
        y = _bucketed_mm(x.reshape(-1, x.shape[-1]), W if transposed else W.T, b)
    return y.view(*x.shape[:-1], y.shape[-1])


# Significant bits a product's row count keeps when rounded up (``bucket_rows``): at most
# 2^-(bits-1) of padding rows (6.25%), 2^(bits-1) row counts an octave. (4 bits: up to 11%
# slower prompt products at a 10.7M model's widths, bench/rows.py.)
ROW_BITS = 5


def bucket_rows(rows: int) -> int:
    """rows rounded up to ``ROW_BITS`` significant bits: the row count oneDNN computes for.

    >>> [bucket_rows(m) for m in (31, 32, 33, 65, 100, 129, 255, 257)]
    [31, 32, 34, 68, 100, 136, 256, 272]
    """
    step = 1 << max(rows.bit_length() - ROW_BITS, 0)
    return -(-rows // step) * step


def _bucketed_mm(x2: Tensor, b_t: Tensor, bias: Tensor | None) -> Tensor:
    """x2 b_tᵀ + bias with x2's rows padded with zero rows to ``bucket_rows`` (the extra
    outputs dropped; y is a view of the first rows). oneDNN keeps memory for every shape it
    sees, for good: a 10.7M model's prompts of every length 33-256 grew its RSS by 630 MiB,
    and a second pass over them by 165 MiB more (its four block products alone: 540 MiB,
    320 with oneDNN's primitive cache off, so not the cache alone). Rounded, a product sees
    16 row counts an octave: those prompts grew RSS by 112 MiB, a second pass by none."""
    rows = x2.shape[0]
    padded = bucket_rows(rows)
    if padded == rows:
        return _mm(x2, b_t, bias)
    xp = x2.new_empty(padded, x2.shape[1])
    xp[:rows].copy_(x2)
    xp[rows:].zero_()
    return _mm(xp, b_t, bias)[:rows]
