"""Weight-only int8: y = (x q)·s + b = x W̃ + b, with W̃ = q·s quantized per output channel.

For W [d_in, d_out] (row vectors, y = x W + b), each output channel j gets one scale:

    s_j = max_i |W[i, j]| / 127,   q[i, j] = round(W[i, j] / s_j) ∈ [−127, 127],   W̃ = q·s

so |W − W̃| ≤ s_j / 2 elementwise. The product reads q (one byte per weight):
y[m, j] = s_j · Σ_i x[m, i] q[i, j] + b_j, which is x W̃ + b. At one row of x (decoding,
batch 1) the product is bound by reading the weights, so a quarter of float32's bytes makes
it up to 4x faster there; at 8 rows by its multiply-adds.

Kernels (:func:`product`): rows ≤ ``MAX_ROWS`` go to the compiled ``_int8`` extension
(``kernels/_int8.c``): q stored in groups of 32 output channels and pairs of inputs, one
64-byte line a pair, so that a thread streams each group front to back (:func:`panels`),
each row of x rounded to 16-bit integers with one scale per row
(r_m = max_i |x[m, i]| / 32767, |Δx| ≤ r_m / 2: a relative error of 2^-16 of the row's
largest entry, about 1/200 of the weights' own on a GPT-2-shape model's logits), exact
integer sums (AVX2 ``vpmaddwd``, 16 products per instruction: twice float32 FMA's rate),
then the scales in float32; groups split over ``torch.get_num_threads()`` threads. More
rows (prefill, perplexity: compute-bound) and machines without the extension compute
x W̃ + b in float32 from W̃ itself (a warning says once that the extension is missing).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassgpt.kernels import dense, replay
from glassgpt.kernels.extensions import extension, warn_unbuilt
from glassgpt.kernels.pages import huge_page_copy

MAX_ROWS = 8  # rows of x (batch × tokens) that the compiled kernel takes
GROUP = 32  # output channels per group of q's layout (:func:`panels`)


def compiled() -> Any | None:
    """The ``_int8`` extension module, or None when it was not built (or is hidden)."""
    return extension("_int8")


def quantize(W_out_in: Tensor) -> tuple[Tensor, Tensor]:
    """q int8 [d_out, d_in] and s float32 [d_out] of a weight given as [d_out, d_in] (one row
    per output channel): s_j = max |W_j| / 127, q_j = round(W_j / s_j). An all-zero row gets
    s_j = 1 (q_j = 0).

    >>> q, s = quantize(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    >>> q.tolist(), [round(v * 127, 4) for v in s.tolist()]
    ([[64, -127, 32], [0, 0, 0]], [1.0, 127.0])
    """
    W = W_out_in.detach().float()
    s = W.abs().amax(dim=1) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(W / s[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), s.contiguous()


def dequantize(q: Tensor, s: Tensor) -> Tensor:
    """W̃ [d_out, d_in] = q·s (each row j times s_j), float32."""
    return q.float() * s[:, None]


def panels(q: Tensor) -> Tensor:
    """q int8 [d_out, d_in] as the kernel reads it: groups of 32 output channels and pairs of
    inputs, p [⌈d_out/32⌉, ⌈d_in/2⌉, 32, 2] with p[j // 32, i // 2, j % 32, i % 2] = q[j, i]
    (zeros past d_out and d_in): a group's 64 weights at two inputs are one 64-byte line, and
    each group one run of memory.

    >>> panels(torch.arange(6, dtype=torch.int8).view(3, 2)).flatten().tolist()[:8]
    [0, 1, 2, 3, 4, 5, 0, 0]
    """
    d_out, d_in = q.shape
    n, n2 = -(-d_out // GROUP), -(-d_in // 2)
    padded = torch.zeros(n * GROUP, n2 * 2, dtype=torch.int8)
    padded[:d_out, :d_in] = q
    return padded.view(n, GROUP, n2, 2).transpose(1, 2).contiguous()


def gemv(x: Tensor, q: Tensor, s: Tensor, b: Tensor | None, threads: int) -> Tensor:
    """(x qᵀ)·s + b by the compiled kernel, for x [M, d_in] float32 (M ≤ MAX_ROWS), q int8
    [d_out, d_in], s [d_out], b [d_out] or None (all contiguous, on a CPU) → [M, d_out].
    Packs q into :func:`panels` on every call (``product`` packs once)."""
    ext = compiled()
    M, d_in = x.shape
    d_out = q.shape[0]
    if ext is None:
        raise RuntimeError("the int8 kernel glassgpt.kernels._int8 is not built")
    if not 1 <= M <= MAX_ROWS or q.shape != (d_out, d_in) or s.shape != (d_out,):
        raise ValueError(f"gemv: shapes x {tuple(x.shape)}, q {tuple(q.shape)}, s {tuple(s.shape)}")
    for t, dtype in ((x, torch.float32), (q, torch.int8), (s, torch.float32), (b, torch.float32)):
        if t is not None and (t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu"):
            raise ValueError("gemv: x, s, b contiguous float32 and q int8 on a CPU")
    if b is not None and b.shape != (d_out,):
        raise ValueError(f"gemv: b has shape {tuple(b.shape)}, expected ({d_out},)")
    y = torch.empty(M, d_out, dtype=torch.float32)
    p = panels(q)
    ext.gemv(x.data_ptr(), p.data_ptr(), s.data_ptr(), 0 if b is None else b.data_ptr(),
             y.data_ptr(), M, d_in, d_out, threads)  # fmt: skip
    return y


def pack_int8(W: Tensor, *, transposed: bool = False) -> bool:
    """Quantize a float32 CPU weight in place, W ← W̃ = q·s, and register its int8 product
    (x q)·s + b with the seam (``glassgpt.kernels.matmul`` then takes it for inference
    products of W); returns False (W untouched) for other dtypes or devices.

    W in place: every reader of W (hooks, inspection, the tied embedding lookup, the float32
    path for many rows) computes the same function W̃ as the int8 kernel.
    """
    if W.device.type != "cpu" or W.dtype != torch.float32:
        return False
    with torch.inference_mode(False), torch.no_grad():
        view = dense.out_in_view(W, transposed=transposed)
        q, s = quantize(view)
        view.copy_(dequantize(q, s))
    many = float_product(W, transposed=transposed)
    dense.register(W, product(q, s, many=many), transposed=transposed)
    return True


def float_product(W: Tensor, *, transposed: bool = False) -> Any:
    """``fn(x, W, b)`` = x W + b from the float32 W itself, for more rows than the int8 kernel
    takes: glassgpt's small-batch float32 kernel (a short prefill) where W is stored
    [d_in, d_out], else the seam's unpacked kernels."""

    def plain(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        return dense.unpacked(x, W, b, transposed=transposed)

    if transposed or not dense.has_small_batch_kernel() or not W.is_contiguous():
        return plain
    # reads W live, no copy: the int8 kernel takes the rows that a panel copy would serve
    return dense._streamed(dense.out_in_view(W), False, plain, with_panels=False)


def product(q: Tensor, s: Tensor, *, many: Any) -> Any:
    """``fn(x, W, b)`` = (x qᵀ)·s + b (q [d_out, d_in], s [d_out]) for W = W̃ = q·s in the
    seam's layout: the compiled kernel for 1..MAX_ROWS float32 rows, else x W̃ + b from W
    itself by ``many`` (:func:`float_product`)."""
    ext = compiled()
    d_out, d_in = q.shape
    if ext is not None:
        gemv(torch.zeros(1, d_in), q, s, None, 1)  # checks their dtypes, layout and shapes
    p = huge_page_copy(panels(q))  # the only copy kept (q is dropped), on 2 MiB pages
    q_ptr, s_ptr = p.data_ptr(), s.data_ptr()  # kept alive by fn

    def fn(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        rows = x.numel() // d_in if d_in and x.shape[-1] == d_in else 0
        if ext is None or not 1 <= rows <= MAX_ROWS or not x.is_cpu or not _bias_ok(b):
            if ext is None:
                warn_unbuilt("_int8", "int8")
            return many(x, W, b)
        x = x if x.is_contiguous() else x.contiguous()  # float32: the seam's packed products
        y = x.new_empty((*x.shape[:-1], d_out))  # see only x of W's dtype
        args = (x.data_ptr(), q_ptr, s_ptr, 0 if b is None else b.data_ptr(), y.data_ptr(),
                rows, d_in, d_out, torch.get_num_threads())  # fmt: skip
        ext.gemv(*args)
        if replay.RECORDING:
            replay.add(ext.gemv, args)
        return y

    fn.panels, fn.s = p, s  # type: ignore[attr-defined]
    return fn


def _bias_ok(b: Tensor | None) -> bool:
    return b is None or (b.dtype == torch.float32 and b.is_cpu and b.is_contiguous())
