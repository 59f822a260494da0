"""The families' weights ↔ glassgpt's names: the same matrices, transposed and permuted.

transformers' ``nn.Linear`` stores W [d_out, d_in] and computes x Wᵀ; glassgpt stores the
row-vector form, x W. So, for a Llama-shaped layer (``model.layers.l.``),

    W_Q[h] = q_proj.weight[h·d_head : (h+1)·d_head, :]ᵀ[:, π]       (W_K[g], k_proj, too)
    W_V[g] = v_proj.weight[g·d_head : (g+1)·d_head, :]ᵀ
    W_O    = o_proj.weightᵀ as [H, d_head, d_model]
    W_gate = gate_proj.weightᵀ,  W_in = up_proj.weightᵀ,  W_out = down_proj.weightᵀ
    W_E    = embed_tokens.weight,  W_U = lm_head.weightᵀ (= W_Eᵀ when tied)

and GPT-NeoX's ``query_key_value.weight`` [H·3·d_head, d_model] holds each head's q, k, v
rows one after the other. π is the rotary permutation: glassgpt rotates the pairs
(2i, 2i+1) of a head's first r dimensions, transformers' ``rotate_half`` the pairs
(i, i + r/2); so glassgpt's dimension 2i is theirs i and 2i+1 theirs i + r/2, for the
columns of W_Q and W_K, the entries of b_Q and b_K and of the q/k-norm weights. q kᵀ, and
so the function, is unchanged. Norm weights (Gemma's w of 1 + w too) are the same numbers.

``*_from_hf`` read the HF tensors through ``read(name, shape)`` (which checks the shape and
names the tensor that is missing or wrong) and hand glassgpt's through ``put(name,
tensor)``, one at a time; ``*_to_hf`` give the HF state dict of a glassgpt one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from glassgpt.model import GPTConfig

Read = Callable[[str, tuple[int, ...]], Tensor]
Put = Callable[[str, Tensor], None]


def rotate_half_order(d_head: int, r: int) -> Tensor:
    """π: glassgpt's dimension 2i is transformers' i, 2i+1 its i + r/2 (2i < r; the rest kept).

    >>> rotate_half_order(6, 4).tolist()
    [0, 2, 1, 3, 4, 5]
    """
    pairs = torch.stack([torch.arange(r // 2), torch.arange(r // 2) + r // 2], 1).flatten()
    return torch.cat([pairs, torch.arange(r, d_head)])


def heads_from_hf(W: Tensor, n: int, order: Tensor | None = None) -> Tensor:
    """An HF projection weight [n·d_head, d_model] → glassgpt's [n, d_model, d_head]
    (its d_head columns permuted by ``order``)."""
    heads = W.unflatten(0, (n, -1))  # [n, d_head, d_model]
    if order is not None:  # whole rows gathered (an element-wise gather is many times slower)
        heads = heads[:, order]
    return heads.transpose(1, 2)  # [n, d_model, d_head]


def heads_to_hf(W: Tensor, order: Tensor | None = None) -> Tensor:
    """glassgpt's [n, d_model, d_head] → an HF projection weight [n·d_head, d_model]."""
    if order is not None:
        W = W[..., torch.argsort(order)]
    return W.transpose(1, 2).flatten(0, 1)


def sandwich_names(config: GPTConfig) -> dict[str, str]:
    """glassgpt's norms of a block → the family's names (Gemma's four, or Llama's two)."""
    if config.sandwich_norm:
        return {"ln1": "input_layernorm", "ln1_post": "post_attention_layernorm",
                "ln2": "pre_feedforward_layernorm", "ln2_post": "post_feedforward_layernorm"}  # fmt: skip
    return {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}


# -- Llama, Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3 ---------------------------------------


