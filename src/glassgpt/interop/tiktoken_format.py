"""tiktoken's ``.tiktoken`` rank file: export, import, and when its ids equal ours.

The file has one line per ordinary token, ``base64(token bytes) + " " + rank``, ranks
0, 1, 2, … (here rank = our id). tiktoken encodes a chunk by *rank of concatenation*::

    parts = the chunk's bytes
    while some adjacent parts (u, v) have u + v in the vocabulary:
        merge the leftmost such pair with the lowest rank(u + v)

whereas our encoder applies the *pair* merges ``(a, b) → c`` lowest rank first, as GPT-2's
encoder does. The two agree on every text when the merges can be read back from the ranks
(:func:`merges_from_ranks`): for each token t, the rank-based loop run on t's own bytes with
ranks below rank(t) ends in exactly the two parts our merge joins. (Inside any text, the
parts of a span that becomes t evolve exactly as in that loop on t's bytes alone, so tiktoken
only ever joins pairs that are our merges, lowest rank first, which is what we do.)
:func:`tiktoken_mismatches` runs this check; :func:`save_tiktoken` warns when it fails.
Vocabularies trained by :func:`~glassgpt.tokenizer.bpe_train.train_merges` pass it on every
corpus we have tried; a hand-made one can fail (see docs/tokenizer-training.md).

The format holds neither the split pattern nor the special tokens: pass them to
:func:`load_tiktoken`, or build the whole ``tiktoken.Encoding`` with
:func:`to_tiktoken_encoding` (from :mod:`glassgpt.tokenizer.engine`, which encodes with it).
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

from glassgpt.errors import GlassError, InputFileError
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.engine import to_tiktoken_encoding
from glassgpt.tokenizer.files import read_text

__all__ = [
    "TiktokenMismatchWarning",
    "load_tiktoken",
    "merges_from_ranks",
    "rank_bpe",
    "read_ranks",
    "save_tiktoken",
    "tiktoken_mismatches",
    "to_tiktoken_encoding",
]


class TiktokenMismatchWarning(UserWarning):
    """tiktoken's rank-based encoding may give other ids than ours for this vocabulary."""


def rank_bpe(piece: bytes, ranks: Mapping[bytes, int], *, below: int | None = None) -> list[bytes]:
    """tiktoken's merge loop on one piece, using only tokens of rank < ``below`` if given.

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}
    >>> rank_bpe(b"abcd", ranks), rank_bpe(b"abc", ranks, below=258)
    ([b'abc', b'd'], [b'ab', b'c'])
    """
    parts = [piece[i : i + 1] for i in range(len(piece))]
    limit = sys.maxsize if below is None else below
    while len(parts) > 1:
        best, where = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], limit)
            if rank < best:
                best, where = rank, i
        if where < 0:
            break
        parts[where : where + 2] = [parts[where] + parts[where + 1]]
    return parts


def merges_from_ranks(vocab: list[bytes]) -> dict[tuple[int, int], int]:
    """Pair merges from a rank-ordered vocabulary (id = rank), as tiktoken would build them.

    Each token of two or more bytes is split by :func:`rank_bpe` with the ranks below its
    own; the split must be two tokens, or the token is unreachable and this raises.

    >>> vocab = [bytes([b]) for b in range(256)] + [b"ab", b"bc", b"abc"]
    >>> merges_from_ranks(vocab)
    {(97, 98): 256, (98, 99): 257, (256, 99): 258}
    """
    ranks = {token: i for i, token in enumerate(vocab)}
    merges: dict[tuple[int, int], int] = {}
    for rank, token in enumerate(vocab):
        if len(token) < 2:
            continue
        parts = rank_bpe(token, ranks, below=rank)
        if len(parts) != 2:
            raise GlassError(
                f"token {rank} {token!r} cannot be built from two tokens of lower rank "
                f"(tiktoken's loop stops at {len(parts)} parts)"
            )
        merges[(ranks[parts[0]], ranks[parts[1]])] = rank
    return merges


