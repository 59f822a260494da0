"""The Unicode class of every code point, as the ``regex`` module reads it, computed once per user.

    table[c] = group(c) | case(c) << 2        for every code point c < 0x110000

with ``group`` 0 (other), 1 (``\\p{L}``), 2 (``\\p{N}``) or 3 (``\\s``), and ``case`` which
of ``(?i:s)``, ``(?i:d)``, ``(?i:m)``, ``(?i:t)``, ``(?i:l)``, ``(?i:v)``, ``(?i:e)``,
``(?i:r)`` matches c (1-8; 0 none). The compiled encoder's scanners read it, so its classes
are the reference's by construction.

Computing it runs the ``regex`` module over all 1.1 million code points (a large part of
loading GPT-2's tokenizer). It depends only on the ``regex`` module, which ships
its own Unicode tables (not Python's ``unicodedata``: ``regex`` 2026.11 calls U+0558 a
letter, Python 3.11 does not), and on the definitions above. So it is computed once per
``regex`` version and kept, zlib-compressed (about 5 KB), in a per-user cache folder:
``$GLASSGPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/glassgpt``, else ``~/.cache/glassgpt``.
The file name holds the ``regex`` version and a hash of the definitions, so an upgrade of
either computes a new table instead of reading a stale one; it is written atomically, and
one that does not decompress to the right length (zlib checks its own checksum) is
computed again. Where the folder cannot be written, every process computes the table, as
before. Why not at build time: the table would then be tied to the ``regex`` installed at
build time, not the one imported, and an install without a C compiler builds nothing.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from functools import lru_cache
from pathlib import Path

import regex

from glassgpt.errors import GlassError
from glassgpt.storage import atomic_write

N_CODE_POINTS = 0x110000
GROUPS = ((1, r"\p{L}+"), (2, r"\p{N}+"), (3, r"\s+"))
CASE_LETTERS = "sdmtlver"
TABLE_VERSION = 1


def cache_dir() -> Path:
    """The per-user cache folder (see the module docstring); not created here."""
    if os.environ.get("GLASSGPT_CACHE_DIR"):
        return Path(os.environ["GLASSGPT_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "glassgpt"
    return Path.home() / ".cache" / "glassgpt"


def cache_path() -> Path:
    """The table's file: named by the ``regex`` version and a hash of the definitions.

    >>> cache_path().name.startswith(f"unicode-classes-regex-{regex.__version__}-")
    True
    """
    spec = repr((TABLE_VERSION, GROUPS, CASE_LETTERS)).encode()
    digest = f"{zlib.crc32(spec):08x}"
    return cache_dir() / f"unicode-classes-regex-{regex.__version__}-{digest}.zlib"


def compute_table() -> bytes:
    """The table, computed with the ``regex`` module (every code point: slow, hence the cache).

    >>> t = compute_table()
    >>> [t[ord(c)] & 3 for c in "a1 .\u0558"], [t[ord(c)] >> 2 for c in "sSE\u017fx"]
    ([1, 2, 3, 0, 1], [1, 1, 7, 1, 0])
    """
    everything = "".join(map(chr, range(N_CODE_POINTS)))  # surrogates included; never looked up
    table = bytearray(N_CODE_POINTS)
    for group, cls in GROUPS:
        for m in regex.finditer(cls, everything):
            table[m.start() : m.end()] = bytes([group]) * (m.end() - m.start())
    for m in regex.finditer(f"(?i:[{CASE_LETTERS}])", everything):
        c = m.group()
        k = next(k for k, x in enumerate(CASE_LETTERS) if regex.fullmatch(f"(?i:{x})", c))
        table[ord(c)] |= (k + 1) << 2
    return bytes(table)


def read_cached(path: Path) -> bytes | None:
    """The table kept at ``path``, or None when it is missing, unreadable or corrupt."""
    try:
        table = zlib.decompress(path.read_bytes())
    except (OSError, zlib.error):
        return None
    return table if len(table) == N_CODE_POINTS else None


@lru_cache(maxsize=1)
def class_table() -> bytes:
    """The table: read from the per-user cache, else computed (and kept when possible).

    >>> t = class_table()
    >>> len(t), t[ord("a")] & 3, t[ord("\u0558")] & 3
    (1114112, 1, 1)
    """
    path = cache_path()
    table = read_cached(path)
    if table is not None:
        return table
    table = compute_table()
    with contextlib.suppress(OSError, GlassError):  # a read-only home: compute every time
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, zlib.compress(table, 9))
    return table
