"""HF GPT-2 ↔ GPT: the same function under two parameter layouts.

GPT-2 (transformers' ``GPT2LMHeadModel``) stores each block's attention as Conv1D matrices
acting on row vectors, x @ W: ``c_attn.weight`` [d, 3·d] packs the columns q | k | v, each
d = H·d_head wide with head h's d_head columns contiguous, and ``c_proj.weight`` [H·d_head, d]
has rows indexed (h, i). So, with the (h, i) index split out,

    W_Q[h] = c_attn.weight[:, h·d_head : (h+1)·d_head]           (and W_K, W_V at +d, +2d)
    W_O[h] = c_proj.weight[h·d_head : (h+1)·d_head, :]
    W_in = c_fc.weight,  W_out = mlp.c_proj.weight,  W_E = wte.weight,  W_P = wpe.weight,
    W_U = lm_head.weightᵀ (= W_Eᵀ when tied),  b_U = 0 (GPT-2 has no unembedding bias).

GPT-2 is our pre-norm, learned-position, LayerNorm, biased model with the tanh GELU
("gelu_new"); a GPTConfig outside that family cannot be exported, and an HF config with
a feature GPTConfig lacks (cross-attention, attention scaled by 1/(layer+1), unscaled
attention, other activations) is refused naming the field. Folders, models and state dicts
are read by :func:`glassgpt.interop.hf.from_hf`, which maps GPT-2's weights through
:func:`state_dict_from_hf`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.interop.hf_files import write_folder
from glassgpt.model import GPT, GPTConfig

# transformers' activation names → our MLP kinds (the tanh forms differ only in rounding)
HF_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
}
EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old checkpoints


# -- configs ---------------------------------------------------------------------------


def config_from_hf(hf: Mapping[str, Any] | Any, *, dropout: float | None = None) -> GPTConfig:
    """The GPTConfig of a ``GPT2Config`` (or its ``config.json`` dict); refuses, naming the
    field, what GPTConfig cannot represent. ``dropout`` overrides the three HF dropouts."""
    d = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
    model_type = d.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ConfigError("model_type", f"expected a GPT-2 config, got {model_type!r}")
    refuse = {
        "add_cross_attention": False,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
    }
    for key, ok in refuse.items():
        if bool(d.get(key, ok)) != ok:
            raise ConfigError(key, f"{key}={d[key]!r} has no GPTConfig equivalent")
    act = d.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        known = ", ".join(HF_ACTIVATIONS)
        raise ConfigError("activation_function", f"{act!r} has no GPTConfig MLP; known: {known}")
    if dropout is None:
        drops = {d.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
        if len(drops) > 1:
            raise ConfigError(
                "resid_pdrop",
                f"GPTConfig has one dropout but resid/embd/attn_pdrop differ ({sorted(drops)}); "
                "pass dropout=",
            )
        dropout = float(drops.pop())
    try:
        fields = {
            "n_vocab": d["vocab_size"],
            "n_ctx": d["n_positions"],
            "d_model": d["n_embd"],
            "n_layers": d["n_layer"],
            "n_heads": d["n_head"],
        }
    except KeyError as e:
        raise ConfigError(str(e.args[0]), "missing from the GPT-2 config") from None
    return GPTConfig.from_dict(
        {
            **fields,
            "d_mlp": d.get("n_inner"),
            "mlp": HF_ACTIVATIONS[act],
            "norm_eps": d.get("layer_norm_epsilon", 1e-5),
            "init_std": d.get("initializer_range", 0.02),
            "tie_embeddings": d.get("tie_word_embeddings", True),
            "dropout": dropout,
            "positional": "learned",
            "norm": "layernorm",
            "norm_placement": "pre",
            "bias": True,
            "unembed_bias": False,
        }
    )


def check_exportable(config: GPTConfig) -> None:
    """Raise ConfigError naming the first field that GPT-2's layout cannot hold."""
    wanted = {"positional": "learned", "norm": "layernorm", "norm_placement": "pre"}
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise ConfigError(
                field, f"GPT-2 needs {field}={value!r}, got {getattr(config, field)!r}"
            )
    if config.mlp not in EXPORT_ACTIVATIONS:
        raise ConfigError(
            "mlp", f"GPT-2 needs mlp in {', '.join(EXPORT_ACTIVATIONS)}, got {config.mlp!r}"
        )
    if config.n_heads * config.d_head != config.d_model:  # type: ignore[operator]
        raise ConfigError(
            "d_head", f"GPT-2 needs n_heads·d_head = d_model, got d_head={config.d_head}"
        )


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` of the GPT-2 that computes the same function as ``config``."""
    check_exportable(config)
    gpt2_vocab = config.n_vocab == 50257
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.n_vocab,
        "n_positions": config.n_ctx,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.d_mlp,
        "activation_function": EXPORT_ACTIVATIONS[config.mlp],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.norm_eps,
        "initializer_range": config.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": 50256 if gpt2_vocab else None,
        "eos_token_id": 50256 if gpt2_vocab else None,
        "use_cache": True,
    }


# -- weights ---------------------------------------------------------------------------


def _strip(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """HF keys without the ``transformer.`` prefix and without mask buffers."""
    out = {}
    for key, value in state.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        out[key.removeprefix("transformer.")] = value
    return out


def _take(hf: dict[str, Tensor], key: str, shape: tuple[int, ...], field: str) -> Tensor:
    if key not in hf:
        raise InputFileError(f"GPT-2 weights: missing {key}")
    t = hf.pop(key)
    if tuple(t.shape) != shape:
        raise ConfigError(field, f"{key} has shape {tuple(t.shape)}, the config implies {shape}")
    return t


def state_dict_from_hf(state: Mapping[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPT state_dict (our names) from a GPT-2 state dict; every shape is checked, naming the
    config field it contradicts; leftover or missing keys are errors."""
    c = config
    hf = _strip(state)
    d, H, dh, dm, V = c.d_model, c.n_heads, c.d_head or 0, c.d_mlp or 0, c.n_vocab
    out: dict[str, Tensor] = {
        "embed.W_E": _take(hf, "wte.weight", (V, d), "n_vocab"),
        "pos_embed.W_P": _take(hf, "wpe.weight", (c.n_ctx, d), "n_ctx"),
    }
    for l in range(c.n_layers):
        h, p = f"h.{l}.", f"blocks.{l}."
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[p + ours + ".w"] = _take(hf, h + theirs + ".weight", (d,), "d_model")
            out[p + ours + ".b"] = _take(hf, h + theirs + ".bias", (d,), "d_model")
        W = _take(hf, h + "attn.c_attn.weight", (d, 3 * d), "d_model")  # [d, q|k|v]
        b = _take(hf, h + "attn.c_attn.bias", (3 * d,), "d_model")
        for i, m in enumerate("QKV"):
            out[p + f"attn.W_{m}"] = W[:, i * d : (i + 1) * d].reshape(d, H, dh).permute(1, 0, 2)
            out[p + f"attn.b_{m}"] = b[i * d : (i + 1) * d].reshape(H, dh)
        out[p + "attn.W_O"] = _take(hf, h + "attn.c_proj.weight", (d, d), "d_model").reshape(
            H, dh, d
        )
        out[p + "attn.b_O"] = _take(hf, h + "attn.c_proj.bias", (d,), "d_model")
        out[p + "mlp.W_in"] = _take(hf, h + "mlp.c_fc.weight", (d, dm), "d_mlp")
        out[p + "mlp.b_in"] = _take(hf, h + "mlp.c_fc.bias", (dm,), "d_mlp")
        out[p + "mlp.W_out"] = _take(hf, h + "mlp.c_proj.weight", (dm, d), "d_mlp")
        out[p + "mlp.b_out"] = _take(hf, h + "mlp.c_proj.bias", (d,), "d_model")
    out["ln_final.w"] = _take(hf, "ln_f.weight", (d,), "d_model")
    out["ln_final.b"] = _take(hf, "ln_f.bias", (d,), "d_model")
    head = hf.pop("lm_head.weight", None)
    if c.tie_embeddings:
        if head is not None and tuple(head.shape) != (V, d):
            raise ConfigError(
                "n_vocab",
                f"tied embeddings: lm_head.weight has shape {tuple(head.shape)} but wte.weight "
                f"has {(V, d)}",
            )
        if head is not None and not torch.equal(head, out["embed.W_E"]):
            raise ConfigError(
                "tie_word_embeddings", "the config ties embeddings but lm_head.weight ≠ wte.weight"
            )
    else:
        if head is None:
            raise InputFileError("GPT-2 weights: missing lm_head.weight (untied embeddings)")
        if tuple(head.shape) != (V, d):
            raise ConfigError(
                "n_vocab", f"lm_head.weight has shape {tuple(head.shape)}, expected {(V, d)}"
            )
        out["unembed.W_U"] = head.T
    if c.bias and c.unembed_bias:
        out["unembed.b_U"] = torch.zeros(V, dtype=out["embed.W_E"].dtype)
    if hf:
        raise InputFileError(f"GPT-2 weights: unexpected key {sorted(hf)[0]}")
    return out


def state_dict_to_hf(model: GPT) -> dict[str, Tensor]:
    """The GPT-2 state dict (``transformer.*`` and, untied, ``lm_head.weight``) of ``model``;
    a model without biases exports zero biases (the same function)."""
    c = model.config
    check_exportable(c)
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    b_U = ours.get("unembed.b_U")
    if b_U is not None and bool(b_U.any()):
        raise GlassError(
            "unembed.b_U is not zero: GPT-2's lm_head has no bias (train with --set "
            "model.unembed_bias=false to export)"
        )
    d, dm = c.d_model, c.d_mlp or 0
    zeros = torch.zeros_like(ours["embed.W_E"][0])  # [d]
    bias = lambda key, n: ours.get(key, zeros.new_zeros(n))  # noqa: E731
    t: dict[str, Tensor] = {"wte.weight": ours["embed.W_E"], "wpe.weight": ours["pos_embed.W_P"]}
    for l in range(c.n_layers):
        h, p = f"h.{l}.", f"blocks.{l}."
        for theirs, mine in (("ln_1", "ln1"), ("ln_2", "ln2")):
            t[h + theirs + ".weight"] = ours[p + mine + ".w"]
            t[h + theirs + ".bias"] = bias(p + mine + ".b", d)
        qkv = [ours[p + f"attn.W_{m}"].permute(1, 0, 2).reshape(d, d) for m in "QKV"]
        t[h + "attn.c_attn.weight"] = torch.cat(qkv, dim=1)  # [d, 3d]
        t[h + "attn.c_attn.bias"] = torch.cat(
            [bias(p + f"attn.b_{m}", d).reshape(d) for m in "QKV"]
        )
        t[h + "attn.c_proj.weight"] = ours[p + "attn.W_O"].reshape(d, d)
        t[h + "attn.c_proj.bias"] = bias(p + "attn.b_O", d)
        t[h + "mlp.c_fc.weight"] = ours[p + "mlp.W_in"]
        t[h + "mlp.c_fc.bias"] = bias(p + "mlp.b_in", dm)
        t[h + "mlp.c_proj.weight"] = ours[p + "mlp.W_out"]
        t[h + "mlp.c_proj.bias"] = bias(p + "mlp.b_out", d)
    t["ln_f.weight"] = ours["ln_final.w"]
    t["ln_f.bias"] = bias("ln_final.b", d)
    out = {"transformer." + k: v.contiguous().clone() for k, v in t.items()}
    if not c.tie_embeddings:
        out["lm_head.weight"] = ours["unembed.W_U"].T.contiguous().clone()
    return out


# -- files and public API --------------------------------------------------------------


def to_hf(model: GPT, folder: str | os.PathLike) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that
    ``transformers.GPT2LMHeadModel.from_pretrained(folder)`` loads as the same function."""
    if not isinstance(model, GPT):
        raise GlassError(f"to_hf: expected a glassgpt GPT, got {type(model).__name__}")
    return write_folder(Path(folder), config_to_hf(model.config), state_dict_to_hf(model))
