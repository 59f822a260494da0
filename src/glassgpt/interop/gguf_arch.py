"""GPTConfig → the llama.cpp architecture that computes it, its GGUF metadata and tensors.

The family is :func:`~glassgpt.interop.hf_export.family_for`'s (the one the HF export
writes); llama.cpp names it

    gpt2 → gpt2,  llama, mistral → llama,  qwen2 → qwen2,  qwen3 → qwen3,
    gemma2 → gemma2,  gemma3_text → gemma3,  gpt_neox → gptneox

and then holds a little less than transformers does: no sliding window outside Gemma, SiLU
gates only (GELU-tanh for Gemma), always-tied Gemma 2 embeddings, the attention scale and the
soft-caps of its own Gemma graphs, ``llama3`` scaling only on ``llama``. What it cannot hold
is refused in one line naming the field (a ConfigError), before anything is written.

The tensors are the HF ones (:mod:`.hf_layouts`, :mod:`.hf_gpt2`) under llama.cpp's names
(``blk.l.attn_q.weight`` …), as its ``convert_hf_to_gguf.py`` writes them, with three changes:

- ``llama`` rotates the pairs (2i, 2i+1) (rope type NORM), HF ``rotate_half``'s (i, i + r/2);
  so W_Q's and W_K's rows (and b_Q, b_K) are permuted back by :func:`interleave`, which
  makes them glassgpt's own layout again. qwen2, qwen3, gemma* and gptneox rotate as HF does
  (NEOX) and keep HF's rows.
- Gemma's RMSNorm gains 1 + w are stored as 1 + w (llama.cpp's RMSNorm multiplies by w).
- GPT-2's Conv1D matrices are transposed to [d_out, d_in], and GPT-NeoX's per-head q, k, v
  rows regrouped as q | k | v.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from glassgpt.console import say
from glassgpt.errors import ConfigError
from glassgpt.interop import hf_gpt2
from glassgpt.interop.hf_export import family_for
from glassgpt.interop.hf_layouts import llama_to_hf, neox_to_hf
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.layers import rope_frequencies

ARCHS = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "qwen2",
         "qwen3": "qwen3", "gemma2": "gemma2", "gemma3_text": "gemma3", "gpt_neox": "gptneox"}  # fmt: skip
INTERLEAVED = ("llama",)  # rope type NORM; the rest that rotate are NEOX (rotate_half)
GEMMA = ("gemma2", "gemma3")
# llama.cpp's Gemma graphs scale q by 1/√(d_model/H) at these depths (their 27B), else 1/√d_head
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# llama.cpp's GELU is the tanh form; an erf GELU is exported with a note (≤ 5e-4 apart)
TANH_GELU = ("gelu_tanh", "gelu")


def _no(field: str, arch: str, why: str) -> ConfigError:
    return ConfigError(field, f"llama.cpp's {arch} {why} (no llama.cpp architecture computes "
                       "this config)")  # fmt: skip


def arch_for(c: GPTConfig) -> str:
    """The llama.cpp architecture that computes ``c``, or a ConfigError naming the field."""
    family = family_for(c)
    arch = ARCHS[family]
    act = c.mlp_activations[0]
    if arch in ("gpt2", "gptneox"):
        if act not in TANH_GELU:
            raise _no("mlp", arch, f"computes a GELU MLP, got {c.mlp!r}")
        if act == "gelu":
            say(f"llama.cpp's {arch} computes GELU in its tanh form; this model's is the erf "
                "form (they differ by at most 5e-4 per activation)")  # fmt: skip
    elif act != ("gelu_tanh" if arch in GEMMA else "silu"):
        gate = "GELU-tanh" if arch in GEMMA else "SiLU"
        raise _no("mlp", arch, f"gates its MLP with {gate}, got mlp={c.mlp!r} (gate {act})")
    sliding = "sliding" in c.layer_kinds and (c.sliding_window or 0) < c.n_ctx
    if sliding and arch not in GEMMA:
        raise _no("sliding_window", arch, f"has no sliding window (got {c.sliding_window} "
                  f"< n_ctx {c.n_ctx}; a window ≥ n_ctx is the same function)")  # fmt: skip
    if c.rope_scaling == "llama3" and arch != "llama":
        raise _no("rope_scaling", arch, "reads llama3 rope scaling only for arch llama")
    if arch in GEMMA:
        if arch == "gemma2" and not c.tie_embeddings:
            raise _no("tie_embeddings", arch, "ties its unembedding to W_E")
        dh = c.d_model // c.n_heads if c.n_layers == GEMMA_27B_LAYERS[arch] else c.d_head or 1
        if not math.isclose(c.attn_scale or (c.d_head or 1) ** -0.5, dh**-0.5, rel_tol=1e-6):
            raise _no("attn_scale", arch, f"scales the scores by 1/√{dh} at this depth")
        if arch == "gemma2" and (c.attn_softcap is None or c.final_softcap is None):
            field = "attn_softcap" if c.attn_softcap is None else "final_softcap"
            raise _no(field, arch, "always soft-caps (its defaults 50 and 30 when unset)")
        local = "sliding" in c.layer_kinds and c.rope_local_base is None
        if arch == "gemma3" and c.rope_scaling != "none" and local:  # glassgpt scales them
            raise _no("rope_local_base", arch, "leaves its local layers' rope unscaled")
    return arch


# -- metadata ------------------------------------------------------------------------------


def metadata(c: GPTConfig, arch: str) -> dict[str, Any]:
    """The ``{arch}.*`` keys of the model (without the ``{arch}.`` prefix)."""
    out: dict[str, Any] = {
        "context_length": c.n_ctx, "embedding_length": c.d_model, "block_count": c.n_layers,
        "feed_forward_length": c.d_mlp, "attention.head_count": c.n_heads, "vocab_size": c.n_vocab,
    }  # fmt: skip
    eps = "layer_norm_epsilon" if c.norm == "layernorm" else "layer_norm_rms_epsilon"
    out[f"attention.{eps}"] = float(c.norm_eps)
    if arch == "gpt2":
        return out
    out |= {"attention.head_count_kv": c.kv_heads, "attention.key_length": c.d_head,
            "attention.value_length": c.d_head, "rope.dimension_count": c.rotary_dims,
            "rope.freq_base": float(c.rope_base)}  # fmt: skip
    if arch == "gptneox":
        out["use_parallel_residual"] = c.parallel_residual
    if c.rope_scaling in ("linear", "yarn"):
        out |= {"rope.scaling.type": c.rope_scaling, "rope.scaling.factor": float(c.rope_factor)}
    if c.rope_scaling == "yarn":
        out |= {"rope.scaling.original_context_length": c.rope_original_ctx or c.n_ctx,
                "rope.scaling.yarn_beta_fast": float(c.rope_beta_fast),
                "rope.scaling.yarn_beta_slow": float(c.rope_beta_slow)}  # fmt: skip
    if arch in GEMMA:
        if c.attn_softcap is not None:
            out["attn_logit_softcapping"] = float(c.attn_softcap)
        if c.final_softcap is not None:
            out["final_logit_softcapping"] = float(c.final_softcap)
        window, kinds = c.sliding_window, [k == "sliding" for k in c.layer_kinds]
        if arch == "gemma2" and not any(kinds):  # it needs a sliding layer: n_ctx is no window
            window, kinds = c.n_ctx, [True] * c.n_layers
        if window is not None:
            out |= {"attention.sliding_window": window, "attention.sliding_window_pattern": kinds,
                    "rope.freq_base_swa": float(c.rope_local_base or c.rope_base)}  # fmt: skip
    return out


def rope_freq_factors(c: GPTConfig) -> Tensor:
    """llama3 scaling as llama.cpp's ``rope_freqs``: ω⁰_i / ω_i, by which it divides θ_i."""
    r = c.rotary_dims
    plain = rope_frequencies(r, c.rope_base)[0]
    scaled = rope_frequencies(
        r, c.rope_base, "llama3", factor=c.rope_factor, low_freq_factor=c.rope_low_freq_factor,
        high_freq_factor=c.rope_high_freq_factor, original_ctx=c.rope_original_ctx or c.n_ctx,
    )[0]  # fmt: skip
    return (plain / scaled).to(torch.float32)


