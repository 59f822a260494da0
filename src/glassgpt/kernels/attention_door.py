"""z = softmax(q kᵀ/√d_head + M) v by the kernel ``glassgpt.kernels.policy`` picks.

M[i, j] = −∞ where key j is past query i's position (j > offset + i), or where a caller's
boolean mask (True = may attend) says no. PyTorch's ``scaled_dot_product_attention`` never
materialises the pattern; this module chooses how to call it (``is_causal``, no mask for one
query after every key, an explicit mask otherwise) and, on CPUs, when to avoid it: for a
decoding step's few queries in float32 inference, glassgpt's own kernel
(``glassgpt.kernels._attend``) computes the same z without PyTorch's per-call set-up; for
float32 causal self-attention with small heads (training, or a prompt's forward), glassgpt's
causal kernel (``glassgpt.kernels.flash``) computes z and its gradients several times faster.

This module is the attention door: every attention of the model enters by its
:func:`attention` (``glassgpt.kernels.attention``), which picks the path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from glassgpt.kernels import bf16, custom_ops, flash, replay
from glassgpt.kernels.extensions import extension
from glassgpt.kernels.policy import attention_path

_attend = extension(
    "_attend"
)  # not built (no C compiler at install): PyTorch's kernel for every shape


def compute_dtype(q: Tensor, device: str | None = None) -> torch.dtype:
    """The dtype a kernel computes in: q's, or the autocast dtype of q's device (type
    ``device`` when given) when on."""
    device = q.device.type if device is None else device
    if torch.is_autocast_enabled(device) and q.dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return q.dtype


def _hidden(t_q: int, t_k: int, offset: int | Tensor, device: torch.device) -> Tensor:
    """Boolean [t_q, t_k], True where key j is past query i (j > offset + i); for per-row
    offsets [B], [B, 1, t_q, t_k] (j > offset[b] + i)."""
    if isinstance(offset, Tensor):
        last = offset.to(device)[:, None] + torch.arange(t_q, device=device)  # [B, t_q]
        return (torch.arange(t_k, device=device) > last[..., None])[:, None]
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(offset + 1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: int | Tensor = 0,
    dropout_p: float = 0.0,
    mask: Tensor | None = None,
) -> Tensor:
    """q [B, H, T, d_head], k, v [B, G, T, d_head] → z [B, H, T_q, d_head] (keys T_k ≥ T_q,
    queries at positions offset … offset + T_q − 1, or row b's at offset[b] … for int64
    per-row offsets [B], a batch of sequences of different lengths, whose keys past each
    row's own are never read); ``mask`` (bool, True = may attend) replaces the causal mask (a
    padded batch). With G < H key/value heads (grouped-query), query head h reads k, v head
    h // (H/G): the decoding kernel reads it in place, the other paths repeat each group."""
    inference = not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                   or v.requires_grad))  # fmt: skip
    device = "cpu" if q.is_cpu else q.device.type  # (is_cpu: the cheaper question)
    rows = isinstance(offset, Tensor)
    # Under torch.compile only PyTorch's kernels are traced (glassgpt's bf16 paths are off
    # there too), and asking the CPU (it reads /proc/cpuinfo) would break the graph.
    native = device != "cpu" or torch.compiler.is_compiling() or bf16.native()
    path = attention_path(
        device, compute_dtype(q, device), q.shape[-1], k.shape[-2],
        masked=mask is not None or rows, dropout=dropout_p > 0.0, n_queries=q.shape[-2],
        inference=inference, few_queries_kernel=_attend is not None,
        causal_kernel=flash._flash is not None, native_bf16=native,
    )  # fmt: skip
    if path == "few_queries" and _few_queries_ok(q, k, v, offset, mask):
        return few_queries(q, k, v, offset, mask)
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if rows:  # the mask that per-row offsets stand for, over the keys some row may see
        k, v, mask = _rows_as_mask(q, k, v, offset, mask)  # type: ignore[arg-type]
        offset = 0
    if path == "causal_small" and offset == 0 and flash.takes(q, k, v):
        if not torch.compiler.is_compiling():
            return flash.causal_attention(q, k, v)
        if custom_ops.registered():  # an opaque call in the compiled graph
            return custom_ops.causal_attention(q, k, v)
    if path == "explicit_bf16":
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(_hidden(q.shape[-2], k.shape[-2], offset, q.device), -math.inf)
        pattern = torch.softmax(scores.float(), dim=-1)
        return torch.matmul(pattern.to(v.dtype), v).to(torch.bfloat16)
    if path == "fused_float32":  # float32 copies, by the kernel float32 ones would take
        with torch.autocast(q.device.type, enabled=False):
            z = attention(q.float(), k.float(), v.float(), offset, dropout_p, mask)
        return z.to(torch.bfloat16)
    return _sdpa(q, k, v, offset, dropout_p, mask)


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, offset: int, dropout_p: float, mask: Tensor | None
) -> Tensor:
    t_q, t_k = q.shape[-2], k.shape[-2]
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if offset == 0 and t_q == t_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if t_q == 1 and offset >= t_k - 1:  # one new query after every key: nothing to hide
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    allowed = ~_hidden(t_q, t_k, offset, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)


