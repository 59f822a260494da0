"""y = x W + b (row vectors) by the fastest kernel this device has for the shape.

W is [d_in, d_out] (a 3-D W such as W_O [H, d_head, d_model] is read as [H·d_head, d_model]);
``transposed``: W is [d_out, d_in] and the product is x Wᵀ + b (the tied unembedding W_Eᵀ).
The kernel, first that applies:

1. a packed copy of W registered by :func:`pack` or ``glassgpt.kernels.int8.pack_int8``
   (inference only: no autograd, x in W's dtype, or float32 x for a bf16 W, W unchanged
   since it was packed); for
   float32 at up to ``SMALL_BATCH`` rows of x (decoding) that is glassgpt's own product
   (``glassgpt.kernels._gemv``), which streams W once for all rows (with AVX-512F, up to
   ``PANEL_BLOCK_ROWS`` rows by its panels, 32 rows a call), and for bfloat16 too on
   CPUs without bf16 arithmetic (``glassgpt.kernels.bf16.native``), and on those with it
   for the rows that its panels take (decoding);
2. under CPU autocast to bf16 on a CPU without bf16 arithmetic, float32 products of the
   bf16-rounded operands, which compute the same function (``glassgpt.kernels.bf16``);
3. oneDNN for float32 products on CPUs where it beats MKL (``glassgpt.kernels.onednn``; without
   autograd at a row count rounded up to a few an octave, ``onednn.bucket_rows``);
4. ``F.linear``.

Every kernel computes the same products; only the summation order (and so the rounding)
differs. Packed copies live in this module's registry, keyed by the weight tensor itself
(held weakly) and the weight's version counter at packing: an in-place change through
``copy_``, ``mul_`` or an optimizer makes the copy stale and unused. A write through
``W.data`` bypasses the version counter: call :func:`unpack` (or :func:`pack` again) after one.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

from glassgpt.kernels import bf16, custom_ops, onednn, replay
from glassgpt.kernels.extensions import extension
from glassgpt.kernels.onednn import use_onednn
from glassgpt.kernels.pages import huge_page_copy, huge_page_empty

_gemv = extension(
    "_gemv"
)  # not built (no C compiler at install): PyTorch's kernels do every product

# rows of x up to which float32 packed products take glassgpt's own kernel: decoding steps and
# short prefills (beyond it oneDNN catches up)
SMALL_BATCH = 32

PANEL = 64  # outputs per panel of a float32 weight's panel copy (``_gemv.gemv_panels``)
# a panel copy is made while it takes at most this share of the memory available then
PANEL_MEMORY_SHARE = 0.25

Product = Callable[[Tensor, Tensor, Tensor | None], Tensor]  # fn(x, W, b) = x W + b, packed


@dataclass(frozen=True)
class _Packed:
    weight: weakref.ref  # the tensor it was packed from
    version: int  # the weight's version counter when packed (0 for inference tensors)
    transposed: bool
    fn: Product
    mixed: bool = False  # fn also takes float32 x for a bf16 W (y float32)


_PACKED: dict[int, _Packed] = {}  # id(W) → its packed copy


def _version(W: Tensor) -> int:
    return 0 if W.is_inference() else W._version


def _packed(x: Tensor, W: Tensor, transposed: bool) -> Product | None:
    entry = _PACKED.get(id(W))
    if entry is None or entry.weight() is not W or entry.transposed != transposed:
        return None
    if entry.version != _version(W):
        return None
    if x.dtype != W.dtype and not (entry.mixed and x.dtype == torch.float32):
        return None
    return entry.fn


def matmul(x: Tensor, W: Tensor, b: Tensor | None = None, *, transposed: bool = False) -> Tensor:
    """x W + b for x [..., d_in] (x Wᵀ + b when ``transposed``) → [..., d_out]."""
    if _PACKED and not torch.is_grad_enabled():
        fn = _packed(x, W, transposed)
        if fn is not None:
            return fn(x, W, b)
    return unpacked(x, W, b, transposed=transposed)


def out_in_view(W: Tensor, *, transposed: bool = False) -> Tensor:
    """W as [d_out, d_in] (one row per output channel), a view: W itself when ``transposed``
    (the tied W_E [n_vocab, d_model]), else W [d_in, d_out] (3-D W_O read as 2-D) transposed."""
    W2 = W.flatten(0, -2) if W.ndim > 2 else W
    return W2 if transposed else W2.T


def unpacked(x: Tensor, W: Tensor, b: Tensor | None = None, *, transposed: bool = False) -> Tensor:
    """x W + b (x Wᵀ + b when ``transposed``) by the kernels that need no packed copy."""
    W2 = W.flatten(0, -2) if W.ndim > 2 else W
    if bf16.emulated(x):
        return bf16.linear(x, W2, b, transposed=transposed)
    if not torch.compiler.is_compiling():
        if use_onednn(x, W2):
            return onednn.linear(x, W2, b, transposed)
    elif custom_ops.registered() and use_onednn(x, W2, compiling=True):  # an opaque call
        return custom_ops.linear(x, W2, b, transposed)
    return F.linear(x, W2 if transposed else W2.T, b)


def _onednn_packed(W_out_in: Tensor) -> Product | None:
    """``fn(x, W, b) = x W_out_inᵀ + b`` from oneDNN's packed copy of W [d_out, d_in] (the
    live W is not read), or None where oneDNN cannot (checked once against F.linear on a
    probe input)."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")):
        return None
    try:
        P = ops._reorder_linear_weight(W_out_in.contiguous(), 1)

        def fn(x: Tensor, _W: Tensor, b: Tensor | None) -> Tensor:
            return ops._linear_pointwise(x, P, b, "none", [], "")

        probe = torch.ones(1, W_out_in.shape[1], dtype=W_out_in.dtype)
        got = fn(probe, W_out_in, None)
        if not torch.allclose(got, F.linear(probe, W_out_in), rtol=1e-2, atol=1e-2):
            return None
    except RuntimeError:
        return None
    return fn


