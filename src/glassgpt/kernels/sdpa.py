"""z = softmax(q kᵀ/√d_head + M) v by the kernel ``glassgpt.kernels.policy`` picks.

M[i, j] = −∞ where key j is past query i's position (j > offset + i), or where a caller's
boolean mask (True = may attend) says no. PyTorch's ``scaled_dot_product_attention`` never
materialises the pattern; this module only chooses how to call it (``is_causal``, no mask
for one query after every key, an explicit mask otherwise) and, on CPUs, when to avoid it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from glassgpt.kernels.policy import attention_path


def compute_dtype(q: Tensor) -> torch.dtype:
    """The dtype a kernel computes in: q's, or the autocast dtype of q's device when on."""
    device = q.device.type
    if torch.is_autocast_enabled(device) and q.dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return q.dtype


def _hidden(t_q: int, t_k: int, offset: int, device: torch.device) -> Tensor:
    """Boolean [t_q, t_k], True where key j is past query i (j > offset + i)."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(offset + 1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: int = 0,
    dropout_p: float = 0.0,
    mask: Tensor | None = None,
) -> Tensor:
    """q, k, v [B, H, T, d_head] → z [B, H, T_q, d_head] (keys T_k ≥ T_q, queries at
    positions offset … offset + T_q − 1); ``mask`` (bool, True = may attend) replaces the
    causal mask (a padded batch)."""
    path = attention_path(
        q.device.type, compute_dtype(q), q.shape[-1], k.shape[-2],
        masked=mask is not None, dropout=dropout_p > 0.0,
    )  # fmt: skip
    if path == "explicit_bf16":
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(_hidden(q.shape[-2], k.shape[-2], offset, q.device), -math.inf)
        pattern = torch.softmax(scores.float(), dim=-1)
        return torch.matmul(pattern.to(v.dtype), v).to(torch.bfloat16)
    if path == "fused_float32":
        with torch.autocast(q.device.type, enabled=False):
            z = _sdpa(q.float(), k.float(), v.float(), offset, dropout_p, mask)
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
