"""Documents → token shards, streaming, with a deterministic train/val split.

    stream = enc(d₁) ‖ sep ‖ enc(d₂) ‖ sep ‖ … ‖ enc(d_m) ‖ sep
    train  = the tokens of the first (1 − f) of the text bytes,  val = the last f

Documents are the input text files, or the records of JSON Lines, JSON, Parquet or dataset
inputs (:mod:`glassgpt.data.documents`), in the order given; ``sep`` follows every document: the
tokenizer's ``<|endoftext|>`` id when it has that special token (else a model family's
end-of-text token: Llama 3's ``<|end_of_text|>``, or ``tokenizer_config.json``'s
``eos_token``, Llama 2's ``</s>``, Gemma's ``<eos>``), else the encoding of a newline. A
family tokenizer whose post-processor puts a BOS before a prompt puts it before each document
too (``bos ‖ enc(d) ‖ eos``): each document is delimited as in the families' own pretraining
(Llama's ``<s> … </s>``, Llama 3's ``<|begin_of_text|> … <|end_of_text|>``, Gemma's
``<bos> … <eos>``, Qwen's ``… <|endoftext|>``, torchtune's ``add_bos``/``add_eos``), and the
model sees a document's start as it sees a prompt's. Text that happens to spell a special token is encoded as ordinary text, so a corpus
cannot forge document boundaries and decoding the shards gives back the text exactly.

The split is by position, not by document: with B total input bytes, the cut sits near byte
B − ⌈f·B⌉ (at the nearest safe point before it, see :mod:`glassgpt.data.reading`), so a
single file (Tiny Shakespeare) splits like nanoGPT's first 90 % / last 10 %, and val holds at
least one byte whenever f > 0. Files larger than a piece are read in pieces and encoded in
batches with ``encode_batch``; memory stays within a few batches whatever the input size.
Records are counted in a first pass when the split needs the total (f > 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from glassgpt.data.documents import Corpus, as_corpus, check_not_empty
from glassgpt.data.reading import PIECE_BYTES, Piece, safe_cut
from glassgpt.data.shards import (
    META,
    SHARD_TOKENS,
    TOKENIZER,
    DataDir,
    DataMeta,
    ShardWriter,
    Split,
    dtype_for,
    saved_tokenizer,
)
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.char import CharTokenizer
from glassgpt.tokenizer.family import FamilyTokenizer

BATCH_BYTES = 8 << 20  # text per encode_batch call
EOT = "<|endoftext|>"
END_OF_TEXT = "<|end_of_text|>"  # Llama 3's (its eos_token may be the end of a turn)
CUT_WINDOW = 1 << 16  # how far before the val cut to look for a safe point


def separator(tokenizer: Any) -> tuple[str, str, list[int]]:
    """(kind, text, ids) of the document separator: ``<|endoftext|>`` if the tokenizer has it.

    Else a family's end-of-text token (Llama 3's ``<|end_of_text|>``, the tokenizer's
    ``eos_token``); otherwise the tokenizer's encoding of ``"\\n"``.
    """
    specials = getattr(tokenizer, "special_tokens", None) or {}
    for name in (EOT, END_OF_TEXT, getattr(tokenizer, "eos_token", None)):
        if name in specials:
            return "special", name, [int(specials[name])]
    try:
        ids = [int(i) for i in tokenizer.encode("\n")]
    except (GlassError, KeyError, ValueError) as e:
        raise GlassError(f"the tokenizer cannot encode the newline separator ({e})") from None
    if not ids:
        raise GlassError("the tokenizer encodes the newline separator as no tokens")
    return "text", "\n", ids


def document_prefix(tokenizer: Any, probe: str = "hello world") -> list[int]:
    """The ids a family tokenizer's post-processor puts before a prompt's own (its BOS: the
    ``encode_prompt`` ids before ``encode``'s), [] for glassgpt's own tokenizers."""
    if not isinstance(tokenizer, FamilyTokenizer):
        return []
    whole, own = list(tokenizer.encode_prompt(probe)), list(tokenizer.encode(probe))
    for k in range(len(whole) - len(own) + 1):
        if whole[k : k + len(own)] == own:
            return whole[:k]
    return []


def continuation(tokenizer: Any) -> tuple[str, list[int]] | None:
    """``(lead, its ids)`` for a tokenizer that puts ``▁`` before every text (Llama 2's,
    Mistral's): a part that continues a document (a large file's next piece, the text after
    the val cut) is encoded after ``lead`` and the lead's ids dropped, so that it is not read
    as a text's start (a ``▁`` there). None for any other tokenizer.

    The lead is a newline, a byte-fallback token that merges with nothing."""
    if not isinstance(tokenizer, FamilyTokenizer) or not tokenizer.prepends_space:
        return None
    return "\n", tokenizer.encode_ordinary("\n")


def ordinary_encoder(
    tokenizer: Any, workers: int | None = None
) -> Callable[[list[str]], list[Any]]:
    """texts → ids per text on ``workers`` cores (None: all), special-token strings as text."""
    kw: dict[str, Any] = {"allowed_special": frozenset(), "disallowed_special": frozenset()}
    if workers is not None:
        kw["num_workers"] = workers
    return lambda texts: tokenizer.encode_batch(texts, **kw)


def _clear_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise GlassError(f"{output}: output exists and is not a folder")
    old = [p for p in output.glob("*") if p.name in (META, TOKENIZER) or _is_shard(p.name)]
    if old and not overwrite:
        raise GlassError(f"{output}: already holds prepared data (pass --overwrite to replace it)")
    for p in old + [p for p in output.glob("*.bin.tmp") if _is_shard(p.name[:-4])]:
        p.unlink()  # .tmp: a shard a killed run left half-written


def _is_shard(name: str) -> bool:
    split, _, rest = name.partition("_")
    return split in ("train", "val") and rest.endswith(".bin") and rest[:-4].isdigit()


def prepare(
    inputs: Sequence[str | Path] | Corpus,
    output: str | Path,
    tokenizer: Any,
    *,
    val_fraction: float = 0.1,
    shard_tokens: int = SHARD_TOKENS,
    piece_bytes: int = PIECE_BYTES,
    batch_bytes: int = BATCH_BYTES,
    workers: int | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> DataDir:
    """Encode ``inputs`` (paths in order, or a :class:`~glassgpt.data.documents.Corpus`)
    into a data folder at ``output``; return it opened.

    ``workers`` cores encode (None: all); the ids are the same for any number, since
    texts are cut only where the ids of the parts are the ids of the whole. On any error,
    the files this call wrote are removed and the folder holds no ``meta.json``.
    """
    if workers is not None and workers < 1:
        raise ConfigError("workers", f"must be at least 1, got {workers}")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError("val_fraction", f"must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise ConfigError("shard_tokens", f"must be positive, got {shard_tokens}")
    corpus = as_corpus(inputs)
    # the split needs the total; text files cost a stat, records a counting pass
    sizes = corpus.sizes() if val_fraction > 0 or corpus.text_only else None
    total = sum(sizes) if sizes is not None else None
    n_vocab = int(tokenizer.n_vocab)
    dtype = dtype_for(n_vocab)
    sep_kind, sep_text, sep_ids = separator(tokenizer)
    sep_bytes = len(sep_text.encode("utf-8")) if sep_kind == "text" else 0
    prefix = document_prefix(tokenizer)
    tok_json, tok_kind, fingerprint = saved_tokenizer(tokenizer)
    encode = ordinary_encoder(tokenizer, workers)

    out = Path(output)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _clear_output(out, overwrite)
    except OSError as e:
        raise GlassError(f"{out}: cannot create the output folder ({e.strerror or e})") from None
    sink = _Sink(out, encode, n_vocab, dtype, shard_tokens, batch_bytes, sep_ids, sep_bytes,
                 prefix, continuation(tokenizer))  # fmt: skip
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    try:
        # global byte offset where val starts (no val: past the end)
        cut_at = total - val_bytes(total, val_fraction) if total is not None else math.inf
        _feed(corpus.pieces(piece_bytes), cut_at, total or 0, sink, bar.update)
        read = corpus.read_sizes
        if sizes is not None and read != sizes:
            changed = next(n for n, a, b in zip(corpus.names, read, sizes) if a != b)
            raise InputFileError(f"{changed}: changed while it was being read")
        check_not_empty(corpus.names, sum(read), corpus.bad)
        meta = DataMeta(
            dtype=str(dtype),
            n_vocab=n_vocab,
            tokenizer_kind=tok_kind,
            tokenizer_fingerprint=fingerprint,
            separator_kind=sep_kind,
            separator_text=sep_text,
            separator_ids=tuple(sep_ids),
            prefix_ids=tuple(prefix),
            splits=sink.close(),
            sources=tuple(zip(corpus.names, read)),
            shard_tokens=shard_tokens,
            val_fraction=val_fraction,
        )
        atomic_write(out / TOKENIZER, tok_json)
        atomic_write(
            out / META, (json.dumps(meta.to_json(), indent=1, ensure_ascii=False) + "\n").encode()
        )
    except BaseException as e:
        sink.discard()
        (out / TOKENIZER).unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, GlassError):
            raise GlassError(f"{out}: cannot write the data ({e.strerror or e})") from None
        raise
    finally:
        bar.close()
    return DataDir.open(out)


def val_bytes(total: int, val_fraction: float) -> int:
    """⌈f·B⌉ bytes of B for val, at least one when f > 0 and at most B − 1 (B ≥ 2).

    >>> val_bytes(1000, 0.1), val_bytes(3, 0.01), val_bytes(1000, 0.0)
    (100, 1, 0)
    """
    n_val = math.ceil(val_fraction * total) if val_fraction > 0 else 0
    if n_val and total >= 2:
        n_val = min(max(n_val, 1), total - 1)
    return n_val


Part = tuple[str, int, bool, str]  # (text, its bytes, ends its document, split)


def split_piece(piece: Piece, start: int, cut_at: float, total: int) -> list[Part]:
    """A piece (at global offset ``start``) as one part, or two where the val cut falls in it.

    The cut moves back to a safe point (:func:`~glassgpt.data.reading.safe_cut`).
    """
    split = "train" if start < cut_at else "val"
    if not start < cut_at < start + piece.n_bytes:
        return [(piece.text, piece.n_bytes, piece.last, split)]
    data = piece.text.encode("utf-8")
    local = safe_cut(data, int(cut_at) - start - CUT_WINDOW, int(cut_at) - start)
    if local == 0:  # the cut fell inside the first character: train takes it,
        local = len(piece.text[0].encode("utf-8"))  # unless nothing follows
        if local == piece.n_bytes and start + local >= total:
            local = 0
    return [
        (data[:local].decode("utf-8"), local, False, "train"),
        (data[local:].decode("utf-8"), piece.n_bytes - local, piece.last, "val"),
    ]


def _feed(
    pieces: Iterable[Piece],
    cut_at: float,
    total: int,
    sink: _Sink,
    advance: Callable[[int], Any],
) -> None:
    """Hand the pieces' parts to ``sink``, which encodes in batches."""
    start = 0  # global offset of the piece: the pieces are the corpus, in order
    for piece in pieces:
        for text, n_bytes, last, split in split_piece(piece, start, cut_at, total):
            if n_bytes or last:
                sink.add(text, n_bytes, last, split)
        sink.flush_if_full()
        advance(piece.n_bytes)
        start += piece.n_bytes
    sink.flush()


class _Sink:
    """Texts in, ids out: batches of about ``batch_bytes`` encoded at once and written to the
    train or val shards, each document after the prefix (a family's BOS) and followed by the
    separator; bytes and documents counted."""

    def __init__(
        self,
        out: Path,
        encode: Callable[[list[str]], list[Any]],
        n_vocab: int,
        dtype: Any,
        shard_tokens: int,
        batch_bytes: int,
        sep_ids: Sequence[int],
        sep_bytes: int,
        prefix: Sequence[int] = (),
        lead: tuple[str, list[int]] | None = None,
    ) -> None:
        self.encode, self.n_vocab, self.batch_bytes = encode, n_vocab, batch_bytes
        self.sep_array, self.sep_bytes = np.asarray(sep_ids, dtype=np.int64), sep_bytes
        self.prefix = np.asarray(prefix, dtype=np.int64)
        self.at_start = True  # the next part starts a document (parts come in stream order)
        self.lead = lead  # what a part that continues a document is encoded after
        self.writers = {s: ShardWriter(out, s, dtype, shard_tokens) for s in ("train", "val")}
        self.counts = {s: {"bytes": 0, "documents": 0} for s in ("train", "val")}
        self.batch: list[tuple[str, str, bool]] = []  # (text, split, ends its document)
        self.batch_size = 0

    def add(self, text: str, n_bytes: int, last: bool, split: str) -> None:
        self.counts[split]["bytes"] += n_bytes
        self.batch.append((text, split, last))
        self.batch_size += n_bytes

    def flush_if_full(self) -> None:
        if self.batch_size >= self.batch_bytes:
            self.flush()

    def flush(self) -> None:
        """Encode the batch and write its ids (and separators)."""
        if self.batch:
            starts, start = [], self.at_start
            for _, _, last in self.batch:
                starts.append(start)
                start = last
            lead, lead_ids = self.lead or ("", [])
            texts = [t if s else lead + t for (t, _, _), s in zip(self.batch, starts)]
            for (_, split, last), ids, s in zip(self.batch, self.encode(texts), starts):
                if not s and lead_ids:
                    if list(ids[: len(lead_ids)]) != lead_ids:
                        raise GlassError("the tokenizer merged a newline with the text after it")
                    ids = ids[len(lead_ids) :]
                arr = np.asarray(ids, dtype=np.int64)
                if arr.size and (arr.min() < 0 or arr.max() >= self.n_vocab):
                    raise GlassError(f"the tokenizer produced an id outside [0, {self.n_vocab})")
                if self.at_start and self.prefix.size:
                    self.writers[split].write(self.prefix)
                self.writers[split].write(arr)
                self.at_start = last
                if last:
                    self.writers[split].write(self.sep_array)
                    self.counts[split]["bytes"] += self.sep_bytes
                    self.counts[split]["documents"] += 1
        self.batch.clear()
        self.batch_size = 0

    def close(self) -> dict[str, Split]:
        """Close the shards; what each split holds."""
        for w in self.writers.values():
            w.close()
        return {
            s: Split(
                w.tokens, self.counts[s]["bytes"], self.counts[s]["documents"], tuple(w.shards)
            )
            for s, w in self.writers.items()
        }

    def discard(self) -> None:
        """Close the shards and remove every file written."""
        for w in self.writers.values():
            w.close()
            for p in w.written:
                p.unlink(missing_ok=True)


def char_set(inputs: Sequence[str | Path] | Corpus, piece_bytes: int = PIECE_BYTES) -> set[str]:
    """The distinct characters of the documents, read in pieces (strict UTF-8)."""
    chars: set[str] = set()
    for piece in as_corpus(inputs).pieces(piece_bytes):
        chars.update(piece.text)
    return chars


def char_tokenizer(files: Sequence[str | Path] | Corpus) -> Any:
    """A :class:`~glassgpt.tokenizer.CharTokenizer` of the files' characters plus ``"\\n"``.

    The newline is added so that it can always separate documents.
    """
    alphabet = sorted(char_set(files) | {"\n"})
    return CharTokenizer(alphabet)
