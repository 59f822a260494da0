"""A head's circuits, read from the weights: where it attends (QK) and what it moves (OV).

For head h of layer l (row vectors; E the inputs the head reads, one row per token or position;
g = h // (H/G) the key/value head that h reads under grouped-query attention):

    QK_h = n_q(Ê W_Q[h] + b_Q[h]) n_k(Ê W_K[g] + b_K[g])ᵀ · a      [query input, key input]
    OV_h = (Ê W_V[g] + b_V[g]) W_O[h] diag(w₁') U                    [source input, n_vocab]

Ê is E as the head reads it: each row passed through the block's first norm N₁ (pre-norm), or
E itself (post-norm attention reads the residual directly); n_q, n_k the per-head q/k-norms
(QK-norm: Qwen3, Gemma 3; applied row by row, so each entry stays exact; else identity);
a = attn_scale or 1/√d_head. U is the unembedding W_U with the final norm's linear part
folded in (pre-norm layernorm: centring and ⊙ (o + w_f); rmsnorm: ⊙ (o + w_f)); the final
norm's scale is one positive number per position, so it rescales a row of logits and is
left out; with sandwich norms (Gemma) the head's output passes N₁' too, whose gain w₁' is
folded in and whose scale is left out likewise. QK_h[a, b] is then exactly the attention
score (before a soft-cap c·tanh(s/c), Gemma 2's, which the caller applies to ``full()``) of a
layer-0 query token a on a key token b when the residual stream holds only token embeddings,
and OV_h[b] is exactly head h's direct logit contribution (before a final soft-cap), per unit
of attention and of those scales, from key token b. For later layers these are the direct
paths (the "virtual weights" that skip the layers between). Both are rank ≤ d_head and
returned as ``FactoredMatrix``.

With RoPE the score depends on the distance i − j between query and key, so a RoPE model
has no position-free QK circuit: ``distance`` is then required, and rotates the query side
by that angle (q R_i · k R_j = q R_{i−j} · k; partial rotary on its first dimensions, a
sliding layer by its own base).

Composition (heads h₁ in layer l₁ < l₂ ∋ h₂), with W_OV = W_V W_O, W_QK = W_Q W_Kᵀ and each
reading matrix carrying its norm's linear part:

    Q: ‖W_OV¹ W_QK²‖_F / (‖W_OV¹‖_F ‖W_QK²‖_F)      K: ‖W_QK² (W_OV¹)ᵀ‖_F / (same)
    V: ‖W_OV¹ W_OV²‖_F / (‖W_OV¹‖_F ‖W_OV²‖_F)

Precision: circuits and scores are in the model's dtype (float64 for a float64 model); for a
bfloat16 or float16 model the weights are widened and every product is computed and returned
in float32 (the inputs Ê pass the norm N₁ in the model's own dtype, as in its forward).
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.factored import FactoredMatrix, copying_score, widened
from glassgpt.model import GPT
from glassgpt.model.gpt import Block
from glassgpt.model.layers import apply_rope

Inputs = Literal["token", "position"]
Composition = Literal["q", "k", "v"]


def check_layer_head(model: GPT, layer: int, head: int | None = None) -> None:
    """Raise GlassError unless ``layer`` (and ``head``) index this model's blocks (heads)."""
    L, H = model.config.n_layers, model.config.n_heads
    if not isinstance(layer, int) or not 0 <= layer < L:
        raise GlassError(f"layer {layer} is out of range: the model has {L} layers (0..{L - 1})")
    if head is not None and (not isinstance(head, int) or not 0 <= head < H):
        raise GlassError(f"head {head} is out of range: each layer has {H} heads (0..{H - 1})")


def block(model: GPT, layer: int) -> Block:
    """Block ``layer`` of ``model`` (checked)."""
    check_layer_head(model, layer)
    return cast(Block, model.blocks[layer])


def inputs(model: GPT, kind: Inputs = "token") -> Tensor:
    """The rows a circuit is indexed by: s · W_E [n_vocab, d_model] (s the embedding scale) or
    the positions [n_ctx, d_model] (in the model's dtype)."""
    W_E = model.embed.W_E.detach()
    if kind == "token":
        s = model.config.embed_scale  # what the residual holds: s · W_E (Gemma's √d_model)
        return W_E if s == 1.0 else W_E * s
    if kind == "position":
        if model.pos_embed is None:
            raise GlassError(
                f"position circuits need learned or sinusoidal positions; this model's "
                f"positional is {model.config.positional!r}"
            )
        return model.pos_embed(model.config.n_ctx, dtype=W_E.dtype, device=W_E.device).detach()
    raise GlassError(f"circuit inputs must be 'token' or 'position', got {kind!r}")


