"""Checkpoints: written so that a crash at any instant loses nothing (:mod:`.files`), and
opened one way, :func:`open_run` (:mod:`.runs`), by every command, ``glassgpt.load``, the
server and the trainer's ``--resume``."""

from __future__ import annotations

from glassgpt.checkpoint.files import (
    STATE,
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    ckpt_root_of,
    find_resumable,
    load_checkpoint,
    sha256,
    sha256_file,
    step_folders,
    step_of,
    write_checkpoint,
)
from glassgpt.checkpoint.runs import CONFIG, Run, load, needs_tokenizer, open_run

__all__ = [
    "CONFIG",
    "STATE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "Run",
    "ckpt_root_of",
    "find_resumable",
    "load",
    "load_checkpoint",
    "needs_tokenizer",
    "open_run",
    "sha256",
    "sha256_file",
    "step_folders",
    "step_of",
    "write_checkpoint",
]
