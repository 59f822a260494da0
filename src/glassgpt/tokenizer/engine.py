"""The fast encoder: a compiled extension of our own, built from the tokenizer's tables.

    engine.encode_ordinary(text) == the merge loop of :mod:`.bpe` on text     (same ids)

:mod:`.bpe` is the definition (regex split, then pair merges by rank, in Python); this
module only makes it fast. For the ``"gpt2"`` and ``"gpt4"`` patterns, ``_fastbpe`` (C,
``tokenizer/_fastbpe.c``) splits with a hand-written scanner per pattern and merges with
the same loop; its Unicode classes (``\\p{L}``, ``\\p{N}``, ``\\s``, and which letters
``(?i:s)`` etc. match) come from a table computed with the ``regex`` module itself, once per
``regex`` version and user (:mod:`.classes`), so they are the reference's by construction.
It releases the GIL while it encodes, so threads run it on every core. Its cache of pieces
lives for one call: every call is cold.

Where the compiled extension is missing (installed without a C compiler), tiktoken's Rust
core encodes instead, only where the ids provably stay the same:

- tiktoken's merges by rank of concatenation are our pair merges (:func:`tiktoken_agrees`);
- the text holds no character that the two engines' Unicode tables class differently
  (``regex`` ships a newer Unicode: e.g. U+0558 is a letter there only); such a text is
  encoded by the Python loop.

Other patterns (a custom regex, or None) are encoded by the Python loop. Each fallback is
said once per reason and process with an :class:`EngineFallbackWarning`.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

import regex
import tiktoken

from glassgpt.tokenizer.classes import class_table
from glassgpt.tokenizer.corpus import fix_surrogates
from glassgpt.tokenizer.merge import bpe, bpe_heap, rank_table

FAST_PATTERNS = ("gpt2", "gpt4")
_CLASSES = (r"\p{L}", r"\p{N}", r"\s")
_LOW = 0x558  # with regex 2026.11 and tiktoken 0.14 the first character they class otherwise
_warned: set[str] = set()
_agreed: set[str] = set()  # characters both engines class alike
_differ: set[str] = set()  # characters they class differently
_WHOLE_TEXT = r"[\s\S]+"  # tiktoken needs a pattern; for "no split" one chunk is the whole text


class Vocabulary(Protocol):
    """What the engine reads of a tokenizer (:class:`~glassgpt.tokenizer.Tokenizer` has it)."""

    vocab: Sequence[bytes]
    merges: Mapping[tuple[int, int], int]
    pattern: str | None
    pattern_name: str | None
    special_tokens: Mapping[str, int]


class EngineFallbackWarning(UserWarning):
    """The compiled engine cannot encode here; a slower one (same ids) does."""


PYTHON_LOOP = "encoding with the Python merge loop (slower, same ids)"


def fall_back(reason: str, instead: str = PYTHON_LOOP) -> None:
    """Warn once per ``reason`` (and process) that another engine encodes instead."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"{reason}; {instead}", EngineFallbackWarning, stacklevel=4)


def compiled() -> Any | None:
    """The ``_fastbpe`` extension module, or None when it was not built."""
    try:
        return importlib.import_module("glassgpt.tokenizer._fastbpe")
    except ImportError:
        return None


def build(tok: Vocabulary) -> Any | None:
    """An object whose ``encode_ordinary`` gives ``tok``'s ids, or None (after a warning)."""
    if tok.pattern_name not in FAST_PATTERNS:
        what = "no pattern" if tok.pattern is None else "a custom pattern"
        fall_back(f"tokenizer with {what}: the fast engines know only 'gpt2' and 'gpt4'")
        return None
    ext = compiled()
    if ext is not None:
        return CompiledEngine(ext, tok)
    problem = tiktoken_agrees(tok)
    if problem is not None:
        fall_back(
            f"the compiled encoder is not built, and tiktoken's rank order would give "
            f"other ids ({problem})"
        )
        return None
    fall_back(
        "the compiled encoder glassgpt.tokenizer._fastbpe is not built (installed without a "
        "C compiler?)",
        "encoding with tiktoken's core (same ids)",
    )
    return to_tiktoken_encoding(tok)


class CompiledEngine:
    """``_fastbpe.Engine`` over ``tok``'s tables; lone surrogates become U+FFFD, as in :mod:`.bpe`."""

    def __init__(self, ext: Any, tok: Vocabulary) -> None:
        pairs = tok.merges  # not tok: the engine is held by tok, so no reference back (no cycle)
        merges = [(a, b, c) for (a, b), c in pairs.items()]
        vocab = list(tok.vocab)
        ranks: dict[tuple[int, int], int] = {}
        byte_ids: dict[int, int] = {}

        def long_bpe(data: bytes) -> list[int]:  # merge.py's O(n log n) loop, for long pieces
            if not ranks:
                ranks.update(rank_table(pairs))
                singles = reversed(list(enumerate(vocab)))
                byte_ids.update({t[0]: i for i, t in singles if len(t) == 1})
            return bpe_heap([byte_ids[x] for x in data], ranks)

        self.engine = ext.Engine(vocab, merges, class_table(), tok.pattern_name == "gpt4", long_bpe)

    def encode_ordinary(self, text: str) -> list[int]:
        try:
            return self.engine.encode(text)
        except UnicodeEncodeError:
            return self.engine.encode(fix_surrogates(text))


