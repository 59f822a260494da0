"""Files a tokenizer reads and writes: corpora, GPT-2's original files, our JSON format.

GPT-2's files write each token's bytes in a printable alphabet, one character per byte:

    byte b ↦ chr(b)          for the 188 printable bytes  ! .. ~,  ¡ .. ¬,  ® .. ÿ
    byte b ↦ chr(256 + k)    for the k-th (k = 0, 1, ...) remaining byte, in byte order

so the space 0x20 is ``Ġ`` (U+0120) and ``Ġthe`` is b" the". Our JSON format writes tokens
the same way (:func:`token_to_str`), so a saved GPT-2 vocab reads like ``encoder.json``.

Every failure here is a one-line :class:`~glassgpt.errors.GlassError` naming the file.
"""

from __future__ import annotations

import codecs
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import compress, repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from glassgpt.errors import GlassError, InputFileError
from glassgpt.formats import check_format
from glassgpt.storage import atomic_write

if TYPE_CHECKING:
    from typing import Self  # novermin (for the type checker only; 3.11+ there)

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
    try:
        return codecs.charmap_encode(text, "strict", _charmap())[0]
    except UnicodeEncodeError as e:
        raise KeyError(text[e.start]) from None


def strs_to_tokens(texts: Iterable[str]) -> list[bytes]:
    """:func:`str_to_token` of each text, the loop in C.

    >>> strs_to_tokens(["Ġthe", "Ċ"])
    [b' the', b'\\n']
    """
    encoded = map(codecs.charmap_encode, texts, repeat("strict"), repeat(_charmap()))
    try:
        return list(map(itemgetter(0), encoded))
    except UnicodeEncodeError as e:
        raise KeyError(e.object[e.start]) from None


@lru_cache(maxsize=1)
def _charmap() -> Any:
    """The codec table of :func:`bytes_to_unicode` (a C map: encoding runs without Python)."""
    return codecs.charmap_build("".join(bytes_to_unicode()[b] for b in range(256)))


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
    maybe_special = compress(
        encoder, map(str.startswith, encoder, repeat("<|"))
    )  # no loop in Python
    specials = {t: encoder[t] for t in maybe_special if t.endswith("|>")}
    ordinary = dict(encoder)
    for t in specials:
        del ordinary[t]
    n = len(ordinary)
    ids = list(ordinary.values())
    if not set(map(type, ids)) <= {int} or sorted(ids) != list(range(n)):
        seen: set[int] = set()
        for text, i in ordinary.items():
            if not isinstance(i, int) or not 0 <= i < n or i in seen:
                raise InputFileError(
                    f"{encoder_json}: token {text!r} has id {i!r}; ids must be 0..{n - 1}, once each"
                )
            seen.add(i)
    try:
        vocab = strs_to_tokens(sorted(ordinary, key=ordinary.__getitem__))
    except KeyError as e:
        text = next(t for t in ordinary if e.args[0] in t)
        raise InputFileError(
            f"{encoder_json}: token {text!r} is not in GPT-2's byte alphabet"
        ) from None
    lines = read_text(vocab_bpe).split("\n")
    first = 1 if lines[0].startswith("#version") else 0
    lines = [line for line in lines[first:] if line]
    parts = " ".join(lines).split(" ")  # left, right, left, right, ...: one space a line
    lefts, rights = (parts[0::2], parts[1::2]) if lines else ([], [])
    try:  # in the printable form each character is one byte: a + b is the pair's token
        if lines and len(parts) != 2 * len(lines):
            raise KeyError
        pairs = zip(map(ordinary.__getitem__, lefts), map(ordinary.__getitem__, rights))
        merges = dict(zip(pairs, map(ordinary.__getitem__, map(str.__add__, lefts, rights))))
    except KeyError:
        for lineno, line in enumerate(read_text(vocab_bpe).split("\n"), start=1):
            left, _, right = line.partition(" ")
            header = not line or (lineno == 1 and line.startswith("#version"))
            if not header and (" " in right or not {left, right, left + right} <= ordinary.keys()):
                raise InputFileError(
                    f"{vocab_bpe}: line {lineno} is not a merge of two known tokens: {line!r}"
                ) from None
        raise  # not reached: the loop finds the line
    return vocab, merges, specials


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