def read_inputs(model: GPT, layer: int, kind: Inputs = "token") -> Tensor:
    """Ê: the inputs as the attention of ``layer`` reads them (each row through N₁ for pre-norm),
    at least float32."""
    E = inputs(model, kind)
    if model.config.norm_placement == "pre":
        with torch.no_grad():
            E = cast(Tensor, block(model, layer).ln1(E))
    return widened(E)


def unembedding(model: GPT, fold_final_norm: bool = True) -> Tensor:
    """U [d_model, n_vocab]: W_U, with the final norm's linear part folded in if asked.

    Layernorm: (I − 11ᵀ/d) diag(w_f) W_U; rmsnorm: diag(w_f) W_U; post-norm: W_U.
    """
    W_U = widened(model.W_U.detach())
    ln = model.ln_final
    if not fold_final_norm or ln is None:
        return W_U
    U = widened(ln.gain.detach())[:, None] * W_U
    return U - U.mean(0, keepdim=True) if ln.kind == "layernorm" else U


def _heads(t: Tensor, head: int | None) -> Tensor:
    """All heads of a per-head weight [H, ...], or one head's [...] (detached, at least float32)."""
    return widened(t.detach() if head is None else t.detach()[head])


def _kv_heads(model: GPT, t: Tensor, head: int | None) -> Tensor:
    """A key/value weight [G, ...] as query head ``head`` reads it (group h // (H/G)), or as
    every query head reads it [H, ...] (each group repeated H/G times)."""
    per_group = model.config.n_heads // model.config.kv_heads
    if head is None:
        return widened(t.detach().repeat_interleave(per_group, 0))
    return widened(t.detach()[head // per_group])


def qk_circuit(
    model: GPT,
    layer: int,
    head: int | None = None,
    *,
    query: Inputs = "token",
    key: Inputs = "token",
    bias: bool = True,
    distance: int | None = None,
) -> FactoredMatrix:
    """QK of one head [n_q, n_k] (or of every head [n_heads, n_q, n_k]), in units of attn_scores.

    ``query``/``key``: index by tokens or by positions; ``bias``: include b_Q, b_K;
    ``distance``: the query–key distance, required for RoPE models (ignored otherwise).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2))
    >>> qk_circuit(model, 1, 0).shape, qk_circuit(model, 0).shape
    ((10, 10), (2, 10, 10))
    """
    check_layer_head(model, layer, head)
    if model.rotary is not None and distance is None:
        raise GlassError(
            "this model uses RoPE: a query-key score depends on their distance, so there is "
            "no position-free QK circuit; pass distance=d (the circuit at distance i - j = d)"
        )
    attn = block(model, layer).attn
    with torch.no_grad():
        q = read_inputs(model, layer, query) @ _heads(attn.W_Q, head)  # [(H,) n_q, d_head]
        k = read_inputs(model, layer, key) @ _kv_heads(model, attn.W_K, head)  # [(H,) n_k, d_head]
        if bias and attn.b_Q is not None and attn.b_K is not None:
            q = q + _heads(attn.b_Q, head)[..., None, :]
            k = k + _kv_heads(model, attn.b_K, head)[..., None, :]
        if attn.q_norm is not None and attn.k_norm is not None:  # row by row: exact
            dtype = attn.W_QKV.dtype
            q, k = widened(attn.q_norm(q.to(dtype))), widened(attn.k_norm(k.to(dtype)))
        if model.rotary is not None:  # k at 0: its rotated dims take a scaled rope's factor
            q = _rotate(model, layer, q, cast(int, distance))
            k = _rotate(model, layer, k, 0)
    a = 1 / math.sqrt(attn.d_head) if attn.scale is None else attn.scale
    return FactoredMatrix(q * a, k.transpose(-1, -2))


def shown_distance(model: GPT) -> int | None:
    """The query–key distance a page shows a QK circuit at: 1 (a key just before its query)
    for a RoPE model, whose scores depend on it; None for the others, whose do not."""
    return None if model.rotary is None else 1


def _rotate(model: GPT, layer: int, q: Tensor, distance: int) -> Tensor:
    """Rotate each row of q [..., n, d_head] by the RoPE angle of ``distance`` (the layer's
    own rotary: a sliding layer's local base where the model has one)."""
    n_ctx = model.config.n_ctx
    if not isinstance(distance, int) or not 0 <= distance < n_ctx:
        raise GlassError(f"distance {distance} is out of range 0..{n_ctx - 1} (n_ctx={n_ctx})")
    rotary = model.rotary
    if model.rotary_local is not None and block(model, layer).kind == "sliding":
        rotary = model.rotary_local
    cos, sin = rotary(1, distance, device=q.device)  # type: ignore[misc]  # [1, r/2]
    flat = q.reshape(1, 1, -1, q.shape[-1])  # [1, T=1, rows as heads, d_head]
    return apply_rope(flat, cos.to(q.dtype), sin.to(q.dtype)).reshape(q.shape)


def ov_circuit(
    model: GPT,
    layer: int,
    head: int | None = None,
    *,
    source: Inputs = "token",
    bias: bool = True,
    fold_final_norm: bool = True,
) -> FactoredMatrix:
    """OV of one head [n_src, n_vocab] (or of every head [n_heads, n_src, n_vocab]).

    Row b: the logits the head writes per unit of attention on source b (see the module
    docstring for U). ``bias``: include b_V (the same shift on every row).
    """
    check_layer_head(model, layer, head)
    attn = block(model, layer).attn
    with torch.no_grad():
        v = read_inputs(model, layer, source) @ _kv_heads(
            model, attn.W_V, head
        )  # [(H,) n_src, d_head]
        if bias and attn.b_V is not None:
            v = v + _kv_heads(model, attn.b_V, head)[..., None, :]
        W_O = _heads(attn.W_O, head)  # [(H,) d_head, d_model]
        post = block(model, layer).ln1_post
        if post is not None and fold_final_norm:  # sandwich: N₁' between the head and x
            W_O = W_O * widened(post.gain.detach())
        out = W_O @ unembedding(model, fold_final_norm)  # [(H,) d_head, n_vocab]
    return FactoredMatrix(v, out)


def copying_scores(model: GPT) -> Tensor:
    """[n_layers, n_heads]: the copying score (Re Σλ / Σ|λ|) of each head's token OV circuit."""
    return torch.stack(
        [copying_score(ov_circuit(model, layer)) for layer in range(model.config.n_layers)]
    )


def folded_weights(model: GPT, layer: int) -> dict[str, Tensor]:
    """W_Q, W_K, W_V [n_heads, d_model, d_head] (W_K, W_V repeated per group) with N₁'s linear
    part folded in, and W_O (with N₁'s gain under sandwich norms; at least float32)."""
    blk = block(model, layer)
    out = {"W_O": widened(blk.attn.W_O.detach())}
    if blk.ln1_post is not None:
        out["W_O"] = out["W_O"] * widened(blk.ln1_post.gain.detach())
    for name in ("W_Q", "W_K", "W_V"):
        W = getattr(blk.attn, name)
        W = widened(W.detach()) if name == "W_Q" else _kv_heads(model, W, None)
        if model.config.norm_placement == "pre":
            W = widened(blk.ln1.gain.detach())[None, :, None] * W
            if blk.ln1.kind == "layernorm":
                W = W - W.mean(1, keepdim=True)  # (I − 11ᵀ/d) on the input side
        out[name] = W
    return out


def composition_scores(model: GPT, kind: Composition = "q") -> Tensor:
    """[n_layers, n_heads, n_layers, n_heads]: score of h₁ in l₁ into h₂ in l₂ (NaN unless l₁ < l₂).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2))
    >>> s = composition_scores(model, "k")
    >>> s.shape, bool(s[0, :, 1].isfinite().all()), bool(s[1, :, 0].isnan().all())
    (torch.Size([2, 2, 2, 2]), True, True)
    """
    if kind not in ("q", "k", "v"):
        raise GlassError(f"composition kind must be 'q', 'k' or 'v', got {kind!r}")
    L, H = model.config.n_layers, model.config.n_heads
    W = [folded_weights(model, layer) for layer in range(L)]
    dtype = widened(model.embed.W_E).dtype
    scores = torch.full((L, H, L, H), float("nan"), dtype=dtype)
    with torch.no_grad():
        for l1 in range(L):
            V1 = W[l1]["W_V"][:, None]  # [H, 1, d_model, d_head]
            O1 = W[l1]["W_O"][:, None]  # [H, 1, d_head, d_model]
            ov1 = FactoredMatrix(V1, O1).norm()  # [H, 1]
            for l2 in range(l1 + 1, L):
                Q2, K2 = W[l2]["W_Q"][None], W[l2]["W_K"][None]  # [1, H, d_model, d_head]
                V2, O2 = W[l2]["W_V"][None], W[l2]["W_O"][None]
                if kind == "q":  # (V1 O1)(Q2 K2ᵀ)
                    num = FactoredMatrix(V1, (O1 @ Q2) @ K2.transpose(-1, -2))
                    den = ov1 * FactoredMatrix(Q2, K2.transpose(-1, -2)).norm()
                elif kind == "k":  # (Q2 K2ᵀ)(V1 O1)ᵀ = Q2 (K2ᵀ O1ᵀ) V1ᵀ
                    num = FactoredMatrix(Q2, (K2.transpose(-1, -2) @ O1.transpose(-1, -2)))
                    num = num @ V1.transpose(-1, -2)
                    den = ov1 * FactoredMatrix(Q2, K2.transpose(-1, -2)).norm()
                else:  # (V1 O1)(V2 O2)
                    num = FactoredMatrix(V1, (O1 @ V2) @ O2)
                    den = ov1 * FactoredMatrix(V2, O2).norm()
                scores[l1, :, l2, :] = num.norm() / den
    return scores
