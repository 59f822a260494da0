"""Bounded caches text → ids, filled on a miss.

    cache[text] = ids(text)      computed once, kept while the cache has room

Both are ``dict`` subclasses whose ``__missing__`` computes the ids, so a lookup that hits
is the C ``dict.__getitem__`` and ``list(map(cache.__getitem__, keys))`` runs without a
Python-level loop. When a cache reaches ``CACHE_MAX`` entries it is emptied; texts
longer than ``CACHE_KEY_MAX`` characters are encoded but not kept.

>>> c = Cache(lambda text: (len(text),))
>>> c["abc"], "abc" in c, c["x" * 300], len(c)
((3,), True, (300,), 1)
"""

from __future__ import annotations

from typing import Any

from glassgpt.tokenizer.pretokenize import WHITESPACE

CACHE_MAX = 1 << 17  # entries per cache before it is cleared
CACHE_KEY_MAX = 256  # longer texts are encoded but not kept
BAD = object()  # a piece ending in whitespace: not followed by a chunk boundary


class Cache(dict):  # type: ignore[type-arg]
    """text → ids; a miss calls ``fill(text)`` and keeps the result."""

    __slots__ = ("_fill",)

    def __init__(self, fill: Any) -> None:
        super().__init__()
        self._fill = fill

    def __missing__(self, text: str) -> tuple[int, ...]:
        ids = self._fill(text)
        if len(text) > CACHE_KEY_MAX:
            return ids
        if len(self) >= CACHE_MAX:
            self.clear()
        self[text] = ids
        return ids


class PieceCache(dict):  # type: ignore[type-arg]
    """piece → ids of ``" " + piece``; ``BAD`` (not cached) for a piece ending in whitespace."""

    __slots__ = ("_spaced",)

    def __init__(self, spaced: Any) -> None:
        super().__init__()
        self._spaced = spaced

    def __missing__(self, piece: str) -> Any:
        if not piece or piece[-1] in WHITESPACE:
            return BAD
        ids = self._spaced(piece)
        if len(piece) > CACHE_KEY_MAX:
            return ids
        if len(self) >= CACHE_MAX:
            self.clear()
        self[piece] = ids
        return ids
