"""Character-level tokenizer: one id per distinct character of the training text.

    chars = sorted(set(corpus))      encode(s) = [chars.index(c) for c in s]
    decode(ids) = "".join(chars[i] for i in ids)

The interface is :class:`~glassgpt.tokenizer.Tokenizer`'s (``encode``, ``encode_batch``,
``decode``, ``decode_bytes``, ``n_vocab``, ``special_tokens``, ``save``/``load``, ``train``),
so a character model swaps one for the other. A character outside ``chars`` is an error.

>>> tok = CharTokenizer.train(["hello world"])
>>> tok.chars, tok.encode("hold")
([' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w'], [3, 5, 4, 1])
>>> tok.decode(tok.encode("hello")), tok.n_vocab
('hello', 8)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from glassgpt.errors import GlassError
from glassgpt.tokenizer import files
from glassgpt.tokenizer.corpus import TextOrPath, iter_texts
from glassgpt.tokenizer.special import (
    SpecialSet,
    check_disallowed,
    encode_with_specials,
    resolve,
    split_special,
)


class CharTokenizer(files.SavedAsJson):
    """``CharTokenizer(chars, *, special_tokens=())``: ids 0.. the characters, then the specials."""

    kind = "char"

    def __init__(self, chars: Sequence[str], *, special_tokens: Sequence[str] = ()) -> None:
        self.chars: list[str] = list(chars)
        seen: set[str] = set()
        for i, c in enumerate(self.chars):
            if not isinstance(c, str) or len(c) != 1:
                raise GlassError(f"chars: entry {i} must be one character, got {c!r}")
            if c in seen:
                raise GlassError(f"chars: {c!r} appears twice")
            seen.add(c)
        self.special_tokens: dict[str, int] = {}
        for s in special_tokens:
            if not isinstance(s, str) or not s or s in self.special_tokens:
                raise GlassError(f"special token {s!r} must be a non-empty str, given once")
            self.special_tokens[s] = len(self.chars) + len(self.special_tokens)
        self._ids = {c: i for i, c in enumerate(self.chars)}
        self._decoder = dict(enumerate(self.chars))
        self._decoder.update({i: s for s, i in self.special_tokens.items()})

    @property
    def vocab(self) -> list[str]:
        """The characters by id (ordinary ids only), like ``Tokenizer.vocab``."""
        return self.chars

    @property
    def n_vocab(self) -> int:
        """Number of ids: characters + special tokens."""
        return len(self.chars) + len(self.special_tokens)

    def __repr__(self) -> str:
        return f"CharTokenizer(n_vocab={self.n_vocab}, special_tokens={list(self.special_tokens)})"

    @classmethod
    def train(
        cls,
        texts_or_paths: Iterable[TextOrPath] | TextOrPath,
        *,
        special_tokens: Sequence[str] = (),
    ) -> CharTokenizer:
        """The sorted set of characters of all inputs (str texts or file paths)."""
        specials = frozenset(special_tokens)
        chars: set[str] = set()
        for _, text in iter_texts(texts_or_paths):
            for part in split_special(text, specials)[::2]:
                chars.update(part)
        if not chars:
            raise GlassError("empty corpus: the inputs hold no text to train on")
        return cls(sorted(chars), special_tokens=special_tokens)

    def encode_ordinary(self, text: str) -> list[int]:
        """One id per character; special-token strings are ordinary text."""
        try:
            return list(map(self._ids.__getitem__, text))
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._ids)
            raise GlassError(
                f"character {text[pos]!r} (U+{ord(text[pos]):04X}) at position {pos} "
                "is not in this character tokenizer's vocabulary"
            ) from None

    def encode(
        self,
        text: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[int]:
        """Encode ``text``; special tokens follow tiktoken's policy, as in ``Tokenizer``."""
        allowed, disallowed = resolve(self.special_tokens, allowed_special, disallowed_special)
        check_disallowed(text, disallowed)
        return encode_with_specials(text, allowed, self.special_tokens, self.encode_ordinary)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids: special strings read as their ids (no BOS), as in ``Tokenizer``."""
        return self.encode(text, allowed_special="all")

    def encode_batch(self, texts: Sequence[str], **kw: Any) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (one process: character lookup is already fast)."""
        kw.pop("num_workers", None)
        return [self.encode(t, **kw) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The characters (and special strings) of ``ids``."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        try:
            return "".join(map(self._decoder.__getitem__, ids))
        except (KeyError, TypeError):
            bad = next(i for i in ids if not (isinstance(i, int) and i in self._decoder))
            raise GlassError(
                f"token id {bad!r} is not in this tokenizer (ids are 0..{self.n_vocab - 1})"
            ) from None

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """``decode(ids)`` as UTF-8."""
        return self.decode(ids).encode("utf-8", errors="surrogatepass")

    def _fields(self) -> dict[str, Any]:
        return {"chars": self.chars, "special_tokens": list(self.special_tokens)}

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> CharTokenizer:
        return cls(list(data["chars"]), special_tokens=list(data["special_tokens"]))
