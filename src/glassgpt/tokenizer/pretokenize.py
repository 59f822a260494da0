"""Pre-tokenization: text → chunks by a regex, before any merge.

    chunks(text) = re.findall(pattern, text)        with  "".join(chunks(text)) == text

BPE merges never cross a chunk boundary, so the pattern decides what a token can be (a
word with its leading space, a run of digits, a run of punctuation, a run of whitespace).
Two patterns are named:

- ``"gpt2"``: GPT-2's pattern, exactly as its ``encoder.py`` wrote it;
- ``"gpt4"``: the pattern of tiktoken's ``cl100k_base`` (digits in groups of at most 3,
  case-insensitive contractions, newlines kept with punctuation).

``\\s`` in both is Unicode White_Space (:data:`WHITESPACE`), as in the ``regex`` module and
in tiktoken's Rust engine; Python's ``re`` would also count U+001C..U+001F.

What this module adds beyond ``regex.findall`` is speed, with the same chunks:

- for ASCII-only text the stdlib ``re`` runs an equivalent pattern with explicit ASCII
  classes (about twice as fast as ``regex`` with ``\\p{L}``);
- :func:`space_segments` cuts text at *safe spaces* (see its docstring), so an encoder
  can cache whole space-separated pieces: one dict lookup per word of prose.

>>> split("Hello world's  123 🙂!", "gpt2")
['Hello', ' world', "'s", ' ', ' 123', ' 🙂!']
>>> split("Hello world's  1234!!\\n\\n", "gpt4")
['Hello', ' world', "'s", ' ', ' ', '123', '4', '!!\\n\\n']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

import regex

from glassgpt.errors import ConfigError

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
    r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}

# Unicode White_Space: what ``\s`` means in these patterns (``regex`` and tiktoken agree).
WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

# The same patterns restricted to ASCII text: \p{L} → [A-Za-z], \p{N} → [0-9],
# \s → [\t\n\x0b\x0c\r ]. Equal chunks on any ASCII str (tested against tiktoken).
# No possessive quantifiers: each one above is followed by nothing that could backtrack
# into it, so the plain quantifier matches the same (and `re` gets them only in 3.11).
_W = r"\t\n\x0b\x0c\r "
_ASCII_PATTERNS: dict[str, str] = {
    "gpt2": (
        rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_W}A-Za-z0-9]+"""
        rf"""|[{_W}]+(?![^{_W}])|[{_W}]+"""
    ),
    "gpt4": (
        rf"""'(?i:[sdmt]|ll|ve|re)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{{1,3}}"""
        rf"""| ?[^{_W}A-Za-z0-9]+[\r\n]*|[{_W}]+\Z|[{_W}]*[\r\n]|[{_W}]+(?![^{_W}])|[{_W}]"""
    ),
}

# A safe space (one right after a non-whitespace character); for re.split.
_WS_CLASS = "".join(f"\\u{ord(c):04x}" for c in sorted(WHITESPACE))
SAFE_SPACE = re.compile(f" (?<=[^{_WS_CLASS}] )")

Splitter = Callable[[str], list[str]]


def resolve_pattern(pattern: str | None) -> tuple[str | None, str | None]:
    """``pattern`` (a name, a regex, or None) → ``(regex source, name)``.

    >>> resolve_pattern("gpt2")[1], resolve_pattern(GPT4_PATTERN)[1], resolve_pattern(None)
    ('gpt2', 'gpt4', (None, None))
    >>> resolve_pattern(r"\\w+|\\W+")
    ('\\\\w+|\\\\W+', None)
    """
    if pattern is None or pattern == "none":
        return None, None
    if pattern in PATTERNS:
        return PATTERNS[pattern], pattern
    for name, source in PATTERNS.items():
        if pattern == source:
            return source, name
    try:
        regex.compile(pattern)
    except regex.error as e:
        raise ConfigError("pattern", f"not a valid regex ({e}): {pattern!r}") from None
    return pattern, None


@lru_cache(maxsize=16)
def splitter(pattern: str | None) -> Splitter:
    """The fastest function ``text → chunks`` for a pattern (regex source or None)."""
    if pattern is None:
        return lambda text: [text] if text else []
    _, name = resolve_pattern(pattern)
    general = regex.compile(pattern).findall
    if name is None:
        return general
    ascii_findall = re.compile(_ASCII_PATTERNS[name], re.ASCII).findall

    def split_text(text: str) -> list[str]:
        return ascii_findall(text) if text.isascii() else general(text)

    return split_text


def split(text: str, pattern: str | None) -> list[str]:
    """Pre-tokenize ``text`` with ``pattern`` (``"gpt2"``, ``"gpt4"``, a regex, or None)."""
    return splitter(resolve_pattern(pattern)[0])(text)


def good_end(piece: str) -> bool:
    """True when ``piece`` is non-empty and does not end in whitespace.

    >>> [good_end(p) for p in ["word", "", "a\\n", "a\\u3000", "."]]
    [True, False, False, False, True]
    """
    return bool(piece) and piece[-1] not in WHITESPACE


def space_segments(text: str) -> list[str]:
    """Cut ``text`` before each *safe space* (a space whose left neighbour is not whitespace).

    For the named patterns, a safe space always starts a chunk, and the chunks of ``text``
    are the chunks of each segment in turn: the chunk holding the non-space character before
    it cannot contain a space (letter, digit and punctuation runs take none, whitespace runs
    take no non-space), and the regex matches at a position depend only on the text after
    it, where the lone look-ahead ``(?!\\S)`` ends a whitespace run, and a segment never ends
    in one. The encoder makes this cut with :data:`SAFE_SPACE` (``re.split``) to cache whole
    pieces; this plain version states it and the tests hold the two equal.

    >>> space_segments("To be,  or not\\n to be")
    ['To', ' be,', '  or', ' not\\n to', ' be']
    >>> "".join(space_segments(" a  b ")) == " a  b "
    True
    """
    pieces = text.split(" ")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if good_end(out[-1]):
            out.append(" " + piece)
        else:
            out[-1] += " " + piece
    return out
