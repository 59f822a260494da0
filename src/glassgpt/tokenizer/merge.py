"""Byte-pair merging of one chunk: merges applied lowest rank first.

    repeat:  (a, b) = argmin over adjacent pairs of rank(a, b)      (stop if none has a rank)
             replace every non-overlapping (a, b), left to right, by merges[(a, b)]

This is GPT-2's original ``bpe()`` on ids instead of strings. :func:`bpe` runs it as
written, which is fastest for the short chunks a pre-tokenizer makes; :func:`bpe_heap`
gives the same ids in O(n log n) for long chunks (the ``pattern=None`` case, where the
whole text is one chunk). They agree whenever each merge's operands exist before it (a
base token or the result of a lower-ranked merge) and each result comes from one merge
only (:func:`check_merge_order`): then every pair a merge creates ranks above it, so the
heap's (rank, position) order visits the pairs exactly as the repeated scan does.

>>> ranks = {(1, 2): (0, 4), (4, 3): (1, 5), (4, 4): (2, 6)}   # pair → (rank, merged id)
>>> bpe([1, 2, 3, 1, 2, 1, 2], ranks)
[5, 6]
>>> bpe_heap([1, 2, 3, 1, 2, 1, 2], ranks)
[5, 6]
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from itertools import pairwise

from glassgpt.errors import GlassError

Ranks = Mapping[tuple[int, int], tuple[int, int]]
_NO_RANK = (1 << 62, -1)

HEAP_MIN_LEN = 400  # chunks longer than this use bpe_heap


def bpe(ids: list[int], ranks: Ranks) -> list[int]:
    """Merge ``ids`` (a list, modified) by repeated lowest-rank scans; returns the ids.

    ``ranks`` maps a pair of ids to ``(rank, merged id)``.

    >>> bpe([7, 7, 7], {(7, 7): (0, 9)})
    [9, 7]
    """
    get = ranks.get
    while len(ids) > 1:
        (_, new), (a, b) = min((get(pair, _NO_RANK), pair) for pair in pairwise(ids))
        if new < 0:
            break
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                out.append(new)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


def bpe_heap(ids: list[int], ranks: Ranks) -> list[int]:
    """The same merges as :func:`bpe`, with a heap of (rank, position) over a linked list.

    >>> bpe_heap([7, 7, 7, 7, 7], {(7, 7): (0, 9), (9, 9): (1, 10)})
    [10, 7]
    """
    n = len(ids)
    if n < 2:
        return list(ids)
    val = list(ids)  # val[i] = -1 once node i is merged into its left neighbour
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = []
    for i in range(n - 1):
        r = get((val[i], val[i + 1]))
        if r is not None:
            heap.append((r[0], i, val[i], val[i + 1], r[1]))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        _, i, a, b, new = pop(heap)
        j = nxt[i]
        if val[i] != a or j < 0 or val[j] != b:
            continue  # stale: one side was merged since this pair was pushed
        val[i], val[j] = new, -1
        k = nxt[j]
        nxt[i] = k
        if k >= 0:
            prv[k] = i
            r = get((new, val[k]))
            if r is not None:
                push(heap, (r[0], i, new, val[k], r[1]))
        h = prv[i]
        if h >= 0:
            r = get((val[h], new))
            if r is not None:
                push(heap, (r[0], h, val[h], new, r[1]))
    out, i = [], 0
    while i >= 0:
        out.append(val[i])
        i = nxt[i]
    return out


def check_merge_order(merges: Mapping[tuple[int, int], int], n_vocab: int) -> None:
    """Raise :class:`GlassError` unless each merge's operands exist before it (see module).

    >>> check_merge_order({(1, 2): 4, (4, 3): 5}, 6)
    >>> check_merge_order({(5, 3): 4, (1, 2): 5}, 6)
    Traceback (most recent call last):
    ...
    glassgpt.errors.GlassError: merge 0 (5, 3) -> 4 uses token 5, which merge 1 makes
    """
    made_at: dict[int, int] = {}
    for rank, ((a, b), new) in enumerate(merges.items()):
        for t in (a, b, new):
            if not 0 <= t < n_vocab:
                raise GlassError(f"merge {rank} ({a}, {b}) -> {new}: id {t} is not in the vocab")
        if new in made_at:
            raise GlassError(f"merges {made_at[new]} and {rank} both make token {new}")
        made_at[new] = rank
    for rank, ((a, b), new) in enumerate(merges.items()):
        for t in (a, b):
            if made_at.get(t, -1) >= rank:
                raise GlassError(
                    f"merge {rank} ({a}, {b}) -> {new} uses token {t}, which merge {made_at[t]} makes"
                )
