"""How a token is shown to a reader: one function for the explorer, the inspect report, the
figures of ``patch`` and the feature pages.

A byte-level token need not be whole UTF-8 characters (``b"\\xe2\\x80"`` is two thirds of
"—"); its bytes that are not part of a whole character are shown as ``<0xE2>``, never as �.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any


def show_bytes(data: bytes) -> str:
    """The text of ``data``, each byte outside a whole UTF-8 character as ``<0xNN>``.

    >>> show_bytes("—".encode()[:2]), show_bytes(b"a\\xffb"), show_bytes(" é".encode())
    ('<0xE2><0x80>', 'a<0xFF>b', ' é')
    """
    out, i = [], 0
    while i < len(data):
        try:
            text = data[i:].decode("utf-8")
        except UnicodeDecodeError as e:
            out.append(data[i : i + e.start].decode("utf-8"))
            bad = max(e.end - e.start, 1)
            out.extend(f"<0x{b:02X}>" for b in data[i + e.start : i + e.start + bad])
            i += e.start + bad
        else:
            out.append(text)
            break
    return "".join(out)


def token_texts(tokenizer: Any, ids: Iterable[int]) -> list[str]:
    """The text of each id on its own: bytes that are not whole characters as ``<0xNN>``; ids
    of a model vocabulary padded beyond the tokenizer's as ``<pad N>``.

    >>> from glassgpt.tokenizer import CharTokenizer
    >>> token_texts(CharTokenizer(["a", "b"]), [1, 0, 7])
    ['b', 'a', '<pad 7>']
    """
    out = []
    n_vocab = getattr(tokenizer, "n_vocab", None)
    for i in ids:
        if n_vocab is not None and i >= n_vocab:
            out.append(f"<pad {i}>")
        elif hasattr(tokenizer, "decode_bytes"):
            out.append(show_bytes(tokenizer.decode_bytes([i])))
        else:
            out.append(tokenizer.decode([i]))
    return out


def visible(text: str, width: int | None = None) -> str:
    """A token's text with its whitespace and controls made visible (spaces as ␣, newlines as
    ``\\n``), cut to ``width`` characters with …; ∅ for the empty text.

    >>> visible(" the"), visible("a\\nb"), visible("x" * 20, width=5), visible("")
    ('␣the', 'a\\\\nb', 'xxxx…', '∅')
    """
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif unicodedata.category(ch)[0] == "C":
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    label = "".join(out) or "∅"
    return label if width is None or len(label) <= width else label[: width - 1] + "…"


def visible_tokens(tokenizer: Any, ids: Sequence[int], width: int | None = None) -> list[str]:
    """:func:`visible` of each of :func:`token_texts`."""
    return [visible(t, width) for t in token_texts(tokenizer, ids)]
