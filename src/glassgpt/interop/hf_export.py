"""GPTConfig → the ``config.json`` of the transformers family that computes the same function.

:func:`family_for` reads the config as a family's signature: learned positions are GPT-2;
RoPE with LayerNorm is GPT-NeoX; RoPE with RMSNorm is Llama-shaped, and among those the
Gemma fields (gains 1 + w, sandwich norms, s = √d_model) make Gemma 2 (Gemma 3 with
q/k-norms), q/k-norms alone Qwen 3, b_Q, b_K, b_V alone Qwen 2, a sliding window on every
layer Mistral, and the rest Llama (biases on every projection too: Llama's
``attention_bias`` and ``mlp_bias``). A field that family cannot hold is refused in one line
naming it (a ConfigError), before anything is written.
"""

from __future__ import annotations

import math
from typing import Any

from glassgpt.errors import ConfigError
from glassgpt.interop.hf_families import ACTIVATIONS, ARCHITECTURES, PLAIN_MLPS
from glassgpt.interop.hf_gpt2 import check_exportable
from glassgpt.model import GPTConfig

# GPTConfig's activations → the name transformers' ACT2FN knows them by
HF_NAMES = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu",
            "relu2": "relu2", "sigmoid": "sigmoid", "tanh": "tanh"}  # fmt: skip
assert set(HF_NAMES) == set(ACTIVATIONS.values())


def _refuse(c: GPTConfig, family: str, **wanted: Any) -> None:
    """ConfigError naming the first field of ``c`` that is not as ``family`` needs it."""
    for field, value in wanted.items():
        if getattr(c, field) != value:
            raise ConfigError(
                field, f"a {family} needs {field}={value!r}, got {getattr(c, field)!r} "
                "(no transformers family computes this config)"
            )  # fmt: skip


def family_for(c: GPTConfig) -> str:
    """The ``model_type`` that computes ``c``'s function, or a ConfigError naming the field."""
    if c.positional == "learned":
        check_exportable(c)
        _refuse(
            c, "GPT-2", **{f: GPTConfig.__dataclass_fields__[f].default for f in c.family_fields()}
        )
        return "gpt2"
    _refuse(c, "transformers model", positional="rope", norm_placement="pre", attn_only=False)
    if c.norm == "layernorm":
        if c.kv_heads != c.n_heads:
            raise ConfigError("n_kv_heads", "a GPT-NeoX has one key and value head per query head")
        _refuse(c, "GPT-NeoX", qk_norm=False, sandwich_norm=False, attn_softcap=None,
                final_softcap=None, attn_scale=None, embed_scale=1.0, norm_offset=0.0,
                sliding_window=None, rope_local_base=None, qkv_bias=False)  # fmt: skip
        if c.mlp not in PLAIN_MLPS:
            raise ConfigError(
                "mlp", f"a GPT-NeoX needs mlp in {', '.join(PLAIN_MLPS)}, got {c.mlp!r}"
            )
        if c.n_heads * (c.d_head or 0) != c.d_model:
            raise ConfigError(
                "d_head", f"a GPT-NeoX needs n_heads·d_head = d_model, got {c.d_head}"
            )
        return "gpt_neox"
    _refuse(c, "Llama-shaped model", parallel_residual=False, rotary_fraction=1.0)
    if not c.gated or c.mlp_activations[1] != "identity":
        raise ConfigError("mlp", f"a Llama-shaped model needs a gated MLP (σ(x W_gate) ⊙ x W_in), got {c.mlp!r}"
                          + (f" with mlp_value={c.mlp_value!r}" if c.mlp == "gated" else ""))  # fmt: skip
    if c.bias:  # Llama's attention_bias and mlp_bias: every projection biased
        _refuse(c, "Llama with biases", norm_offset=0.0, sandwich_norm=False, embed_scale=1.0,
                qk_norm=False, sliding_window=None)  # fmt: skip
    if c.norm_offset != 0.0 or c.sandwich_norm or c.embed_scale != 1.0:
        _refuse(c, "Gemma", norm_offset=1.0, sandwich_norm=True, qkv_bias=False)
        if not math.isclose(c.embed_scale, c.d_model**0.5, rel_tol=1e-6):
            raise ConfigError(
                "embed_scale", f"a Gemma needs √d_model = {c.d_model**0.5:g}, got {c.embed_scale:g}"
            )
        scalar = _query_pre_attn_scalar(c)
        if not math.isclose(scalar, round(scalar), rel_tol=1e-9):
            raise ConfigError("attn_scale", f"a Gemma scales by an integer query_pre_attn_scalar^-½, "
                              f"got attn_scale={c.attn_scale} (= {scalar:g}^-½)")  # fmt: skip
        if not c.qk_norm:
            _refuse(c, "Gemma 2 (a Gemma 3 has q/k-norms)", rope_local_base=None)
        else:  # transformers' Gemma 3 attention does not apply its attn_logit_softcapping
            _refuse(c, "Gemma 3 (transformers' applies no attention soft-cap)", attn_softcap=None)
        return "gemma3_text" if c.qk_norm else "gemma2"
    _refuse(c, "Llama-shaped model", attn_softcap=None, final_softcap=None, rope_local_base=None)
    if c.attn_scale is not None and not math.isclose(c.attn_scale, (c.d_head or 1) ** -0.5):
        raise ConfigError("attn_scale", "only a Gemma scales the scores otherwise than 1/√d_head")
    if c.qk_norm or c.qkv_bias:
        if c.qk_norm and c.qkv_bias:
            raise ConfigError("qkv_bias", "q/k-norms (Qwen 3) and b_Q, b_K, b_V (Qwen 2) together")
        return "qwen3" if c.qk_norm else "qwen2"
    kinds = set(c.layer_kinds)
    if kinds == {"sliding"}:
        return "mistral"
    if kinds != {"full"}:
        raise ConfigError("layer_types", "sliding and full layers mixed: a Gemma's or Qwen's, "
                          "not a Llama's (set qkv_bias for Qwen 2)")  # fmt: skip
    return "llama"


