"""Byte-pair merging of one chunk: merges applied lowest rank first.

    repeat:  (a, b) = argmin over adjacent pairs of rank(a, b)      (stop if none has a rank)
             replace every non-overlapping (a, b), left to right, by merges[(a, b)]

This is GPT-2's original ``bpe()`` on ids instead of strings. :func:`bpe` merges the
leftmost lowest-rank pair at each step, which is the same thing (the next steps take the
remaining occurrences of that pair, left to right) and keeps the pair ranks in a list
updated in place; it is fastest for the short chunks a pre-tokenizer makes. :func:`bpe_heap`
gives the same ids in O(n log n) for long chunks (the ``pattern=None`` case, where the
whole text is one chunk). Both rely on each merge's operands existing before it (a base
token or the result of a lower-ranked merge) and each result coming from one merge only
(:func:`check_merge_order`): then every pair a merge creates ranks above it.

A pair's rank and merged id travel packed in one int, ``rank << 32 | merged id``
(:func:`pack`), so the lowest rank is a plain ``min`` over ints.

>>> ranks = {(1, 2): pack(0, 4), (4, 3): pack(1, 5), (4, 4): pack(2, 6)}
>>> bpe([1, 2, 3, 1, 2, 1, 2], ranks)
[5, 6]
>>> bpe_heap([1, 2, 3, 1, 2, 1, 2], ranks)
[5, 6]
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import chain, pairwise, repeat
from operator import eq, itemgetter, lt

from glassgpt.errors import GlassError

Ranks = Mapping[tuple[int, int], int]  # pair -> pack(rank, merged id)
NO_MERGE = 1 << 62
_ID_MASK = (1 << 32) - 1

HEAP_MIN_LEN = 400  # chunks longer than this use bpe_heap


def pack(rank: int, new: int) -> int:
    """``rank`` and merged id in one int that sorts by rank."""
    return rank << 32 | new


def rank_table(merges: Mapping[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    """``{pair: pack(rank, merged id)}`` for merges in rank order, as :func:`bpe` reads them.

    >>> rank_table({(1, 2): 4, (4, 3): 5}) == {(1, 2): pack(0, 4), (4, 3): pack(1, 5)}
    True
    """
    return {pair: pack(rank, new) for rank, (pair, new) in enumerate(merges.items())}


def bpe(ids: list[int], ranks: Ranks) -> list[int]:
    """Merge ``ids`` (a list, modified in place) lowest rank first; returns it.

    >>> bpe([7, 7, 7], {(7, 7): pack(0, 9)})
    [9, 7]
    """
    if len(ids) < 2:
        return ids
    get = ranks.get
    codes = [get(pair, NO_MERGE) for pair in pairwise(ids)]  # codes[i]: pair (ids[i], ids[i+1])
    while codes:
        best = min(codes)
        if best == NO_MERGE:
            break
        i = codes.index(best)
        new = best & _ID_MASK
        ids[i : i + 2] = (new,)
        del codes[i]
        if i < len(codes):
            codes[i] = get((new, ids[i + 1]), NO_MERGE)
        if i:
            codes[i - 1] = get((ids[i - 1], new), NO_MERGE)
    return ids


def bpe_heap(ids: list[int], ranks: Ranks) -> list[int]:
    """The same merges as :func:`bpe`, with a heap of (rank, position) over a linked list.

    >>> bpe_heap([7, 7, 7, 7, 7], {(7, 7): pack(0, 9), (9, 9): pack(1, 10)})
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
        code = get((val[i], val[i + 1]))
        if code is not None:
            heap.append((code, i, val[i], val[i + 1]))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        code, i, a, b = pop(heap)
        j = nxt[i]
        if val[i] != a or j < 0 or val[j] != b:
            continue  # stale: one side was merged since this pair was pushed
        new = code & _ID_MASK
        val[i], val[j] = new, -1
        k = nxt[j]
        nxt[i] = k
        if k >= 0:
            prv[k] = i
            code = get((new, val[k]))
            if code is not None:
                push(heap, (code, i, new, val[k]))
        h = prv[i]
        if h >= 0:
            code = get((val[h], new))
            if code is not None:
                push(heap, (code, h, val[h], new))
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
    made = list(merges.values())
    ids = [*chain.from_iterable(merges), *made]
    made_at = dict(zip(made, range(len(made))))
    if ids and (min(ids) < 0 or max(ids) >= n_vocab or len(made_at) != len(made)):
        _explain_merge_order(merges, n_vocab)
    # each operand made at a lower rank (a base token: -1) than the merge that uses it
    firsts = map(made_at.get, map(itemgetter(0), merges), repeat(-1))
    seconds = map(made_at.get, map(itemgetter(1), merges), repeat(-1))
    if not all(map(lt, map(max, firsts, seconds), range(len(made)))):
        _explain_merge_order(merges, n_vocab)


def _explain_merge_order(merges: Mapping[tuple[int, int], int], n_vocab: int) -> None:
    """The merge-by-merge check, for its error message (slower than the check above)."""
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


def check_tables(
    vocab: Sequence[bytes], merges: Mapping[tuple[int, int], int], special_tokens: Mapping[str, int]
) -> None:
    """Raise :class:`GlassError` unless the tables make a byte-level BPE tokenizer.

    Each token non-empty and distinct, every single byte a token, merges in order
    (:func:`check_merge_order`) with ``vocab[c] == vocab[a] + vocab[b]``, and special ids
    distinct and after the vocab.

    >>> check_tables([bytes([b]) for b in range(256)] + [b"ab"], {(97, 98): 256}, {"<|e|>": 257})
    >>> check_tables([bytes([b]) for b in range(256)], {}, {"<|e|>": 3})
    Traceback (most recent call last):
    ...
    glassgpt.errors.GlassError: special token '<|e|>' has id 3; ids must be distinct and >= 256 (after the vocab)
    """
    n, present = len(vocab), set(vocab)
    if not all(vocab) or len(present) != n:
        seen: dict[bytes, int] = {}
        for i, t in enumerate(vocab):
            if not t:
                raise GlassError(f"vocab: token {i} is empty")
            if t in seen:
                raise GlassError(f"vocab: tokens {seen[t]} and {i} are both {t!r}")
            seen[t] = i
    missing = [b for b in range(256) if bytes([b]) not in present]
    if missing:
        raise GlassError(
            f"vocab: byte {missing[0]:#04x} is not a token ({len(missing)} bytes missing)"
        )
    check_merge_order(merges, n)
    token = vocab.__getitem__
    joined = map(
        bytes.__add__,
        map(token, map(itemgetter(0), merges)),
        map(token, map(itemgetter(1), merges)),
    )
    if not all(map(eq, joined, map(token, merges.values()))):
        for rank, ((a, b), c) in enumerate(merges.items()):
            if vocab[a] + vocab[b] != vocab[c]:
                raise GlassError(
                    f"merge {rank}: {vocab[a]!r} + {vocab[b]!r} is not token {c} {vocab[c]!r}"
                )
    special_ids: dict[int, str] = {}
    for s, i in special_tokens.items():
        if not isinstance(s, str) or not s:
            raise GlassError(f"special token {s!r} must be a non-empty str")
        if not isinstance(i, int) or i < n or i in special_ids:
            raise GlassError(
                f"special token {s!r} has id {i!r}; ids must be distinct and >= {n} (after the vocab)"
            )
        special_ids[i] = s
