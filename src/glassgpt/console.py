"""``say``: a note to the user on stderr, once per job however many processes run it."""

from __future__ import annotations

import os
import sys


def is_main_process() -> bool:
    """False on every rank but 0 of a ``torchrun`` job (it sets ``RANK``), which would repeat
    each note once per process."""
    return os.environ.get("RANK", "0") == "0"


def say(message: str, *, kind: str | None = "note") -> None:
    """``glassgpt: note: MESSAGE`` (``kind=None``: ``glassgpt: MESSAGE``) on stderr, from the
    main process only.

    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     say("resuming at step 500"); say("wrote out.json", kind=None)
    >>> print(err.getvalue(), end="")
    glassgpt: note: resuming at step 500
    glassgpt: wrote out.json
    """
    if is_main_process():
        prefix = f"glassgpt: {kind}: " if kind else "glassgpt: "
        print(prefix + message, file=sys.stderr, flush=True)
