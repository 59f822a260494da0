"""Token shards on disk: the layout of a prepared data folder, its ``meta.json``, and reading it.

A split (``train`` or ``val``) is one token stream s = s₀ s₁ … s_{N−1} with every sᵢ < n_vocab,
stored as consecutive raw little-endian files ``{split}_000.bin``, ``{split}_001.bin``, …
of at most ``shard_tokens`` tokens each; dtype uint16 when n_vocab ≤ 65,536, else uint32.
The folder also holds ``tokenizer.json`` (a copy of the tokenizer that made the ids, so
training needs only this folder) and ``meta.json``::

    {"format": "glassgpt-data", "version": 1, "dtype": "uint16", "n_vocab": 65,
     "tokenizer": {"file": "tokenizer.json", "kind": "char", "fingerprint": "sha256:…"},
     "separator": {"kind": "text", "text": "\\n", "ids": [0]},
     "splits": {"train": {"tokens": …, "bytes": …, "documents": …,
                          "shards": [{"file": "train_000.bin", "tokens": …}]},
                "val": {…}},
     "sources": [{"path": "…", "bytes": …}], "shard_tokens": …, "val_fraction": 0.1,
     "created_by": "glassgpt 0.1.0"}

A family tokenizer that puts a BOS before each prompt has its ids as ``"prefix_ids"`` in
``"separator"``: they open each document (:mod:`glassgpt.data.prepare`).

``bytes`` counts the UTF-8 bytes of text that a split's tokens stand for (separators written
as text included, special tokens excluded), so that bits per byte = Σ loss_nats / (bytes · ln 2).
The tokenizer fingerprint is the SHA-256 of its saved JSON in canonical form (keys sorted,
no whitespace); a data folder is refused with a tokenizer whose fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from glassgpt.errors import GlassError, InputFileError
from glassgpt.formats import check_format
from glassgpt.storage import inside
from glassgpt.tokenizer.loading import load_tokenizer
from glassgpt.version import __version__

FORMAT = "glassgpt-data"
VERSION = 1
META = "meta.json"
TOKENIZER = "tokenizer.json"
SPLITS = ("train", "val")
SHARD_TOKENS = 100_000_000


def dtype_for(n_vocab: int) -> np.dtype:
    """Little-endian uint16 when every id fits (n_vocab ≤ 2¹⁶), else uint32.

    >>> [str(dtype_for(n)) for n in (65, 50257, 65536, 65537)]
    ['uint16', 'uint16', 'uint16', 'uint32']
    """
    if not 1 <= n_vocab <= 1 << 32:
        raise GlassError(f"n_vocab={n_vocab} cannot be stored as token shards")
    return np.dtype("<u2") if n_vocab <= 1 << 16 else np.dtype("<u4")


def fingerprint_json(data: bytes | str) -> str:
    """``sha256:`` of a JSON document in canonical form (sorted keys, no whitespace).

    >>> fingerprint_json('{"b": 1, "a": [1, 2]}') == fingerprint_json('{"a":[1,2],"b":1}')
    True
    """
    obj = json.loads(data)
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def saved_tokenizer(tokenizer: Any) -> tuple[bytes, str, str]:
    """(saved JSON bytes, kind, fingerprint) of a tokenizer object, via its ``save``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, TOKENIZER)
        tokenizer.save(path)
        raw = path.read_bytes()
    kind = str(json.loads(raw).get("kind", type(tokenizer).__name__))
    return raw, kind, fingerprint_json(raw)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The fingerprint that a data folder prepared with ``tokenizer`` records."""
    return saved_tokenizer(tokenizer)[2]


@dataclass(frozen=True)
class Split:
    """One split's counts and shard files."""

    tokens: int
    bytes: int
    documents: int  # documents that start in this split
    shards: tuple[tuple[str, int], ...]  # (file name, tokens)

    @property
    def bytes_per_token(self) -> float:
        """Text bytes per token: bits per byte = loss_nats / (bytes_per_token · ln 2).

        >>> Split(tokens=4, bytes=10, documents=1, shards=()).bytes_per_token
        2.5
        """
        if self.tokens == 0:
            raise GlassError("an empty split has no bytes per token")
        return self.bytes / self.tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "documents": self.documents,
            "shards": [{"file": f, "tokens": n} for f, n in self.shards],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Split:
        shards = tuple((str(s["file"]), int(s["tokens"])) for s in d["shards"])
        return cls(int(d["tokens"]), int(d["bytes"]), int(d["documents"]), shards)