# -- tensors -------------------------------------------------------------------------------


def interleave(rows: Tensor, n: int) -> Tensor:
    """HF's rotate_half rows [n·d_head, ...] → llama.cpp's interleaved ones (its converter's
    ``permute``): within each head, row i goes to 2i and row i + d_head/2 to 2i + 1.

    >>> interleave(torch.arange(8), 2).tolist()
    [0, 2, 1, 3, 4, 6, 5, 7]
    """
    return (
        rows.reshape(n, 2, rows.shape[0] // n // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


_LLAMA = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}  # fmt: skip
_NEOX = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "attention.query_key_value": "attn_qkv", "attention.dense": "attn_output",
    "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down",
}  # fmt: skip
_GPT2 = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "attn_qkv",
         "attn.c_proj": "attn_output", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight", "gpt_neox.embed_in.weight": "token_embd.weight",
        "gpt_neox.final_layer_norm.weight": "output_norm.weight",
        "gpt_neox.final_layer_norm.bias": "output_norm.bias", "embed_out.weight": "output.weight",
        "transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
        "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}  # fmt: skip


def _rename(key: str, table: Mapping[str, str], sandwich: bool) -> str:
    """An HF key → llama.cpp's name (``model.layers.3.mlp.up_proj.weight`` → ``blk.3.ffn_up.weight``)."""
    if key in _TOP:
        return _TOP[key]
    parts = key.split(".")
    at = next(i for i, p in enumerate(parts) if p.isdecimal())
    layer, rest = parts[at], ".".join(parts[at + 1 :])
    if rest == "post_attention_layernorm.weight" and table is _LLAMA:
        rest_name = "post_attention_norm.weight" if sandwich else "ffn_norm.weight"
        return f"blk.{layer}.{rest_name}"
    for theirs, ours in table.items():
        if rest == theirs or rest.startswith(theirs + "."):
            return f"blk.{layer}.{ours}{rest[len(theirs) :]}"
    raise KeyError(key)  # every HF key of the layouts is in a table: a missing one is a bug


