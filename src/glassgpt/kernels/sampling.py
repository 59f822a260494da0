"""A sampler's passes over a step's rows of logits or probabilities [B, V], by
``glassgpt.kernels._rowwise`` (``_argmax.h``, ``_nucleus.h``, ``_topk.h``): the same bits as
the PyTorch operations each names, without their sorts, extra passes over [B, V], or
hand-offs of the GIL between two decoding steps.

    argmax_rows(z)     each row's first index of its largest value (greedy decoding)
    top_p_drop(probs, p)   the tokens top-p drops: a row's stable descending sort, its
                       cumsum, and drop where the mass before a token is ≥ p_b (no sort);
                       top_p_fill(z, probs, p): z with −inf there
    min_p_fill(z, log m)   z with −inf where z_i − max z < log m_b (min-p)
    top_k_fill(z, k)   z with −inf below each row's k_b-th largest (top-k; no sort)
    draw_rows(probs, cdf, u)   each row's inverse-CDF draw (``sample.filters.draw`` after its
                       softmax and cumsum) in one call
    finite_rows(z)     whether each row holds a finite value (``isfinite(z).any(-1)``), and all

Each takes float32 (the draw float64) CPU tensors with contiguous rows and returns None
where it does not take its input, or where the extension is not built: the caller
(``glassgpt.sample.filters``, ``glassgpt.sample.rows``) then runs PyTorch's operations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glassgpt.kernels.extensions import extension

_rowwise = extension("_rowwise")  # not built: None, and every function here returns None


def argmax_rows(z: Tensor, n: int | None = None) -> list[int] | None:
    """The first index of the largest of each row's first ``n`` values (all, by default), as
    ``z[:, :n].max(-1)`` gives it, for a float32 CPU z [B, V] with contiguous rows; None where
    the kernel does not take z or a row holds a NaN or has an infinite largest value (PyTorch's
    path handles those).

    A greedy step's pick over GPT-2's 50,257 logits: ``z.max(-1)`` reads them one value at a
    time, this kernel 8 at a time, and returns a list, not a tensor."""
    if _rowwise is None or z.ndim != 2 or z.dtype is not torch.float32 or not z.is_cpu:
        return None
    V = z.shape[1] if n is None else min(n, z.shape[1])
    if V <= 0 or z.stride(1) != 1 or (z.shape[0] > 1 and z.stride(0) < V):
        return None
    return _rowwise.argmax_rows(z.data_ptr(), z.shape[0], V, max(z.stride(0), V))


def top_p_drop(probs: Tensor, p: Tensor) -> Tensor | None:
    """The tokens top-p drops [B, V] (bool) for float32 probabilities [B, V] on a CPU (rows
    contiguous) and each row's p_b (float32 [B]): the bits of PyTorch's

        s, order = sort(probs, descending=True, stable=True)
        drop[order] = (s.cumsum(-1) − s) ≥ p

    (``sample.filters.top_p_filter``) without its sort of the vocabulary (``kernels/_nucleus.h``:
    a histogram of the values' bits, and a sort of the few values near the cut). None where
    the kernel does not take them: another dtype or device, a row with a negative or infinite
    value, not built (then PyTorch's sort)."""
    return _nucleus(probs, p, None)


def top_p_fill(z: Tensor, probs: Tensor, p: Tensor) -> Tensor | None:
    """``z.masked_fill(top_p_drop(probs, p), −inf)`` for float32 z [B, V] (contiguous, on a
    CPU, probs = softmax(z) or any probabilities): the fill in the kernel's pass, not another
    pass over [B, V]. None where :func:`top_p_drop` would be."""
    if z.shape != probs.shape or z.dtype is not torch.float32 or not z.is_cpu:
        return None
    return _nucleus(probs, p, z.contiguous())


def min_p_fill(z: Tensor, log_m: Tensor) -> Tensor | None:
    """``z.masked_fill(z − z.max(−1) < log_m[:, None], −inf)`` for float32 z [B, V] on a CPU
    (contiguous rows) and log_m [B] (float32, log m_b as ``torch.log`` gives it): the same
    bits in one pass after the maximum; None where the kernel does not take them."""
    if _rowwise is None or torch.compiler.is_compiling() or z.ndim != 2 or not z.shape[1]:
        return None
    if z.dtype is not torch.float32 or not z.is_cpu or not z.is_contiguous():
        return None
    if log_m.shape != z.shape[:1] or log_m.dtype is not torch.float32 or not log_m.is_cpu:
        return None
    log_m = log_m.contiguous()
    out = torch.empty_like(z)
    _rowwise.min_p_fill(z.data_ptr(), log_m.data_ptr(), out.data_ptr(), *z.shape)
    return out


def top_k_fill(z: Tensor, k: Tensor) -> Tensor | None:
    """``z.masked_fill(z < t, −inf)`` for float32 z [B, V] on a CPU (contiguous rows) and
    k [B] (int64), where t_b = ``torch.topk(z_b, k_b).values[k_b − 1]`` for 0 < k_b < V and
    −∞ otherwise (the row kept): ``sample.rows._top_k``'s bits without ``torch.topk``
    (``kernels/_topk.h``: one pass keeping a min-heap of the k largest order keys so far).
    None where the kernel does not take them."""
    if _rowwise is None or torch.compiler.is_compiling() or z.ndim != 2 or not z.shape[1]:
        return None
    if z.dtype is not torch.float32 or not z.is_cpu or not z.is_contiguous():
        return None
    if k.shape != z.shape[:1] or k.dtype is not torch.long or not k.is_cpu:
        return None
    k, out = k.contiguous(), torch.empty_like(z)
    if not _rowwise.top_k_fill(z.data_ptr(), k.data_ptr(), out.data_ptr(), *z.shape,
                               torch.get_num_threads()):  # fmt: skip
        return None
    return out


def draw_rows(probs: Tensor, cdf: Tensor, u: Tensor) -> Tensor | None:
    """Each row's id [B] (int64) from float64 probabilities [B, V], their cumsum and uniforms
    u [B] (CPU, contiguous), the bits of ``sample.filters.draw``'s PyTorch operations after
    the cumsum: ``searchsorted(cdf, u · cdf[:, −1], right=True)`` clamped to V − 1, and where
    that id has no mass the last one that has. None where the kernel does not take them."""
    if _rowwise is None or torch.compiler.is_compiling() or probs.ndim != 2:
        return None
    B, V = probs.shape
    if not V or cdf.shape != (B, V) or u.shape != (B,):
        return None
    if any(t.dtype is not torch.float64 or not t.is_cpu or not t.is_contiguous()
           for t in (probs, cdf, u)):  # fmt: skip
        return None
    ids = torch.empty(B, dtype=torch.long)
    _rowwise.draw_rows(probs.data_ptr(), cdf.data_ptr(), u.data_ptr(), ids.data_ptr(), B, V)
    return ids


def finite_rows(z: Tensor) -> tuple[Tensor, bool] | None:
    """(``torch.isfinite(z).any(-1)`` [B] bool, whether every row has one) for float32 z
    [B, V] on a CPU (contiguous), in one call that does not let go of the GIL (a sampler's
    check between two steps); None where the kernel does not take z."""
    if _rowwise is None or torch.compiler.is_compiling() or z.ndim != 2 or not z.shape[1]:
        return None
    if z.dtype is not torch.float32 or not z.is_cpu or not z.is_contiguous():
        return None
    ok = torch.empty(z.shape[0], dtype=torch.bool)
    every = _rowwise.finite_rows(z.data_ptr(), ok.data_ptr(), *z.shape)
    return ok, bool(every)


def _nucleus(probs: Tensor, p: Tensor, z: Tensor | None) -> Tensor | None:
    if _rowwise is None or torch.compiler.is_compiling() or probs.ndim != 2:
        return None
    if probs.dtype is not torch.float32 or not probs.is_cpu or not probs.is_contiguous():
        return None
    B, V = probs.shape
    if V == 0 or p.shape != (B,) or p.dtype is not torch.float32 or not p.is_cpu:
        return None
    p = p.contiguous()
    drop = torch.empty(B, V, dtype=torch.bool)
    out = None if z is None else torch.empty_like(z)
    if not _rowwise.top_p_drop(probs.data_ptr(), p.data_ptr(), drop.data_ptr(), B, V,
                               torch.get_num_threads(), 0 if z is None else z.data_ptr(),
                               0 if out is None else out.data_ptr()):  # fmt: skip
        return None
    return drop if out is None else out
