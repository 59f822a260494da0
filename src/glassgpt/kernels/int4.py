"""Weight-only int4: y = x W̃ + b, W̃ = q·d with q ∈ [−8, 7] and one float16 scale per group.

For W [d_in, d_out] (row vectors), each output channel j is cut into groups of GROUP = 32
consecutive inputs g (the last one padded with zero weights when d_in is not a multiple of
32), and each group gets one scale d[j, g] (float16, 2 bytes per 32 weights):

    q[i, j] = clamp(round(W[i, j] / d[j, g]), −8, 7),    W̃[i, j] = q[i, j] · d[j, g]

Round to nearest; the scale is the best by squared error of 8 candidates, −c · m / 8 and
c · m / 7 for c = 1, 0.96, 0.92, 0.88, where m is the group's largest-magnitude weight (with
its sign). −m / 8 is llama.cpp's Q4_0 choice (m lands on −8 exactly), so no group is rounded
worse than Q4_0 rounds it; over Gaussian weights the squared error is 9.5% lower (32
candidates: 10.5%). The compiled extension runs the search (a PyTorch loop otherwise). 4.5 bits a
weight: a decoding step at batch 1 reads 7.1× fewer bytes than float32 (1.8× fewer than
int8).

Kernels (:func:`product`): rows ≤ ``MAX_ROWS`` go to the compiled ``_int4`` extension
(``kernels/_int4.c``, chosen at run time), which by default rounds x to int8 per row and group
of 32 (:func:`round_x`) and computes x̃ W̃ + b from exact integer sums of the nibbles (AVX-512
VNNI, AVX-512BW, AVX2 or a portable loop); its float kernels (``float-avx512``, ``float-avx2``,
``float-scalar``, forced by ``compiled().use(name)``) compute x W̃ + b with x unrounded. More
rows (prefill, perplexity) and machines without the extension compute x W̃ + b in float32
from W̃ itself (a note says so once).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassgpt.kernels import dense, replay
from glassgpt.kernels.extensions import extension, warn_unbuilt
from glassgpt.kernels.int8 import float_product
from glassgpt.kernels.pages import huge_page_copy

MAX_ROWS = 8  # rows of x (batch × tokens) that the compiled kernel takes
GROUP = 32  # inputs per scale
PANEL = 16  # output channels per block of the kernel's layout (:func:`blocks`)
BLOCK_BYTES = 16 * PANEL + 2 * PANEL  # 256 bytes of nibbles, 16 float16 scales
# scale = c · m with m the group's signed largest weight; the first is Q4_0's
CANDIDATES = tuple(-(1 - 0.02 * k) / 8 for k in range(16)) + tuple(
    (1 - 0.02 * k) / 7 for k in range(16)
)


def compiled() -> Any | None:
    """The ``_int4`` extension module, or None when it was not built (or is hidden)."""
    return extension("_int4")


def quantize(W_out_in: Tensor) -> tuple[Tensor, Tensor]:
    """q int8 in [−8, 7] [d_out, G·32] and d float16 [d_out, G] of a weight given as
    [d_out, d_in] (G = ⌈d_in / 32⌉; inputs past d_in hold q = 0). A group of zeros gets d = 0;
    d may be negative (the sign that puts the largest weight on −8).

    >>> q, d = quantize(torch.tensor([[-1.0, 0.5, 0.25] + [0.0] * 29]))
    >>> q[0, :3].tolist(), d.float().tolist()
    ([-8, 4, 2], [[0.125]])
    >>> quantize(torch.tensor([[1.0] + [0.0] * 31]))[0][0, 0].item()   # d = −1/8
    -8
    """
    W = W_out_in.detach().float()
    d_out, d_in = W.shape
    G = -(-d_in // GROUP)
    Wp = torch.zeros(d_out, G * GROUP)
    Wp[:, :d_in] = W
    Wg = Wp.view(d_out, G, GROUP)
    ext = compiled()
    if ext is not None:
        q = torch.empty(d_out, G * GROUP, dtype=torch.int8)
        d = torch.empty(d_out, G, dtype=torch.float16)
        c = torch.tensor(CANDIDATES, dtype=torch.float32)
        ext.quantize(Wp.data_ptr(), q.data_ptr(), d.data_ptr(), c.data_ptr(), len(CANDIDATES),
                     d_out, G, torch.get_num_threads())  # fmt: skip
        return q, d
    m = Wg.gather(-1, Wg.abs().argmax(dim=-1, keepdim=True))[..., 0]
    best_err = torch.full((d_out, G), float("inf"), dtype=torch.float64)
    best_d = torch.zeros(d_out, G, dtype=torch.float16)
    for c in CANDIDATES:
        d = (m * torch.tensor(c, dtype=torch.float32)).clamp(-65504.0, 65504.0).half()
        q = _round(Wg, d)
        err = (Wg.double() - (q * d.float()[..., None]).double()).square().sum(dim=-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_d = torch.where(better, d, best_d)
    q = _round(Wg, best_d).to(torch.int8).view(d_out, G * GROUP)
    return q.contiguous(), best_d.contiguous()


def _round(Wg: Tensor, d: Tensor) -> Tensor:
    """clamp(round(W / d), −8, 7) per group, 0 where d = 0 (float32 values)."""
    df = d.float()[..., None]
    safe = torch.where(df != 0, df, torch.ones_like(df))
    return torch.where(df != 0, torch.round(Wg / safe).clamp(-8, 7), torch.zeros_like(Wg))


def dequantize(q: Tensor, d: Tensor, d_in: int | None = None) -> Tensor:
    """W̃ [d_out, d_in] = q·d (each group of 32 inputs times its scale), float32."""
    d_out, width = q.shape
    W = (q.float().view(d_out, -1, GROUP) * d.float()[..., None]).view(d_out, width)
    return W[:, : width if d_in is None else d_in]


def blocks(q: Tensor, d: Tensor) -> Tensor:
    """q, d as the kernel reads them: uint8 [⌈d_out/16⌉, G, 288], one block per 16 output
    channels × 32 inputs, four lines of 64 bytes then the block's 16 float16 scales: byte
    64 l + 4 c + k = u[j, 8l+k] | u[j, 8l+4+k] << 4 (u = q + 8, j = 16 p + c, k < 4), so that
    a line's low nibbles are each channel's four consecutive inputs in one 32-bit lane
    (channels past d_out: zero weights, zero scales).

    >>> q, d = torch.zeros(1, 32, dtype=torch.int8), torch.ones(1, 1, dtype=torch.float16)
    >>> q[0, 1], q[0, 5], q[0, 8] = 7, -8, 1
    >>> b = blocks(q, d)
    >>> b.shape, b[0, 0, 1].item() == 15 | 0 << 4, b[0, 0, 64].item() == 9 | 8 << 4
    (torch.Size([1, 1, 288]), True, True)
    """
    d_out, width = q.shape
    G, P = width // GROUP, -(-d_out // PANEL)
    u = torch.full((P * PANEL, width), 8, dtype=torch.uint8)
    u[:d_out] = (q.to(torch.int16) + 8).to(torch.uint8)
    u = u.view(P, PANEL, G, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [P, G, l, c, k, half]
    nib = (u[..., 0] | (u[..., 1] << 4)).reshape(P, G, 16 * PANEL)
    dp = torch.zeros(P * PANEL, G, dtype=torch.float16)
    dp[:d_out] = d
    scales = dp.view(P, PANEL, G).transpose(1, 2).contiguous().view(torch.uint8)
    return torch.cat([nib, scales.view(P, G, 2 * PANEL)], dim=-1).contiguous()


def round_x(x: Tensor) -> Tensor:
    """x̃ = s · x8 (float64), x [M, d_in] float32 as the int8 kernels round it: per row and
    group of 32 inputs, s = max |x| / 127 and x8 = round(x / s) (half to even; 0 where s = 0,
    NaN where the group holds a non-finite entry). The int8 kernels compute x̃ W̃ + b."""
    M, d_in = x.shape
    G = -(-d_in // GROUP)
    xp = torch.zeros(M, G * GROUP)
    xp[:, :d_in] = x
    xg = xp.view(M, G, GROUP)
    finite = xg.isfinite().all(dim=-1, keepdim=True)
    s = xg.abs().amax(dim=-1, keepdim=True) / torch.tensor(127.0)
    s = torch.where(finite, s, torch.tensor(float("nan")))
    safe = torch.where(s > 0, s, torch.ones_like(s))
    x8 = torch.where(s > 0, torch.round(xg / safe).clamp(-127, 127), torch.zeros_like(xg))
    return (x8.double() * s.double()).view(M, G * GROUP)[:, :d_in]


def gemv(x: Tensor, q: Tensor, d: Tensor, b: Tensor | None, threads: int) -> Tensor:
    """x W̃ᵀ + b by the compiled kernel, for x [M, d_in] float32 (M ≤ MAX_ROWS), q, d from
    :func:`quantize` of a [d_out, d_in] weight, b [d_out] or None → [M, d_out]. Packs the
    blocks on every call (``product`` packs once)."""
    ext = compiled()
    if ext is None:
        raise RuntimeError("the int4 kernel glassgpt.kernels._int4 is not built")
    M, d_in = x.shape
    d_out, width = q.shape
    if (
        not 1 <= M <= MAX_ROWS
        or width != -(-d_in // GROUP) * GROUP
        or d.shape != (d_out, width // GROUP)
    ):
        raise ValueError(f"gemv: shapes x {tuple(x.shape)}, q {tuple(q.shape)}, d {tuple(d.shape)}")
    if x.dtype != torch.float32 or not x.is_contiguous() or not x.is_cpu or not _bias_ok(b):
        raise ValueError("gemv: x and b contiguous float32 on a CPU")
    if b is not None and b.shape != (d_out,):
        raise ValueError(f"gemv: b has shape {tuple(b.shape)}, expected ({d_out},)")
    y = torch.empty(M, d_out, dtype=torch.float32)
    w = blocks(q, d)
    ext.gemv(x.data_ptr(), w.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
             M, d_in, d_out, threads)  # fmt: skip
    return y


def pack_int4(W: Tensor, *, transposed: bool = False) -> bool:
    """Quantize a float32 CPU weight in place, W ← W̃ = q·d, and register its int4 product
    x W̃ + b with the seam (``glassgpt.kernels.matmul`` then takes it for inference products
    of W); returns False (W untouched) for other dtypes or devices. W in place, as
    ``pack_int8`` does: every reader of W computes the same function W̃."""
    if W.device.type != "cpu" or W.dtype != torch.float32:
        return False
    with torch.inference_mode(False), torch.no_grad():
        view = dense.out_in_view(W, transposed=transposed)
        q, d = quantize(view)
        view.copy_(dequantize(q, d, view.shape[1]))
    many = float_product(W, transposed=transposed)
    dense.register(W, product(q, d, many=many), transposed=transposed)
    return True


def product(q: Tensor, d: Tensor, *, many: Any) -> Any:
    """``fn(x, W, b)`` = x W̃ + b for W = W̃ in the seam's layout: the compiled kernel for
    1..MAX_ROWS float32 rows, else x W̃ + b from W itself by ``many``."""
    ext = compiled()
    d_out = q.shape[0]
    w = huge_page_copy(blocks(q, d))  # the only copy kept, on 2 MiB pages
    w_ptr = w.data_ptr()

    def fn(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        d_in = x.shape[-1]
        rows = x.numel() // d_in if d_in else 0
        ok = d_in and -(-d_in // GROUP) * GROUP == q.shape[1] and x.dtype == torch.float32
        if ext is None or not ok or not 1 <= rows <= MAX_ROWS or not x.is_cpu or not _bias_ok(b):
            if ext is None:
                warn_unbuilt("_int4", "int4")
            return many(x, W, b)
        x = x if x.is_contiguous() else x.contiguous()
        y = x.new_empty((*x.shape[:-1], d_out))
        args = (x.data_ptr(), w_ptr, 0 if b is None else b.data_ptr(), y.data_ptr(),
                rows, d_in, d_out, torch.get_num_threads())  # fmt: skip
        ext.gemv(*args)
        if replay.RECORDING:
            replay.add(ext.gemv, args)
        return y

    fn.blocks = w  # type: ignore[attr-defined]  (kept alive by fn)
    return fn


def _bias_ok(b: Tensor | None) -> bool:
    return b is None or (b.dtype == torch.float32 and b.is_cpu and b.is_contiguous())
