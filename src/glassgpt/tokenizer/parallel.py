"""Batch encoding on all cores.

    encode_batch(texts) = [encode(t) for t in texts]

The texts are cut into one share of about equal length per worker; a long text is itself
cut at safe spaces (:func:`~glassgpt.tokenizer.pretokenize.space_segments`), where the
ids of the parts are the ids of the whole. Workers are forked processes, so they start
with the parent's tokenizer, caches and texts without pickling any of them; each returns
its ids as one int32 array (cheap to send back). The parent encodes the first share
itself meanwhile. Small inputs, or systems without ``fork``, run in one process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from glassgpt.errors import GlassError
from glassgpt.tokenizer.pretokenize import WHITESPACE
from glassgpt.tokenizer.special import SpecialSet, check_disallowed, resolve

if TYPE_CHECKING:
    from glassgpt.tokenizer.bpe import Tokenizer

PARALLEL_MIN_CHARS = 1 << 18  # below this, forking costs more than it saves

Job = tuple[int, int, int]  # (text index, start, end)
_shared: dict[str, Any] = {}  # what forked workers read: set just before the fork


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


def _encode_jobs(jobs: list[Job]) -> tuple[np.ndarray, np.ndarray]:
    tok: Tokenizer = _shared["tokenizer"]
    texts: Sequence[str] = _shared["texts"]
    kw = _shared["kw"]
    ids = [tok.encode(texts[i][a:b], **kw) for i, a, b in jobs]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    return np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


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
    allowed, disallowed = resolve(tok.special_tokens, allowed_special, disallowed_special)
    kw = {"allowed_special": allowed, "disallowed_special": disallowed}
    lengths = [len(t) for t in texts]
    workers = cpu_count() if num_workers is None else num_workers
    if (
        workers <= 1
        or sum(lengths) < PARALLEL_MIN_CHARS
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return [tok.encode(t, **kw) for t in texts]
    for t in texts:  # raise here, not in a worker
        check_disallowed(t, disallowed)
    kw["disallowed_special"] = frozenset()
    cut = tok.pattern_name is not None and not allowed
    shares = plan(lengths, workers, cut, texts)
    if len(shares) == 1:
        return [tok.encode(t, **kw) for t in texts]
    _shared.update(tokenizer=tok, texts=texts, kw=kw)
    try:
        with ProcessPoolExecutor(
            len(shares) - 1, mp_context=multiprocessing.get_context("fork")
        ) as pool:
            futures = [pool.submit(_encode_jobs, jobs) for jobs in shares[1:]]
            results = [_encode_jobs(shares[0])] + [f.result() for f in futures]
    finally:
        _shared.clear()
    out: list[list[int]] = [[] for _ in texts]
    for jobs, (flat, lens) in zip(shares, results):
        ids = flat.tolist()
        offsets = np.concatenate([[0], np.cumsum(lens)]).tolist()
        for k, (i, _, _) in enumerate(jobs):
            out[i] += ids[offsets[k] : offsets[k + 1]]
    return out
