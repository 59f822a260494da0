"""Read a saved tokenizer of either kind, as its ``"kind"`` field says; or GPT-2's files; or
an HF ``tokenizer.json`` (:mod:`.family`).

:mod:`.bpe` and :mod:`.char` know nothing of each other; this module reads both.
"""

from __future__ import annotations

import os
from pathlib import Path

from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer import files
from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer
from glassgpt.tokenizer.family import FamilyTokenizer, read_family

KINDS: dict[str, type[Tokenizer] | type[CharTokenizer]] = {
    Tokenizer.kind: Tokenizer,
    CharTokenizer.kind: CharTokenizer,
}


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer | CharTokenizer | FamilyTokenizer:
    """Read a saved tokenizer of either kind: a ``Tokenizer`` or a ``CharTokenizer``; or an HF
    ``tokenizer.json`` (what a :class:`FamilyTokenizer` saves), run as the file says."""
    try:
        data = files.read_tokenizer_json(path)
    except GlassError:
        if _is_hf(path):  # a model family's tokenizer.json, saved as it came (FamilyTokenizer.save)
            return read_family(path)
        raise
    kind = data.get("kind")
    if kind not in KINDS:
        raise GlassError(f"{path}: unknown tokenizer kind {kind!r} (expected 'bpe' or 'char')")
    return KINDS[kind].from_dict(data, str(Path(path)))


def open_tokenizer(spec: str) -> Tokenizer | CharTokenizer | FamilyTokenizer:
    """The tokenizer a ``--tokenizer`` value names: a saved tokenizer (either kind), a folder
    holding GPT-2's ``encoder.json`` and ``vocab.bpe`` (glassgpt looks nowhere else for them),
    or an HF ``tokenizer.json`` or the folder holding one (run by the ``tokenizers`` library
    as the file says: :func:`~glassgpt.tokenizer.family.read_family`)."""
    path = Path(spec)
    if spec == "gpt2" and not path.exists():
        raise InputFileError(
            "--tokenizer gpt2: give the folder that holds GPT-2's encoder.json and vocab.bpe "
            "(e.g. --tokenizer ../shared/data/gpt2)"
        )
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return read_family(path)
        if (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
            return Tokenizer.from_gpt2(path / "encoder.json", path / "vocab.bpe")
        raise InputFileError(
            f"{path}: a folder without tokenizer.json or GPT-2's encoder.json and vocab.bpe"
        )
    return load_tokenizer(path)


def _is_hf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is JSON in HF's layout (a ``model`` table; glassgpt's has ``format``)."""
    try:
        data = files.read_json(path)
    except GlassError:
        return False
    return isinstance(data, dict) and "model" in data and "format" not in data
