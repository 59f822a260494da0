"""``from_hf`` / ``to_hf``: a GPT from or to an HF model of any family glassgpt implements.

The family is the ``model_type`` of ``config.json``: ``gpt2`` (:mod:`.hf_gpt2`), ``llama``,
``mistral``, ``qwen2``, ``qwen3``, ``gemma2``, ``gemma3_text`` and ``gpt_neox``
(:mod:`.hf_families` for the config, :mod:`.hf_layouts` for the weights). Any other is
refused in one line naming it and the families known. Weights are read one tensor at a time
from their memory-mapped files and copied once, into the model's own parameters
(:mod:`.hf_files`); a missing, unexpected or misshapen tensor is one line naming it.

``to_hf`` writes the family that computes the config (:mod:`.hf_export`): a RoPE, RMSNorm,
SwiGLU model without biases is a ``LlamaForCausalLM``, and so on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.interop import hf_gpt2
from glassgpt.interop.hf_export import config_to_hf as family_config_to_hf
from glassgpt.interop.hf_export import family_for
from glassgpt.interop.hf_families import ARCHITECTURES, LLAMA_SHAPED, family_config, model_type_of
from glassgpt.interop.hf_files import Tensors, as_path, build, owned, read_config, write_folder
from glassgpt.interop.hf_layouts import llama_from_hf, llama_to_hf, neox_from_hf, neox_to_hf
from glassgpt.model import GPT, GPTConfig

Source = str | os.PathLike | nn.Module | Mapping[str, Tensor]
# buffers that old checkpoints saved beside the weights (masks, rotary frequencies)
IGNORED = (".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias",
           ".attn.bias", ".attn.masked_bias")  # fmt: skip
_PREFIXES = {"gpt_neox": "gpt_neox."}  # the base model's key prefix (else "model.")
ALIASES = {
    "embed_out.weight": ("lm_head.weight",)
}  # NeoX's head, as transformers 5 names it in memory


def config_from_hf(hf: Mapping[str, Any] | Any, *, dropout: float | None = None) -> GPTConfig:
    """The GPTConfig of an HF config (a ``PretrainedConfig`` or its ``config.json`` dict) of
    any family glassgpt implements; a field it cannot express is refused naming the field."""
    d = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
    model_type = model_type_of(d)
    if model_type == "gpt2":
        return hf_gpt2.config_from_hf(d, dropout=dropout)
    return family_config(d, model_type, dropout=dropout)


def from_hf(
    source: Source, *, config: Mapping[str, Any] | Any = None, dropout: float | None = None,
    dtype: torch.dtype | None = torch.float32,
) -> GPT:  # fmt: skip
    """A GPT equal (as a function) to an HF model: ``source`` is a ``save_pretrained`` folder,
    a transformers model, or its state dict (then ``config`` — its config, or the dict of
    ``config.json`` — is required). Eval mode, in ``dtype`` (None: as stored)."""
    hf_config, tensors = _open(source, config)
    ours = config_from_hf(hf_config, dropout=dropout)  # refused before any weight is read
    return build(ours, state_dict_from_hf(tensors, ours, model_type_of(hf_config), dtype))


def _open(source: Source, config: Mapping[str, Any] | Any) -> tuple[dict[str, Any], Tensors]:
    """(the HF config as a dict, the weights by name) of a folder, model or state dict."""
    path = as_path(source)
    if path is not None:
        hf_config = config if config is not None else read_config(path)
        tensors = Tensors.of_folder(path)  # the files' headers: no tensor is read yet
    elif isinstance(source, nn.Module):
        if not hasattr(source, "config"):
            name = type(source).__name__
            raise GlassError(f"{name} has no .config; expected a transformers model")
        tensors = Tensors(state=source.state_dict(), where=type(source).__name__)
        hf_config = config if config is not None else source.config
    elif isinstance(source, Mapping):
        if config is None:
            raise ConfigError("config", "a state dict needs config= (its HF config or dict)")
        hf_config, tensors = config, Tensors(state=source, where="the state dict")
    else:
        raise GlassError(
            f"from_hf: expected a folder, a model or a state dict, got {type(source).__name__}"
        )
    return dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config), tensors


def state_dict_from_hf(
    tensors: Tensors, c: GPTConfig, model_type: str, dtype: torch.dtype | None = torch.float32
) -> dict[str, Tensor]:
    """glassgpt's state dict (each tensor its own contiguous copy in ``dtype``) of an HF
    family's weights; a tensor missing, unexpected or of the wrong shape is one line naming it."""
    keep = lambda t: owned(t, dtype or t.dtype)  # noqa: E731
    if model_type == "gpt2":
        weights = hf_gpt2.state_dict_from_hf(dict(tensors.items()), c)
        return {k: keep(weights.pop(k)) for k in list(weights)}
    family = ARCHITECTURES[model_type]
    prefix = _PREFIXES.get(model_type, "model.")
    headless = (
        f"{prefix}embed_tokens.weight" not in tensors and f"{prefix}embed_in.weight" not in tensors
    )

    def read(name: str, shape: tuple[int, ...]) -> Tensor:
        key = name.removeprefix(prefix) if headless else name  # a base model: no prefix
        key = next((k for k in (key, *ALIASES.get(key, ())) if k in tensors), key)
        if key not in tensors:
            raise InputFileError(f"{tensors.where}: missing tensor {key} (of a {family})")
        t = tensors[key]
        if tuple(t.shape) != shape:
            raise InputFileError(f"{tensors.where}: {key} has shape {tuple(t.shape)}; "
                                 f"config.json implies {shape}")  # fmt: skip
        return t

    out: dict[str, Tensor] = {}

    def put(name: str, t: Tensor) -> None:
        out[name] = keep(t)

    (llama_from_hf if model_type in LLAMA_SHAPED else neox_from_hf)(c, read, put)
    W_E = out["embed.W_E"]
    for head in ("lm_head.weight", "embed_out.weight") if c.tie_embeddings else ():
        # a tied model that saved its head all the same (a model object's state dict does)
        if head in tensors and not torch.equal(tensors[head].to(W_E.dtype), W_E):
            raise ConfigError("tie_word_embeddings", f"the config ties embeddings but {head} ≠ W_E")
    extra = tensors.unused(IGNORED)
    if extra:
        raise InputFileError(f"{tensors.where}: unexpected tensor {extra[0]} (not of a {family})")
    return out


def to_hf(model: GPT, folder: str | os.PathLike) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of the transformers family that
    computes ``model``'s function (``AutoModelForCausalLM.from_pretrained(folder)`` loads it);
    a config no family expresses is refused naming the field, and nothing is written."""
    if not isinstance(model, GPT):
        raise GlassError(f"to_hf: expected a glassgpt GPT, got {type(model).__name__}")
    c = model.config
    family = family_for(c)
    if family == "gpt2":
        return hf_gpt2.to_hf(model, folder)
    hf_config = family_config_to_hf(c)
    ours = {k: v.detach() for k, v in model.state_dict().items()}
    b_U = ours.pop("unembed.b_U", None)
    if b_U is not None and bool(b_U.any()):
        raise ConfigError("unembed_bias", f"unembed.b_U is not zero: a {ARCHITECTURES[family]} "
                          "has no unembedding bias")  # fmt: skip
    tensors = (neox_to_hf if family == "gpt_neox" else llama_to_hf)(c, ours)
    tensors = {k: v.clone(memory_format=torch.contiguous_format) for k, v in tensors.items()}
    return write_folder(Path(folder), hf_config, tensors)