def tiktoken_agrees(tok: Vocabulary) -> str | None:
    """None if tiktoken encodes every text as ``tok`` does; else the first reason it may not.

    The condition of :func:`~glassgpt.interop.tiktoken_format.tiktoken_mismatches`, checked
    faster with our own merge loop: when merge order is id order and every token of two or
    more bytes is made by a merge, the rank-based loop on token c's bytes with ranks below
    c's ends in c's two parts exactly when our loop on c's bytes ends in ``[c]``, given that
    this holds for every lower rank (by induction: up to that rank the two loops take the
    same steps, and ours applies merges in increasing rank, so it reaches ``[c]`` only
    through c's own merge).

    >>> from glassgpt.tokenizer import Tokenizer
    >>> tiktoken_agrees(Tokenizer.from_merges([(b"a", b"b"), (b"ab", b"c")])) is None
    True
    >>> tiktoken_agrees(Tokenizer.from_merges([(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")]))
    "token 258 b'abc' is not reached by its merge (b'ab' + b'c'): our loop gives 2 tokens"
    """
    made = [new for new in tok.merges.values()]
    if made != sorted(made):
        return "merge order differs from id order (tiktoken's rank is the id)"
    n_long = sum(len(t) > 1 for t in tok.vocab)
    if n_long != len(made):
        return f"{n_long - len(made)} tokens of two or more bytes are made by no merge"
    vocab, ranks = tok.vocab, rank_table(tok.merges)
    byte_ids = {t[0]: i for i, t in enumerate(vocab) if len(t) == 1}
    for (a, b), new in tok.merges.items():
        if len(vocab[new]) == 2:  # two bytes: their pair is this merge
            continue
        ids = bpe([byte_ids[x] for x in vocab[new]], ranks)
        if ids != [new]:
            return (
                f"token {new} {tok.vocab[new]!r} is not reached by its merge "
                f"({tok.vocab[a]!r} + {tok.vocab[b]!r}): our loop gives {len(ids)} tokens"
            )
    return None


def to_tiktoken_encoding(tok: Vocabulary, name: str = "glassgpt") -> Any:
    """The ``tiktoken.Encoding`` with ``tok``'s tokens, pattern and special tokens."""
    return tiktoken.Encoding(
        name,
        pat_str=tok.pattern if tok.pattern is not None else _WHOLE_TEXT,
        mergeable_ranks={token: i for i, token in enumerate(tok.vocab)},
        special_tokens=dict(tok.special_tokens),
    )


def same_classes(text: str) -> bool:
    """Whether ``regex`` and tiktoken class every character of ``text`` alike (\\p{L}, \\p{N}, \\s).

    Always True where the compiled engine encodes (it reads the ``regex`` module's classes).

    >>> same_classes("naïve 日本語 🙂")
    True
    """
    if text.isascii() or compiled() is not None:
        return True
    new = set(_beyond_agreed().findall(text)) - _agreed
    if not new:
        return True
    new = {"\ufffd" if "\ud800" <= c <= "\udfff" else c for c in new}  # as tiktoken reads them
    _classify(new - _differ)
    if new & _differ:
        fall_back(
            "a text holds characters (e.g. U+0558) that tiktoken's Unicode tables class "
            "otherwise than the regex module's"
        )
        return False
    return True


@lru_cache(maxsize=1)
def _beyond_agreed() -> re.Pattern[str]:
    """A regex for the characters past the first run of code points both engines agree on."""
    low = "".join(map(chr, range(_LOW)))
    _classify(set(low))
    first = min((ord(c) for c in _differ if ord(c) < _LOW), default=_LOW)
    return re.compile(f"[^\\x00-\\U{first - 1:08x}]")


def _classify(chars: set[str]) -> None:
    """Sort ``chars`` into those the two engines class alike and those they class otherwise."""
    if not chars:
        return
    fresh = "".join(sorted(chars))
    differ: set[str] = set()
    for cls in _CLASSES:
        differ |= set(regex.findall(cls, fresh)) ^ set(tiktoken_class(cls, fresh))
    _differ.update(differ)
    _agreed.update(chars - differ)


def tiktoken_class(cls: str, text: str) -> str:
    """The characters of ``text`` that tiktoken's regex engine puts in ``cls``.

    tiktoken encodes only what its pattern matches, so an encoding whose pattern is ``cls``
    and whose tokens are the 256 single bytes hands back exactly the matching characters.
    """
    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(f"class {cls}", pat_str=cls, mergeable_ranks=ranks, special_tokens={})
    return enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8")
