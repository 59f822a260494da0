"""Checkpoints that survive a crash at any instant: write aside, fsync, rename, then point.

Layout of a run's ``OUT/ckpt``::

    step_000500/  model.safetensors  optimizer.safetensors  config.toml  tokenizer.json
                  state.json   (step, trainer state, RNG, sampler, sha256 of every other file;
                                written last)
    best/         model.safetensors  config.toml  tokenizer.json  state.json  (no optimizer)
    latest        "step_000500\\n"   (written atomically after the folder is in place)

A checkpoint is written into ``.tmp-<name>-<pid>/``, every file and then the folder fsync'ed,
and renamed into place (``rename`` is atomic on POSIX), so a reader sees either the old or
the new checkpoint, never a mix. Loading re-hashes every file; a checkpoint that fails
(truncated, corrupted, half-deleted) is reported and the previous one is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from glassgpt.console import say
from glassgpt.errors import GlassError, InputFileError
from glassgpt.formats import check_format
from glassgpt.storage import atomic_write, fsync_dir, fsync_file, inside, write_failed
from glassgpt.version import __version__

FORMAT = "glassgpt-checkpoint"
VERSION = 1
STATE = "state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(GlassError):
    """A checkpoint folder that is missing, not a checkpoint, or fails its checksums."""


@dataclass
class Checkpoint:
    """A verified checkpoint folder: ``state`` (state.json) and its files' bytes."""

    path: Path
    state: dict[str, Any]
    files: dict[str, bytes] = field(repr=False)

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of ``name`` (a ``.safetensors`` file of this checkpoint)."""
        try:
            return st_load(self.files[name])
        except KeyError:
            raise CheckpointError(f"{self.path}: has no {name}") from None
        except SafetensorError as e:
            raise CheckpointError(f"{self.path / name}: unreadable safetensors: {e}") from None

    def text(self, name: str) -> str:
        try:
            return self.files[name].decode("utf-8")
        except KeyError:
            raise CheckpointError(f"{self.path}: has no {name}") from None


# -- writing --------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """:func:`sha256` of a file's bytes, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def write_checkpoint(
    folder: str | Path,
    *,
    step: int,
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    files: Mapping[str, bytes],
    state: Mapping[str, Any],
    folders: Mapping[str, Path] | None = None,
) -> Path:
    """Write a checkpoint folder atomically; returns its path.

    ``tensors`` maps file names (``model.safetensors``) to tensor dicts, ``files`` other file
    names to bytes; ``state`` (JSON-able) becomes ``state.json`` with the checksums.
    ``folders`` maps subfolder names to folders already written beside the checkpoint (the
    optimizer shards every rank of a sharded run wrote, ``glassgpt.train.distributed_checkpoint``):
    each is moved in, and its files are listed with their checksums as ``NAME/FILE``.
    """
    folder = Path(folder)
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    payload = {name: st_save(_contiguous(t)) for name, t in tensors.items()}
    payload.update(files)
    tmp = parent / f".tmp-{folder.name}-{os.getpid()}"
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "glassgpt_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **state,
        "files": {name: sha256(data) for name, data in payload.items()},
    }
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, data in payload.items():
            fsync_file(tmp / name, data)
        for name, written in (folders or {}).items():
            os.replace(written, tmp / name)
            for path in sorted(p for p in (tmp / name).rglob("*") if p.is_file()):
                doc["files"][path.relative_to(tmp).as_posix()] = sha256_file(path)
            fsync_dir(tmp / name)
        fsync_file(tmp / STATE, json.dumps(doc, indent=1).encode())
        fsync_dir(tmp)
    except OSError as e:  # a full disk, a read-only folder: the old checkpoints stay as they were
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_failed(folder, e, sum(len(d) for d in payload.values())) from None
    if folder.exists():
        old = parent / f".old-{folder.name}-{os.getpid()}"
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, folder)
    fsync_dir(parent)
    return folder


