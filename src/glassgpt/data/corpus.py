"""The embedded default corpus: the Python standard library sources of the running interpreter.

    corpus = [f ∈ stdlib/**/*.py, f outside site-packages, f non-empty valid UTF-8],
    ordered by sha256(relative path of f),  optionally cut to Σ bytes ≤ max_bytes

Every interpreter carries some 30 MB of Python source in ``sysconfig.get_paths()["stdlib"]``,
so ``glassgpt train`` needs no download. The policy, exactly:

- Files: every ``*.py`` under the stdlib folder, walked recursively; the folders
  ``site-packages`` and ``dist-packages`` (third-party code, which differs from machine to
  machine) and hidden folders are skipped; empty files are skipped.
- Encoding: each file is read as strict UTF-8. The few files that are not (in CPython 3.11,
  four test fixtures written on purpose in Latin-1 or KOI8-R, or deliberately broken, to test
  PEP 263 coding cookies) are *skipped* and listed in :attr:`CorpusScan.skipped`; decoding
  them by their declared codec would make the corpus depend on codec tables.
- Order: by the SHA-256 of each file's path relative to the stdlib folder (POSIX form).
  This is deterministic for a given interpreter, stable when files are added or removed, and
  well mixed across packages, so that a size cap takes a spread sample of the library and
  the tail taken as the validation split is representative.
- Size cap: with ``max_bytes``, files are taken in that order while the running total stays
  within the cap; a file that would overflow it is passed over and the next is tried.

>>> scan = scan_default_corpus(max_bytes=200_000)
>>> 0 < scan.n_bytes <= 200_000 and scan.files == scan_default_corpus(max_bytes=200_000).files
True
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from glassgpt.errors import GlassError

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_dir() -> Path:
    """The running interpreter's standard library folder (``sysconfig`` ``stdlib`` path)."""
    path = Path(sysconfig.get_paths()["stdlib"])
    if not path.is_dir():
        raise GlassError(f"the standard library folder {path} of this interpreter is absent")
    return path


def _order_key(relpath: str) -> str:
    return hashlib.sha256(relpath.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CorpusScan:
    """The default corpus: its root, its files in corpus order, and the files left out."""

    root: Path
    files: tuple[Path, ...]
    sizes: tuple[int, ...]  # bytes of each file (UTF-8 text)
    skipped: tuple[tuple[Path, str], ...]  # (file, why) for non-UTF-8 files

    @property
    def n_bytes(self) -> int:
        return sum(self.sizes)


def _walk_py(root: Path) -> list[tuple[str, Path, int]]:
    """(relative posix path, path, size) of each ``*.py`` under ``root`` outside excluded folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if size > 0:
                    found.append((path.relative_to(root).as_posix(), path, size))
    return found


def scan_default_corpus(max_bytes: int | None = None, *, root: Path | None = None) -> CorpusScan:
    """List the default corpus (see the module docstring for the policy).

    ``root`` replaces the stdlib folder (for tests). Only files that fit under the cap are
    read (to check that they are UTF-8), so a small cap is fast.
    """
    if max_bytes is not None and max_bytes < 1:
        raise GlassError(f"max_bytes must be positive, got {max_bytes}")
    root = stdlib_dir() if root is None else Path(root)
    entries = sorted(_walk_py(root), key=lambda e: _order_key(e[0]))
    files: list[Path] = []
    sizes: list[int] = []
    skipped: list[tuple[Path, str]] = []
    total = 0
    for _, path, size in entries:
        if max_bytes is not None and total + size > max_bytes:
            continue
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except OSError as e:
            skipped.append((path, f"unreadable: {e.strerror or e}"))
            continue
        except UnicodeDecodeError as e:
            skipped.append((path, f"not valid UTF-8 at byte {e.start}"))
            continue
        files.append(path)
        sizes.append(len(data))
        total += len(data)
    if not files:
        raise GlassError(f"no usable Python sources under {root} for the default corpus")
    return CorpusScan(root, tuple(files), tuple(sizes), tuple(skipped))


def default_corpus_files(max_bytes: int | None = None) -> list[Path]:
    """The files of the default corpus, in corpus order (see the module docstring)."""
    return list(scan_default_corpus(max_bytes).files)


def iter_default_corpus(max_bytes: int | None = None) -> Iterator[str]:
    """The texts of the default corpus, one document per file, in corpus order.

    Texts are the files' exact bytes decoded (no newline translation).
    """
    for path in scan_default_corpus(max_bytes).files:
        yield path.read_bytes().decode("utf-8")
