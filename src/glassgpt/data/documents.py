"""A corpus: the documents of inputs in any supported format, as one stream of pieces.

    corpus = docs(input₁) ‖ docs(input₂) ‖ …
    docs(a text file) = [its text]        docs(records) = [r[field] for r in records]

An input's format follows from its name: ``.jsonl`` / ``.ndjson`` are JSON Lines, ``.json``
a JSON array of records when it starts with ``[`` (else JSON Lines), ``.parquet`` Parquet, a
folder written by ``save_to_disk`` a Hugging Face dataset, ``hf:NAME[:split]`` a dataset
``datasets.load_dataset`` can reach (a path that exists is always a path); any other file is
text. Other folders give their files (:func:`~glassgpt.data.reading.resolve_inputs`), each
read by its own name. The records' text field is ``text_field`` (default ``text``).

A document is one text file or one record, and a record's text is cut into pieces exactly
where :func:`~glassgpt.data.reading.iter_pieces` cuts a file holding the same bytes
(:func:`~glassgpt.data.reading.text_pieces`). So the same documents give the same pieces,
hence the same ids, written as one ``.txt`` file each, as JSON Lines, a JSON array, Parquet
or a dataset. Empty documents contribute nothing, as empty files do.

A corpus is read in at most two passes, both streaming: :meth:`Corpus.sizes` (the bytes of
each input: a text file's size, a counting pass over records, which only the train/val
split needs) and :meth:`Corpus.pieces`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from glassgpt.data.reading import (
    PIECE_BYTES,
    Piece,
    file_size,
    iter_pieces,
    resolve_inputs,
    text_pieces,
)
from glassgpt.data.records import (
    BadRecords,
    DatasetSource,
    ParquetSource,
    is_saved_dataset,
    iter_json_array,
    iter_json_lines,
    json_kind,
)
from glassgpt.errors import ConfigError, InputFileError

HF_PREFIX = "hf:"
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


def input_kind(path: Path) -> str:
    """``text``, ``jsonl``, ``json`` or ``parquet`` by the file's suffix (case ignored).

    >>> [input_kind(Path(p)) for p in ("a.txt", "b.JSONL", "c.json", "d.parquet", "e")]
    ['text', 'jsonl', 'json', 'parquet', 'text']
    """
    return SUFFIXES.get(path.suffix.lower(), "text")


def resolve_corpus(inputs: Sequence[str | Path], pattern: str = "*") -> list[tuple[str, str]]:
    """Inputs as ``(kind, path or dataset spec)``: folders expanded, datasets kept whole."""
    if not inputs:
        raise InputFileError("no input given")
    out: list[tuple[str, str]] = []
    for raw in inputs:
        p = Path(raw)
        if isinstance(raw, str) and raw.startswith(HF_PREFIX) and not p.exists():
            out.append(("dataset", raw[len(HF_PREFIX) :]))
        elif is_saved_dataset(p):
            out.append(("dataset", str(p)))
        else:
            out.extend((input_kind(f), str(f)) for f in resolve_inputs([p], pattern))
    return out


class Corpus:
    """Documents from ``inputs`` (paths, folders, ``hf:NAME[:split]``), read as pieces.

    ``skip_bad``: bad records are skipped and counted (:attr:`skipped`, the counts of the
    latest pass) instead of stopping with an error.
    """

    def __init__(
        self,
        inputs: Sequence[str | Path],
        *,
        text_field: str = "text",
        skip_bad: bool = False,
        pattern: str = "*",
    ) -> None:
        if not text_field:
            raise ConfigError("text_field", "must name a field")
        self.text_field, self.skip_bad = text_field, skip_bad
        self.inputs = resolve_corpus(inputs, pattern)
        self._datasets: dict[str, DatasetSource] = {}
        self._sizes: list[int] | None = None
        self.bad = BadRecords(skip_bad)
        self.read_sizes: list[int] = []  # bytes of each input in the latest pass of pieces()

    @property
    def text_only(self) -> bool:
        """Every input is a text file (sizes cost nothing; tokenizers read the paths)."""
        return all(kind == "text" for kind, _ in self.inputs)

    @property
    def names(self) -> list[str]:
        return [self._name(kind, spec) for kind, spec in self.inputs]

    @property
    def skipped(self) -> dict[str, int]:
        """Bad records skipped in the latest pass, per input."""
        return dict(self.bad.counts)

    def _name(self, kind: str, spec: str) -> str:
        return self._dataset(spec).name if kind == "dataset" else spec

    def _dataset(self, spec: str) -> DatasetSource:
        if spec not in self._datasets:
            self._datasets[spec] = DatasetSource(spec, self.text_field)
        return self._datasets[spec]

    def _documents(self, kind: str, spec: str, bad: BadRecords) -> Iterator[tuple[str, int]]:
        """(text, UTF-8 bytes) of each document of a record input."""
        path = Path(spec)
        if kind == "jsonl" or (kind == "json" and json_kind(path) == "lines"):
            return iter_json_lines(path, self.text_field, bad)
        if kind == "json":
            return iter_json_array(path, self.text_field, bad)
        if kind == "parquet":
            return ParquetSource(path, self.text_field).documents(bad)
        return self._dataset(spec).documents(bad)

    def _count(self, kind: str, spec: str, bad: BadRecords) -> int:
        if kind == "text":
            return file_size(Path(spec))
        if kind == "parquet":
            return ParquetSource(Path(spec), self.text_field).count(bad)
        if kind == "dataset":
            return self._dataset(spec).count(bad)
        return sum(n for _, n in self._documents(kind, spec, bad))

    def sizes(self) -> list[int]:
        """UTF-8 bytes of each input's documents (a counting pass; kept); none is an error."""
        if self._sizes is None:
            self.bad = BadRecords(self.skip_bad)
            sizes = [self._count(kind, spec, self.bad) for kind, spec in self.inputs]
            check_not_empty(self.names, sum(sizes), self.bad)
            self._sizes = sizes
        return self._sizes

    def pieces(self, piece_bytes: int = PIECE_BYTES) -> Iterator[Piece]:
        """Every document as pieces (:attr:`Piece.last` ends a document), inputs in order."""
        self.bad = BadRecords(self.skip_bad)
        self.read_sizes = [0] * len(self.inputs)
        for i, (kind, spec) in enumerate(self.inputs):
            if kind == "text":
                for piece in iter_pieces(Path(spec), piece_bytes):
                    self.read_sizes[i] += piece.n_bytes
                    yield piece
                continue
            for text, n_bytes in self._documents(kind, spec, self.bad):
                self.read_sizes[i] += n_bytes
                yield from text_pieces(text, n_bytes, piece_bytes)

    def texts(self) -> Iterator[str | Path]:
        """For training a tokenizer: a text file's path, a record's text."""
        self.bad = BadRecords(self.skip_bad)
        for kind, spec in self.inputs:
            if kind == "text":
                yield Path(spec)
            else:
                yield from (text for text, _ in self._documents(kind, spec, self.bad))

    def describe_skipped(self) -> str | None:
        """One line on the bad records skipped in the latest pass, or None."""
        if not self.bad.total:
            return None
        parts = [f"{n:,} in {name}" for name, n in self.bad.counts.items()]
        first = next(iter(self.bad.first.values()))
        return f"skipped {self.bad.total:,} bad records ({', '.join(parts)}); the first: {first}"


def check_not_empty(names: Sequence[str], total: int, bad: BadRecords) -> None:
    """No text in all the inputs is an :class:`InputFileError` naming them."""
    if total:
        return
    shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    extra = f" ({bad.total:,} bad records skipped)" if bad.total else ""
    raise InputFileError(f"the input is empty: {shown}{extra}")


def as_corpus(inputs: Sequence[str | Path] | Corpus, **options: Any) -> Corpus:
    return inputs if isinstance(inputs, Corpus) else Corpus(list(inputs), **options)
