"""A model and its tokenizer written for other tools: an HF model folder, a ``.tiktoken`` file.

``export_hf`` writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json``: ``transformers``' ``AutoModelForCausalLM`` and ``AutoTokenizer``
load the folder without glassgpt (the model as the family that computes its config, see
:func:`glassgpt.interop.hf.to_hf`; a byte-level BPE or a character tokenizer).
``export_tiktoken`` writes a byte-level BPE tokenizer's ranks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError
from glassgpt.interop.hf import to_hf
from glassgpt.interop.hf_tokenizers import save_tokenizer_json
from glassgpt.interop.tiktoken_format import save_tiktoken
from glassgpt.storage import atomic_write
from glassgpt.tokenizer import FamilyTokenizer
from glassgpt.tokenizer.family import write_sidecars
from glassgpt.tokenizer.special import END_OF_TEXT as EOT


def export_hf(
    model: Any, tok: Any, out: Path, tokenizer_files: Mapping[str, bytes] | None = None
) -> list[Path]:
    """Weights, ``config.json`` and the tokenizer files of an HF model folder; the files
    written, in the order written.

    ``tokenizer_files``: the tokenizer's own ``tokenizer_config.json``,
    ``generation_config.json`` and ``chat_template.jinja`` (``Run.tokenizer_files``: a model
    family's, kept by a run fine-tuned from it), written as they are, so that the folder
    chats with the same template and stops at the same ids."""
    char = not hasattr(tok, "merges")  # a character tokenizer: BPE without merges, Fuse decoder
    to_hf(model, out)
    written = [out / "model.safetensors", out / "config.json"]  # to_hf's
    save_tokenizer_json(tok, out / "tokenizer.json")
    written.append(out / "tokenizer.json")
    if tokenizer_files and "tokenizer_config.json" in tokenizer_files:
        return written + write_sidecars(out, tokenizer_files)
    if isinstance(tok, FamilyTokenizer):  # its own file, run by PreTrainedTokenizerFast
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.config.n_ctx,
                  "bos_token": tok.bos_token, "eos_token": tok.eos_token}  # fmt: skip
        atomic_write(out / "tokenizer_config.json", (json.dumps(config, indent=2) + "\n").encode())
        return [
            *written,
            out / "tokenizer_config.json",
            *write_sidecars(out, tokenizer_files or {}),
        ]
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast" if char else "GPT2TokenizerFast",
        "model_max_length": model.config.n_ctx,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    if EOT in tok.special_tokens:
        config.update(bos_token=EOT, eos_token=EOT)
        if not char:
            config.update(unk_token=EOT)
    atomic_write(out / "tokenizer_config.json", (json.dumps(config, indent=2) + "\n").encode())
    written.append(out / "tokenizer_config.json")
    return written


def export_tiktoken(tok: Any, out: Path) -> Path:
    """The tokenizer's ranks as ``out`` (a ``.tiktoken`` file) or ``out/tokenizer.tiktoken``."""
    if not hasattr(tok, "merges"):
        raise GlassError(
            "--format tiktoken needs a byte-level BPE tokenizer; this checkpoint's is a "
            f"{type(tok).__name__} (train with --set data.tokenizer=bpe)"
        )
    path = out if out.suffix == ".tiktoken" else out / "tokenizer.tiktoken"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tiktoken(tok, path)
    return path
