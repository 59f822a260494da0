"""glassgpt.tokenizer: text ↔ token ids.

    ids = tok.encode(text)          text = tok.decode(ids)        decode(encode(s)) == s

- :class:`Tokenizer`: byte-level BPE (train your own, or GPT-2's original files with ids
  identical to tiktoken's ``gpt2``);
- :class:`CharTokenizer`: one id per character, for character-level models;
- :func:`load_tokenizer`: read either kind from its JSON file.

The names load on first use, so ``glassgpt --help`` does not import ``regex``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassgpt.tokenizer.bpe import Tokenizer
    from glassgpt.tokenizer.char import CharTokenizer
    from glassgpt.tokenizer.loading import load_tokenizer
    from glassgpt.tokenizer.special import SpecialTokenError

__all__ = ["CharTokenizer", "SpecialTokenError", "Tokenizer", "load_tokenizer"]

_HOMES = {
    "Tokenizer": "glassgpt.tokenizer.bpe",
    "CharTokenizer": "glassgpt.tokenizer.char",
    "load_tokenizer": "glassgpt.tokenizer.loading",
    "SpecialTokenError": "glassgpt.tokenizer.special",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'glassgpt.tokenizer' has no attribute {name!r}")
