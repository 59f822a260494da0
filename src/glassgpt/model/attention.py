"""Causal multi-head self-attention, with G = n_kv_heads key/value heads (grouped-query).

For each query head h, reading key/value head g = h // (H/G) (row vectors, x [T, d_model]):

    q = x W_Q[h] + b_Q[h],  k = x W_K[g] + b_K[g],  v = x W_V[g] + b_V[g]      [T, d_head]
    (qk_norm: q ← RMSNorm(q) ⊙ (o + w_q), k ← RMSNorm(k) ⊙ (o + w_k), over d_head)
    (RoPE: q and k rotated by position, on their first r = rotary_fraction · d_head dims)
    attn_scores = cap(q kᵀ · a) + M,  a = attn_scale or 1/√d_head,               [T, T]
                  cap(s) = c·tanh(s/c) (attn_softcap c; else s),
                  M[i, j] = 0 if j ≤ i (and i − w < j on a sliding layer of window w), else −∞
    pattern     = softmax(attn_scores) (over j)
    z           = pattern v                                                  [T, d_head]
    Attn(x)     = Σ_h z_h W_O[h] + b_O                                       [T, d_model]

W_Q [n_heads, d_model, d_head], W_K and W_V [n_kv_heads, d_model, d_head] are views of one
parameter W_QKV = [W_Q | W_K | W_V] [d_model, (n_heads + 2·n_kv_heads)·d_head] (columns:
q|k|v, head, d_head), so q, k, v for all heads come from one product x W_QKV; the state dict
holds the three views under their own names. The biases b_Q, b_K, b_V (``bias``, or
``qkv_bias`` alone) are views of b_QKV ([3, n_heads, d_head] without grouping, else
[n_heads + 2·n_kv_heads, d_head]). The hooks ``k`` and ``v`` see the G heads
[B, T, n_kv_heads, d_head]; ``attn_scores``, ``pattern`` and ``z`` every query head. A KV
cache stores the G heads.

A soft-capped or rescaled score (``attn_softcap``, ``attn_scale``) takes the explicit path
below, as no fused kernel computes it, and a sliding window is a mask handed to the kernel;
but a decoding step's one query takes the kernel seam's ``step_attention`` where it can (the
scale, cap and window are its arguments: no mask built each step). z comes from the kernel seam (``glassgpt.kernels.attention``, which
never materialises the T×T pattern); the explicit path, used when ``attn_scores`` or
``pattern`` is hooked or ``impl == "explicit"``, builds both and computes z = pattern v
(hooks that only read keep the kernel's z, so reading never changes the logits).

``offset`` is the absolute position of the first query (0 without a cache): query i may see
key j iff j ≤ offset + i, which is what a KV cache needs. With a cache (``kv``), the new keys
and values are appended to the cached ones and the queries attend to all of them; a padded
batch passes its own boolean ``mask`` (True = may attend) instead of the causal one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassgpt.kernels import attention as fused_attention
from glassgpt.kernels import step_attention
from glassgpt.model.cache import LayerKV
from glassgpt.model.config import GPTConfig
from glassgpt.model.hooks import HookPoint, Hooks
from glassgpt.model.layers import Norm, apply_rope, linear, softcap

ATTN_IMPLS: tuple[str, ...] = ("auto", "explicit")
QKV = ("Q", "K", "V")


def causal_mask(
    t_q: int, t_k: int, offset: int | Tensor = 0, device: torch.device | None = None
) -> Tensor:
    """Boolean [t_q, t_k], True where query i must NOT see key j (j > offset + i); for
    per-row offsets [B] (row b's queries at offset[b] + i), [B, 1, t_q, t_k].

    >>> causal_mask(3, 3).int().tolist()
    [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    >>> causal_mask(1, 3, offset=2).int().tolist()
    [[0, 0, 0]]
    >>> causal_mask(1, 3, offset=torch.tensor([0, 1])).int().flatten(1).tolist()
    [[0, 1, 1], [0, 0, 1]]
    """
    if isinstance(offset, Tensor):
        last = offset.to(device)[:, None] + torch.arange(t_q, device=device)  # [B, t_q]
        return (torch.arange(t_k, device=device) > last[..., None])[:, None]
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(offset + 1)


def window_mask(
    t_q: int, t_k: int, offset: int | Tensor, window: int, mask: Tensor | None,
    device: torch.device | None = None,
) -> Tensor:  # fmt: skip
    """Bool, True where query i (at column offset + i) may see key j: j ≤ offset + i and
    offset + i − window < j (transformers' sliding window), and ``mask`` where given;
    [t_q, t_k], or [B, 1, t_q, t_k] for per-row offsets [B] or a mask [B, 1, t_q, t_k].

    >>> window_mask(4, 4, 0, 2, None).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    keys = torch.arange(t_k, device=device)
    if isinstance(offset, Tensor):
        last = (offset.to(device)[:, None] + torch.arange(t_q, device=device))[:, None, :, None]
    else:
        last = torch.arange(offset, offset + t_q, device=device)[:, None]  # [t_q, 1]
    allowed = (keys <= last) & (keys > last - window)
    return allowed if mask is None else allowed & mask


def attention_scores(
    q: Tensor, k: Tensor, offset: int | Tensor = 0, mask: Tensor | None = None, *,
    scale: float | None = None, cap: float | None = None,
) -> Tensor:  # fmt: skip
    """cap(q kᵀ · scale) + M for q [B, H, T_q, d_head], k [B, H, T_k, d_head] → [B, H, T_q, T_k]
    (scale default 1/√d_head; cap(s) = c·tanh(s/c) for ``cap`` c, else s).

    ``mask`` (bool, True = may attend, broadcast to [B, H, T_q, T_k]) replaces the causal one.
    """
    k = k.to(q.dtype)  # (a cache may keep bf16 keys in float32, exactly)
    a = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    scores = softcap(torch.matmul(q, k.transpose(-1, -2)) * a, cap)
    if mask is not None:
        return scores.masked_fill(~mask, float("-inf"))
    hidden = causal_mask(q.shape[-2], k.shape[-2], offset, device=q.device)
    return scores.masked_fill(hidden, float("-inf"))


class Attention(nn.Module):
    """Multi-head causal self-attention with parameters W_QKV (viewed as W_Q, W_K, W_V), W_O
    (and b_QKV viewed as b_Q, b_K, b_V, and b_O; the q/k-norms' weights ``q_norm.w``,
    ``k_norm.w``). ``sliding``: this layer attends within ``sliding_window``."""

    def __init__(
        self, config: GPTConfig, hooks: Hooks, name: str, *, sliding: bool = False
    ) -> None:
        super().__init__()
        H, G, D, dh = config.n_heads, config.kv_heads, config.d_model, config.d_head
        assert dh is not None
        self.n_heads, self.n_kv_heads, self.d_model, self.d_head = H, G, D, dh
        self.W_QKV = nn.Parameter(torch.empty(D, (H + 2 * G) * dh))  # [d_model, (H+2G)·d_head]
        self.W_O = nn.Parameter(torch.empty(H, dh, D))  # [n_heads, d_head, d_model]
        self.b_QKV: nn.Parameter | None = None
        self.b_O: nn.Parameter | None = None
        if config.bias or config.qkv_bias:
            shape = (3, H, dh) if G == H else (H + 2 * G, dh)
            self.b_QKV = nn.Parameter(torch.zeros(shape))  # [3, H, d_head] or [H+2G, d_head]
        if config.bias:
            self.b_O = nn.Parameter(torch.zeros(D))  # [d_model]
        self.q_norm: Norm | None = None
        self.k_norm: Norm | None = None
        if config.qk_norm:  # RMSNorm over d_head (their scales are not hook points)
            self.q_norm = Norm(config, {}, f"{name}.q_norm", d=dh, kind="rmsnorm")
            self.k_norm = Norm(config, {}, f"{name}.k_norm", d=dh, kind="rmsnorm")
        self.window = config.sliding_window if sliding else None
        self.scale, self.cap = config.attn_scale, config.attn_softcap
        self.plain = self.scale is not None or self.cap is not None  # no kernel computes these
        self.dropout = config.dropout
        self.impl = "auto"
        self._hooks = hooks  # the model's shared dict: empty while nothing is hooked
        point = lambda site: HookPoint(hooks, f"{name}.{site}")  # noqa: E731
        self.hook_q, self.hook_k, self.hook_v = point("q"), point("k"), point("v")
        self.hook_scores, self.hook_pattern = point("attn_scores"), point("pattern")
        self.hook_z, self.hook_result = point("z"), point("result")
        self.register_state_dict_post_hook(_split_qkv)
        self.register_load_state_dict_pre_hook(_fuse_qkv)

    def extra_repr(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        window = f", window={self.window}" if self.window is not None else ""
        return f"n_heads={self.n_heads}{kv}, d_head={self.d_head}{window}, impl={self.impl}"

    # -- W_Q, W_K, W_V (and their biases) as views of the fused parameters --------------------
    def _span(self, m: str) -> tuple[int, int]:
        """(first head, heads) of m in Q, K, V among the H + 2G heads of W_QKV's columns."""
        H, G = self.n_heads, self.n_kv_heads
        return {"Q": (0, H), "K": (H, G), "V": (H + G, G)}[m]

    def qkv_weight(self, m: str) -> Tensor:
        """W_m [n_heads (Q) or n_kv_heads (K, V), d_model, d_head]: a view of W_QKV."""
        first, n = self._span(m)
        W = self.W_QKV.view(self.d_model, -1, self.d_head)  # [d_model, H+2G, d_head]
        return W[:, first : first + n].transpose(0, 1)

    def qkv_bias(self, m: str) -> Tensor | None:
        """b_m [n_heads or n_kv_heads, d_head]: a view of b_QKV (None without biases)."""
        b = self.b_QKV
        if b is None:
            return None
        if b.ndim == 3:  # [3, H, d_head]: indexed, not viewed (an FSDP shard splits dim 0)
            return b[QKV.index(m)]
        first, n = self._span(m)
        return b[first : first + n]

    @property
    def W_Q(self) -> Tensor:
        return self.qkv_weight("Q")

    @property
    def W_K(self) -> Tensor:
        return self.qkv_weight("K")

    @property
    def W_V(self) -> Tensor:
        return self.qkv_weight("V")

    @property
    def b_Q(self) -> Tensor | None:
        return self.qkv_bias("Q")

    @property
    def b_K(self) -> Tensor | None:
        return self.qkv_bias("K")

    @property
    def b_V(self) -> Tensor | None:
        return self.qkv_bias("V")

    # -- the function ---------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        offset: int | Tensor = 0,
        kv: LayerKV | None = None,
    ) -> Tensor:
        """x [B, T, d_model] → Attn(x) [B, T, d_model]; ``rope`` = (cos, sin) [T, r/2].

        ``kv`` (a KV cache's view of this layer) supplies ``offset`` and ``mask`` and
        ``update(k, v)`` → every cached key and value [B, G, offset + T, d_head], these included.
        """
        B, T, _ = x.shape
        H, G, dh = self.n_heads, self.n_kv_heads, self.d_head
        b_QKV = self.b_QKV  # (a parameter: each read is a Module.__getattr__ call)
        b_QKV = None if b_QKV is None else b_QKV.flatten()  # [(H+2G)·d_head]
        qkv = linear(x, self.W_QKV, b_QKV)  # [B, T, (H+2G)·d_head] = x W_QKV + b_QKV
        if G == H:
            q, k, v = self._heads(qkv.view(B, T, 3, H, dh), rope)  # each [B, H, T, d_head]
        else:
            q, k, v = self._grouped_heads(qkv.view(B, T, H + 2 * G, dh), rope)
        mask = None
        if kv is not None:
            offset, mask = kv.offset, kv.mask
            k, v = kv.update(k, v)  # [B, G, offset + T, d_head]
        explicit = (self.impl == "explicit" or self.hook_scores.active
                    or self.hook_pattern.active)  # fmt: skip
        z = None
        if (self.plain or self.window is not None) and not explicit and T == 1:
            # a decoding step: the kernel seam's scale, cap and window, where it takes them
            z = step_attention(q, k, v, offset, mask,
                               scale=self.scale, cap=self.cap, window=self.window)  # fmt: skip
        if z is None and self.window is not None:
            mask = window_mask(T, k.shape[2], offset, self.window, mask, device=q.device)
        p_drop = self.dropout if self.training else 0.0
        if z is not None:
            pass
        elif self.plain or explicit:
            z = self._explicit(q, *_repeated(k, v, H), offset, p_drop, mask)  # [B, H, T, d_head]
        else:  # (the kernel seam reads group h // (H/G) itself)
            z = fused_attention(q, k, v, offset, p_drop, mask)  # [B, H, T, d_head]
        z = self.hook_z(z.transpose(1, 2))  # [B, T, H, d_head]
        out = linear(z.reshape(B, T, H * dh), self.W_O, self.b_O)  # [B, T, d_model]
        return self._hooked_result(z, out) if self.hook_result.active else out

    def _heads(
        self, qkv: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """q, k, v [B, H, T, d_head] (views) from qkv [B, T, 3, H, d_head]: q and k rotated
        (RoPE), then each handed to its hook as [B, T, H, d_head]."""
        if (
            rope is None and not self._hooks and self.q_norm is None
        ):  # nothing to see them as [B, T, H, d_head]
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, v
        q, k, v = qkv.unbind(2)  # each [B, T, H, d_head]
        return self._rotated(q, k, v, rope)

    def _grouped_heads(
        self, qkv: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """q [B, H, T, d_head], k, v [B, G, T, d_head] from qkv [B, T, H + 2G, d_head]."""
        H, G = self.n_heads, self.n_kv_heads
        q, k, v = qkv.split([H, G, G], dim=2)  # [B, T, H | G | G, d_head]
        return self._rotated(q, k, v, rope)

    def _rotated(
        self, q: Tensor, k: Tensor, v: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """q, k normed (qk_norm) and rotated (RoPE), each handed to its hook as [B, T, heads,
        d_head], returned as [B, heads, T, d_head]."""
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _explicit(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offset: int | Tensor,
        p_drop: float,
        mask: Tensor | None,
    ) -> Tensor:
        """z = pattern v from the materialised scores and pattern, each handed to its hook.

        Under ``impl == "auto"`` hooks that only read (return their input or None) leave z to
        the kernel, so that reading never changes the logits: the pattern is then computed
        for the hooks alone, besides the kernel's own.
        """
        scores = attention_scores(q, k, offset, mask, scale=self.scale, cap=self.cap)
        hooked_scores = self.hook_scores(scores)  # [B, H, T_q, T_k]
        pattern = torch.softmax(hooked_scores, dim=-1)
        hooked = self.hook_pattern(pattern)
        if (self.impl != "explicit" and not self.plain and hooked_scores is scores
                and hooked is pattern):  # fmt: skip
            return fused_attention(q, k, v, offset, p_drop, mask)
        if p_drop:
            hooked = F.dropout(hooked, p_drop, training=True)
        return torch.matmul(hooked.to(q.dtype), v.to(q.dtype))  # [B, H, T_q, d_head]

    def _hooked_result(self, z: Tensor, out: Tensor) -> Tensor:
        """Hand result_h = z_h W_O[h] [B, T, H, d_model] to its hook; a replacement makes
        Attn(x) = Σ_h result_h + b_O, an unchanged result keeps ``out``."""
        result = torch.einsum("bthd,hdm->bthm", z, self.W_O)
        new = self.hook_result(result)
        if new is result:
            return out
        out = new.sum(2)
        return out if self.b_O is None else out + self.b_O


def _repeated(k: Tensor, v: Tensor, H: int) -> tuple[Tensor, Tensor]:
    """k, v [B, G, T, d_head] with each group repeated H/G times → [B, H, T, d_head] (query
    head h reads group h // (H/G))."""
    if k.shape[1] == H:
        return k, v
    return k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)


def _split_qkv(module: nn.Module, state: dict[str, Any], prefix: str, _meta: Any) -> None:
    """State-dict post-hook: W_QKV (b_QKV) leave as their views W_Q, W_K, W_V (b_Q, b_K, b_V),
    the names and shapes of the checkpoint format."""
    attn = module if isinstance(module, Attention) else None
    assert attn is not None
    mine = {key: state.pop(prefix + key) for key in ("W_QKV", "W_O", "b_QKV", "b_O")
            if prefix + key in state}  # fmt: skip
    D, dh = attn.d_model, attn.d_head
    W = mine["W_QKV"].view(D, -1, dh)  # [d_model, H+2G, d_head]
    spans = [attn._span(m) for m in QKV]
    for m, (first, n) in zip(QKV, spans, strict=True):
        state[prefix + f"W_{m}"] = W[:, first : first + n].transpose(0, 1)
    state[prefix + "W_O"] = mine["W_O"]
    if "b_QKV" in mine:
        b = mine["b_QKV"]
        if b.ndim == 3:  # [3, H, d_head]: indexed, not viewed (an FSDP shard splits dim 0)
            for i, m in enumerate(QKV):
                state[prefix + f"b_{m}"] = b[i]
        else:
            for m, (first, n) in zip(QKV, spans, strict=True):
                state[prefix + f"b_{m}"] = b[first : first + n]
    if "b_O" in mine:
        state[prefix + "b_O"] = mine["b_O"]


def _fuse_qkv(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """Load-state-dict pre-hook: W_Q, W_K, W_V (b_Q, b_K, b_V) of the model's shapes are
    written into W_QKV (b_QKV); others are left for ``load_state_dict`` to report."""
    attn = module if isinstance(module, Attention) else None
    assert attn is not None
    D, H, G, dh = attn.d_model, attn.n_heads, attn.n_kv_heads, attn.d_head
    for kind, shape, fused in (("W", (D, dh), "W_QKV"), ("b", (dh,), "b_QKV")):
        keys = [prefix + f"{kind}_{m}" for m in QKV]
        parts = [state.get(key) for key in keys]
        heads = (H, G, G)
        if any(not isinstance(t, Tensor) or tuple(t.shape) != (n, *shape)
               for t, n in zip(parts, heads, strict=True)):  # fmt: skip
            continue
        for key in keys:
            del state[key]
        state[prefix + fused] = fuse_qkv(parts)  # type: ignore[arg-type]


def fuse_qkv(parts: list[Tensor]) -> Tensor:
    """[W_Q, W_K, W_V] ([n_heads | n_kv_heads | n_kv_heads, d_model, d_head]) → W_QKV
    [d_model, (n_heads + 2·n_kv_heads)·d_head], or [b_Q, b_K, b_V] → b_QKV [3, n_heads,
    d_head] (n_kv_heads = n_heads) or [n_heads + 2·n_kv_heads, d_head].

    >>> W = [torch.full((2, 3, 4), float(i)) for i in range(3)]
    >>> fuse_qkv(W).shape, fuse_qkv(W)[0, ::8].tolist()
    (torch.Size([3, 24]), [0.0, 1.0, 2.0])
    >>> fuse_qkv([torch.zeros(4, 3, 2), torch.ones(1, 3, 2), torch.ones(1, 3, 2)]).shape
    torch.Size([3, 12])
    """
    if parts[0].ndim == 3:
        return torch.cat([W.transpose(0, 1) for W in parts], 1).flatten(1)
    if parts[0].shape == parts[1].shape:
        return torch.stack(parts)
    return torch.cat(parts)


def fuse_legacy_names(names: list[str]) -> list[str]:
    """Parameter names of a state saved with W_Q, W_K, W_V (b_Q, b_K, b_V) as parameters,
    with each such run replaced by W_QKV (b_QKV), the parameters' order kept.

    >>> fuse_legacy_names(["a.W_Q", "a.W_K", "a.W_V", "a.W_O"])
    ['a.W_QKV', 'a.W_O']
    """
    out: list[str] = []
    for name in names:
        stem, _, leaf = name.rpartition(".")
        if leaf in ("W_K", "W_V", "b_K", "b_V"):
            continue
        out.append(f"{stem}.{leaf[0]}_QKV" if leaf in ("W_Q", "b_Q") else name)
    return out