def gguf_tensors(model: GPT, arch: str) -> Iterator[tuple[str, Tensor]]:
    """(llama.cpp's name, the tensor [d_out, d_in] as numpy-shaped) for each weight, float32."""
    c = model.config
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    b_U = ours.pop("unembed.b_U", None)
    if b_U is not None and bool(b_U.any()):
        raise ConfigError("unembed_bias", f"unembed.b_U is not zero: llama.cpp's {arch} has no "
                          "unembedding bias")  # fmt: skip
    if arch == "gpt2":
        for key, t in hf_gpt2.state_dict_to_hf(model).items():
            conv = key.endswith(".weight") and (".attn." in key or ".mlp." in key)
            yield _rename(key, _GPT2, False), (t.T if conv else t).float()
        return  # tied: no output.weight, llama.cpp reads token_embd
    if arch == "gptneox":
        H, dh = c.n_heads, c.d_head or 0
        for key, t in neox_to_hf(c, ours).items():
            if ".query_key_value." in key:  # [H, 3, d_head, ...] → [3, H, d_head, ...]
                t = t.reshape(H, 3, dh, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
            yield _rename(key, _NEOX, False), t
        if c.tie_embeddings:  # llama.cpp's gptneox requires output.weight
            yield "output.weight", ours["embed.W_E"]
        return
    gain = 1.0 if arch in GEMMA else 0.0  # Gemma's 1 + w, stored whole
    for key, t in llama_to_hf(c, ours).items():
        if arch in INTERLEAVED and (".q_proj." in key or ".k_proj." in key):
            t = interleave(t, c.n_heads if ".q_proj." in key else c.kv_heads)
        if gain and key.endswith("norm.weight"):
            t = t + gain
        yield _rename(key, _LLAMA, c.sandwich_norm), t
    if c.rope_scaling == "llama3":
        yield "rope_freqs.weight", rope_freq_factors(c)
