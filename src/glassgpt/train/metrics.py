"""``OUT/metrics.jsonl``: one JSON object per line, ``{"step", "loss", ...}``.

Training lines carry ``step`` (optimizer steps done), ``loss`` (mean cross-entropy in nats
over the global batch), ``lr``, ``grad_norm``, ``tokens`` (seen so far), ``tok_per_s``,
``elapsed_s`` (wall seconds since the start of this process's training, evaluations
included), ``eval_s`` (the part of ``elapsed_s`` spent in evaluations and their samples, so
``elapsed_s − eval_s`` is the training time) and ``cpu_s`` (its CPU
seconds over all threads, a measure that other load on the machine disturbs less); evaluation steps add ``val_loss``, ``val_ppl`` = exp(val_loss) and
``val_bpb`` = val_loss · tokens / (bytes · ln 2), comparable across tokenizers.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
>>> log = MetricsLog(p)
>>> for s in (1, 2, 3):
...     log.write({"step": s, "loss": 1.0 / s})
>>> truncate_after(p, 2)
>>> [r["step"] for r in read_metrics(p)]
[1, 2]
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError, InputFileError
from glassgpt.storage import atomic_write


class MetricsLog:
    """Appends JSON lines, flushed line by line so a killed run loses at most one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()}, ensure_ascii=False)
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:  # a torn last line is skipped by read_metrics
            raise GlassError(
                f"{self.path}: cannot append the metrics ({e.strerror or e}); the checkpoints "
                "are untouched: free some space, then continue with --resume"
            ) from None


def _clean(v: Any) -> Any:
    # JSON has no NaN or infinity: write them as null
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file (a torn last line, from a killed run, is skipped)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no metrics file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(f"{path}: unreadable metrics file ({e})") from None
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            records.append(rec)
    return records


def truncate_after(path: str | Path, step: int) -> None:
    """Drop the records past ``step`` (what a resumed run is about to write again)."""
    path = Path(path)
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r["step"] <= step]
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep).encode())
