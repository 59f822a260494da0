"""Files a tokenizer reads and writes: corpora, GPT-2's original files, our JSON format.

GPT-2's files write each token's bytes in a printable alphabet, one character per byte:

    byte b ↦ chr(b)          for the 188 printable bytes  ! .. ~,  ¡ .. ¬,  ® .. ÿ
    byte b ↦ chr(256 + k)    for the k-th (k = 0, 1, ...) remaining byte, in byte order

so the space 0x20 is ``Ġ`` (U+0120) and ``Ġthe`` is b" the". Our JSON format writes tokens
the same way (:func:`token_to_str`), so a saved GPT-2 vocab reads like ``encoder.json``.

Every failure here is a one-line :class:`~glassgpt.errors.GlassError` naming the file.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from glassgpt.errors import GlassError, InputFileError
from glassgpt.formats import check_format
from glassgpt.storage import atomic_write

if TYPE_CHECKING:
    from typing import Self

FORMAT = "glassgpt-tokenizer"
VERSION = 1


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to one printable character (see the module docstring).

    >>> m = bytes_to_unicode()
    >>> m[ord("a")], m[ord(" ")], m[0], len(set(m.values()))
    ('a', 'Ġ', 'Ā', 256)
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shown = set(printable)
    out = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in shown)
    out.update({b: chr(256 + k) for k, b in enumerate(others)})
    return dict(sorted(out.items()))


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of :func:`bytes_to_unicode`."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_str(token: bytes) -> str:
    """Token bytes → GPT-2's printable form.

    >>> token_to_str(b" the\\n")
    'ĠtheĊ'
    """
    m = bytes_to_unicode()
    return "".join(m[b] for b in token)


def str_to_token(text: str) -> bytes:
    """GPT-2's printable form → token bytes (``KeyError`` for a character outside it).

    >>> str_to_token("ĠtheĊ")
    b' the\\n'
    """
    m = unicode_to_bytes()
    return bytes(m[c] for c in text)


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 file's text; missing, unreadable or non-UTF-8 files raise :class:`InputFileError`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"input file not found: {p}") from None
    except IsADirectoryError:
        raise InputFileError(f"input is a directory, not a file: {p}") from None
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(
            f"{p}: not UTF-8 at byte offset {e.start} ({data[e.start : e.start + 1]!r})"
        ) from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file, turning every failure into a one-line :class:`InputFileError`."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}") from None


def read_gpt2(
    encoder_json: str | os.PathLike[str], vocab_bpe: str | os.PathLike[str]
) -> tuple[list[bytes], dict[tuple[int, int], int], dict[str, int]]:
    """GPT-2's ``encoder.json`` and ``vocab.bpe`` → ``(vocab, merges, special_tokens)``.

    Ids are those of ``encoder.json``; ``<|endoftext|>`` is the one special token.
    """
    encoder = read_json(encoder_json)
    if not isinstance(encoder, dict) or not encoder:
        raise InputFileError(f"{encoder_json}: expected a JSON object token → id")
    specials = {t: i for t, i in encoder.items() if t.startswith("<|") and t.endswith("|>")}
    ordinary = {t: i for t, i in encoder.items() if t not in specials}
    n = len(ordinary)
    vocab: list[bytes | None] = [None] * n
    for text, i in ordinary.items():
        if not isinstance(i, int) or not 0 <= i < n or vocab[i] is not None:
            raise InputFileError(
                f"{encoder_json}: token {text!r} has id {i!r}; ids must be 0..{n - 1}, once each"
            )
        try:
            vocab[i] = str_to_token(text)
        except KeyError:
            raise InputFileError(
                f"{encoder_json}: token {text!r} is not in GPT-2's byte alphabet"
            ) from None
    ids = {t: i for i, t in enumerate(vocab)}
    merges: dict[tuple[int, int], int] = {}
    lines = read_text(vocab_bpe).split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        left, _, right = line.partition(" ")
        try:
            a, b = ids[str_to_token(left)], ids[str_to_token(right)]
            merges[(a, b)] = ids[vocab[a] + vocab[b]]  # type: ignore[operator]
        except KeyError:
            raise InputFileError(
                f"{vocab_bpe}: line {lineno} is not a merge of two known tokens: {line!r}"
            ) from None
    return vocab, merges, specials  # type: ignore[return-value]


def dumps(data: dict[str, Any]) -> str:
    """JSON with one line per top-level key, and per item of a top-level list.

    >>> print(dumps({"version": 1, "merges": [[0, 1, 2], [2, 2, 3]]}))
    {
     "version": 1,
     "merges": [
      [0, 1, 2],
      [2, 2, 3]
     ]
    }
    """

    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))

    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {one(v)}" for v in value)
            lines.append(f" {one(key)}: [\n{items}\n ]")
        else:
            lines.append(f" {one(key)}: {one(value)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write ``data`` as JSON (UTF-8, see :func:`dumps`), atomically; OS errors become one-line
    :class:`GlassError`."""
    atomic_write(path, (dumps(data) + "\n").encode("utf-8"))  # an old file survives a failure


def read_tokenizer_json(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
    """Read a saved tokenizer, checking the format, the version and (if given) the kind."""
    data = check_format(
        read_json(path),
        path,
        FORMAT,
        VERSION,
        what="tokenizer file",
        not_ours=f'not a glassgpt tokenizer file (no "format": "{FORMAT}")',
    )
    if kind is not None and data.get("kind") != kind:
        raise InputFileError(f"{path}: holds a {data.get('kind')!r} tokenizer, not {kind!r}")
    return data


class SavedAsJson(ABC):
    """``save``/``load`` and ``to_dict``/``from_dict`` in our versioned JSON, for each kind.

    A tokenizer class names its ``kind`` (``"bpe"``, ``"char"``) and gives ``_fields()``, its
    part of the document, and ``_from_fields(data)``, a tokenizer from that part (a malformed
    part raises ``KeyError``, ``TypeError`` or ``ValueError``). The format is described in
    docs/tokenizer.md.
    """

    kind: ClassVar[str]

    @abstractmethod
    def _fields(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> Self: ...

    def to_dict(self) -> dict[str, Any]:
        """The JSON document :meth:`save` writes."""
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, **self._fields()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "tokenizer") -> Self:
        """Inverse of :meth:`to_dict`; a malformed document raises :class:`GlassError`."""
        try:
            return cls._from_fields(data)
        except GlassError as e:
            raise GlassError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise GlassError(
                f"{source}: malformed {cls.kind} tokenizer ({type(e).__name__}: {e})"
            ) from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer as versioned JSON (``{"format": "glassgpt-tokenizer", ...}``)."""
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a file written by :meth:`save`."""
        return cls.from_dict(read_tokenizer_json(path, cls.kind), str(Path(path)))
