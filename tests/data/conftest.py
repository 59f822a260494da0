"""Fixtures for the data tests: a character tokenizer with a free id offset (``char_tok``).

``OffsetCharTokenizer`` maps the i-th character of its alphabet to ``offset + i``; with a large
offset its ids need uint32, which no real tokenizer of a test-friendly size reaches; it is the
independent oracle for the shard dtype rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassgpt.errors import GlassError


class OffsetCharTokenizer:
    def __init__(self, chars: str, offset: int = 0) -> None:
        self.chars = "".join(sorted(set(chars)))
        self.offset = offset
        self.stoi = {c: offset + i for i, c in enumerate(self.chars)}
        self.n_vocab = offset + len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise GlassError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def encode_batch(self, texts, allowed_special=(), disallowed_special=()):
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        inv = {i: c for c, i in self.stoi.items()}
        return "".join(inv[int(i)] for i in ids)

    def save(self, path) -> None:
        doc = {"kind": "offset-char", "chars": self.chars, "offset": self.offset}
        Path(path).write_text(json.dumps(doc, indent=2))


@pytest.fixture(scope="session")
def char_tok():
    return OffsetCharTokenizer
