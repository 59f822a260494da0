"""An HF ``config.json`` of a decoder-only family → the GPTConfig of the same function.

Each family is GPTConfig's fields set as its modelling code computes (transformers 5;
``config.json`` files written by transformers 4, with ``rope_theta``, ``rope_scaling``,
``rotary_pct``, ``rope_local_base_freq`` or ``sliding_window_pattern``, read the same):

- ``llama`` (Llama 2, 3, SmolLM2, TinyLlama), ``mistral``, ``qwen2``, ``qwen3``: RoPE, RMSNorm,
  a gated MLP, no biases; G = ``num_key_value_heads``; Mistral's ``sliding_window`` on every
  layer; Qwen 2's b_Q, b_K, b_V; Qwen 3's q/k-norms; Qwen's sliding layers from
  ``max_window_layers`` on, when ``use_sliding_window``.
- ``gemma2``, ``gemma3_text``: the same with s = √d_model (rounded to float32, as their
  embedding's buffer), gains 1 + w, sandwich norms, soft-caps, attn_scale =
  ``query_pre_attn_scalar``^−½, ``layer_types``; Gemma 3's q/k-norms and its sliding layers'
  own RoPE base. (Gemma 3's ``attn_logit_softcapping`` is left out, as transformers' Gemma 3
  attention leaves it out.)
- ``gpt_neox`` (Pythia): LayerNorm, biases, a GELU MLP, the parallel residual, RoPE on
  ``partial_rotary_factor`` of each head.

A field glassgpt cannot express (a RoPE type, an activation, a bias on o without the MLP's,
a quantised checkpoint, bidirectional attention) is refused naming it: never a silently
different function. The way back (GPTConfig → ``config.json``) is :mod:`.hf_export`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from glassgpt.errors import ConfigError
from glassgpt.model import GPTConfig

# model_type → the transformers class that computes it (GPT-2 is hf_gpt2's)
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
}
LLAMA_SHAPED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
GEMMA = ("gemma2", "gemma3_text")
HINTS = {
    "gemma3": "a Gemma 3 vision-language model; its text model is a gemma3_text folder",
    "gemma": "Gemma 1",
    "qwen2_moe": "a mixture of experts",
    "qwen3_moe": "a mixture of experts",
    "mixtral": "a mixture of experts",
}

# transformers' ACT2FN names → GPTConfig's activations (the tanh forms differ only in rounding)
ACTIVATIONS = {
    "silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh", "gelu_python_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh", "relu": "relu", "relu2": "relu2", "sigmoid": "sigmoid",
    "tanh": "tanh",
}  # fmt: skip
PLAIN_MLPS = ("relu", "relu2", "gelu", "gelu_tanh")  # GPTConfig's ungated MLPs
NULLABLE = ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping")
THETA = 10000.0  # every family's default RoPE base but Gemma 3's (in DEFAULTS)

# transformers' defaults for what a config.json may leave out (each family's config class)
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "hidden_act": "silu", "tie_word_embeddings": False},
    "mistral": {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 4096,
              "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 4096,
              "max_window_layers": 28, "head_dim": 128},
    "gemma2": {"max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
               "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
               "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
                    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                    "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    "gpt_neox": {"max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
                 "tie_word_embeddings": False, "use_parallel_residual": True,
                 "attention_bias": True},
}  # fmt: skip


def gemma_embed_scale(d_model: int) -> float:
    """√d_model as Gemma computes it: a float32 buffer, ``torch.tensor(d ** 0.5)``.

    >>> gemma_embed_scale(64), gemma_embed_scale(640) == 640 ** 0.5
    (8.0, False)
    """
    return float(torch.tensor(d_model**0.5, dtype=torch.float32))


def model_type_of(hf: Mapping[str, Any]) -> str:
    """The family's ``model_type``; one line naming it and the families glassgpt knows when
    it is none of them (``gpt2`` where a GPT-2 config of old leaves it out)."""
    model_type = hf.get("model_type", "gpt2" if "n_embd" in hf else None)
    if model_type in ARCHITECTURES:
        return model_type
    if model_type is None:
        raise ConfigError(
            "model_type", f"missing from the config; glassgpt reads {', '.join(ARCHITECTURES)}"
        )
    hint = f" ({HINTS[model_type]})" if model_type in HINTS else ""
    raise ConfigError(
        "model_type",
        f"{model_type!r}{hint} is not a family glassgpt implements; it reads "
        f"{', '.join(ARCHITECTURES)}",
    )


def family_config(
    hf: Mapping[str, Any], model_type: str, *, dropout: float | None = None
) -> GPTConfig:
    """The GPTConfig of a Llama-shaped or GPT-NeoX ``config.json`` (see the module docstring)."""
    # a key left out takes the class's default; a null one too, where null is not a value
    d = {**DEFAULTS[model_type], **{k: v for k, v in hf.items() if v is not None or k in NULLABLE}}
    if "quantization_config" in d:
        raise ConfigError("quantization_config", "quantised weights: glassgpt reads float ones")
    if d.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention", "glassgpt's attention is causal")
    need = lambda key: _need(d, key, model_type)  # noqa: E731
    D, H = need("hidden_size"), need("num_attention_heads")
    fields: dict[str, Any] = {
        "n_vocab": need("vocab_size"), "n_ctx": need("max_position_embeddings"), "d_model": D,
        "n_layers": need("num_hidden_layers"), "n_heads": H,
        "d_mlp": d.get("intermediate_size", 4 * D), "tie_embeddings": bool(d["tie_word_embeddings"]),
        "init_std": d.get("initializer_range", 0.02), "positional": "rope",
        "dropout": _dropout(d, dropout),
    }  # fmt: skip
    if model_type == "gpt_neox":
        fields |= _neox(d)
    else:
        fields |= _llama_shaped(d, model_type)
    return GPTConfig.from_dict(fields)


def _need(d: Mapping[str, Any], key: str, model_type: str) -> Any:
    if key not in d:
        raise ConfigError(key, f"missing from the {model_type} config")
    return d[key]


def _dropout(d: Mapping[str, Any], dropout: float | None) -> float:
    """0, or ``dropout``: an HF dropout ≠ 0 is refused (glassgpt's drops the residual
    branches too, so in training it would be another function), unless one is given."""
    if dropout is not None:
        return dropout
    for key in ("attention_dropout", "hidden_dropout"):
        if float(d.get(key, 0.0) or 0.0) != 0.0:
            raise ConfigError(
                key, f"{d[key]} differs from glassgpt's one dropout (which drops the residual "
                "branches as well); pass dropout="
            )  # fmt: skip
    return 0.0


def _activation(d: Mapping[str, Any], key: str) -> str:
    act = d.get(key) or d.get("hidden_act")
    if act not in ACTIVATIONS:
        raise ConfigError(
            key, f"{act!r} has no GPTConfig activation; known: {', '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[act]


def _llama_shaped(d: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The fields of Llama, Mistral, Qwen 2, Qwen 3, Gemma 2 and Gemma 3."""
    D, H, L = d["hidden_size"], d["num_attention_heads"], d["num_hidden_layers"]
    gemma = model_type in GEMMA
    act = _activation(d, "hidden_activation" if gemma else "hidden_act")
    mlp = {"silu": {"mlp": "swiglu"}}.get(act, {"mlp": "gated", "mlp_gate": act})
    attention_bias, mlp_bias = bool(d.get("attention_bias")), bool(d.get("mlp_bias"))
    if attention_bias != mlp_bias or (attention_bias and model_type != "llama"):
        key = "attention_bias" if attention_bias else "mlp_bias"
        raise ConfigError(key, "biases on some projections only: GPTConfig has all (bias) "
                          "or those of q, k, v alone (qkv_bias)")  # fmt: skip
    fields: dict[str, Any] = {
        "n_kv_heads": d.get("num_key_value_heads", H), "d_head": d.get("head_dim", D // H),
        "norm": "rmsnorm", "norm_eps": d["rms_norm_eps"], **mlp, "mlp_value": "identity",
        "bias": attention_bias, "qkv_bias": model_type == "qwen2",
        "qk_norm": model_type in ("qwen3", "gemma3_text"),
    }  # fmt: skip
    if fields["mlp"] == "swiglu":
        del fields["mlp_value"]
    kinds = _layer_kinds(d, model_type, L)
    if "sliding" in kinds:
        fields |= {"sliding_window": d["sliding_window"], "layer_types": tuple(kinds)}
    if gemma:
        fields |= {
            "embed_scale": gemma_embed_scale(D), "norm_offset": 1.0, "sandwich_norm": True,
            "attn_scale": float(d["query_pre_attn_scalar"]) ** -0.5,
            # transformers' Gemma 3 reads attn_logit_softcapping but never applies it
            "attn_softcap": d.get("attn_logit_softcapping") if model_type == "gemma2" else None,
            "final_softcap": d.get("final_logit_softcapping"),
        }  # fmt: skip
    if model_type == "gemma3_text":
        full, local = _gemma3_rope(d)
        fields |= _rope(full, d, "rope_parameters.full_attention")
        if "sliding" in kinds and local != full:
            if local.get("rope_type", "default") != "default":
                raise ConfigError("rope_parameters.sliding_attention.rope_type",
                                  "glassgpt's sliding layers rotate by plain RoPE")  # fmt: skip
            fields["rope_local_base"] = float(local["rope_theta"])
    else:
        params, where = _rope_parameters(d)
        fields |= _rope(params, d, where)
        if fields.pop("rotary_fraction", 1.0) != 1.0:
            raise ConfigError(f"{where}.partial_rotary_factor",
                              f"{model_type} rotates whole heads in transformers")  # fmt: skip
    return fields


def _layer_kinds(d: Mapping[str, Any], model_type: str, L: int) -> list[str]:
    """Each layer's ``full`` or ``sliding``, as the family's transformers code decides."""
    window = d.get("sliding_window")
    if model_type == "mistral":  # every layer; Mistral's code ignores layer_types
        return ["sliding" if window is not None else "full"] * L
    if model_type in ("qwen2", "qwen3"):
        if not d.get("use_sliding_window"):
            return ["full"] * L
        first = d["max_window_layers"]
        default = ["sliding_attention" if i >= first else "full_attention" for i in range(L)]
        types = d.get("layer_types") or default
    elif model_type in GEMMA:
        pattern = 2 if model_type == "gemma2" else d.get("sliding_window_pattern", 6)
        default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]
        types = d.get("layer_types") or default
    else:  # llama: no sliding window in its code
        return ["full"] * L
    if len(types) != L or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ConfigError("layer_types", f"expected {L} of full_attention, sliding_attention")
    kinds = [t.removesuffix("_attention") for t in types]
    if "sliding" in kinds and window is None:
        raise ConfigError("sliding_window", "sliding layers without a window")
    return kinds


