"""One owner per run folder: an exclusive advisory lock on ``RUN/.lock`` while a trainer runs.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the file, which holds the owner's pid, host and
start time as JSON. The operating system drops the lock when its process ends, however it
ends, so a lock file left by a killed trainer is stale by construction: the next trainer
takes it over and says whose it was. A second trainer, fresh or ``--resume``, that finds
the lock held is refused at once, naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError

LOCK_NAME = ".lock"


class RunFolderBusy(GlassError):
    """Another live process owns the run folder."""


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return dict(json.loads(os.read(fd, 4096).decode("utf-8") or "{}"))
    except (OSError, ValueError, TypeError):
        return {}


def _describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "another process"
    since = owner.get("started", "?")
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')} (since {since})"


class RunLock:
    """``with RunLock(folder):`` — hold ``folder/.lock`` for the block (created if needed).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with RunLock(folder):
    ...     try:
    ...         RunLock(folder).acquire()
    ...     except RunFolderBusy as e:
    ...         print(str(e).split(" is in use")[0] == str(folder))
    True
    """

    def __init__(self, folder: str | Path, note: Callable[[str], None] | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.note = note
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"{self.folder} is in use by {_describe(owner)}: one trainer per run folder; "
                "wait for it to finish, stop it, or pass another --out"
            ) from None
        except OSError as e:  # a filesystem without advisory locks
            os.close(fd)
            raise GlassError(f"{self.path}: cannot lock the run folder ({e.strerror})") from None
        previous = _read_owner(fd)
        if previous and previous.get("pid") != os.getpid() and self.note is not None:
            self.note(f"took over {self.path} left by {_describe(previous)}, which no longer runs")
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go (the file stays; an unlocked lock file is free to take)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
