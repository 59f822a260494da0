"""Causal multi-head self-attention.

For each head h (row vectors, x [T, d_model]):

    q = x W_Q[h] + b_Q[h],  k = x W_K[h] + b_K[h],  v = x W_V[h] + b_V[h]      [T, d_head]
    (RoPE: q and k rotated by position)
    attn_scores = q kᵀ / √d_head + M,   M[i, j] = −∞ if j > i else 0          [T, T]
    pattern     = softmax(attn_scores) (over j)
    z           = pattern v                                                  [T, d_head]
    Attn(x)     = Σ_h z_h W_O[h] + b_O                                       [T, d_model]

The code computes q, k, v for all heads with one matmul against the fused matrix
[W_Q | W_K | W_V] reshaped to [d_model, 3·n_heads·d_head], and z with PyTorch's fused
``scaled_dot_product_attention`` (never materialising the T×T pattern). The explicit path,
used when ``attn_scores`` or ``pattern`` is hooked or ``impl == "explicit"``, builds both.

``offset`` is the absolute position of the first query (0 without a cache): query i may see
key j iff j ≤ offset + i, which is what a KV cache needs. With a cache (``kv``), the new keys
and values are appended to the cached ones and the queries attend to all of them; a padded
batch passes its own boolean ``mask`` (True = may attend) instead of the causal one.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassgpt.model.accounting import EXPLICIT_MAX_KEYS, SMALL_HEAD
from glassgpt.model.config import GPTConfig
from glassgpt.model.hooks import Hooks, run_hook
from glassgpt.model.layers import apply_rope, linear

ATTN_IMPLS: tuple[str, ...] = ("auto", "explicit")


class LayerKV(Protocol):
    """One layer's view of a KV cache (``glassgpt.sample.cache.KVCache`` provides it)."""

    offset: int  # positions cached before this step
    mask: Tensor | None  # bool [B, 1, T_q, offset + T_q] (True = may attend), or None: causal

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


