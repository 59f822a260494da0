"""Read a saved tokenizer of either kind, as its ``"kind"`` field says; or GPT-2's files.

:mod:`.bpe` and :mod:`.char` know nothing of each other; this module reads both.
"""

from __future__ import annotations

import os
from pathlib import Path

from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer import files
from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer

KINDS: dict[str, type[Tokenizer] | type[CharTokenizer]] = {
    Tokenizer.kind: Tokenizer,
    CharTokenizer.kind: CharTokenizer,
}


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer | CharTokenizer:
    """Read a saved tokenizer of either kind: a ``Tokenizer`` or a ``CharTokenizer``."""
    data = files.read_tokenizer_json(path)
    kind = data.get("kind")
    if kind not in KINDS:
        raise GlassError(f"{path}: unknown tokenizer kind {kind!r} (expected 'bpe' or 'char')")
    return KINDS[kind].from_dict(data, str(Path(path)))


def open_tokenizer(spec: str) -> Tokenizer | CharTokenizer:
    """The tokenizer a ``--tokenizer`` value names: a saved tokenizer (either kind) or a folder
    holding GPT-2's ``encoder.json`` and ``vocab.bpe`` (glassgpt looks nowhere else for them)."""
    path = Path(spec)
    if spec == "gpt2" and not path.exists():
        raise InputFileError(
            "--tokenizer gpt2: give the folder that holds GPT-2's encoder.json and vocab.bpe "
            "(e.g. --tokenizer ../shared/data/gpt2)"
        )
    if path.is_dir():
        if (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
            return Tokenizer.from_gpt2(path / "encoder.json", path / "vocab.bpe")
        raise InputFileError(f"{path}: a folder without GPT-2's encoder.json and vocab.bpe")
    return load_tokenizer(path)