def _rows_as_mask(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """k, v narrowed to the keys some row may see, and the mask [B, 1, T_q, m] (and ``mask``'s,
    if given) of keys j ≤ offsets[b] + i."""
    t_q = q.shape[-2]
    m = min(k.shape[-2], int(offsets.max()) + t_q)
    allowed = ~_hidden(t_q, m, offsets, q.device)  # [B, 1, T_q, m]
    if mask is not None:
        allowed = allowed & mask[..., :m]
    return k[..., :m, :], v[..., :m, :], allowed


def _few_queries_ok(q: Tensor, k: Tensor, v: Tensor, offset: object, mask: Tensor | None) -> bool:
    """Whether the decoding kernel takes these inputs: float32 q, k, v of one shape family,
    an int offset or int64 per-row offsets [B] (contiguous, on the CPU), and no mask or a
    boolean one that broadcasts to the scores."""
    if not (q.dtype == k.dtype == v.dtype == torch.float32):
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or ks != v.shape or qs[0] != ks[0] or qs[3] != ks[3]:
        return False
    if ks[1] < 1 or qs[1] % ks[1]:  # H query heads over G key/value heads
        return False
    if isinstance(offset, Tensor):
        if not (offset.dtype == torch.int64 and offset.is_cpu and offset.is_contiguous()
                and offset.shape == (qs[0],)):  # fmt: skip
            return False
    elif not isinstance(offset, int):
        return False
    return mask is None or (mask.dtype == torch.bool and mask.ndim == 4)


def step_attention(
    q: Tensor, k: Tensor, v: Tensor, offset: int | Tensor, mask: Tensor | None, *,
    scale: float | None = None, cap: float | None = None, window: int | None = None,
) -> Tensor | None:  # fmt: skip
    """A decoding step's z = softmax(cap(q kᵀ · a) + M) v by the decoding kernel, with the
    scale a (default 1/√d_head), the soft cap c·tanh(s/c) and a sliding window (query i sees
    keys offset + i − window < j ≤ offset + i) as its arguments; None where the kernel does
    not take these inputs (then the caller's explicit path): float32, no autograd, no mask."""
    if _attend is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    if mask is not None or not q.is_cpu or not _few_queries_ok(q, k, v, offset, None):
        return None
    return few_queries(q, k, v, offset, None, scale=scale, cap=cap, window=window)


def few_queries(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: int | Tensor = 0,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    cap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """z = softmax(q kᵀ/√d_head + M) v by ``glassgpt.kernels._attend`` (float32, no autograd):
    q [B, H, T_q, d_head], k, v [B, G, T_k, d_head] (query head h reads h // (H/G)), any
    strides; M as in :func:`attention`.
    A query that may see no key gets z = 0. z is a [B, H, T_q, d_head] view of a
    [B, T_q, H, d_head] buffer, the layout the output projection reads."""
    assert _attend is not None
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    z = torch.empty(B, Tq, H, D, dtype=torch.float32)
    m = mask.expand(B, H, Tq, Tk) if mask is not None else None
    strides = (
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *(m.stride() if m is not None else (0,) * 4),
        Tq * H * D,
        D,
        H * D,
        1,
    )  # fmt: skip  (z's, read as [B, H, Tq, D])
    rows = isinstance(offset, Tensor)  # per-row offsets, read by the kernel when it runs
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if m is None else m.data_ptr(),
            z.data_ptr(), B, H, Tq, Tk, D, 0 if rows else offset, strides,
            torch.get_num_threads(), offset.data_ptr() if rows else 0,  # type: ignore[union-attr]
            H // k.shape[1], scale or 0.0, cap or 0.0, window or 0)  # fmt: skip
    _attend.attend(*args)
    if replay.RECORDING:
        if m is not None:  # a mask's keys do not move with the position
            replay.fail("a masked attention")
        replay.add(_attend.attend, args, positional=() if rows else (8, 10))  # Tk, offset
    return z.transpose(1, 2)  # [B, H, Tq, D]