def tiktoken_mismatches(tok: Tokenizer) -> list[str]:
    """Why tiktoken could encode some text differently from ``tok`` (empty: it never does).

    Compares ``tok.merges`` with the merges read back from the ranks (= ids). Each message
    names a token whose merge differs.
    """
    try:
        theirs = merges_from_ranks(tok.vocab)
    except GlassError as err:
        return [str(err)]
    ours = list(tok.merges.items())
    problems = []
    made_by = {new: pair for pair, new in theirs.items()}
    for rank, (pair, new) in enumerate(ours):
        if made_by.get(new) != pair:
            problems.append(_describe(tok.vocab, new, pair, made_by.get(new), rank))
    if not problems and [new for _, new in ours] != list(theirs.values()):
        problems.append("merge order differs from id order (tiktoken's rank is the id)")
    if not problems and len(ours) != len(theirs):
        extra = sorted(set(theirs.values()) - {new for _, new in ours})
        problems.append(f"token {extra[0]} {tok.vocab[extra[0]]!r} is made by no merge")
    return problems


def _describe(
    vocab: list[bytes], new: int, ours: tuple[int, int], theirs: tuple[int, int] | None, rank: int
) -> str:
    a, b = (vocab[i] for i in ours)
    head = f"token {new} {vocab[new]!r} (merge {rank}) is {a!r} + {b!r} here"
    if theirs is None:
        return head + ", but tiktoken's ranks do not build it that way"
    return head + f", {vocab[theirs[0]]!r} + {vocab[theirs[1]]!r} in tiktoken's rank order"


def save_tiktoken(tok: Tokenizer, path: str | os.PathLike[str], *, check: bool = True) -> None:
    """Write ``tok``'s ordinary tokens as a ``.tiktoken`` file (rank = id).

    With ``check`` (default), warn with :class:`TiktokenMismatchWarning` if tiktoken's
    encoding could differ from ours (:func:`tiktoken_mismatches`).
    """
    if check:
        problems = tiktoken_mismatches(tok)
        if problems:
            warnings.warn(
                f"{Path(path)}: tiktoken may encode some text with other ids than this "
                f"tokenizer ({len(problems)} merges differ; first: {problems[0]})",
                TiktokenMismatchWarning,
                stacklevel=2,
            )
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {i}\n" for i, token in enumerate(tok.vocab)
    ]
    atomic_write(path, "".join(lines).encode("ascii"))


def read_ranks(path: str | os.PathLike[str]) -> list[bytes]:
    """The tokens of a ``.tiktoken`` file in rank order; ranks must be 0..n-1."""
    name = Path(path)
    text = read_text(name)
    by_rank: dict[int, bytes] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            encoded, rank_text = line.split()
            token, rank = base64.b64decode(encoded, validate=True), int(rank_text)
        except (ValueError, binascii.Error):
            raise GlassError(
                f"{name}:{lineno}: expected 'base64 rank', got {line[:60]!r}"
            ) from None
        if rank in by_rank:
            raise GlassError(f"{name}:{lineno}: rank {rank} appears twice")
        by_rank[rank] = token
    if not by_rank:
        raise InputFileError(f"{name}: empty .tiktoken file")
    missing = next((r for r in range(len(by_rank)) if r not in by_rank), None)
    if missing is not None:
        raise GlassError(f"{name}: ranks must be 0..{len(by_rank) - 1}; rank {missing} is missing")
    return [by_rank[r] for r in range(len(by_rank))]


def load_tiktoken(
    path: str | os.PathLike[str],
    *,
    pattern: str | None = "gpt2",
    special_tokens: Mapping[str, int] | None = None,
) -> Tokenizer:
    """A :class:`~glassgpt.tokenizer.Tokenizer` from a ``.tiktoken`` file (id = rank).

    ``pattern`` ("gpt2", "gpt4", a regex, or None) and ``special_tokens`` ({string: id},
    ids after the ordinary ones) are not in the file and must be given.
    """
    vocab = read_ranks(path)
    try:
        merges = merges_from_ranks(vocab)
        return Tokenizer(vocab, merges, pattern=pattern, special_tokens=dict(special_tokens or {}))
    except GlassError as err:
        raise GlassError(f"{Path(path)}: {err}") from None