def _streamed(
    out_in: Tensor,
    transposed: bool,
    fallback: Product,
    *,
    with_panels: bool = True,
    rows_form: bool = True,
) -> Product:
    """``fn(x, W, b) = x W + b`` by ``_gemv`` for up to ``SMALL_BATCH`` rows of x, streaming
    W row by row as a row-major [d_in, d_out] matrix: the live W where it is stored so, else
    a copy on 2 MiB pages (the tied unembedding W_Eᵀ); ``fallback`` for larger x. A bfloat16
    W takes ``gemv_rows_bf16_io`` for bf16 x (x and b widened to float32, float32 sums, y
    rounded to bf16, all in the kernel) and ``gemv_rows_bf16`` for float32 x (bf16 weights
    under float32 activations: y float32, :func:`pack`'s mixed products). One row of x (a
    decoding step; with AVX-512F up to 32 rows, batched decoding and short prompts, but up
    to ``IO_PANEL_ROWS`` of bf16 x without ``rows_form``) reads W from its
    panel copy (:func:`panels`, float32 or bf16) where one was made (:func:`_panel_copy`;
    none without ``with_panels``: a caller whose own kernel takes those rows); a bf16 W's
    panel copy is made at its first decoding step's product (x [..., 1, d_in]: one token a
    row), not at packing nor at a prompt's (a loaded model holds its weights once until it
    decodes). A float32 W's panels also take ``panels_rows()`` < M ≤ ``PANEL_BLOCK_ROWS``
    rows where they take several (AVX-512F), a block of ``panels_rows()`` a call
    (:func:`_in_row_blocks`). Without ``rows_form`` only the panels serve (a bf16 W
    on a CPU with bf16 arithmetic, whose ``fallback`` is faster for more rows)."""
    assert _gemv is not None
    d_out, d_in = out_in.shape
    W_io = None
    if rows_form and not out_in.T.is_contiguous():
        W_io = huge_page_copy(out_in.T)  # [d_in, d_out]
    half = out_in.dtype == torch.bfloat16
    lazy = [half and with_panels]  # the panel copy is still to be made
    made = [_panel_copy(out_in.T) if with_panels and not lazy[0] else None]

    def panel_copy(x: Tensor, W: Tensor) -> Tensor | None:
        # made at a decoding step (one token a row), not at a short prompt's product: a
        # model that only reads prompts holds its weights once. (From the W of the call:
        # holding W here would keep it alive, and its registry entry, for good.)
        # A decoding copy's float32 x (its prompt, then its steps) makes them at once.
        if lazy[0] and (x.dtype == torch.float32 or (x.ndim >= 2 and x.shape[-2] == 1)):
            lazy[0] = False
            with _outside_modes():  # (a recording's first step: not one of its operations)
                made[0] = _panel_copy(out_in_view(W, transposed=transposed).T)
        return made[0]

    def fn(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        M = x.numel() // d_in
        if M == 0 or (b is not None and not b.is_contiguous()):
            return fallback(x, W, b)
        panel_rows = _gemv.panels_rows() if with_panels else 0  # (asked each call: tests)
        if half and x.dtype == torch.bfloat16 and not rows_form:  # PyTorch's bf16 past them
            panel_rows = min(panel_rows, IO_PANEL_ROWS)
        if half and x.dtype == torch.float32 and panel_rows < M <= PANEL_PROMPT_ROWS:
            P = panel_copy(x, W)  # a decoding copy's prompt: its rows a few at a time
            if P is not None:
                return _in_row_blocks(x, P, b, d_out, panel_rows, _gemv.gemv_panels_bf16)
        if not half and 1 < panel_rows < M <= PANEL_BLOCK_ROWS:  # float32: the panels in blocks
            P = panel_copy(x, W)
            if P is not None:
                return _in_row_blocks(x, P, b, d_out, panel_rows, _gemv.gemv_panels)
        if M > SMALL_BATCH:
            return fallback(x, W, b)
        if not rows_form and panel_rows < M:
            return fallback(x, W, b)
        P = panel_copy(x, W) if panel_rows >= M else None
        if P is None and not rows_form:
            return fallback(x, W, b)
        if b is not None and b.dtype != x.dtype:
            b = b.to(x.dtype)
        x2 = x.contiguous()
        y = torch.empty(*x.shape[:-1], d_out, dtype=x.dtype)
        b_ptr, threads = 0 if b is None else b.data_ptr(), torch.get_num_threads()
        io = half and x.dtype == torch.bfloat16  # else float32 activations
        if P is not None:
            panel_kernel = (_gemv.gemv_panels_bf16_io if io else _gemv.gemv_panels_bf16) if half \
                else _gemv.gemv_panels  # fmt: skip
            call, args = panel_kernel, (x2.data_ptr(), P.data_ptr(), b_ptr, y.data_ptr(),
                                        M, d_in, d_out, threads)  # fmt: skip
        else:
            kernel = (_gemv.gemv_rows_bf16_io if io else _gemv.gemv_rows_bf16) if half \
                else _gemv.gemv_rows  # fmt: skip
            rows = W if W_io is None else W_io
            call, args = kernel, (x2.data_ptr(), rows.data_ptr(), b_ptr, y.data_ptr(), M, d_in,
                                  d_out, threads)  # fmt: skip
        call(*args)
        if replay.RECORDING:
            replay.add(call, args)
        return y

    return fn


# Up to this many rows of x, a float32 W's panels take them, a block of panels_rows() (32 with
# AVX-512F: one pass over W a block) at a time, where the panels take more than one row:
# faster than the rows kernel for 9-32 rows (bench/rows.py) and no slower than oneDNN up to
# 64, and a row's sums are its own whatever the rows beside it (a request's logits alone or
# batched).
PANEL_BLOCK_ROWS = 64

# On a CPU with bf16 arithmetic, up to this many rows of bf16 x a bf16 W's panels take them
# (widened to float32), past it PyTorch's bf16 products, faster there at 32 rows; without it
# the panels take all they can, faster than the rows kernel (docs/performance.md, "A step
# of 8 rows and a prompt of 32").
IO_PANEL_ROWS = 16

# Up to this many rows of float32 x, a bf16 W's panels serve a prompt (a few rows at a time,
# each block one pass over W): for more, one float32 product of widened copies is faster.
PANEL_PROMPT_ROWS = 256


def _in_row_blocks(
    x: Tensor, P: Tensor, b: Tensor | None, d_out: int, block: int, kernel: Callable[..., None]
) -> Tensor:
    """x W + b for float32 x [..., d_in] and W's panels P (float32 or bf16), ``block`` rows of x
    a call to ``kernel`` (``gemv_panels`` or ``gemv_panels_bf16``; y float32; recorded, a
    server's many rows, while recording). Each row's sums are those of the row alone (the
    panels sum each output over k in order whatever the rows beside it), so a request's
    logits do not depend on the requests batched with it."""
    d_in = x.shape[-1]
    x2 = x.contiguous().view(-1, d_in)
    M = x2.shape[0]
    if b is not None and b.dtype != torch.float32:
        b = b.float()
    y = torch.empty(*x.shape[:-1], d_out, dtype=torch.float32)
    y2 = y.view(M, d_out)
    b_ptr, threads = 0 if b is None else b.data_ptr(), torch.get_num_threads()
    for m0 in range(0, M, block):
        rows = min(block, M - m0)
        args = (x2[m0].data_ptr(), P.data_ptr(), b_ptr, y2[m0].data_ptr(), rows, d_in, d_out,
                threads)  # fmt: skip
        kernel(*args)
        if replay.RECORDING:
            replay.add(kernel, args)
    return y


def _outside_modes() -> Any:
    """A context in which PyTorch operations bypass any dispatch mode (a recording's)."""
    return _disable_current_modes()


def panels(W: Tensor, out: Tensor | None = None) -> Tensor:
    """W [d_in, d_out] as its panels P [⌈d_out/64⌉, d_in, 64], P[p, k, c] = W[k, 64p + c]
    (zeros past d_out), contiguous: each panel of 64 outputs is one run of memory. Written into
    ``out`` where given (contiguous, that shape), read from W in place: no other copy.

    >>> panels(torch.arange(6.0).view(2, 3))[0, :, :4].tolist()
    [[0.0, 1.0, 2.0, 0.0], [3.0, 4.0, 5.0, 0.0]]
    """
    d_in, d_out = W.shape
    n, full = -(-d_out // PANEL), d_out // PANEL
    P = torch.empty(n, d_in, PANEL, dtype=W.dtype) if out is None else out
    if full:
        P[:full].copy_(W[:, : full * PANEL].unflatten(1, (full, PANEL)).transpose(0, 1))
    if full < n:  # the last panel: the remaining outputs, then zeros
        rest = d_out - full * PANEL
        P[full, :, :rest].copy_(W[:, full * PANEL :])
        P[full, :, rest:].zero_()
    return P


def _panel_copy(W: Tensor) -> Tensor | None:
    """The panels of a float32 or bf16 W [d_in, d_out] on 2 MiB pages, for products of a few rows
    (``_gemv.gemv_panels``: one stream of memory a thread, faster than streaming W's rows;
    with AVX-512F up to 32 rows, six at a time, each panel read from memory once); None where
    the kernel is not built, W is neither float32 nor bf16, or the copy would take more than
    ``PANEL_MEMORY_SHARE`` of the memory available now (the rows of the live W serve then, a
    little slower)."""
    if _gemv is None or W.dtype not in (torch.float32, torch.bfloat16):
        return None
    d_in, d_out = W.shape
    shape = (-(-d_out // PANEL), d_in, PANEL)
    if math.prod(shape) * W.dtype.itemsize > PANEL_MEMORY_SHARE * _available_memory():
        return None
    return panels(W, out=huge_page_empty(shape, W.dtype))


def _available_memory() -> float:
    """Bytes of memory available to new allocations (Linux: MemAvailable), else infinity."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def _upcast(transposed: bool) -> Product:
    """``fn(x, W, b) = x W + b`` as a float32 product of float32 copies of x, W and b, rounded
    to x's dtype: bf16 products on CPUs without native bf16 (a pass over W per call costs far
    less than the bf16 GEMM there)."""

    def fn(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        W_oi = out_in_view(W, transposed=transposed).float()
        return F.linear(x.float(), W_oi, None if b is None else b.float()).to(x.dtype)

    return fn


def _live(transposed: bool) -> Product:
    """``fn(x, W, b) = x W + b`` by the kernels that read W itself (:func:`unpacked`)."""
    return lambda x, W, b: unpacked(x, W, b, transposed=transposed)


def _row_major(out_in: Tensor, transposed: bool) -> Product:
    """``fn(x, W, b) = x W + b`` reading W as a row-major [d_in, d_out] matrix: a copy where
    W is stored the other way round, else W itself."""
    if out_in.T.is_contiguous():  # W is already [d_in, d_out] row-major: read it live
        return _live(transposed)
    W_io = out_in.T.contiguous()  # [d_in, d_out]

    def copied(x: Tensor, _W: Tensor, b: Tensor | None) -> Tensor:
        return F.linear(x, W_io.T, b)

    return copied


def pack(W: Tensor, *, transposed: bool = False) -> bool:
    """Register a packed copy of a CPU weight for inference products; returns whether one was made.

    - bfloat16 on a CPU with bf16 arithmetic (``glassgpt.kernels.bf16.native``): for the
      rows of a decoding step (1, or up to ``IO_PANEL_ROWS`` with AVX-512F) a bf16 panel copy
      that ``_gemv`` streams, widening each weight exactly to float32 (faster than oneDNN's
      packed GEMV), made at its first decoding step (a model loaded for a prompt, or not yet
      decoding, holds its weights once); more rows take PyTorch's bf16 product of W itself
      (oneDNN, which re-packs W per call: a prompt's cost, not a step's). No oneDNN packed copy is
      kept: it doubled a loaded model's memory and took most of its load time;
    - bfloat16 elsewhere (bf16 products there run many times slower than float32 ones): as for
      float32 below, ``_gemv`` streams the bf16 W (read live or copied) for up to
      ``SMALL_BATCH`` rows of x, widening each weight (and x and b) exactly to float32 as it
      reads it and rounding y to bf16 (the panels, made at its first decoding step, for
      its rows); more rows (a long prompt) take a float32 ``F.linear`` of float32 copies of
      x, W and b made per call (:func:`_upcast`).
      Either way: products and sums in float32, the result rounded to bf16. Either way too,
      the products also take float32 x (y float32, not rounded): bf16 weights under float32
      activations, as ``glassgpt.model.precision.decoding_copy`` decodes a bf16 model;
    - float32: W read as a row-major [d_in, d_out] matrix, the layout in which x W streams
      fastest: W itself, or a contiguous copy where W is stored the other way round (the
      tied W_E); glassgpt's own kernel (``_gemv``) streams it for up to ``SMALL_BATCH`` rows
      of x, the unpacked kernels read W itself for more. What it streams lives on 2 MiB
      pages (``glassgpt.kernels.pages``): the copy, or W itself, moved there with its
      values. W also gets a panel copy for the products of one row (decoding; with
      AVX-512F up to ``PANEL_BLOCK_ROWS`` rows, 32 a call), while memory allows
      (:func:`_panel_copy`): W's bytes again, for a faster stream.

    The weight's values are untouched (hooks, training and the embedding still read them).
    """
    if W.device.type != "cpu" or W.dtype not in (torch.float32, torch.bfloat16):
        return False
    with torch.inference_mode(False), torch.no_grad():
        out_in = out_in_view(W, transposed=transposed)  # [d_out, d_in]
        float32 = W.dtype == torch.float32
        if not float32 and bf16.native() and _gemv is not None:
            # oneDNN's bf16 products for many rows read W itself (no packed copy: a loaded
            # model holds its weights once), the panels decoding's rows
            fn: Product | None = _streamed(out_in, transposed, _bf16_many(transposed),
                                           rows_form=False)  # fmt: skip
        elif _gemv is not None and W.is_contiguous():
            if out_in.T.is_contiguous() and not W.is_inference():  # streamed live: move it
                W.data = huge_page_copy(W.data)
                out_in = out_in_view(W, transposed=transposed)
            # more rows than _gemv takes: W itself (a tied W_E too: [d_out, d_in] is the
            # layout oneDNN and MKL read fastest for many rows)
            fallback = _live(transposed) if float32 else _upcast(transposed)
            fn = _streamed(out_in, transposed, fallback)
        else:
            fn = _row_major(out_in, transposed) if float32 else _upcast(transposed)
        if fn is None:
            return False
    register(W, fn, transposed=transposed, mixed=not float32)
    return True


def _bf16_many(transposed: bool) -> Product:
    """``fn(x, W, b) = x W + b`` for a bf16 W on a CPU with bf16 arithmetic, more rows than
    the panels take: bf16 x by PyTorch's bf16 product (oneDNN), float32 x by
    :func:`_upcast` (bf16 weights under float32 activations)."""
    upcast = _upcast(transposed)

    def fn(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        if x.dtype == torch.float32:
            return upcast(x, W, b)
        return F.linear(x, out_in_view(W, transposed=transposed), b)

    return fn


def alias(W: Tensor, source: Tensor, *, transposed: bool = False) -> bool:
    """Make W's inference products those registered for ``source`` (W's values rounded as
    ``source`` holds them; float32 x of a bf16 ``source`` allowed): a float32 W_E whose
    unembedding reads its bf16 twin's panels (``glassgpt.model.precision.decoding_copy``).
    Returns whether ``source`` has such products."""
    entry = _PACKED.get(id(source))
    if entry is None or entry.weight() is not source or entry.transposed != transposed:
        return False
    fn = entry.fn

    def aliased(x: Tensor, _W: Tensor, b: Tensor | None) -> Tensor:
        return fn(x, source, b)

    aliased.source = source  # type: ignore[attr-defined]  (kept alive with W's entry)
    register(W, aliased, transposed=transposed)
    return True


def register(W: Tensor, fn: Product, *, transposed: bool = False, mixed: bool = False) -> None:
    """Make ``fn(x, W, b)`` compute W's inference products from now on (until W changes in
    place or :func:`unpack`); the registry holds W weakly. ``pack`` and
    ``glassgpt.kernels.int8.pack_int8`` register through it."""
    key = id(W)
    ref = weakref.ref(W, lambda _, key=key: _PACKED.pop(key, None))
    _PACKED[key] = _Packed(ref, _version(W), transposed, fn, mixed)


def has_small_batch_kernel() -> bool:
    """Whether glassgpt's own float32 small-batch product (``_gemv``) is built."""
    return _gemv is not None


def unpack(W: Tensor) -> None:
    """Forget W's packed copy (if any): its products go back to the ordinary kernels."""
    entry = _PACKED.get(id(W))
    if entry is not None and entry.weight() is W:
        del _PACKED[id(W)]


def is_packed(W: Tensor, *, transposed: bool = False) -> bool:
    """Whether W has a packed copy that its products would use now (registered, not stale)."""
    return _packed(W.new_empty(0), W, transposed) is not None