def llama_from_hf(c: GPTConfig, read: Read, put: Put) -> None:
    """glassgpt's tensors of a Llama-shaped ``*ForCausalLM`` (the formulas above)."""
    D, H, G, dh, F, V = c.d_model, c.n_heads, c.kv_heads, c.d_head or 0, c.d_mlp or 0, c.n_vocab
    order = rotate_half_order(dh, c.rotary_dims)
    put("embed.W_E", read("model.embed_tokens.weight", (V, D)))
    for l in range(c.n_layers):
        h, p = f"model.layers.{l}.", f"blocks.{l}."
        for ours, theirs in sandwich_names(c).items():
            put(p + ours + ".w", read(h + theirs + ".weight", (D,)))
        a = h + "self_attn."
        for m, proj, n, perm in (("Q", "q", H, order), ("K", "k", G, order), ("V", "v", G, None)):
            put(
                p + f"attn.W_{m}",
                heads_from_hf(read(a + f"{proj}_proj.weight", (n * dh, D)), n, perm),
            )
            if c.qkv_bias or c.bias:
                b = read(a + f"{proj}_proj.bias", (n * dh,)).unflatten(0, (n, dh))
                put(p + f"attn.b_{m}", b if perm is None else b[:, perm])
        if c.qk_norm:
            put(p + "attn.q_norm.w", read(a + "q_norm.weight", (dh,))[order])
            put(p + "attn.k_norm.w", read(a + "k_norm.weight", (dh,))[order])
        put(p + "attn.W_O", read(a + "o_proj.weight", (D, H * dh)).T.unflatten(0, (H, dh)))
        if c.bias:
            put(p + "attn.b_O", read(a + "o_proj.bias", (D,)))
        for ours, theirs, shape in (("W_gate", "gate_proj", (F, D)), ("W_in", "up_proj", (F, D)),
                                    ("W_out", "down_proj", (D, F))):  # fmt: skip
            put(p + f"mlp.{ours}", read(h + f"mlp.{theirs}.weight", shape).T)
            if c.bias:
                put(p + f"mlp.b_{ours[2:]}", read(h + f"mlp.{theirs}.bias", shape[:1]))
    put("ln_final.w", read("model.norm.weight", (D,)))
    if not c.tie_embeddings:
        put("unembed.W_U", read("lm_head.weight", (V, D)).T)


