"""File names read from files stay inside their folder; pickles are never loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from glassgpt.checkpoint import CheckpointError, load_checkpoint, write_checkpoint
from glassgpt.errors import InputFileError
from glassgpt.storage import inside


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "", 3, None, "a\x00b"])
def test_names_that_leave_the_folder_are_refused(tmp_path: Path, name: object) -> None:
    with pytest.raises(InputFileError, match=r"meta\.json: corrupt"):
        inside(tmp_path, name, "meta.json")


def test_a_symbolic_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path, tmp_path / "run" / "up")
    assert inside(tmp_path / "run", "a/b.bin", "x") == tmp_path / "run" / "a" / "b.bin"
    with pytest.raises(InputFileError, match="leaves its folder"):
        inside(tmp_path / "run", "up/secret", "x")


def test_a_hand_edited_checkpoint_cannot_read_outside_its_folder(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"private")
    folder = write_checkpoint(tmp_path / "ckpt" / "step_000001", step=1,
                              tensors={"model.safetensors": {"w": torch.ones(2)}},
                              files={}, state={})  # fmt: skip
    state = json.loads((folder / "state.json").read_text())
    state["files"] = {"../../secret": state["files"]["model.safetensors"]}
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="leaves its folder"):
        load_checkpoint(folder)


def test_a_pickled_hf_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    from glassgpt.interop import from_hf
    from glassgpt.interop.hf_gpt2 import config_to_hf
    from glassgpt.model import GPTConfig

    cfg = config_to_hf(GPTConfig(n_vocab=11, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    torch.save({"w": torch.ones(2), "obj": Path("x")}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InputFileError) as e:
        from_hf(tmp_path)
    assert "never unpickles" in str(e.value) and "\n" not in str(e.value)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch
) -> None:
    import errno

    from glassgpt import storage
    from glassgpt.errors import GlassError
    from glassgpt.tokenizer.files import write_json

    target = tmp_path / "tok.json"
    target.write_text('{"old": true}')

    def full_disk(path: Path, data: bytes) -> None:
        path.write_bytes(data[:10])  # a torn temporary file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage, "fsync_file", full_disk)
    with pytest.raises(GlassError, match=r"No space left on device while writing about 0\.0 MiB"):
        write_json(target, {"new": 1})
    assert target.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]


def test_a_hand_edited_data_folder_cannot_point_outside_itself(tmp_path: Path) -> None:
    from glassgpt.data import DataDir
    from glassgpt.data import prepare as prepare_data
    from glassgpt.tokenizer import CharTokenizer

    text = tmp_path / "a.txt"
    text.write_text("abc def\n" * 200, "utf-8")
    folder = prepare_data([text], tmp_path / "data", CharTokenizer.train([text]), val_fraction=0.1)
    meta_path = folder.path / "meta.json"
    meta = json.loads(meta_path.read_text())
    first = next(iter(meta["splits"].values()))
    first["shards"][0]["file"] = "../a.txt"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputFileError, match="leaves its folder"):
        DataDir.open(folder.path)
