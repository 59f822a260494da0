"""glassgpt.tokenizer: text ↔ token ids.

    ids = tok.encode(text)          text = tok.decode(ids)        decode(encode(s)) == s

- :class:`Tokenizer`: byte-level BPE (train your own, or GPT-2's original files with ids
  identical to tiktoken's ``gpt2``);
- :class:`CharTokenizer`: one id per character, for character-level models;
- :class:`FamilyTokenizer`: a model family's own HF ``tokenizer.json`` (Llama 3, Qwen, Gemma,
  Llama 2 …), run by the ``tokenizers`` library, ids equal to ``AutoTokenizer``'s;
- :func:`load_tokenizer`: read either kind from its JSON file; :func:`open_tokenizer`: that,
  or a folder of GPT-2's files (what ``--tokenizer`` takes).
"""

from __future__ import annotations

from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer
from glassgpt.tokenizer.family import FamilyTokenizer
from glassgpt.tokenizer.loading import load_tokenizer, open_tokenizer
from glassgpt.tokenizer.special import SpecialTokenError

__all__ = [
    "CharTokenizer",
    "FamilyTokenizer",
    "SpecialTokenError",
    "Tokenizer",
    "load_tokenizer",
    "open_tokenizer",
]