def _rope(c: GPTConfig, *, scaled: bool = True) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` dict of ``c``'s (full layers') RoPE."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_base}
    if c.rotary_fraction != 1.0:
        out["partial_rotary_factor"] = c.rotary_fraction
    if not scaled or c.rope_scaling == "none":
        return out
    ctx = c.rope_original_ctx if c.rope_original_ctx is not None else c.n_ctx
    out |= {"rope_type": c.rope_scaling, "factor": c.rope_factor}
    if c.rope_scaling == "llama3":
        out |= {"low_freq_factor": c.rope_low_freq_factor,
                "high_freq_factor": c.rope_high_freq_factor, "original_max_position_embeddings": ctx}  # fmt: skip
    if c.rope_scaling == "yarn":
        out |= {"original_max_position_embeddings": ctx, "beta_fast": c.rope_beta_fast,
                "beta_slow": c.rope_beta_slow, "truncate": True}  # fmt: skip
    return out


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the family that computes ``c`` (not GPT-2: ``hf_gpt2``'s)."""
    family = family_for(c)
    if family == "gpt2":
        raise ConfigError("positional", "a GPT-2 config is hf_gpt2.config_to_hf's")
    rope = _rope(c)
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]], "model_type": family,
        "vocab_size": c.n_vocab, "max_position_embeddings": c.n_ctx, "hidden_size": c.d_model,
        "intermediate_size": c.d_mlp, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_embeddings, "attention_dropout": c.dropout,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "use_cache": True,
        # transformers 4's keys as well, for readers of that format (5 reads either)
        "rope_theta": c.rope_base, "rope_scaling": rope if rope["rope_type"] != "default" else None,
    }  # fmt: skip
    if family == "gpt_neox":
        return out | {
            "hidden_act": HF_NAMES[c.mlp_activations[0]], "layer_norm_eps": c.norm_eps,
            "use_parallel_residual": c.parallel_residual, "attention_bias": True,
            "hidden_dropout": c.dropout, "rope_parameters": rope,
            "rotary_pct": c.rotary_fraction, "rotary_emb_base": c.rope_base,
        }  # fmt: skip
    gate = HF_NAMES[c.mlp_activations[0]]
    out |= {
        "num_key_value_heads": c.kv_heads, "head_dim": c.d_head, "rms_norm_eps": c.norm_eps,
        "hidden_act": gate, "attention_bias": c.bias, "mlp_bias": c.bias,
    }  # fmt: skip
    types = [f"{kind}_attention" for kind in c.layer_kinds]
    if family in ("gemma2", "gemma3_text"):
        out |= {
            "hidden_activation": gate, "query_pre_attn_scalar": round(_query_pre_attn_scalar(c)),
            "attn_logit_softcapping": c.attn_softcap, "final_logit_softcapping": c.final_softcap,
            "sliding_window": c.sliding_window, "layer_types": types,
        }  # fmt: skip
        if family == "gemma2":
            return out | {"rope_parameters": rope}
        local = _rope(c, scaled=c.rope_local_base is None)
        if c.rope_local_base is not None:
            local["rope_theta"] = c.rope_local_base
        return out | {"rope_parameters": {"full_attention": rope, "sliding_attention": local},
                      "rope_local_base_freq": local["rope_theta"], "use_bidirectional_attention": False}  # fmt: skip
    out["rope_parameters"] = rope
    if family == "mistral":
        return out | {"sliding_window": c.sliding_window}
    if family in ("qwen2", "qwen3"):
        sliding = "sliding" in c.layer_kinds
        out |= {"use_sliding_window": sliding, "sliding_window": c.sliding_window,
                "max_window_layers": c.n_layers, "layer_types": types}  # fmt: skip
    return out


def _query_pre_attn_scalar(c: GPTConfig) -> float:
    """q with attn_scale = q^−½ (Gemma's ``query_pre_attn_scalar``; d_head by default)."""
    return (c.attn_scale if c.attn_scale is not None else (c.d_head or 1) ** -0.5) ** -2.0
