"""Documents stored as records: JSON Lines, JSON arrays, Parquet and Hugging Face datasets.

    document_i = record_i[field]      (records in file order, one document each)

Every reader streams: a JSON Lines file is read a line at a time, a JSON array an element
at a time (:class:`_ArrayScanner`, which holds one element and one read block), a Parquet
file and a dataset a record batch of ``BATCH_ROWS`` rows at a time (Parquet decodes one row
group's column at a time, so a row group bounds the memory too); a dataset saved with
``save_to_disk`` is memory-mapped by ``datasets``. Only the text field (column) is read.

A record is *bad* when its line is not JSON, it is not an object, it lacks the field, or the
field is not a string (``null`` included) or not encodable as UTF-8 (a lone surrogate from a
``\\ud800`` escape). Each reader reports a bad record to a :class:`BadRecords`, which raises
a one-line :class:`~glassgpt.errors.InputFileError` naming the file and line (row), or, with
``skip=True``, counts it and goes on. A file that cannot be read at all (a truncated Parquet
file, a JSON array that is not valid JSON, a missing column) is always an error.

``pyarrow`` and ``datasets`` are imported on use (:func:`require`): the extra
``glassgpt[data]`` installs them.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError, InputFileError

BATCH_ROWS = 256  # rows per Arrow record batch
JSON_BLOCK = 1 << 20  # characters read at a time from a JSON array
EXTRA = "data"  # pip install 'glassgpt[data]'


def require(module: str, what: str) -> Any:
    """Import an optional package, or fail in one line naming the pip extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise GlassError(
            f"reading {what} needs the {top} package: pip install 'glassgpt[{EXTRA}]'"
        ) from None


