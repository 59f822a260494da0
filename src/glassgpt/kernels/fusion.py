"""A recorded decoding step's calls with neighbours fused: fewer calls, fewer parallel runs.

A replayed step (``glassgpt.kernels.replay``) makes each kernel call the eager step made, one
Python call and, for a product, one parallel run of the threads each. Where a product's
output goes straight into the next small call, :func:`fuse` replaces the pair (or four) by
one call of ``_gemv`` that does both in one parallel run, each thread finishing its own
outputs while they are in its cache:

- a panel product y = x W + b followed by the residual sum out = r + y (``_rowwise.add``;
  W_O and W_out in every block) → ``gemv_panels_add``;
- SwiGLU's two products of one x, a = x W_in + b_in and g = x W_gate + b_gate, then
  s = silu(g) and h = s ⊙ a (``_rowwise.silu``, ``_rowwise.mul``) → ``gemv_panels_glu``.

The fused calls compute the same operations on the same values in the same order and write
every buffer the separate calls wrote (y; a, g and s), so the replayed step's logits stay the
eager step's bit for bit (``tests/sample/test_replay*.py``), and a buffer read later, if any,
holds what it held. Float32 panels and bf16 panels under float32 activations both fuse;
other products (int8, int4, the rows form, bf16 activations) are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from glassgpt.kernels.extensions import extension
from glassgpt.kernels.replay import Call

_gemv = extension("_gemv")
_rowwise = extension("_rowwise")


def _panel_kinds() -> dict[Callable[..., Any], int]:
    """The panel products that fuse: the function → half (1: bf16 panels, float32 x)."""
    if _gemv is None or not hasattr(_gemv, "gemv_panels_glu"):
        return {}
    return {_gemv.gemv_panels: 0, _gemv.gemv_panels_bf16: 1}


def fuse(calls: list[Call]) -> list[Call]:
    """``calls`` with each run of a fusable pattern (see the module docstring) replaced by its
    fused call; the others as they were, in order."""
    kinds = _panel_kinds()
    if not kinds or _rowwise is None:
        return list(calls)
    silu_avx2 = int(_rowwise.kernel() == "avx2")  # the SiLU the separate call takes now
    out: list[Call] = []
    i = 0
    while i < len(calls):
        glu = _glu(calls[i : i + 4], kinds, silu_avx2)
        if glu is not None:
            out.append(glu)
            i += 4
            continue
        add = _add(calls[i : i + 2], kinds)
        if add is not None:
            out.append(add)
            i += 2
            continue
        out.append(calls[i])
        i += 1
    return out


def _product(call: Call, kinds: dict[Callable[..., Any], int]) -> tuple[Any, ...] | None:
    """(x, P, b, y, M, K, N, threads, half) of a panel product that fuses, else None."""
    fn, args, positional = call
    if positional or fn not in kinds or len(args) != 8:
        return None
    return (*args, kinds[fn])


def _add(calls: list[Call], kinds: dict[Callable[..., Any], int]) -> Call | None:
    """y = x W + b, then out = r + y (or y + r) → ``gemv_panels_add``."""
    if len(calls) < 2:
        return None
    p = _product(calls[0], kinds)
    fn, args, positional = calls[1]
    if p is None or fn is not _rowwise.add or positional:
        return None
    x, P, b, y, M, K, N, threads, half = p
    a, c, out, n = args
    if n != M * N or (a == y) == (c == y):  # y exactly once among the operands
        return None
    r = c if a == y else a
    if x in (y, out):
        return None
    return (_gemv.gemv_panels_add, (x, P, b, y, M, K, N, threads, half, r, out), ())


def _glu(calls: list[Call], kinds: dict[Callable[..., Any], int], silu_avx2: int) -> Call | None:
    """Two products of one x, silu of one output, times the other → ``gemv_panels_glu``."""
    if len(calls) < 4:
        return None
    p, q = _product(calls[0], kinds), _product(calls[1], kinds)
    (f_silu, silu_args, pos_s), (f_mul, mul_args, pos_m) = calls[2], calls[3]
    if p is None or q is None or pos_s or pos_m:
        return None
    if f_silu is not _rowwise.silu or f_mul is not _rowwise.mul:
        return None
    if p[0] != q[0] or p[4:] != q[4:]:  # one x, one shape, threads and panel format
        return None
    x, _, _, y1, M, K, N, threads, half = p
    y2 = q[3]
    g_in, s, n = silu_args
    u, v, h, n2 = mul_args
    if n != M * N or n2 != n or y1 == y2 or g_in not in (y1, y2):
        return None
    value = y2 if g_in == y1 else y1  # the product that is not the gate
    if {u, v} != {s, value} or s in (x, y1, y2) or h in (x, y1, y2):
        return None
    a, g = (q, p) if g_in == y1 else (p, q)
    return (
        _gemv.gemv_panels_glu,
        (x, a[1], a[2], a[3], g[1], g[2], g[3], M, K, N, threads, half, s, h, silu_avx2),
        (),
    )