def _contiguous(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses non-contiguous tensors and tensors sharing storage; clone those.
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().cpu()
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        if not t.is_contiguous() or ptr in seen:
            t = t.contiguous().clone()
        seen.add(ptr)
        out[name] = t
    return out


# -- reading --------------------------------------------------------------------------------


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read and verify one checkpoint folder; :class:`CheckpointError` says what is wrong."""
    folder = Path(folder)
    state_path = folder / STATE
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not state_path.is_file():
        raise CheckpointError(f"{folder}: not a checkpoint (no {STATE})")
    try:
        state = json.loads(state_path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{state_path}: truncated or corrupt ({e})") from None
    state = check_format(
        state,
        state_path,
        FORMAT,
        VERSION,
        what="checkpoint format",
        not_ours="not a glassgpt checkpoint",
        error=CheckpointError,
    )
    files: dict[str, bytes] = {}
    listed = state.get("files", {})
    if not isinstance(listed, dict):
        raise CheckpointError(f"{state_path}: corrupt (its file list is not a table)")
    for name, digest in listed.items():
        try:
            path = inside(folder, name, state_path)
        except InputFileError as e:
            raise CheckpointError(str(e)) from None
        if "/" in name:  # a subfolder's file (optimizer shards): checked, read by its owner
            try:
                if sha256_file(path) != digest:
                    raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupt)")
            except OSError:
                raise CheckpointError(f"{path}: missing") from None
            continue
        try:
            data = path.read_bytes()
        except OSError:
            raise CheckpointError(f"{path}: missing") from None
        if sha256(data) != digest:
            raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupt)")
        files[name] = data
    return Checkpoint(folder, state, files)


def step_folders(ckpt_root: str | Path) -> list[Path]:
    """``step_*`` folders under ``ckpt_root``, newest (highest step) first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def ckpt_root_of(path: str | Path) -> Path:
    """The ``ckpt`` folder for a run folder, a ``ckpt`` folder, or a checkpoint folder."""
    path = Path(path)
    if (path / "ckpt").is_dir():
        return path / "ckpt"
    if (path / STATE).is_file() or _STEP_DIR.match(path.name):
        return path.parent
    return path


def find_resumable(path: str | Path, warn: Callable[[str], None] | None = None) -> Checkpoint:
    """The newest valid checkpoint under a run folder, a ``ckpt`` folder, or a step folder.

    Starts from ``latest`` (or the named step folder), then tries older ``step_*`` folders,
    reporting each failure through ``warn``; raises :class:`CheckpointError` if none is valid.
    """
    warn = warn or (lambda msg: say(msg, kind="warning"))
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run or checkpoint folder")
    root = ckpt_root_of(path)
    candidates = step_folders(root)
    if _STEP_DIR.match(path.name) and (path / STATE).exists():
        first = path  # an explicit step folder: it, then older ones
        candidates = [first] + [p for p in candidates if step_of(p) < step_of(first)]
    else:
        pointer = root / "latest"
        if pointer.is_file():
            named = root / pointer.read_text().strip()
            if named in candidates:
                candidates.remove(named)
                candidates.insert(0, named)
    if not candidates:
        raise CheckpointError(f"{path}: not a checkpoint folder (no ckpt/step_* inside)")
    for folder in candidates:
        try:
            return load_checkpoint(folder)
        except CheckpointError as e:
            warn(f"skipping checkpoint {e}; trying the previous one")
    raise CheckpointError(f"{path}: no valid checkpoint (all {len(candidates)} failed checks)")


def step_of(folder: Path) -> int:
    """The step a ``step_*`` folder holds (-1 for another name).

    >>> step_of(Path("ckpt/step_000500")), step_of(Path("ckpt/best"))
    (500, -1)
    """
    m = _STEP_DIR.match(folder.name)
    return int(m.group(1)) if m else -1


class CheckpointManager:
    """Writes ``step_*`` checkpoints with keep-last-k pruning, ``best``, and ``latest``."""

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        # leftovers of writes killed halfway, removed here: checkpoint folders (.tmp-*, .old-*)
        # and the ``latest`` pointer's atomic_write temporary (.latest.tmp-*)
        self.removed = 0
        if self.root.is_dir():
            for pattern in (".tmp-*", ".old-*", ".*.tmp-*"):
                for stale in self.root.glob(pattern):
                    if stale.is_dir():
                        shutil.rmtree(stale, ignore_errors=True)
                    else:
                        stale.unlink(missing_ok=True)
                    self.removed += 1

    def save(
        self,
        step: int,
        *,
        tensors: Mapping[str, Mapping[str, torch.Tensor]],
        files: Mapping[str, bytes],
        state: Mapping[str, Any],
        best: bool = False,
        folders: Mapping[str, Path] | None = None,
    ) -> Path:
        """Write ``step_{step:06d}``, point ``latest`` at it and prune old ones; or, with
        ``best``, write ``best`` (weights, config, tokenizer: no optimizer). Returns it."""
        name = "best" if best else f"step_{step:06d}"
        folder = write_checkpoint(
            self.root / name, step=step, tensors=tensors, files=files, state=state, folders=folders
        )
        if not best:
            atomic_write(self.root / "latest", f"{folder.name}\n".encode())
            self.prune()
        return folder

    def prune(self) -> None:
        """Delete all but the newest ``keep_last`` step folders (0 keeps all)."""
        if self.keep_last <= 0:
            return
        for old in step_folders(self.root)[self.keep_last :]:
            shutil.rmtree(old, ignore_errors=True)
