"""Reading text inputs as a stream of UTF-8 pieces, in bounded memory.

A corpus is a sequence of documents d₁, …, d_m (one document per file). A document larger
than ``piece_bytes`` is read in pieces p₁ ‖ p₂ ‖ … = d, each cut at a *safe* point:

1. after a newline between two printable, non-space ASCII characters (``x\n|f``), or
2. before a space that follows a printable, non-space ASCII character (``x| y``).

At such a cut the first piece ends in a non-space character, and no chunk of the GPT-2 or
the GPT-4 pre-tokenizer pattern runs from a non-space character into the following
whitespace; the second piece starts where a chunk starts anyway, and neither pattern looks
behind. So the chunks, hence the ids, of the pieces are those of the whole:

    encode(p₁ ‖ p₂) = encode(p₁) ‖ encode(p₂)

and cutting costs nothing (tested against ``regex.findall`` on both patterns). A window with
no safe point (no space or newline in the right place for half a piece) is cut after any
newline, failing that at any character boundary; only there may the ids near the cut
differ from encoding the whole file. The text itself is always reproduced exactly.

Bytes are decoded strictly as UTF-8; a failure names the file and the absolute byte offset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from glassgpt.errors import InputFileError

PIECE_BYTES = 4 << 20  # a file larger than this is read in pieces

_PRINTABLE = bytes(range(0x21, 0x7F))  # printable, non-space ASCII


def _safe_newline(data: bytes | bytearray, i: int) -> bool:
    """Is the newline at ``data[i]`` between two printable non-space ASCII bytes?"""
    return 0 < i < len(data) - 1 and data[i - 1] in _PRINTABLE and data[i + 1] in _PRINTABLE


def _safe_space(data: bytes | bytearray, i: int) -> bool:
    """Does the space at ``data[i]`` follow a printable non-space ASCII byte?"""
    return i > 0 and data[i - 1] in _PRINTABLE


def char_boundary(data: bytes | bytearray, i: int) -> int:
    """The largest UTF-8 character boundary ≤ ``i`` (never splits a multi-byte character).

    It steps back over at most three continuation bytes: more cannot be valid UTF-8, and
    the strict decode reports such bytes.

    >>> data = "aé".encode()  # b'a\\xc3\\xa9'
    >>> [char_boundary(data, i) for i in range(4)]
    [0, 1, 1, 3]
    """
    i = max(0, min(i, len(data)))
    if i == len(data):
        return i
    for j in range(i, max(i - 3, 0) - 1, -1):
        if (data[j] & 0xC0) != 0x80:
            return j
    return i


def safe_cut(data: bytes | bytearray, lo: int, hi: int) -> int:
    """The latest cut position in ``[lo, hi]`` by preference (see the module docstring).

    Preference: a safe newline (cut after it), a safe space (cut before it), any newline
    (cut after it), the character boundary at ``hi``.

    >>> safe_cut(b"ab\\n  c\\nd  \\n", 0, 11)  # 'c\\nd' is the only safe newline
    7
    >>> safe_cut(b"    if x:\\n        y", 0, 20)  # no safe newline: before ' x'
    6
    >>> safe_cut(b"  \\n  \\n  ", 0, 8)  # neither: after the last newline
    6
    >>> safe_cut("aé€".encode(), 0, 5)  # nothing: a character boundary
    3
    """
    lo, hi = max(lo, 0), min(hi, len(data))
    any_newline = -1
    i = data.rfind(b"\n", lo, hi)
    while i != -1:
        if _safe_newline(data, i):
            return i + 1
        any_newline = max(any_newline, i + 1)
        i = data.rfind(b"\n", lo, i)
    i = data.rfind(b" ", max(lo, 1), hi + 1)
    while i != -1:
        if _safe_space(data, i):
            return i
        i = data.rfind(b" ", max(lo, 1), i)
    if any_newline > 0:
        return any_newline
    return char_boundary(data, hi)


def decode_utf8(data: bytes | bytearray, path: Path | str, offset: int = 0) -> str:
    """Strict UTF-8 decode; an error names the file and the absolute byte offset.

    >>> decode_utf8(b"ok", "a.txt")
    'ok'
    >>> decode_utf8(b"ab\\xff", "a.txt", offset=100)
    Traceback (most recent call last):
    ...
    glassgpt.errors.InputFileError: a.txt: not valid UTF-8 at byte 102 (invalid start byte)
    """
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(
            f"{path}: not valid UTF-8 at byte {offset + e.start} ({e.reason})"
        ) from None


@dataclass(frozen=True)
class Piece:
    """A piece of one document: its text, where it starts in the file, whether it ends it."""

    text: str
    offset: int  # byte offset of the piece in its file
    n_bytes: int  # UTF-8 length of ``text``
    last: bool  # the final piece of its document


def iter_pieces(path: Path, piece_bytes: int = PIECE_BYTES) -> Iterator[Piece]:
    """Read one file as pieces of at most about ``piece_bytes`` bytes, cut at safe points.

    An empty file yields nothing. Memory stays within a few ``piece_bytes``.
    """
    if piece_bytes < 4:  # room for any one UTF-8 character
        raise ValueError(f"piece_bytes must be at least 4, got {piece_bytes}")
    try:
        f = path.open("rb")
    except OSError as e:
        raise InputFileError(f"{path}: cannot read ({e.strerror or e})") from None
    with f:
        buffer = bytearray()
        offset = 0  # file offset of buffer[0]
        eof = False
        while True:
            while not eof and len(buffer) < piece_bytes + 1:
                try:
                    block = f.read(piece_bytes)
                except OSError as e:
                    raise InputFileError(f"{path}: cannot read ({e.strerror or e})") from None
                eof = not block
                buffer += block
            if eof and len(buffer) <= piece_bytes:
                if buffer:
                    text = decode_utf8(buffer, path, offset)
                    yield Piece(text, offset, len(buffer), True)
                return
            # Cut as late as possible in the second half of the window.
            cut = safe_cut(buffer, piece_bytes // 2, piece_bytes)
            text = decode_utf8(buffer[:cut], path, offset)
            yield Piece(text, offset, cut, False)
            del buffer[:cut]
            offset += cut


def text_pieces(text: str, n_bytes: int, piece_bytes: int = PIECE_BYTES) -> Iterator[Piece]:
    """One document held in memory (``n_bytes`` its UTF-8 length) as the pieces
    :func:`iter_pieces` would read from a file holding exactly its bytes.

    >>> [p.text for p in text_pieces("ab cd ef", 8, piece_bytes=4)]
    ['ab', ' cd', ' ef']
    """
    if n_bytes <= piece_bytes:
        if n_bytes:
            yield Piece(text, 0, n_bytes, True)
        return
    data = text.encode("utf-8")
    offset = 0
    while len(data) - offset > piece_bytes:
        # the window iter_pieces cuts in: piece_bytes + 1 bytes from the offset
        window = data[offset : offset + piece_bytes + 1]
        cut = safe_cut(window, piece_bytes // 2, piece_bytes)
        yield Piece(window[:cut].decode("utf-8"), offset, cut, False)
        offset += cut
    yield Piece(data[offset:].decode("utf-8"), offset, len(data) - offset, True)


def resolve_inputs(paths: Sequence[str | Path], pattern: str = "*") -> list[Path]:
    """Expand input paths to files: a file stays, a folder gives its files matching ``pattern``.

    Folders are walked recursively in sorted order of their relative path, skipping hidden
    names (those starting with ``.``). A missing path, or a folder with no matching file, is a
    :class:`~glassgpt.errors.InputFileError`.
    """
    if not paths:
        raise InputFileError("no input given")
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = sorted(
                (
                    q
                    for q in p.rglob(pattern)
                    if q.is_file()
                    and not any(part.startswith(".") for part in q.relative_to(p).parts)
                ),
                key=lambda q: q.relative_to(p).as_posix(),
            )
            if not found:
                raise InputFileError(f"{p}: folder has no input files matching {pattern!r}")
            files.extend(found)
        elif p.exists():
            raise InputFileError(f"{p}: not a file or folder")
        else:
            raise InputFileError(f"{p}: input not found")
    return files


def file_size(path: Path) -> int:
    """Size in bytes; an unreadable file is an :class:`InputFileError`."""
    try:
        return os.stat(path).st_size
    except OSError as e:
        raise InputFileError(f"{path}: cannot read ({e.strerror or e})") from None
