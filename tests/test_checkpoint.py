from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glassgpt.checkpoint import (
    CheckpointError,
    CheckpointManager,
    find_resumable,
    load_checkpoint,
    step_folders,
)
from glassgpt.storage import atomic_write


def save(manager: CheckpointManager, step: int) -> Path:
    tensors = {"model.safetensors": {"w": torch.full((3, 2), float(step)), "b": torch.arange(4.0)}}
    return manager.save(step, tensors=tensors, files={"note.txt": b"hi"}, state={"x": step})


def test_round_trip_latest_and_keep_last(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=2)
    for step in (10, 20, 30):
        save(manager, step)
    assert [p.name for p in step_folders(tmp_path / "ckpt")] == ["step_000030", "step_000020"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_000030\n"
    ck = find_resumable(tmp_path)  # the run folder
    assert ck.step == 30 and ck.state["x"] == 30 and ck.text("note.txt") == "hi"
    assert torch.equal(ck.tensors("model.safetensors")["w"], torch.full((3, 2), 30.0))
    assert find_resumable(tmp_path / "ckpt" / "step_000020").step == 20  # a named folder
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.joinpath("model.safetensors").write_bytes(
            f.joinpath("model.safetensors").read_bytes()[:-7]
        ),  # truncated
        lambda f: f.joinpath("model.safetensors").write_bytes(
            b"X" + f.joinpath("model.safetensors").read_bytes()[1:]
        ),  # one byte flipped
        lambda f: f.joinpath("state.json").write_text('{"format": "glassgpt-checkp'),
        lambda f: f.joinpath("note.txt").unlink(),
    ],
)
def test_a_damaged_checkpoint_is_reported_and_the_previous_used(tmp_path: Path, damage) -> None:
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=0)
    save(manager, 1)
    newest = save(manager, 2)
    damage(newest)
    warnings: list[str] = []
    ck = find_resumable(tmp_path, warn=warnings.append)
    assert ck.step == 1
    assert len(warnings) == 1 and "step_000002" in warnings[0]
    with pytest.raises(CheckpointError, match="step_000002"):
        load_checkpoint(newest)


def test_no_valid_checkpoint_is_an_error(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt")
    only = save(manager, 5)
    (only / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        find_resumable(tmp_path, warn=lambda m: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        find_resumable(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="no such"):
        find_resumable(tmp_path / "absent")


def test_foreign_state_json_is_not_a_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "step_000001"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointError, match="not a glassgpt checkpoint"):
        load_checkpoint(folder)


def test_rewriting_a_step_replaces_it_and_stale_temporaries_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root)
    save(manager, 3)
    (root / ".tmp-step_000009-123").mkdir()  # a write killed halfway by an earlier process
    (root / ".latest.tmp-123").write_text("step_000003")  # killed before the pointer's rename
    manager = CheckpointManager(root)
    assert not (root / ".tmp-step_000009-123").exists()
    assert not (root / ".latest.tmp-123").exists() and manager.removed == 2
    manager.save(3, tensors={}, files={"note.txt": b"new"}, state={"x": -1})
    ck = load_checkpoint(root / "step_000003")
    assert (
        ck.text("note.txt") == "new" and ck.state["x"] == -1 and "model.safetensors" not in ck.files
    )


def test_shared_and_strided_tensors_are_saved(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {"a": base, "a_t": base.T, "same": base}
    folder = CheckpointManager(tmp_path).save(
        1, tensors={"t.safetensors": tensors}, files={}, state={}
    )
    out = load_checkpoint(folder).tensors("t.safetensors")
    assert all(torch.equal(out[k], v) for k, v in tensors.items())


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["latest"]
