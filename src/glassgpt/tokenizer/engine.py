"""The fast encoder: tiktoken's Rust core, built from the tokenizer's own tokens.

    engine.encode_ordinary(text) == the merge loop of :mod:`.bpe` on text     (same ids)

:mod:`.bpe` is the definition (regex split, then pair merges by rank, in Python); this
module only makes it fast, and only where the ids provably stay the same:

- the pattern is ``"gpt2"`` or ``"gpt4"``, which tiktoken's regex engine reads as the
  ``regex`` module does (a custom regex may not be read the same way; ``None``, one chunk
  per text, would hit tiktoken's merge loop, quadratic in the chunk length);
- tiktoken's merges by rank of concatenation are our pair merges
  (:func:`~glassgpt.interop.tiktoken_format.tiktoken_agrees`);
- the text holds no character that the two engines' Unicode tables class differently
  (``regex`` ships a newer Unicode: e.g. U+0558 is a letter there only); such a text is
  encoded by the Python loop.

Where one of these fails, a :class:`EngineFallbackWarning` says which, once per reason
and process, and the Python loop encodes. tiktoken releases the GIL while it encodes, so
threads run it on every core.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:
    from glassgpt.tokenizer.bpe import Tokenizer

FAST_PATTERNS = ("gpt2", "gpt4")
_CLASSES = (r"\p{L}", r"\p{N}", r"\s")
_LOW = 0x558  # with regex 2026.11 and tiktoken 0.14 the first character they class otherwise
_warned: set[str] = set()
_agreed: set[str] = set()  # characters both engines class alike
_differ: set[str] = set()  # characters they class differently


class EngineFallbackWarning(UserWarning):
    """The fast engine cannot give the reference ids here; the Python loop encodes."""


def fall_back(reason: str) -> None:
    """Warn once per ``reason`` (and process) that the Python loop encodes instead."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"{reason}; encoding with the Python merge loop (slower, same ids)",
            EngineFallbackWarning,
            stacklevel=4,
        )


def build(tok: Tokenizer) -> Any | None:
    """The ``tiktoken.Encoding`` giving ``tok``'s ids, or None (after a warning) if none can."""
    from glassgpt.interop.tiktoken_format import tiktoken_agrees, to_tiktoken_encoding

    if tok.pattern_name not in FAST_PATTERNS:
        what = "no pattern" if tok.pattern is None else "a custom pattern"
        fall_back(f"tokenizer with {what}: tiktoken's core is used only for 'gpt2' and 'gpt4'")
        return None
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        fall_back("tiktoken is not installed")
        return None
    problem = tiktoken_agrees(tok)
    if problem is not None:
        fall_back(f"tiktoken's rank order would give other ids ({problem})")
        return None
    return to_tiktoken_encoding(tok)


def same_classes(text: str) -> bool:
    """Whether ``regex`` and tiktoken class every character of ``text`` alike (\\p{L}, \\p{N}, \\s).

    >>> same_classes("naïve 日本語 🙂"), same_classes("\u0558")
    (True, False)
    """
    if text.isascii():
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
    import tiktoken

    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(f"class {cls}", pat_str=cls, mergeable_ranks=ranks, special_tokens={})
    return enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8")
