"""Byte-level BPE: text → regex chunks → UTF-8 bytes → merges, lowest rank first.

    encode(text) = bpe(utf8(c₁)) ⧺ bpe(utf8(c₂)) ⧺ ...     for  c₁ c₂ ... = split(text)
    decode(ids)  = utf8⁻¹( vocab[i₁] ⧺ vocab[i₂] ⧺ ... )    (errors="replace")

with ``split`` the pre-tokenizer (:mod:`~glassgpt.tokenizer.pretokenize`) and ``bpe`` the
merge loop (:mod:`~glassgpt.tokenizer.merge`), so ``decode(encode(s)) == s`` for every str.
With GPT-2's files the ids are tiktoken's ``gpt2`` ids.

The merge loop here is the definition. For speed, :meth:`Tokenizer.encode_ordinary` hands
the text to glassgpt's compiled encoder for the ``gpt2`` and ``gpt4`` patterns (or, where it
was not built, tiktoken's Rust core where that provably gives the same ids) built from the
same tokens (:mod:`.engine`), and says once when neither can. The Python loop (``fast =
False``) keeps its own speed-ups, again without changing a single id: a cache chunk → ids
(most chunks repeat), and for the named patterns a second cache over whole space-separated
pieces, cut at *safe spaces* (:func:`~glassgpt.tokenizer.pretokenize.space_segments`), so
that prose costs one ``re.split`` and one dict lookup per word. The caches are bounded.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import Any

from glassgpt.errors import ConfigError, GlassError
from glassgpt.tokenizer import files
from glassgpt.tokenizer.bpe_train import train_merges
from glassgpt.tokenizer.caches import BAD, Cache, PieceCache
from glassgpt.tokenizer.corpus import TextOrPath, count_chunks, fix_surrogates
from glassgpt.tokenizer.engine import build as build_engine
from glassgpt.tokenizer.engine import same_classes
from glassgpt.tokenizer.merge import HEAP_MIN_LEN, bpe, bpe_heap, check_tables, rank_table
from glassgpt.tokenizer.parallel import encode_batch
from glassgpt.tokenizer.pretokenize import SAFE_SPACE, resolve_pattern, splitter
from glassgpt.tokenizer.special import (
    SpecialSet,
    check_disallowed,
    encode_with_specials,
    resolve,
)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while tables are built, as it was after.

    Building GPT-2's tables makes some 10^5 tuples and lists, none in a cycle; each 700
    allocations would start a collection that walks every live container, which made up
    half of loading the tokenizer.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def plain_merges(merges: Mapping[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    """``merges`` as a dict of Python ints (from NumPy ints, lists, ...); a dict of ints as is.

    >>> plain_merges({(1, 2): 3}), plain_merges({("1", 2.0): 3})
    ({(1, 2): 3}, {(1, 2): 3})
    """
    ints = set(map(type, chain.from_iterable(merges))) | set(map(type, merges.values()))
    if type(merges) is dict and ints <= {int} and set(map(len, merges)) <= {2}:
        return dict(merges)
    return {(int(a), int(b)): int(c) for (a, b), c in merges.items()}


class Tokenizer(files.SavedAsJson):
    """A byte-level BPE tokenizer.

    ``Tokenizer(vocab, merges, *, pattern="gpt2", special_tokens=())`` builds one from:

    - ``vocab``: the bytes of each ordinary token, by id; every single byte must be one;
    - ``merges``: ``{(a, b): c}`` in rank order (rank 0 first), with
      ``vocab[c] == vocab[a] + vocab[b]``; each ``c`` made by one merge, after ``a`` and ``b``;
    - ``pattern``: ``"gpt2"``, ``"gpt4"``, a regex source string, or None (no split);
    - ``special_tokens``: ``{string: id}`` with ids from ``len(vocab)`` on, or a list of
      strings numbered from ``len(vocab)``.

    Importers of other formats (tiktoken, HF ``tokenizer.json``) build it the same way.
    Public attributes: ``vocab``, ``merges``, ``special_tokens``, ``pattern`` (regex
    source or None), ``pattern_name`` (``"gpt2"``, ``"gpt4"`` or None), ``n_vocab``, and
    ``fast``: True (default) to encode with the compiled engine where it gives the same ids
    (:mod:`.engine`), False for the Python merge loop alone.

    >>> vocab = [bytes([b]) for b in range(256)] + [b"ab", b"abc"]
    >>> tok = Tokenizer(vocab, {(97, 98): 256, (256, 99): 257}, special_tokens=["<|end|>"])
    >>> tok.encode("abcab ab")
    [257, 256, 32, 256]
    >>> tok.encode("ab<|end|>", allowed_special="all"), tok.n_vocab
    ([256, 258], 259)
    >>> tok.decode([257, 258])
    'abc<|end|>'
    """

    kind = "bpe"

    def __init__(
        self,
        vocab: Sequence[bytes],
        merges: Mapping[tuple[int, int], int],
        *,
        pattern: str | None = "gpt2",
        special_tokens: Mapping[str, int] | Sequence[str] = (),
    ) -> None:
        self.vocab: list[bytes] = [t if type(t) is bytes else bytes(t) for t in vocab]
        self.merges: dict[tuple[int, int], int] = plain_merges(merges)
        self.pattern, self.pattern_name = resolve_pattern(pattern)
        if not isinstance(special_tokens, Mapping):
            special_tokens = {s: len(self.vocab) + i for i, s in enumerate(special_tokens)}
        self.special_tokens: dict[str, int] = dict(special_tokens)
        check_tables(self.vocab, self.merges, self.special_tokens)
        ids = dict(zip(self.vocab, range(len(self.vocab))))
        byte_ids = [ids[bytes([b])] for b in range(256)]
        self._byte_table = bytes(byte_ids) if max(byte_ids) < 256 else None
        self._byte_ids = byte_ids
        # ids 0..n_vocab-1, then n_vocab Nones, where a negative id lands (-> TypeError)
        self._decode_table: list[bytes | None] = [
            *self.vocab,
            *[None] * (2 * self.n_vocab - len(self.vocab)),
        ]
        for s, i in self.special_tokens.items():
            self._decode_table[i] = s.encode("utf-8")
        self._split = splitter(self.pattern)
        self._chunks = Cache(self._bpe_chunk)  # chunk → ids
        self._heads = Cache(self._encode_segment)  # text before the first safe space → ids
        self._tails = Cache(self._encode_spaced)  # a last piece ending in whitespace → ids
        self._special_names = frozenset(self.special_tokens)
        self._pieces = PieceCache(self._encode_spaced) if self.pattern_name else None
        self.fast = True
        self._engine: Any = None  # the fast encoder, built on first use; False: none

    @property
    def n_vocab(self) -> int:
        """Number of ids (ordinary + special): the largest id + 1."""
        return max([len(self.vocab) - 1, *self.special_tokens.values()]) + 1

    def __repr__(self) -> str:
        return (
            f"Tokenizer(n_vocab={self.n_vocab}, merges={len(self.merges)}, "
            f"pattern={self.pattern_name or ('none' if self.pattern is None else 'custom')!r}, "
            f"special_tokens={list(self.special_tokens)})"
        )

    @cached_property
    def _ranks(self) -> dict[tuple[int, int], int]:
        """The Python loop's pair ranks (:func:`~glassgpt.tokenizer.merge.rank_table`),
        built on first use: the compiled engine does not read them."""
        return rank_table(self.merges)

    # ---- encoding -------------------------------------------------------------------------

    def _bpe_chunk(self, chunk: str) -> tuple[int, ...]:
        data = chunk.encode("utf-8")
        if self._byte_table is not None:
            ids = list(data.translate(self._byte_table))
        else:
            ids = [self._byte_ids[b] for b in data]
        return tuple(
            bpe_heap(ids, self._ranks) if len(ids) > HEAP_MIN_LEN else bpe(ids, self._ranks)
        )

    def _encode_spaced(self, piece: str) -> tuple[int, ...]:
        return self._encode_segment(" " + piece)

    def _encode_segment(self, text: str) -> tuple[int, ...]:
        return tuple(chain.from_iterable(map(self._chunks.__getitem__, self._split(text))))

    def engine(self) -> Any | None:
        """The fast encoder that gives this tokenizer's ids (the compiled engine, else a
        ``tiktoken.Encoding``), or None (Python loop).

        Built on first use; None when ``fast`` is False or when :mod:`.engine` finds no
        engine that gives the same ids (it warns once, naming why).
        """
        if not self.fast:
            return None
        if self._engine is None:
            with gc_paused():
                self._engine = build_engine(self) or False
        return self._engine or None

    def _encode_ordinary(self, text: str) -> list[int]:
        if self.pattern is None:  # the whole text is one chunk: no cache
            return list(self._bpe_chunk(text)) if text else []
        if self._pieces is None:
            return list(chain.from_iterable(map(self._chunks.__getitem__, self._split(text))))
        # Cut at safe spaces: every piece but the last then ends in non-whitespace.
        pieces = SAFE_SPACE.split(text)
        vals = list(map(self._pieces.__getitem__, pieces))
        vals[0] = self._heads[pieces[0]]
        if vals[-1] is BAD:
            vals[-1] = self._tails[pieces[-1]]
        return list(chain.from_iterable(vals))

    def encode_ordinary_many(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode_ordinary(t) for t in texts]``, with one split and one lookup pass for all.

        Many short texts cost less this way than one call each.
        """
        if self._pieces is None or self.engine() is not None:
            return [self.encode_ordinary(t) for t in texts]
        try:
            splits = list(map(SAFE_SPACE.split, texts))
            vals = list(map(self._pieces.__getitem__, chain.from_iterable(splits)))
            out, k = [], 0
            for pieces in splits:
                end = k + len(pieces)
                vals[k] = self._heads[pieces[0]]
                if vals[end - 1] is BAD:
                    vals[end - 1] = self._tails[pieces[-1]]
                out.append(list(chain.from_iterable(vals[k:end])))
                k = end
            return out
        except UnicodeEncodeError:
            return [self.encode_ordinary(t) for t in texts]

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` with special-token strings read as ordinary text.

        >>> Tokenizer.bytes_only().encode_ordinary("hé")
        [104, 195, 169]
        """
        engine = self.engine()
        if engine is not None and same_classes(text):
            return engine.encode_ordinary(text)
        try:
            return self._encode_ordinary(text)
        except UnicodeEncodeError:  # lone surrogates: as tiktoken, they become U+FFFD
            return self._encode_ordinary(fix_surrogates(text))

    def encode(
        self,
        text: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[int]:
        """Encode ``text``; special tokens follow tiktoken's policy (see :mod:`.special`).

        By default a text containing a special token's string raises
        :class:`~glassgpt.tokenizer.special.SpecialTokenError`.
        """
        allowed, disallowed = resolve(self._special_names, allowed_special, disallowed_special)
        if disallowed:
            check_disallowed(text, disallowed)
        if not allowed:
            return self.encode_ordinary(text)
        return encode_with_specials(text, allowed, self.special_tokens, self.encode_ordinary)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids: special strings read as their ids (this tokenizer adds no BOS).

        The prompt sites call it, so that a model family's tokenizer
        (:class:`~glassgpt.tokenizer.family.FamilyTokenizer`) can put its BOS first.
        """
        return self.encode(text, allowed_special="all")

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        num_workers: int | None = None,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[list[int]]:
        """``[encode(t) for t in texts]``, on all cores (processes) when the input is large."""
        return encode_batch(
            self,
            texts,
            num_workers=num_workers,
            allowed_special=allowed_special,
            disallowed_special=disallowed_special,
        )

    # ---- decoding -------------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of the tokens ``ids`` (a list, array or tensor of ints), concatenated."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        elif not isinstance(ids, (list, tuple)):
            ids = list(ids)
        table = self._decode_table
        try:
            return gather_bytes(table, ids)
        except (IndexError, TypeError):
            n = self.n_vocab
            bad = next(
                i for i in ids if not (isinstance(i, int) and 0 <= i < n and table[i] is not None)
            )
            raise GlassError(
                f"token id {bad!r} is not in this tokenizer (ids are 0..{n - 1})"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """``decode_bytes(ids)`` as text; bytes that are not UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token."""
        return self.decode_bytes([i])

    # ---- building -------------------------------------------------------------------------

    @classmethod
    def bytes_only(
        cls, *, pattern: str | None = "gpt2", special_tokens: Sequence[str] = ()
    ) -> Tokenizer:
        """The 256 single bytes and no merges (ids = byte values)."""
        return cls(
            [bytes([b]) for b in range(256)], {}, pattern=pattern, special_tokens=special_tokens
        )

    @classmethod
    def from_merges(
        cls,
        merges: Iterable[tuple[bytes, bytes]],
        *,
        pattern: str | None = "gpt2",
        special_tokens: Sequence[str] = (),
    ) -> Tokenizer:
        """Ids 0..255 the bytes in byte order, merge i of ``(left bytes, right bytes)`` makes 256 + i.

        >>> Tokenizer.from_merges([(b"a", b"b"), (b"ab", b"ab")]).vocab[256:]
        [b'ab', b'abab']
        """
        vocab = [bytes([b]) for b in range(256)]
        ids = {t: i for i, t in enumerate(vocab)}
        pairs: dict[tuple[int, int], int] = {}
        for rank, (a, b) in enumerate(merges):
            if a not in ids or b not in ids:
                raise GlassError(f"merge {rank} ({a!r}, {b!r}) uses a token no earlier merge made")
            ids[a + b] = len(vocab)
            pairs[(ids[a], ids[b])] = len(vocab)
            vocab.append(a + b)
        return cls(vocab, pairs, pattern=pattern, special_tokens=special_tokens)

    @classmethod
    def from_gpt2(
        cls, encoder_json: str | os.PathLike[str], vocab_bpe: str | os.PathLike[str]
    ) -> Tokenizer:
        """GPT-2's original ``encoder.json`` and ``vocab.bpe``: ids equal to tiktoken's ``gpt2``."""
        with gc_paused():
            vocab, merges, specials = files.read_gpt2(encoder_json, vocab_bpe)
            return cls(vocab, merges, pattern="gpt2", special_tokens=specials)

    @classmethod
    def train(
        cls,
        texts_or_paths: Iterable[TextOrPath] | TextOrPath,
        vocab_size: int,
        *,
        pattern: str | None = "gpt2",
        special_tokens: Sequence[str] = (),
        progress: bool = False,
    ) -> Tokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from texts (str) or files (paths).

        Fewer merges result when the corpus runs out of pairs. See :mod:`.corpus`.
        """
        special_tokens = list(dict.fromkeys(special_tokens))
        n_merges = vocab_size - 256 - len(special_tokens)
        if not isinstance(vocab_size, int) or n_merges < 0:
            raise ConfigError(
                "vocab_size",
                f"must be at least 256 + {len(special_tokens)} special tokens, got {vocab_size!r}",
            )
        source, _ = resolve_pattern(pattern)  # a bad pattern fails before reading anything
        counts = count_chunks(texts_or_paths, source, special_tokens, progress=progress)
        if not counts:
            raise GlassError("empty corpus: the inputs hold no text to train on")
        merges = train_merges(counts, n_merges, progress=progress)
        return cls.from_merges(merges, pattern=pattern, special_tokens=special_tokens)

    # ---- files (save, load, to_dict, from_dict: files.SavedAsJson) ----------------------

    def _fields(self) -> dict[str, Any]:
        return {
            "pattern_name": self.pattern_name,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            "vocab": [files.token_to_str(t) for t in self.vocab],
            "merges": [[a, b, c] for (a, b), c in self.merges.items()],
        }

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> Tokenizer:
        with gc_paused():
            return cls._from_plain_fields(data)

    @classmethod
    def _from_plain_fields(cls, data: Mapping[str, Any]) -> Tokenizer:
        vocab = files.strs_to_tokens(data["vocab"])
        merges = {(a, b): c for a, b, c in data["merges"]}
        if len(merges) != len(data["merges"]):
            raise ValueError("a pair is merged twice")
        bad = next((m for m in data["merges"] for x in m if type(x) is not int), None)
        if bad is not None:
            raise ValueError(f"merge {bad!r} is not three integer ids")
        pattern, specials = data["pattern"], dict(data["special_tokens"])
        return cls(vocab, merges, pattern=pattern, special_tokens=specials)


def gather_bytes(table: Sequence[bytes | None], ids: Sequence[int], block: int = 4096) -> bytes:
    """``b"".join(table[i] for i in ids)``, fast: one ``itemgetter`` and one join per block.

    (A single join over a million items allocates a buffer descriptor for each; blocks keep
    that small.) A ``None`` entry raises ``TypeError``, an index past the end ``IndexError``.

    >>> gather_bytes([b"a", b"bc", None], [1, 0, 1])
    b'bcabc'
    """
    out = []
    for k in range(0, len(ids), block):
        part = ids[k : k + block]
        out.append(b"".join(itemgetter(*part)(table)) if len(part) > 1 else table[part[0]])
    return b"".join(out)  # type: ignore[arg-type]
