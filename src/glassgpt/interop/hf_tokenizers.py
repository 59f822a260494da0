"""Hugging Face ``tokenizer.json`` (ByteLevel BPE) export and import.

A byte-level BPE vocabulary is written in GPT-2's printable alphabet: each byte b becomes
one character u(b),

    u(b) = chr(b)          for b in '!'..'~', 0xA1..0xAC, 0xAE..0xFF   (printable)
    u(b) = chr(256 + n)    for the n-th remaining byte (0x00..0x20, 0x7F..0xA0, 0xAD)

and a token t = b_1 … b_k becomes u(b_1) … u(b_k). The file holds the vocabulary
(string → id), the merges in rank order ("x y"), the pre-tokenizer (the regex split, then
ByteLevel's byte → character map), the ByteLevel decoder and the special tokens.
"""

from __future__ import annotations

from functools import lru_cache

from glassgpt.errors import GlassError

__all__ = ["bytes_to_unicode", "token_to_unicode", "unicode_to_bytes"]


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map u: byte → printable character (see the module docstring).

    >>> u = bytes_to_unicode()
    >>> u[ord("A")], u[ord(" ")], u[0], u[0xAD], len(set(u.values()))
    ('A', 'Ġ', 'Ā', 'Ń', 256)
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + n) for n, b in enumerate(others)})
    return table


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_unicode(token: bytes) -> str:
    """A token's bytes in GPT-2's alphabet.

    >>> token_to_unicode(" héllo".encode())
    'ĠhÃ©llo'
    """
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def unicode_to_bytes(text: str) -> bytes:
    """The inverse of :func:`token_to_unicode`; a character outside the alphabet is an error.

    >>> unicode_to_bytes("ĠhÃ©llo").decode()
    ' héllo'
    """
    table = _unicode_to_byte()
    try:
        return bytes(table[c] for c in text)
    except KeyError as err:
        raise GlassError(
            f"token {text!r} has the character {err.args[0]!r}, outside the ByteLevel alphabet"
        ) from None
