"""A sweep folder's state, read from the folder alone, whichever executor ran its points:

    OUT/points.json                  the grid's points, in order
    OUT/runs/<point>/result.json     finished (skipped when the sweep starts again)
    OUT/runs/<point>/.lock           training now (pid and host of the trainer)
    OUT/runs/<point>/failed.json     failed: exit code and the log's last lines (tried again)
    OUT/runs/<point>/ckpt/           interrupted (resumed from its newest checkpoint)
    OUT/jobs/<point>.json            submitted as a Slurm job, not started yet

:func:`sweep_status` reads every point's state; :func:`format_status` tabulates them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassgpt.checkpoint import step_folders
from glassgpt.errors import InputFileError

FAILED = "failed.json"  # OUT/runs/<point>/failed.json: exit code and the log's last lines
JOBS = "jobs"  # OUT/jobs/<point>.json: the Slurm job a point was submitted as
BUSY = "already training"  # what train_point says of a point a live trainer holds
TAIL = 20  # lines of a failed point's log kept in its failed.json


def lock_holder(run_dir: Path, *, probe: bool = False) -> str | None:
    """Who trains in ``run_dir`` now (its ``.lock``: pid and host), or None. Without ``probe``
    only the lock file is read (a live pid on this host; another host's word is taken); with
    it, the lock itself is tried, which is exact on any filesystem with ``flock``."""
    path = run_dir / ".lock"
    try:
        owner = json.loads(path.read_text("utf-8") or "{}")
    except (OSError, ValueError):
        return None
    if not owner:
        return None
    who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}"
    if probe:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it: a trainer that was killed
        except BlockingIOError:
            return who
        except OSError:
            return None
        finally:
            os.close(fd)
    if owner.get("host") == socket.gethostname() and not _alive(owner.get("pid")):
        return None
    return who


def _alive(pid: Any) -> bool:
    """Whether a process of this machine runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError, OverflowError):
        return False
    try:  # Linux: the state letter after the command's closing parenthesis
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


@dataclass(frozen=True)
class PointState:
    name: str
    state: str  # finished | training | failed | interrupted | submitted | pending
    detail: str = ""


def point_state(out: Path, name: str) -> PointState:
    """One point's state, from its folder alone (see the module docstring)."""
    run_dir = out / "runs" / name
    result = run_dir / "result.json"
    if result.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            r = json.loads(result.read_text("utf-8"))
            return PointState(name, "finished", f"val_loss {r['val_loss']:.4f} at step {r['step']}")  # fmt: skip
        return PointState(name, "finished")
    holder = lock_holder(run_dir)
    step = _last_step(run_dir)
    if holder is not None:
        return PointState(name, "training", f"step {step} ({holder})" if step else holder)
    if (run_dir / FAILED).is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            f = json.loads((run_dir / FAILED).read_text("utf-8"))
            last = (f["tail"] or ["(no output)"])[-1]
            code = f"exit {f['exit']}: " if f["exit"] is not None else ""
            return PointState(name, "failed", f"{code}{last}")
        return PointState(name, "failed")
    ckpts = step_folders(run_dir / "ckpt") if (run_dir / "ckpt").is_dir() else []
    if ckpts:
        return PointState(name, "interrupted", f"resumes from {ckpts[0].name}")
    if run_dir.exists():
        return PointState(name, "interrupted", "before its first checkpoint; starts again")
    job = out / JOBS / f"{name}.json"
    if job.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):
            j = json.loads(job.read_text("utf-8"))
            return PointState(name, "submitted", f"{j['executor']} job {j['job']}")
    return PointState(name, "pending")


def _last_step(run_dir: Path) -> int | None:
    """The last step in ``metrics.jsonl`` (read from its end)."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return int(json.loads(line)["step"])
    return None


def sweep_status(out: str | Path) -> list[PointState]:
    """Every point of a sweep folder with its state, in grid order."""
    out = Path(out)
    try:
        points = [p["name"] for p in json.loads((out / "points.json").read_text("utf-8"))]
    except FileNotFoundError:
        if not out.is_dir():
            raise InputFileError(f"sweep folder not found: {out}") from None
        # a sweep from before points.json: the points it wrote a config or a folder for
        found = {p.stem for p in (out / "configs").glob("*.toml")}
        found |= {p.name for p in (out / "runs").glob("*") if p.is_dir()}
        if not found:
            raise InputFileError(f"{out}: not a sweep folder (no points.json)") from None
        points = sorted(found)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputFileError(f"{out}/points.json: unreadable ({e})") from None
    return [point_state(out, name) for name in points]


def format_status(states: Sequence[PointState]) -> str:
    """A table of point, state and detail, then the count of each state.

    >>> print(format_status([PointState("a", "finished", "val_loss 2.0000 at step 6"),
    ...                      PointState("bb", "pending")]))
    a   finished    val_loss 2.0000 at step 6
    bb  pending
    2 points: 1 finished, 1 pending
    """
    width = max((len(s.name) for s in states), default=0)
    lines = [f"{s.name:{width}}  {s.state:11} {s.detail}".rstrip() for s in states]
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    return "\n".join([*lines, f"{len(states)} points: {summary}"])
