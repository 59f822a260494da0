"""Byte-level BPE training: repeatedly merge the most frequent adjacent pair.

Algorithm (Sennrich et al. 2016, byte-level as in GPT-2). The corpus is a multiset of
pre-tokenized chunks; chunk w with count n(w) starts as its byte sequence t_1 … t_L. Then, for
k = 0, 1, …, n_merges − 1::

    freq(x, y) = Σ_w n(w) · #{i : t_i = x, t_{i+1} = y}      (pairs never cross chunks)
    (x, y)     = argmax freq, ties broken by the tie rule below
    every chunk: replace each occurrence of x y, left to right, by the new token xy

and merge k is (x, y). Training stops early when no pair occurs any more.

What the code adds to the equation: nothing is recounted. The distinct chunks are kept once
with their counts, ``freq`` lives in a dict, an index maps each pair to the chunks that may
contain it, and a merge visits only those chunks, updating ``freq`` by the pairs it destroys
((p, x), (y, q)) and creates ((p, xy), (xy, q)). The argmax comes from a max-heap with lazy
deletion: an entry's count is an upper bound (counts of existing pairs only fall), so a
popped entry whose count is stale is pushed back with its true count.

Tie rule (exactly that of Hugging Face ``tokenizers``' ``BpeTrainer`` with a ``ByteLevel``
alphabet): among the pairs of highest frequency take the smallest (id(x), id(y)) in
lexicographic order, where the 256 single bytes are numbered in the code-point order of
GPT-2's printable stand-ins (bytes ``!``..``~``, 0xA1..0xAC, 0xAE..0xFF in byte order, then
the other 68 bytes in byte order) and each merged token is numbered after them by creation
order. So the merges below agree with ``BpeTrainer`` run on the same chunks.

A merge whose concatenation equals an existing token (possible in principle when a token's
bytes can be reached through two different splits) is skipped, so every merge makes a new
token. ``BpeTrainer`` would instead record it as a second merge into the existing token; no
such case occurs on the corpora we test (see docs/tokenizer-training.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from glassgpt.errors import GlassError

__all__ = ["hf_byte_order", "train_merges"]

_SHIFT = 32  # pair key = (x << _SHIFT) | y; ids stay below 2**32


def hf_byte_order() -> list[int]:
    """The 256 bytes in the order ``BpeTrainer`` numbers them (code points of GPT-2's stand-ins).

    >>> order = hf_byte_order()
    >>> order[:3], order[93], order[94], order[-1]
    ([33, 34, 35], 126, 161, 173)
    """
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    return sorted(range(256), key=lambda b: (b not in printable, b))


def _check_input(chunk_counts: Mapping[bytes, int], n_merges: int) -> None:
    if isinstance(n_merges, bool) or not isinstance(n_merges, int) or n_merges < 0:
        raise GlassError(f"n_merges must be a non-negative integer, got {n_merges!r}")
    for chunk, count in chunk_counts.items():
        if not isinstance(chunk, bytes):
            raise GlassError(f"chunks must be bytes, got {type(chunk).__name__}: {chunk!r:.40}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GlassError(f"chunk {chunk!r:.40} has count {count!r}; counts are integers ≥ 0")


def train_merges(
    chunk_counts: Mapping[bytes, int], n_merges: int, *, progress: bool = False
) -> list[tuple[bytes, bytes]]:
    """Learn up to ``n_merges`` BPE merges from distinct chunks and their counts.

    Returns the merges in order, each as the pair of token byte strings it joins; merge i
    makes the token ``x + y`` (ids are the caller's: bytes 0..255, merge i → 256 + i).

    The Wikipedia example: in "aaabdaaabac" the pair "aa" is most frequent, then "ab"
    (tied with "aaab"... by count, smaller ids first), then "aab"+"Z"-style merges follow.

    >>> train_merges({b"aaabdaaabac": 1}, 3)
    [(b'a', b'a'), (b'aa', b'a'), (b'aaa', b'b')]
    >>> train_merges({b"ab": 3, b"b": 9}, 5)  # stops early: no pair is left
    [(b'a', b'b')]
    """
    _check_input(chunk_counts, n_merges)
    order = hf_byte_order()
    to_internal = bytes(order.index(b) for b in range(256))  # byte → internal id
    tokens: list[bytes] = [bytes([b]) for b in order]  # internal id → token bytes
    known: set[bytes] = set(tokens)

    words: list[list[int]] = []
    counts: list[int] = []
    for chunk, count in chunk_counts.items():
        if len(chunk) > 1 and count > 0:
            words.append(list(chunk.translate(to_internal)))
            counts.append(count)

    # freq[key] = Σ n(w) · occurrences; where[key] = chunks that may contain the pair.
    freq: dict[int, int] = {}
    where: dict[int, list[int]] = {}
    for i, (word, count) in enumerate(zip(words, counts)):
        for x, y in zip(word, word[1:]):
            key = (x << _SHIFT) | y
            freq[key] = freq.get(key, 0) + count
            chunks = where.get(key)
            if chunks is None:
                where[key] = [i]
            elif chunks[-1] != i:
                chunks.append(i)
    heap = [(-c, key) for key, c in freq.items()]
    heapq.heapify(heap)

    merges: list[tuple[bytes, bytes]] = []
    bar = _progress_bar(n_merges) if progress else None
    mask = (1 << _SHIFT) - 1
    while len(merges) < n_merges and heap:
        neg, key = heapq.heappop(heap)
        current = freq.get(key, 0)
        if current != -neg:  # stale entry: the pair lost occurrences since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, key))
            continue
        x, y = key >> _SHIFT, key & mask
        joined = tokens[x] + tokens[y]
        del freq[key]
        if joined in known:  # a second way to spell an existing token: skip (see above)
            continue
        new = len(tokens)
        tokens.append(joined)
        known.add(joined)
        merges.append((tokens[x], tokens[y]))
        gained = _apply_merge(words, counts, where.pop(key), x, y, new, freq, where)
        for k in gained:
            c = freq[k]
            if c > 0:
                heapq.heappush(heap, (-c, k))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return merges


def _apply_merge(
    words: list[list[int]],
    counts: list[int],
    chunk_ids: list[int],
    x: int,
    y: int,
    new: int,
    freq: dict[int, int],
    where: dict[int, list[int]],
) -> set[int]:
    """Replace x y by ``new`` in the listed chunks; update freq and where; return new pairs.

    Left to right within a chunk, as ``str.replace`` would: in x x x merging (x, x) gives
    (xx) x. Each occurrence removes (p, x) and (y, q) and adds (p, new) and (new, q), where p
    is the symbol now before it (possibly ``new`` itself) and q the one after it.
    """
    gained: set[int] = set()
    shift = _SHIFT
    for i in chunk_ids:
        word = words[i]
        if x not in word:
            continue
        n = len(word)
        c = counts[i]
        out: list[int] = []
        j = 0  # next unread position
        while True:
            try:
                k = word.index(x, j)
            except ValueError:
                break
            if k + 1 >= n:
                break
            if word[k + 1] != y:
                out.extend(word[j : k + 1])
                j = k + 1
                continue
            out.extend(word[j:k])
            if out:
                p = out[-1]
                key = (p << shift) | x
                freq[key] -= c
                key = (p << shift) | new
                freq[key] = freq.get(key, 0) + c
                gained.add(key)
                _index(where, key, i)
            if k + 2 < n:
                q = word[k + 2]
                key = (y << shift) | q
                if key in freq:  # absent only when it is the pair being merged (x == y)
                    freq[key] -= c
                key = (new << shift) | q
                freq[key] = freq.get(key, 0) + c
                gained.add(key)
                _index(where, key, i)
            out.append(new)
            j = k + 2
        if j == 0:
            continue
        out.extend(word[j:])
        words[i] = out
    return gained


def _index(where: dict[int, list[int]], key: int, i: int) -> None:
    chunks = where.get(key)
    if chunks is None:
        where[key] = [i]
    elif chunks[-1] != i:
        chunks.append(i)


def _progress_bar(total: int):  # noqa: ANN202 - tqdm is imported lazily
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="BPE merges", unit="merge")
