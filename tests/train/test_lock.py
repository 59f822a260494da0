"""One owner per run folder, fresh runs that never mix with old ones, and no debris."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glassgpt.checkpoint import find_resumable
from glassgpt.cli import main
from glassgpt.train.lock import LOCK_NAME, RunFolderBusy, RunLock
from glassgpt.train.metrics import read_metrics

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["train.progress=false", "train.threads=1", "train.batch_size=4", "train.eval_batches=1",
        "train.sample_tokens=0", "train.eval_every=5", "train.checkpoint_every=5",
        "model.n_ctx=16", "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]  # fmt: skip


def data(tmp_path: Path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text("".join(f"x{i % 17} = {i * 7 % 23}\n" for i in range(2000)), "utf-8")
    return path


def train(tmp_path: Path, out: Path, *extra: str, steps: int = 10) -> list[str]:
    return ["train", "--preset", "cpu-tiny", "--data", str(data(tmp_path)), "--out", str(out),
            *extra, "--set", *TINY, f"train.max_steps={steps}"]  # fmt: skip


def one_line_error(err: str, *needles: str) -> None:
    assert err.startswith("glassgpt: error:") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)


def test_a_held_lock_refuses_a_second_owner_and_a_dead_ones_is_taken_over(tmp_path: Path) -> None:
    notes: list[str] = []
    with RunLock(tmp_path), pytest.raises(RunFolderBusy, match=f"in use by pid {os.getpid()}"):
        RunLock(tmp_path).acquire()
    # a lock file whose owner died: nobody holds the flock any more
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "h", "started": "t"}))
    with RunLock(tmp_path, note=notes.append):
        owner = json.loads((tmp_path / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid()
    assert len(notes) == 1 and "pid 999999 on h" in notes[0]


def test_a_fresh_run_never_mixes_with_an_old_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(train(tmp_path, out)) == 0
    before = (out / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(train(tmp_path, out, steps=6)) == 2
    one_line_error(capsys.readouterr().err, "already holds a run", "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_bytes() == before  # untouched
    # a folder holding any file is refused too; --overwrite replaces it cleanly
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "metrics.jsonl").write_text('{"step": 99, "loss": 1.0}\n')
    assert main(train(tmp_path, stray)) == 2
    one_line_error(capsys.readouterr().err, "metrics.jsonl")
    assert main(train(tmp_path, stray, "--overwrite", steps=6)) == 0
    assert "--overwrite: removed" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(stray / "metrics.jsonl")] == list(range(1, 7))
    assert main(train(tmp_path, out, "--overwrite", steps=6)) == 0
    assert find_resumable(out).step == 6


def test_out_naming_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    assert main(train(tmp_path, path)) == 2
    one_line_error(capsys.readouterr().err, "a file is there")
    assert path.read_text() == "mine"


def test_a_resume_removes_the_debris_of_interrupted_writes(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(train(tmp_path, out)) == 0
    (out / "ckpt" / ".tmp-step_000015-123").mkdir()
    (out / "ckpt" / ".old-best-456").mkdir()
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--set", "train.max_steps=15"]) == 0
    assert "removed 2 leftover(s)" in capsys.readouterr().err
    names = sorted(p.name for p in (out / "ckpt").iterdir())
    assert all(n in ("best", "latest") or n.startswith("step_") for n in names), names


@pytest.mark.slow
def test_a_second_trainer_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "glassgpt", *train(tmp_path, out, steps=100_000)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "ckpt" / "step_000010" / "state.json").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        for argv in (cmd, [sys.executable, "-m", "glassgpt", "train", "--resume", str(out)]):
            second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            assert second.returncode == 2
            one_line_error(second.stderr, "is in use by", f"pid {first.pid}")
        assert first.poll() is None  # the first one runs on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    step = find_resumable(out).step
    resumed = subprocess.run(
        [sys.executable, "-m", "glassgpt", "train", "--resume", str(out), "--set",
         f"train.max_steps={step + 3}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"took over {out / LOCK_NAME}" in resumed.stderr and f"pid {first.pid}" in resumed.stderr


def test_a_config_without_a_model_table_says_what_model_it_trains(tmp_path: Path, capsys) -> None:
    config = tmp_path / "only-train.toml"
    config.write_text("[train]\nmax_steps = 1\ndevice = 'cuda:99'\n")  # stops before training
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "sets no [model] table: the model is GPT-2 small's defaults (12 layers" in err