class BadRecords:
    """Where bad records go: an error (default) or, with ``skip``, a count per source."""

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}  # source -> the first bad record's place and reason

    def __call__(self, source: str, where: str, why: str) -> None:
        if not self.skip:
            raise InputFileError(f"{where}: {why} (--skip-bad skips such records)")
        self.counts[source] = self.counts.get(source, 0) + 1
        self.first.setdefault(source, f"{where}: {why}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def utf8_size(text: str) -> int:
    """UTF-8 length of ``text``; a lone surrogate raises ``UnicodeEncodeError``.

    >>> utf8_size("abc"), utf8_size("é€🙂")
    (3, 9)
    """
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _document(
    record: Any, field: str, name: str, where: str, bad: BadRecords
) -> tuple[str, int] | None:
    """(text, UTF-8 bytes) of one JSON record, or None after reporting it bad."""
    if not isinstance(record, dict):
        bad(name, where, f"the record is {_type_name(record)}, not an object")
        return None
    if field not in record:
        fields = ", ".join(map(repr, list(record)[:8])) or "none"
        bad(name, where, f"no field {field!r} (the record's fields: {fields}; see --text-field)")
        return None
    text = record[field]
    if not isinstance(text, str):
        bad(name, where, f"field {field!r} is {_type_name(text)}, not a string")
        return None
    try:
        return text, utf8_size(text)
    except UnicodeEncodeError as e:
        bad(name, where, f"field {field!r} holds {text[e.start]!r}, a lone surrogate (not UTF-8)")
        return None


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as e:
        raise InputFileError(f"{path}: cannot read ({e.strerror or e})") from None


def iter_json_lines(path: Path, field: str, bad: BadRecords) -> Iterator[tuple[str, int]]:
    """(text, bytes) of each record of a JSON Lines file; blank lines are passed over."""
    name = str(path)
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.isspace():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                bad(name, f"{path}:{lineno}", f"not JSON ({e.msg} at column {e.colno})")
                continue
            except UnicodeDecodeError as e:
                bad(name, f"{path}:{lineno}", f"not valid UTF-8 ({e.reason})")
                continue
            doc = _document(record, field, name, f"{path}:{lineno}", bad)
            if doc is not None:
                yield doc


class _ArrayScanner:
    """The elements of a JSON array read block by block: ``[`` e₁ ``,`` e₂ … ``]``.

    ``raw_decode`` parses one element from the buffer; an element that runs past the buffer
    (an error, or a value that ends exactly at the buffer's end, as ``12`` of ``123`` would)
    is retried after reading at least as much again, so a large element costs linear time.
    """

    def __init__(self, f: Any, path: Path, block: int | None = None) -> None:
        self.f, self.path, self.block = f, path, block or JSON_BLOCK
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.line, self.line_pos = 1, 0  # line number of buf[line_pos]

    def _fill(self, at_least: int) -> bool:
        """Append at least ``at_least`` characters (fewer at the end of the file)."""
        if self.eof:
            return False
        self.line += self.buf.count("\n", self.line_pos, self.pos)
        self.buf, self.line_pos = self.buf[self.pos :], 0
        self.pos = 0
        added = 0
        while added < at_least and not self.eof:
            raw = self.f.read(max(self.block, at_least - added))
            self.eof = not raw
            try:
                text = self.decoder.decode(raw, final=self.eof)
            except UnicodeDecodeError as e:
                raise InputFileError(f"{self.path}: not valid UTF-8 ({e.reason})") from None
            self.buf += text
            added += len(text)
        return True

    def lineno(self, pos: int) -> int:
        self.line += self.buf.count("\n", self.line_pos, pos)
        self.line_pos = pos
        return self.line

    def _skip_space(self) -> str:
        """The next non-space character (consumed), or "" at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n\ufeff":
                self.pos += 1
            if self.pos < len(self.buf):
                self.pos += 1
                return self.buf[self.pos - 1]
            if not self._fill(self.block):
                return ""

    def _fail(self, what: str) -> InputFileError:
        return InputFileError(f"{self.path}:{self.lineno(self.pos)}: not a JSON array ({what})")

    def elements(self) -> Iterator[tuple[Any, int]]:
        """(element, line number where it starts)."""
        decoder = json.JSONDecoder()
        if self._skip_space() != "[":
            raise self._fail("it does not start with '['")
        if self._peek_end():
            return
        while True:
            self._skip_space()
            self.pos -= 1
            while True:
                try:
                    value, end = decoder.raw_decode(self.buf, self.pos)
                    if end < len(self.buf) or self.eof:
                        break
                except json.JSONDecodeError as e:
                    if self.eof:
                        self.pos = e.pos
                        raise self._fail(e.msg) from None
                self._fill(max(len(self.buf) - self.pos, self.block))  # double what is held
            line = self.lineno(self.pos)
            self.pos = end
            yield value, line
            c = self._skip_space()
            if c == "]":
                break
            if c != ",":
                self.pos -= bool(c)
                raise self._fail("expected ',' or ']' after an element")
        if self._skip_space():
            self.pos -= 1
            raise self._fail("text after the closing ']'")

    def _peek_end(self) -> bool:
        c = self._skip_space()
        if c == "]":
            return True
        self.pos -= bool(c)
        if not c:
            raise self._fail("the file ends inside it")
        return False


def json_kind(path: Path) -> str:
    """``"array"`` when a ``.json`` file's first non-space character is ``[``, else ``"lines"``."""
    with _open(path) as f:
        head = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return "array" if head.startswith(b"[") else "lines"


def iter_json_array(path: Path, field: str, bad: BadRecords) -> Iterator[tuple[str, int]]:
    """(text, bytes) of each element of a JSON array of records, streamed."""
    name = str(path)
    with _open(path) as f:
        for record, line in _ArrayScanner(f, path).elements():
            doc = _document(record, field, name, f"{path}:{line}", bad)
            if doc is not None:
                yield doc


# -- Arrow: Parquet files and Hugging Face datasets --------------------------------------------


def _string_column(pa: Any, schema: Any, field: str, where: str) -> None:
    """Refuse a missing or non-string column, naming the columns that exist."""
    if field not in schema.names:
        names = ", ".join(schema.names) or "none"
        raise InputFileError(
            f"{where}: no column {field!r}; its columns: {names} (see --text-field)"
        )
    t = schema.field(field).type
    view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow ≥ 16
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or view(t)):
        raise InputFileError(f"{where}: column {field!r} holds {t}, not strings")


def _batch_documents(
    column: Any, first_row: int, name: str, bad: BadRecords
) -> Iterator[tuple[str, int]]:
    """(text, bytes) of each non-null value of an Arrow string array; nulls are bad records."""
    if column.null_count:
        for i, text in enumerate(column.to_pylist()):
            if text is None:
                bad(name, f"{name}: row {first_row + i}", "the text is null")
            else:
                yield text, utf8_size(text)
        return
    for text in column.to_pylist():
        yield text, utf8_size(text)


def _batch_bytes(pc: Any, column: Any, first_row: int, name: str, bad: BadRecords) -> int:
    """Total UTF-8 bytes of an Arrow string array, nulls reported (the counting pass)."""
    if column.null_count:
        for i in pc.indices_nonzero(column.is_null()).to_pylist():
            bad(name, f"{name}: row {first_row + int(i)}", "the text is null")
    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


