"""Files written so that nothing is lost, and file names read from files kept in their folder.

- :func:`atomic_write`: a new file's bytes go to a temporary file beside the target, which is
  fsync'ed and renamed over it, and the folder fsync'ed; on any failure the old file is
  untouched, the temporary one removed, and the error is one line (a full disk says how
  much was being written).
- :func:`inside`: a name such as ``../../home/me/.ssh/id_rsa`` or ``/etc/passwd`` read from
  a hand-edited or hostile ``state.json``, ``meta.json`` or HF index must not make glassgpt
  read or write outside the folder that file describes.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from glassgpt.errors import GlassError, InputFileError


def fsync_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to the disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_failed(path: Path, error: OSError, need: int) -> GlassError:
    """The one-line error for a write that failed (a full disk says how much was needed)."""
    if error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return GlassError(
            f"{path}: {error.strerror or 'no space left'} while writing about "
            f"{need / 2**20:.1f} MiB; the previous files are untouched: free some space, "
            "then run again (a training run: with --resume)"
        )
    return GlassError(f"{path}: cannot write ({error.strerror or error})")


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file beside it, fsync, rename. On any
    failure the old file is untouched, the temporary one removed, and the error one line."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fsync_file(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):  # e.g. the parent is not a folder
            tmp.unlink(missing_ok=True)
        raise write_failed(path, e, len(data)) from None


def inside(folder: str | Path, name: object, source: str | Path) -> Path:
    """``folder / name``, refused unless ``name`` is a plain relative path that stays inside
    ``folder`` (symbolic links resolved); ``source`` is the file the name was read from.

    >>> inside("/data/run", "ckpt/model.safetensors", "state.json").as_posix()
    '/data/run/ckpt/model.safetensors'
    >>> inside("/data/run", "../secret", "state.json")
    Traceback (most recent call last):
    ...
    glassgpt.errors.InputFileError: state.json: corrupt: the file name '../secret' leaves its folder
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InputFileError(f"{source}: corrupt: {name!r} is not a file name")
    root = Path(folder).resolve()
    path = (root / name).resolve()
    if Path(name).is_absolute() or (path != root and root not in path.parents):
        raise InputFileError(f"{source}: corrupt: the file name {name!r} leaves its folder")
    return Path(folder) / name