def _rope_parameters(d: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The one RoPE dict (transformers 5's ``rope_parameters``, or 4's ``rope_theta`` and
    ``rope_scaling``, NeoX's ``rotary_emb_base`` and ``rotary_pct``) and its key's name."""
    if isinstance(d.get("rope_parameters"), Mapping):
        return dict(d["rope_parameters"]), "rope_parameters"
    params = dict(d.get("rope_scaling") or {})
    params.setdefault("rope_theta", d.get("rope_theta", d.get("rotary_emb_base", THETA)))
    neox = 0.25 if d.get("model_type") == "gpt_neox" else None  # NeoX's default rotary_pct
    frac = d.get("partial_rotary_factor", d.get("rotary_pct", neox))
    if frac is not None:
        params.setdefault("partial_rotary_factor", frac)
    return params, "rope_scaling"


def _gemma3_rope(d: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gemma 3's RoPE dicts of its full and sliding layers."""
    nested = d.get("rope_parameters")
    if isinstance(nested, Mapping) and "full_attention" in nested:
        full, local = dict(nested["full_attention"]), dict(nested.get("sliding_attention") or {})
    else:
        full = {**(d.get("rope_scaling") or {}), "rope_theta": d["rope_theta"]}
        local = {}
    full.setdefault("rope_theta", d["rope_theta"])
    local.setdefault("rope_theta", d["rope_local_base_freq"])
    for params in (full, local):
        params.setdefault("rope_type", params.pop("type", "default"))
    return full, local


def _rope(params: Mapping[str, Any], d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """GPTConfig's RoPE fields of one RoPE dict (``where`` names it in errors)."""
    p = {k: v for k, v in params.items() if v is not None}
    kind = p.get("rope_type", p.get("type", "default"))
    fields: dict[str, Any] = {"rope_base": float(p.get("rope_theta", THETA)),
                              "rotary_fraction": float(p.get("partial_rotary_factor", 1.0))}  # fmt: skip
    ctx = p.get("original_max_position_embeddings", d["max_position_embeddings"])
    if kind == "default":
        return fields
    if kind == "linear":
        return fields | {"rope_scaling": "linear", "rope_factor": float(p["factor"])}
    if kind == "llama3":
        return fields | {
            "rope_scaling": "llama3", "rope_factor": float(p["factor"]),
            "rope_low_freq_factor": float(p["low_freq_factor"]),
            "rope_high_freq_factor": float(p["high_freq_factor"]), "rope_original_ctx": ctx,
        }  # fmt: skip
    if kind == "yarn":
        factor = float(p.get("factor") or d["max_position_embeddings"] / ctx)
        if p.get("mscale") and p.get("mscale_all_dim"):
            raise ConfigError(f"{where}.mscale", "YaRN with mscale and mscale_all_dim (DeepSeek's)")
        expected = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        if "attention_factor" in p and abs(p["attention_factor"] - expected) > 1e-12:
            raise ConfigError(f"{where}.attention_factor", f"glassgpt's YaRN has {expected:g}")
        if not p.get("truncate", True):
            raise ConfigError(f"{where}.truncate", "glassgpt's YaRN truncates")
        return fields | {
            "rope_scaling": "yarn", "rope_factor": factor, "rope_original_ctx": ctx,
            "rope_beta_fast": float(p.get("beta_fast") or 32.0),
            "rope_beta_slow": float(p.get("beta_slow") or 1.0),
        }  # fmt: skip
    raise ConfigError(f"{where}.rope_type",
                      f"{kind!r} RoPE is not in glassgpt (it has default, linear, llama3, yarn)")  # fmt: skip


def _neox(d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of GPT-NeoX (Pythia)."""
    act = _activation(d, "hidden_act")
    if act not in PLAIN_MLPS:
        raise ConfigError("hidden_act", f"{d['hidden_act']!r}: GPTConfig's ungated MLPs are "
                          f"{', '.join(PLAIN_MLPS)}")  # fmt: skip
    if not d["attention_bias"]:
        raise ConfigError("attention_bias", "NeoX without attention biases keeps the MLP's "
                          "and LayerNorms': GPTConfig has all biases or none")  # fmt: skip
    params, where = _rope_parameters(d)
    return {
        "norm": "layernorm", "norm_eps": d["layer_norm_eps"], "mlp": act, "bias": True,
        "parallel_residual": bool(d["use_parallel_residual"]), **_rope(params, d, where),
    }  # fmt: skip