@dataclass(frozen=True)
class DataMeta:
    """The contents of ``meta.json`` (see the module docstring)."""

    dtype: str
    n_vocab: int
    tokenizer_kind: str
    tokenizer_fingerprint: str
    separator_kind: str  # "special" (an end-of-text id) or "text"
    separator_text: str
    separator_ids: tuple[int, ...]
    splits: dict[str, Split]
    sources: tuple[tuple[str, int], ...]  # (path, bytes)
    shard_tokens: int
    val_fraction: float
    prefix_ids: tuple[int, ...] = ()  # before each document: a family tokenizer's BOS

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype,
            "n_vocab": self.n_vocab,
            "tokenizer": {
                "file": TOKENIZER,
                "kind": self.tokenizer_kind,
                "fingerprint": self.tokenizer_fingerprint,
            },
            "separator": {
                "kind": self.separator_kind,
                "text": self.separator_text,
                "ids": list(self.separator_ids),
                **({"prefix_ids": list(self.prefix_ids)} if self.prefix_ids else {}),
            },
            "splits": {name: s.to_json() for name, s in self.splits.items()},
            "sources": [{"path": p, "bytes": n} for p, n in self.sources],
            "shard_tokens": self.shard_tokens,
            "val_fraction": self.val_fraction,
            "created_by": f"glassgpt {__version__}",
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DataMeta:
        tok, sep = d["tokenizer"], d["separator"]
        return cls(
            dtype=str(d["dtype"]),
            n_vocab=int(d["n_vocab"]),
            tokenizer_kind=str(tok["kind"]),
            tokenizer_fingerprint=str(tok["fingerprint"]),
            separator_kind=str(sep["kind"]),
            separator_text=str(sep["text"]),
            separator_ids=tuple(int(i) for i in sep["ids"]),
            splits={name: Split.from_json(s) for name, s in d["splits"].items()},
            sources=tuple((str(s["path"]), int(s["bytes"])) for s in d["sources"]),
            shard_tokens=int(d["shard_tokens"]),
            val_fraction=float(d["val_fraction"]),
            prefix_ids=tuple(int(i) for i in sep.get("prefix_ids", ())),
        )