def causal_mask(t_q: int, t_k: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
    """Boolean [t_q, t_k], True where query i must NOT see key j (j > offset + i).

    >>> causal_mask(3, 3).int().tolist()
    [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    >>> causal_mask(1, 3, offset=2).int().tolist()
    [[0, 0, 0]]
    """
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(offset + 1)


def attention_scores(q: Tensor, k: Tensor, offset: int = 0, mask: Tensor | None = None) -> Tensor:
    """q kᵀ/√d_head + M for q [B, H, T_q, d_head], k [B, H, T_k, d_head] → [B, H, T_q, T_k].

    ``mask`` (bool, True = may attend, broadcast to [B, H, T_q, T_k]) replaces the causal one.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        return scores.masked_fill(~mask, float("-inf"))
    hidden = causal_mask(q.shape[-2], k.shape[-2], offset, device=q.device)
    return scores.masked_fill(hidden, float("-inf"))


def _cpu_bf16(q: Tensor) -> bool:
    """q is bf16, or CPU autocast would make the attention kernel bf16."""
    if q.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offset: int = 0,
    dropout_p: float = 0.0,
    mask: Tensor | None = None,
) -> Tensor:
    """softmax(q kᵀ/√d_head + M) v by the fused kernel; q, k, v [B, H, T, d_head] → z [B, H, T_q, d_head].

    ``mask`` (bool, True = may attend) replaces the causal mask (a padded batch). On CPUs,
    bf16 heads narrower than 64 take the explicit product up to 128 keys.
    """
    if q.device.type == "cpu" and q.shape[-1] < SMALL_HEAD and _cpu_bf16(q):
        # bf16 CPU heads narrower than 64 avoid PyTorch's bf16 fused kernel (~3x slower than
        # its float32 one here). Up to 128 keys they take the explicit product in bf16 with the
        # softmax in float32 (fwd+bwd at B 24, H 4, T 64, d_head 32: 1.4 ms against the float32
        # kernel's 3.2; in a whole training step 4-8% faster), longer ones the float32 fused
        # kernel. (In float32 the explicit product measured faster alone but slower inside a
        # training step.)
        if mask is None and dropout_p == 0.0 and k.shape[-2] <= EXPLICIT_MAX_KEYS:
            pattern = torch.softmax(attention_scores(q, k, offset).float(), dim=-1)
            return torch.matmul(pattern.to(v.dtype), v).to(torch.bfloat16)
        with torch.autocast("cpu", enabled=False):
            z = fused_attention(q.float(), k.float(), v.float(), offset, dropout_p, mask)
        return z.to(torch.bfloat16)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if offset == 0 and t_q == t_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if t_q == 1 and offset >= t_k - 1:  # one new query after every key: nothing to hide
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    allowed = ~causal_mask(t_q, t_k, offset, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)


class Attention(nn.Module):
    """Multi-head causal self-attention with parameters W_Q, W_K, W_V, W_O (and b_*)."""

    def __init__(self, config: GPTConfig, hooks: Hooks, name: str) -> None:
        super().__init__()
        H, D, dh = config.n_heads, config.d_model, config.d_head
        assert dh is not None
        self.n_heads, self.d_head = H, dh
        self.W_Q = nn.Parameter(torch.empty(H, D, dh))  # [n_heads, d_model, d_head]
        self.W_K = nn.Parameter(torch.empty(H, D, dh))
        self.W_V = nn.Parameter(torch.empty(H, D, dh))
        self.W_O = nn.Parameter(torch.empty(H, dh, D))  # [n_heads, d_head, d_model]
        self.b_Q: nn.Parameter | None
        self.b_K: nn.Parameter | None
        self.b_V: nn.Parameter | None
        self.b_O: nn.Parameter | None
        if config.bias:
            self.b_Q = nn.Parameter(torch.zeros(H, dh))  # [n_heads, d_head]
            self.b_K = nn.Parameter(torch.zeros(H, dh))
            self.b_V = nn.Parameter(torch.zeros(H, dh))
            self.b_O = nn.Parameter(torch.zeros(D))  # [d_model]
        else:
            self.b_Q = self.b_K = self.b_V = self.b_O = None
        self.dropout = config.dropout
        self.impl = "auto"
        self._qkv_cache: tuple[tuple, Tensor, Tensor | None] | None = None
        self.hooks = hooks
        self.hook_q, self.hook_k, self.hook_v = (f"{name}.{s}" for s in "qkv")
        self.hook_scores, self.hook_pattern = f"{name}.attn_scores", f"{name}.pattern"
        self.hook_z, self.hook_result = f"{name}.z", f"{name}.result"

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, impl={self.impl}"

    def fused_qkv(self) -> tuple[Tensor, Tensor | None]:
        """[W_Q | W_K | W_V] as one [d_model, 3·n_heads·d_head] matrix (columns: q|k|v, head,
        d_head) and the matching bias, in the autocast dtype when autocast is on.

        Without autograd (``torch.no_grad``/inference) the result is cached until a weight
        changes (its version counter or storage); change weights through ``p.copy_`` under
        ``torch.no_grad()`` or an optimizer, not through ``p.data``, which autograd and this
        cache cannot see.
        """
        params: list[Tensor] = [self.W_Q, self.W_K, self.W_V]
        if self.b_Q is not None and self.b_K is not None and self.b_V is not None:
            params += [self.b_Q, self.b_K, self.b_V]
        device = self.W_Q.device.type
        dtype = self.W_Q.dtype
        if torch.is_autocast_enabled(device) and dtype != torch.float64:  # autocast skips float64
            dtype = torch.get_autocast_dtype(device)
        tracked = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        key = None
        if not tracked and not torch.compiler.is_compiling():  # a compiled graph stacks
            inference = torch.is_inference_mode_enabled()
            key = (dtype, inference, *((p.data_ptr(), p._version) for p in params))
            if self._qkv_cache is not None and self._qkv_cache[0] == key:
                return self._qkv_cache[1], self._qkv_cache[2]
        self._qkv_cache = None
        # Cast each weight first (autocast would cast the stacked matrix anyway), then stack:
        # [d_model, 3, H, d_head] is contiguous, so the flatten is a view.
        W = torch.stack([W.permute(1, 0, 2).to(dtype) for W in params[:3]], dim=1).flatten(1)
        b = torch.stack(params[3:]).flatten().to(dtype) if len(params) > 3 else None
        if key is not None:
            self._qkv_cache = (key, W, b)
        return W, b

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        offset: int = 0,
        kv: LayerKV | None = None,
    ) -> Tensor:
        """x [B, T, d_model] → Attn(x) [B, T, d_model]; ``rope`` = (cos, sin) [T, d_head/2].

        ``kv`` (a KV cache's view of this layer) supplies ``offset`` and ``mask`` and
        ``update(k, v)`` → every cached key and value [B, H, offset + T, d_head], these included.
        """
        B, T, _ = x.shape
        H, dh, hooks = self.n_heads, self.d_head, self.hooks
        W_qkv, b_qkv = self.fused_qkv()
        qkv = linear(x, W_qkv, b_qkv)  # [B, T, 3·H·d_head]
        q, k, v = qkv.view(B, T, 3, H, dh).unbind(2)  # each [B, T, H, d_head]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if hooks:
            q = run_hook(hooks, self.hook_q, q)
            k = run_hook(hooks, self.hook_k, k)
            v = run_hook(hooks, self.hook_v, v)
        q_BHTD, k_BHTD, v_BHTD = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask = None
        if kv is not None:
            offset, mask = kv.offset, kv.mask
            k_BHTD, v_BHTD = kv.update(k_BHTD, v_BHTD)  # [B, H, offset + T, d_head]
        p_drop = self.dropout if self.training else 0.0
        if self.impl == "explicit" or (
            hooks and (self.hook_scores in hooks or self.hook_pattern in hooks)
        ):
            z_BHTD = self._explicit(q_BHTD, k_BHTD, v_BHTD, offset, p_drop, mask)
        else:
            z_BHTD = fused_attention(q_BHTD, k_BHTD, v_BHTD, offset, p_drop, mask)
        z = z_BHTD.transpose(1, 2)  # [B, T, H, d_head]
        if hooks:
            z = run_hook(hooks, self.hook_z, z)
        out = linear(z.reshape(B, T, H * dh), self.W_O, self.b_O)
        if hooks and self.hook_result in hooks:
            out = self._hooked_result(z, out)
        return out  # [B, T, d_model]

    def _explicit(
        self, q: Tensor, k: Tensor, v: Tensor, offset: int, p_drop: float, mask: Tensor | None
    ) -> Tensor:
        """z from the materialised scores and pattern, each handed to its hook."""
        scores = attention_scores(q, k, offset, mask)  # [B, H, T_q, T_k]
        hooked_scores = run_hook(self.hooks, self.hook_scores, scores) if self.hooks else scores
        pattern = torch.softmax(hooked_scores, dim=-1)
        hooked = run_hook(self.hooks, self.hook_pattern, pattern) if self.hooks else pattern
        if self.impl != "explicit" and hooked_scores is scores and hooked is pattern:
            # Only read: keep the fused kernel's z, so reading never changes the logits.
            return fused_attention(q, k, v, offset, p_drop, mask)
        if p_drop:
            hooked = F.dropout(hooked, p_drop, training=True)
        return torch.matmul(hooked.to(v.dtype), v)  # [B, H, T_q, d_head]

    def _hooked_result(self, z: Tensor, out: Tensor) -> Tensor:
        result = torch.einsum("bthd,hdm->bthm", z, self.W_O)  # [B, T, H, d_model]
        new = run_hook(self.hooks, self.hook_result, result)
        if new is result:
            return out
        out = new.sum(2)
        return out if self.b_O is None else out + self.b_O
