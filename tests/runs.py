"""``write_run``: a run folder as ``glassgpt train`` leaves one, written through the trainer's
own :class:`~glassgpt.checkpoint.CheckpointManager`, for the tests of every command that reads
runs (``from tests.runs import write_run``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from glassgpt.checkpoint import CheckpointManager
from glassgpt.train.config import dump_toml


def write_run(
    out: Path,
    model: Any,
    tok: Any,
    *,
    steps: Sequence[int] = (1,),
    best: int | None = None,
    tables: Mapping[str, Any] | None = None,
    keep_last: int = 0,
) -> Path:
    """``out/ckpt/step_*`` for each of ``steps`` (the same weights) and, with ``best``,
    ``out/ckpt/best`` at that step; each holds ``model.safetensors``, ``config.toml`` (the
    ``tables`` given, default ``seed = 1``, and ``[model]`` from the model) and
    ``tokenizer.json``. The tokenizer is also saved as ``out/tok.json``. Returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out / "tok.json")
    config = {"seed": 1, **(tables or {}), "model": model.config.to_dict()}
    files = {
        "config.toml": dump_toml(config).encode(),
        "tokenizer.json": (out / "tok.json").read_bytes(),
    }
    weights = {"model.safetensors": model.state_dict()}
    manager = CheckpointManager(out / "ckpt", keep_last=keep_last)
    for step in steps:
        manager.save(step, tensors=weights, files=files, state={"trainer": {}})
    if best is not None:
        manager.save(best, tensors=weights, files=files, state={"val_loss": 1.0}, best=True)
    return out
