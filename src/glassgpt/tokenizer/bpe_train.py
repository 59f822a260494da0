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
from typing import Any

from tqdm.auto import tqdm

from glassgpt.errors import GlassError
from glassgpt.tokenizer.files import bytes_to_unicode

__all__ = ["hf_byte_order", "train_merges"]

_MAX_ID = 0x10FFFF  # ids are stored as str characters


def hf_byte_order() -> list[int]:
    """The 256 bytes in the order ``BpeTrainer`` numbers them: by GPT-2 stand-in code point.

    >>> order = hf_byte_order()
    >>> order[:3], order[93], order[94], order[187], order[188], order[-1]
    ([33, 34, 35], 126, 161, 255, 0, 173)
    """
    stand_in = bytes_to_unicode()
    return sorted(range(256), key=lambda b: ord(stand_in[b]))


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

    Wikipedia's example: in "aaabdaaabac", "aa" is the most frequent pair; then "aa"+"a"
    and "a"+"b" tie at 2 and the smaller ids win ("a" < "aa"); then "aa"+"ab".

    >>> train_merges({b"aaabdaaabac": 1}, 3)
    [(b'a', b'a'), (b'a', b'b'), (b'aa', b'ab')]
    >>> train_merges({b"ab": 3, b"b": 9}, 5)  # stops early: no pair is left
    [(b'a', b'b')]
    """
    _check_input(chunk_counts, n_merges)
    if n_merges > _MAX_ID - 256:
        raise GlassError(f"n_merges must be at most {_MAX_ID - 256}, got {n_merges}")
    # A chunk is a str whose characters are token ids (chr(id)): a pair is a 2-character
    # str, whose order is the lexicographic order of (id(x), id(y)) the tie rule needs, and
    # str.find / str.replace do the left-to-right merge in C.
    order = hf_byte_order()
    to_internal = bytes(order.index(b) for b in range(256))  # byte → internal id
    tokens: list[bytes] = [bytes([b]) for b in order]  # internal id → token bytes
    known: set[bytes] = set(tokens)

    words: list[str] = []
    counts: list[int] = []
    for chunk, count in chunk_counts.items():
        if len(chunk) > 1 and count > 0:
            words.append(chunk.translate(to_internal).decode("latin-1"))
            counts.append(count)

    # freq[xy] = Σ n(w) · occurrences of xy in w; where[xy] = chunks that may contain xy.
    freq: dict[str, int] = {}
    where: dict[str, list[int]] = {}
    for i, (word, count) in enumerate(zip(words, counts)):
        _add_pairs(freq, where, [word[k : k + 2] for k in range(len(word) - 1)], i, count)
    heap = [(-c, pair) for pair, c in freq.items()]
    heapq.heapify(heap)

    merges: list[tuple[bytes, bytes]] = []
    bar = _progress_bar(n_merges) if progress else None
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        current = freq.get(pair, 0)
        if current != -neg:  # stale entry: the pair lost occurrences since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, pair))
            continue
        x, y = tokens[ord(pair[0])], tokens[ord(pair[1])]
        if x + y in known:  # spells an existing token: drop it (see the module docstring);
            continue  # it is not pushed again, as only pairs with a new token are pushed
        del freq[pair]
        new = chr(len(tokens))
        tokens.append(x + y)
        known.add(x + y)
        merges.append((x, y))
        for gained in _apply_merge(words, counts, where.pop(pair), pair, new, freq, where):
            heapq.heappush(heap, (-freq[gained], gained))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return merges


def _apply_merge(
    words: list[str],
    counts: list[int],
    chunk_ids: list[int],
    pair: str,
    new: str,
    freq: dict[str, int],
    where: dict[str, list[int]],
) -> set[str]:
    """Replace ``pair`` by ``new`` in the listed chunks; update freq and where; return new pairs.

    Left to right within a chunk, as ``str.replace`` does: merging (x, x) in x x x gives
    (xx) x. Each occurrence x y removes (p, x) and (y, q) and adds (p, new) and (new, q), where
    p is the symbol now before it (``new`` itself when the previous occurrence touches it)
    and q the one after it.
    """
    gained: set[str] = set()
    for i in chunk_ids:
        word = words[i]
        k = word.find(pair)
        if k < 0:
            continue
        c = counts[i]
        end = len(word) - 2
        made: list[str] = []  # the pairs (p, new) and (new, q), one per occurrence side
        last = -1  # where the previous occurrence ended
        while k >= 0:
            if k == last:  # p is the previous occurrence: its (new, x) becomes (new, new)
                made[-1] = new + new
            elif k > 0:
                freq[word[k - 1 : k + 1]] -= c
                made.append(word[k - 1] + new)
            if k < end:
                right = word[k + 1 : k + 3]
                if right != pair:  # the merged pair itself is no longer counted
                    freq[right] -= c
                made.append(new + word[k + 2])
            last = k + 2
            k = word.find(pair, last)
        words[i] = word.replace(pair, new)
        _add_pairs(freq, where, made, i, c)
        gained.update(made)
    gained.difference_update([p for p in gained if freq[p] <= 0])
    return gained


def _add_pairs(
    freq: dict[str, int], where: dict[str, list[int]], pairs: list[str], i: int, count: int
) -> None:
    """Count ``pairs``, found in chunk ``i`` (which occurs ``count`` times), and index them."""
    for pair in pairs:
        freq[pair] = freq.get(pair, 0) + count
        chunks = where.get(pair)
        if chunks is None:
            where[pair] = [i]
        elif chunks[-1] != i:  # a chunk's pairs are added together: no repeats
            chunks.append(i)


def _progress_bar(total: int) -> Any:
    return tqdm(total=total, desc="BPE merges", unit="merge")
