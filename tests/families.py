"""Tiny HF folders of each family for the stages' command tests (``from tests.families import
FAMILIES, family_folder``): a model of ``tests/interop/hf_cases.py`` with a vocabulary that
fits a glassgpt byte-level tokenizer (256 bytes and a few merges), saved by transformers'
``save_pretrained`` beside that tokenizer's ``tokenizer.json``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.interop.hf_cases import CASES, make

from glassgpt.interop.hf_tokenizers import save_tokenizer_json
from glassgpt.tokenizer import Tokenizer

# one case per family: GQA + llama3 rope; QK-norm; Gemma 3's local/global layers, √d, 1 + w
# and sandwich norms; NeoX's parallel residual and quarter rotary
FAMILIES = {
    "llama": "llama-gqa2-llama3-untied",
    "qwen3": "qwen3-gqa2-untied",
    "gemma3": "gemma3-local-base-linear-full",
    "neox": "neox-parallel-quarter-rotary",
}
MERGES = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"a", b"n"), (b" ", b"an"), (b"i", b"n")]
V = 256 + len(MERGES)


def tokenizer() -> Tokenizer:
    return Tokenizer.from_merges(MERGES)


def hf_model(family: str, *, n_ctx: int = 64, seed: int = 0, **config: Any) -> Any:
    """The family's tiny transformers model, vocabulary ``V``, context ``n_ctx``."""
    case = CASES[FAMILIES[family]]
    kwargs = {**case.kwargs, "vocab_size": V, "max_position_embeddings": n_ctx, **config}
    return make(replace(case, kwargs=kwargs), seed=seed)


def family_folder(out: Path, family: str, **kw: Any) -> Path:
    """``out`` as an HF folder of the family's tiny model and ``tokenizer.json``."""
    hf_model(family, **kw).save_pretrained(out)
    save_tokenizer_json(tokenizer(), out / "tokenizer.json")
    return out