class ShardWriter:
    """Appends ids to ``{split}_NNN.bin`` files of at most ``shard_tokens`` tokens each.

    A shard is written as ``{name}.tmp`` and renamed to its name when complete, so a killed
    run leaves no half-written file under a shard's name.
    """

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards: list[tuple[str, int]] = []
        self.written: list[Path] = []  # shard paths (and the one being written, as .tmp)
        self._file: BinaryIO | None = None

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.shards)

    def write(self, ids: np.ndarray) -> None:
        """Append ``ids`` (already checked to be in range) across as many shards as needed."""
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        start = 0
        while start < len(ids):
            if self._file is None or self.shards[-1][1] == self.shard_tokens:
                self._file = self._open_next()
            name, n = self.shards[-1]
            take = min(self.shard_tokens - n, len(ids) - start)
            self._file.write(ids[start : start + take].tobytes())
            self.shards[-1] = (name, n + take)
            start += take

    def _open_next(self) -> BinaryIO:
        self.close()
        name = f"{self.split}_{len(self.shards):03d}.bin"
        path = self.folder / name
        self.written += [path, tmp_path(path)]
        self.shards.append((name, 0))
        return tmp_path(path).open("wb")

    def close(self) -> None:
        """Finish the shard being written: flush it and give it its name."""
        if self._file is not None:
            self._file.close()
            self._file = None
            path = self.folder / self.shards[-1][0]
            os.replace(tmp_path(path), path)


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before it is complete."""
    return path.with_name(path.name + ".tmp")


class TokenStream:
    """A split's shards, memory-mapped, read as one stream: ``stream.read(start, n)``."""

    def __init__(self, paths: list[Path], dtype: np.dtype) -> None:
        self.maps = [np.memmap(p, dtype=dtype, mode="r") for p in paths]
        self.maps = [m for m in self.maps if len(m)]
        self.starts = np.cumsum([0] + [len(m) for m in self.maps])  # starts[i] = offset of map i

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens ``[start, start + n)`` as int64 (crossing shard boundaries where needed)."""
        if start < 0 or start + n > len(self):
            raise IndexError(f"window [{start}, {start + n}) outside a stream of {len(self)}")
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        local = start - int(self.starts[i])
        m = self.maps[i]
        if local + n <= len(m):
            return np.asarray(m[local : local + n], dtype=np.int64)
        parts, left = [], n
        while left:
            m = self.maps[i]
            take = min(left, len(m) - local)
            parts.append(np.asarray(m[local : local + take], dtype=np.int64))
            left -= take
            i, local = i + 1, 0
        return np.concatenate(parts)


class DataDir:
    """A prepared data folder: ``DataDir.open(path, tokenizer=None)`` checks it and maps it."""

    def __init__(self, path: Path, meta: DataMeta) -> None:
        self.path, self.meta = path, meta

    @classmethod
    def open(cls, path: str | Path, tokenizer: Any = None) -> DataDir:
        """Read and check ``meta.json`` and the shard sizes; with ``tokenizer``, its fingerprint."""
        folder = Path(path)
        meta_path = folder / META
        if not folder.is_dir():
            raise InputFileError(f"{folder}: data folder not found")
        if not meta_path.is_file():
            raise InputFileError(
                f"{folder}: not a prepared data folder (no {META}; run `glassgpt data prepare`)"
            )
        try:
            raw = json.loads(meta_path.read_bytes())
        except (OSError, ValueError) as e:
            raise InputFileError(f"{meta_path}: unreadable ({e})") from None
        raw = check_format(
            raw,
            meta_path,
            FORMAT,
            VERSION,
            what="data format",
            not_ours=f"not a {FORMAT} meta file",
        )
        try:
            meta = DataMeta.from_json(raw)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise InputFileError(f"{meta_path}: malformed ({type(e).__name__}: {e})") from None
        data = cls(folder, meta)
        data._check_shards()
        if tokenizer is not None:
            data.check_tokenizer(tokenizer)
        return data

    def _check_shards(self) -> None:
        itemsize = np.dtype(self.meta.dtype).itemsize
        for split in self.meta.splits.values():
            for name, n in split.shards:
                path = inside(self.path, name, self.path / META)  # a name from meta.json
                size = path.stat().st_size if path.is_file() else None
                if size != n * itemsize:
                    found = "missing" if size is None else f"{size} bytes"
                    raise InputFileError(
                        f"{path}: shard is {found}, {META} says {n} tokens of {self.meta.dtype}"
                    )

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Refuse a tokenizer other than the one the shards were made with."""
        fingerprint = tokenizer_fingerprint(tokenizer)
        if fingerprint != self.meta.tokenizer_fingerprint:
            raise GlassError(
                f"{self.path} was prepared with another tokenizer "
                f"({self.meta.tokenizer_fingerprint[:19]}…, given {fingerprint[:19]}…); "
                "use its tokenizer.json or prepare the data again"
            )

    def load_tokenizer(self) -> Any:
        """The tokenizer saved with the shards (checked against the recorded fingerprint)."""
        path = self.path / TOKENIZER
        if not path.is_file():
            raise InputFileError(f"{path}: missing from the data folder")
        if fingerprint_json(path.read_bytes()) != self.meta.tokenizer_fingerprint:
            raise InputFileError(f"{path}: does not match the fingerprint in {META}")
        return load_tokenizer(path)

    def split(self, name: str) -> Split:
        if name not in self.meta.splits:
            raise GlassError(f"unknown split {name!r}; this folder has {sorted(self.meta.splits)}")
        return self.meta.splits[name]

    def stream(self, name: str) -> TokenStream:
        """The split's tokens, memory-mapped."""
        paths = [self.path / f for f, _ in self.split(name).shards]
        return TokenStream(paths, np.dtype(self.meta.dtype))
