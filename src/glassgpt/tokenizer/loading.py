"""Read a saved tokenizer of either kind, as its ``"kind"`` field says.

Above both :mod:`.bpe` and :mod:`.char`, which know nothing of each other.
"""

from __future__ import annotations

import os
from pathlib import Path

from glassgpt.errors import GlassError
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