def llama_to_hf(c: GPTConfig, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The Llama-shaped state dict of glassgpt's (``ours``: its ``state_dict()``)."""
    order = rotate_half_order(c.d_head or 0, c.rotary_dims)
    t = {"model.embed_tokens.weight": ours["embed.W_E"], "model.norm.weight": ours["ln_final.w"]}
    for l in range(c.n_layers):
        h, p = f"model.layers.{l}.", f"blocks.{l}."
        for mine, theirs in sandwich_names(c).items():
            t[h + theirs + ".weight"] = ours[p + mine + ".w"]
        a = h + "self_attn."
        for m, proj, perm in (("Q", "q", order), ("K", "k", order), ("V", "v", None)):
            t[a + f"{proj}_proj.weight"] = heads_to_hf(ours[p + f"attn.W_{m}"], perm)
            if c.qkv_bias or c.bias:
                b = ours[p + f"attn.b_{m}"]
                t[a + f"{proj}_proj.bias"] = (
                    b if perm is None else b[:, torch.argsort(perm)]
                ).flatten()
        if c.qk_norm:
            inverse = torch.argsort(order)
            t[a + "q_norm.weight"] = ours[p + "attn.q_norm.w"][inverse]
            t[a + "k_norm.weight"] = ours[p + "attn.k_norm.w"][inverse]
        t[a + "o_proj.weight"] = ours[p + "attn.W_O"].flatten(0, 1).T
        if c.bias:
            t[a + "o_proj.bias"] = ours[p + "attn.b_O"]
        for mine, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
            t[h + f"mlp.{theirs}.weight"] = ours[p + f"mlp.{mine}"].T
            if c.bias:
                t[h + f"mlp.{theirs}.bias"] = ours[p + f"mlp.b_{mine[2:]}"]
    if not c.tie_embeddings:
        t["lm_head.weight"] = ours["unembed.W_U"].T
    return t


# -- GPT-NeoX (Pythia) ---------------------------------------------------------------------


def neox_from_hf(c: GPTConfig, read: Read, put: Put) -> None:
    """glassgpt's tensors of a ``GPTNeoXForCausalLM`` (q, k, v rows interleaved per head)."""
    D, H, dh, F, V = c.d_model, c.n_heads, c.d_head or 0, c.d_mlp or 0, c.n_vocab
    order = rotate_half_order(dh, c.rotary_dims)
    put("embed.W_E", read("gpt_neox.embed_in.weight", (V, D)))
    for l in range(c.n_layers):
        h, p = f"gpt_neox.layers.{l}.", f"blocks.{l}."
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            put(p + ours + ".w", read(h + theirs + ".weight", (D,)))
            put(p + ours + ".b", read(h + theirs + ".bias", (D,)))
        W = read(h + "attention.query_key_value.weight", (3 * H * dh, D)).unflatten(0, (H, 3, dh))
        b = read(h + "attention.query_key_value.bias", (3 * H * dh,)).unflatten(0, (H, 3, dh))
        for i, (m, perm) in enumerate((("Q", order), ("K", order), ("V", None))):
            W_m, b_m = W[:, i].transpose(1, 2), b[:, i]  # [H, d_model, d_head], [H, d_head]
            put(p + f"attn.W_{m}", W_m if perm is None else W_m[..., perm])
            put(p + f"attn.b_{m}", b_m if perm is None else b_m[:, perm])
        put(p + "attn.W_O", read(h + "attention.dense.weight", (D, H * dh)).T.unflatten(0, (H, dh)))
        put(p + "attn.b_O", read(h + "attention.dense.bias", (D,)))
        put(p + "mlp.W_in", read(h + "mlp.dense_h_to_4h.weight", (F, D)).T)
        put(p + "mlp.b_in", read(h + "mlp.dense_h_to_4h.bias", (F,)))
        put(p + "mlp.W_out", read(h + "mlp.dense_4h_to_h.weight", (D, F)).T)
        put(p + "mlp.b_out", read(h + "mlp.dense_4h_to_h.bias", (D,)))
    put("ln_final.w", read("gpt_neox.final_layer_norm.weight", (D,)))
    put("ln_final.b", read("gpt_neox.final_layer_norm.bias", (D,)))
    if not c.tie_embeddings:
        put("unembed.W_U", read("embed_out.weight", (V, D)).T)


def neox_to_hf(c: GPTConfig, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The ``GPTNeoXForCausalLM`` state dict of glassgpt's; a model without biases gets zero
    ones (the same function)."""
    D, H, dh, F = c.d_model, c.n_heads, c.d_head or 0, c.d_mlp or 0
    inverse = torch.argsort(rotate_half_order(dh, c.rotary_dims))
    zeros = lambda *shape: ours["embed.W_E"].new_zeros(shape)  # noqa: E731
    get = lambda key, *shape: ours[key] if key in ours else zeros(*shape)  # noqa: E731
    t = {"gpt_neox.embed_in.weight": ours["embed.W_E"]}
    for l in range(c.n_layers):
        h, p = f"gpt_neox.layers.{l}.", f"blocks.{l}."
        for mine, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            t[h + theirs + ".weight"] = ours[p + mine + ".w"]
            t[h + theirs + ".bias"] = get(p + mine + ".b", D)
        W = [ours[p + f"attn.W_{m}"] for m in "QKV"]  # [H, d_model, d_head] each
        b = [get(p + f"attn.b_{m}", H, dh) for m in "QKV"]
        W[0], W[1] = W[0][..., inverse], W[1][..., inverse]
        b[0], b[1] = b[0][:, inverse], b[1][:, inverse]
        qkv = torch.stack([w.transpose(1, 2) for w in W], 1)  # [H, 3, d_head, d_model]
        t[h + "attention.query_key_value.weight"] = qkv.flatten(0, 2)
        t[h + "attention.query_key_value.bias"] = torch.stack(b, 1).flatten()
        t[h + "attention.dense.weight"] = ours[p + "attn.W_O"].flatten(0, 1).T
        t[h + "attention.dense.bias"] = get(p + "attn.b_O", D)
        t[h + "mlp.dense_h_to_4h.weight"] = ours[p + "mlp.W_in"].T
        t[h + "mlp.dense_h_to_4h.bias"] = get(p + "mlp.b_in", F)
        t[h + "mlp.dense_4h_to_h.weight"] = ours[p + "mlp.W_out"].T
        t[h + "mlp.dense_4h_to_h.bias"] = get(p + "mlp.b_out", D)
    t["gpt_neox.final_layer_norm.weight"] = ours["ln_final.w"]
    t["gpt_neox.final_layer_norm.bias"] = get("ln_final.b", D)
    if not c.tie_embeddings:
        t["embed_out.weight"] = ours["unembed.W_U"].T
    return t