class ParquetSource:
    """The ``field`` column of one Parquet file, read a record batch at a time."""

    def __init__(self, path: Path, field: str) -> None:
        self.path, self.field, self.name = path, field, str(path)
        self.pa = require("pyarrow", "Parquet files")
        pq = require("pyarrow.parquet", "Parquet files")
        try:
            self.file = pq.ParquetFile(path, pre_buffer=False)  # no read-ahead: a row group
        except OSError as e:
            raise InputFileError(f"{path}: cannot read ({e.strerror or e})") from None
        except self.pa.ArrowException as e:
            raise InputFileError(
                f"{path}: not a readable Parquet file ({_first_line(e)})"
            ) from None
        _string_column(self.pa, self.file.schema_arrow, field, self.name)

    def _batches(self) -> Iterator[tuple[Any, int]]:
        row = 0
        try:
            for batch in self.file.iter_batches(batch_size=BATCH_ROWS, columns=[self.field]):
                yield batch.column(0), row
                row += batch.num_rows
        except self.pa.ArrowException as e:
            raise InputFileError(
                f"{self.path}: a damaged Parquet file (near row {row}: {_first_line(e)})"
            ) from None

    def documents(self, bad: BadRecords) -> Iterator[tuple[str, int]]:
        for column, row in self._batches():
            yield from _batch_documents(column, row, self.name, bad)

    def count(self, bad: BadRecords) -> int:
        pc = require("pyarrow.compute", "Parquet files")
        return sum(_batch_bytes(pc, c, row, self.name, bad) for c, row in self._batches())


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """Hold back the named loggers' warnings (retries, cache notes): the error says it."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def is_saved_dataset(path: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and (
        (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def split_spec(spec: str) -> tuple[str, str | None]:
    """``NAME[:split]`` → (NAME, split or None).

    >>> split_spec("stanfordnlp/imdb:test"), split_spec("data/saved")
    (('stanfordnlp/imdb', 'test'), ('data/saved', None))
    """
    name, colon, split = spec.rpartition(":")
    if not colon or not name or not split or "/" in split or "\\" in split:
        return spec, None
    return name, split


class DatasetSource:
    """The ``field`` column of a Hugging Face dataset: a ``save_to_disk`` folder, or a
    dataset ``datasets.load_dataset`` can reach (it caches Arrow files and memory-maps them)."""

    def __init__(self, spec: str, field: str, split: str | None = None) -> None:
        name, given = split_spec(spec)
        split = split or given
        self.field = field
        self.pa = require("pyarrow", "Hugging Face datasets")
        ds = require("datasets", "Hugging Face datasets")
        local = Path(name)
        try:
            if is_saved_dataset(local):
                data = ds.load_from_disk(str(local))
            elif local.exists():
                raise InputFileError(f"{name}: not a dataset folder written by save_to_disk")
            else:
                with _quiet("huggingface_hub", "datasets", "fsspec"):
                    data = ds.load_dataset(name, split=split)
        except GlassError:
            raise
        except Exception as e:  # datasets raises many kinds: network, not found, config
            raise GlassError(
                f"hf dataset {name!r}: cannot load it ({type(e).__name__}: {_first_line(e)})"
            ) from None
        if isinstance(data, ds.DatasetDict):
            splits = list(data)
            if split is None:
                split = "train" if "train" in splits else (splits[0] if len(splits) == 1 else None)
            if split not in splits:
                raise GlassError(
                    f"hf dataset {name!r}: "
                    + (f"no split {split!r}" if split else "several splits; name one as NAME:split")
                    + f"; its splits: {', '.join(splits)}"
                )
            data = data[split]
        self.name = f"hf:{name}" + (f":{split}" if split else "")
        _string_column(self.pa, data.data.schema, field, self.name)
        self.dataset = data.select_columns([field]).with_format("arrow")

    def _batches(self) -> Iterator[tuple[Any, int]]:
        row = 0
        for table in self.dataset.iter(batch_size=BATCH_ROWS):
            for chunk in table.column(0).chunks:
                yield chunk, row
                row += len(chunk)

    def documents(self, bad: BadRecords) -> Iterator[tuple[str, int]]:
        for column, row in self._batches():
            yield from _batch_documents(column, row, self.name, bad)

    def count(self, bad: BadRecords) -> int:
        pc = require("pyarrow.compute", "Hugging Face datasets")
        return sum(_batch_bytes(pc, c, row, self.name, bad) for c, row in self._batches())
