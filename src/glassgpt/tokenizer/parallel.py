"""Batch encoding on all cores.

    encode_batch(texts) = [encode(t) for t in texts]

The texts are cut into one share of about equal length per core; a long text is itself
cut at safe spaces (:func:`~glassgpt.tokenizer.pretokenize.space_segments`), where the
ids of the parts are the ids of the whole. The parent encodes the first share while
worker processes encode the others and send back their ids as one int32 array each
(cheap to pickle). Workers are forked once per tokenizer and kept for later calls, so
they start with the parent's tokenizer and caches and keep their own caches warm; they
end when the tokenizer is garbage-collected, with :func:`close_workers`, or at exit.
Small inputs, or systems without ``fork``, run in one process. When the tokenizer encodes
with tiktoken's core (:mod:`.engine`), which releases the GIL, the shares run on threads
instead: no fork, no ids to send back.
"""

from __future__ import annotations

import multiprocessing
import os
import weakref
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import chain
from typing import Any, Protocol

import numpy as np

from glassgpt.errors import GlassError
from glassgpt.tokenizer.pretokenize import WHITESPACE
from glassgpt.tokenizer.special import SpecialSet, check_disallowed, resolve


class Tokenizer(Protocol):
    """What batch encoding asks of a tokenizer (:class:`~glassgpt.tokenizer.Tokenizer` has it)."""

    special_tokens: dict[str, int]
    pattern_name: str | None

    def encode(
        self, text: str, *, allowed_special: SpecialSet, disallowed_special: SpecialSet
    ) -> list[int]: ...

    def encode_ordinary_many(self, texts: Sequence[str]) -> list[list[int]]: ...

    def engine(self) -> Any | None: ...


PARALLEL_MIN_CHARS = 1 << 18  # below this, one process is faster

Job = tuple[int, int, int]  # (text index, start, end)
# What forked workers find: tokenizers by id, and each tokenizer's pool of workers.
_tokenizers: weakref.WeakValueDictionary[int, Tokenizer] = weakref.WeakValueDictionary()
_pools: dict[int, tuple[int, ProcessPoolExecutor]] = {}


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def safe_cut(text: str, at: int) -> int:
    """The first safe space at or after ``at`` (a space after a non-space), or ``len(text)``.

    >>> safe_cut("ab  cd ef", 3), safe_cut("ab  cd ef", 7)
    (6, 9)
    """
    j = text.find(" ", max(at, 1))
    while j > 0 and text[j - 1] in WHITESPACE:
        j = text.find(" ", j + 1)
    return len(text) if j < 0 else j


def plan(lengths: Sequence[int], n_shares: int, cut: bool, texts: Sequence[str]) -> list[list[Job]]:
    """Split the texts into ``n_shares`` lists of jobs of about equal total length."""
    total = sum(lengths)
    target = -(-total // n_shares)
    shares: list[list[Job]] = [[]]
    room = target
    for i, n in enumerate(lengths):
        start = 0
        while cut and n - start > room and len(shares) < n_shares:
            end = safe_cut(texts[i], start + room)
            if end >= n:
                break
            shares[-1].append((i, start, end))
            shares.append([])
            start, room = end, target
        shares[-1].append((i, start, n))
        room -= n - start
        if room <= 0 and len(shares) < n_shares:
            shares.append([])
            room = target
    return [s for s in shares if s]


def encode_texts(tok: Tokenizer, texts: Sequence[str], allowed: frozenset[str]) -> list[list[int]]:
    """The ids of each text; specials outside ``allowed`` are read as text."""
    if allowed:
        return [tok.encode(t, allowed_special=allowed, disallowed_special=()) for t in texts]
    return tok.encode_ordinary_many(texts)


def _work(key: int, texts: list[str], allowed: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """In a worker: the ids of ``texts`` as one flat int32 array and the lengths."""
    ids = encode_texts(_tokenizers[key], texts, allowed)
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    return np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def _unpack(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    ids, ends = flat.tolist(), np.cumsum(lengths).tolist()
    return [ids[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def _pool(tok: Tokenizer, n: int) -> ProcessPoolExecutor:
    key = id(tok)
    if key in _pools and _pools[key][0] == n:
        return _pools[key][1]
    close_workers(tok)
    _tokenizers[key] = tok
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"))
    _pools[key] = (n, pool)
    weakref.finalize(tok, _drop_pool, key, pool)
    return pool


def _drop_pool(key: int, pool: ProcessPoolExecutor) -> None:
    if key in _pools and _pools[key][1] is pool:
        del _pools[key]
    pool.shutdown(wait=False, cancel_futures=True)


def close_workers(tok: Tokenizer) -> None:
    """End the worker processes ``encode_batch`` keeps for ``tok`` (if any)."""
    entry = _pools.get(id(tok))
    if entry is not None:
        _drop_pool(id(tok), entry[1])


def encode_batch(
    tok: Tokenizer,
    texts: Sequence[str],
    *,
    num_workers: int | None = None,
    allowed_special: SpecialSet = frozenset(),
    disallowed_special: SpecialSet = "all",
) -> list[list[int]]:
    """``[tok.encode(t, ...) for t in texts]``, forking ``num_workers`` processes (default: all cores)."""
    if isinstance(texts, str):
        raise GlassError("encode_batch takes a list of texts, not one str (use encode)")
    texts = list(texts)
    allowed, disallowed = resolve(tok.special_tokens, allowed_special, disallowed_special)
    if disallowed:
        for t in texts:  # raise here, not in a worker
            check_disallowed(t, disallowed)
    lengths = [len(t) for t in texts]
    workers = cpu_count() if num_workers is None else num_workers
    if (
        workers <= 1
        or sum(lengths) < PARALLEL_MIN_CHARS
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return encode_texts(tok, texts, allowed)
    shares = plan(lengths, workers, tok.pattern_name is not None and not allowed, texts)
    if len(shares) == 1:
        return encode_texts(tok, texts, allowed)
    parts = [[texts[i][a:b] for i, a, b in jobs] for jobs in shares]
    if tok.engine() is not None:
        with ThreadPoolExecutor(len(shares)) as threads:
            results = list(threads.map(lambda p: encode_texts(tok, p, allowed), parts))
        return _gather(texts, shares, results)
    try:
        pool = _pool(tok, len(shares) - 1)
        futures = [pool.submit(_work, id(tok), p, allowed) for p in parts[1:]]
        results = [encode_texts(tok, parts[0], allowed)] + [_unpack(*f.result()) for f in futures]
    except BrokenProcessPool:  # a worker died (e.g. killed): do it here instead
        close_workers(tok)
        results = [encode_texts(tok, p, allowed) for p in parts]
    return _gather(texts, shares, results)


def _gather(
    texts: Sequence[str], shares: list[list[Job]], results: list[list[list[int]]]
) -> list[list[int]]:
    """The ids of each text, joined from the ids of its parts in the shares."""
    out: list[list[int]] = [[] for _ in texts]
    for jobs, ids in zip(shares, results):
        for (i, _, _), part in zip(jobs, ids):
            out[i] += part
    return out
