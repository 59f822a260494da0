"""A full disk during training: one line, the earlier checkpoint byte-identical, no debris."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from glassgpt.checkpoint import find_resumable, step_folders
from glassgpt.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"
SETS = ["train.progress=false", "train.threads=1", "train.batch_size=4", "train.eval_batches=1",
        "train.sample_tokens=0", "train.eval_every=5", "train.checkpoint_every=5",
        "model.n_ctx=16", "model.d_model=64", "model.n_layers=2", "model.n_heads=2"]  # fmt: skip
LIMIT = 300_000  # bytes per file: the shards and logs fit, the ~1 MB optimizer state does not


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_full_disk_at_a_checkpoint_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "input.txt"
    data.write_text("".join(f"x{i % 17} = {i * 7 % 23}\n" for i in range(2000)), "utf-8")
    out = tmp_path / "run"
    base = ["train", "--preset", "cpu-tiny", "--data", str(data), "--out", str(out)]
    assert main([*base, "--set", *SETS, "train.max_steps=5"]) == 0
    before = snapshot(out / "ckpt" / "step_000005")
    assert max(len(b) for b in before.values()) > LIMIT  # the next checkpoint cannot fit

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "glassgpt", "train", "--resume", str(out), "--set",
           "train.max_steps=10"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=small_files,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("glassgpt: error:") and "Traceback" not in proc.stderr
    assert "MiB" in err[-1] and "--resume" in err[-1]
    assert snapshot(out / "ckpt" / "step_000005") == before  # byte-identical
    assert not [p for p in (out / "ckpt").iterdir() if p.name.startswith(".")]  # no debris
    assert [p.name for p in step_folders(out / "ckpt")] == ["step_000005"]
    assert find_resumable(out).step == 5
    assert main(["train", "--resume", str(out), "--set", "train.max_steps=10"]) == 0  # room again
    assert find_resumable(out).step == 10


@pytest.mark.slow
def test_kills_at_random_moments_leave_no_debris(tmp_path: Path) -> None:
    import random
    import signal
    import time

    data = tmp_path / "input.txt"
    data.write_text("".join(f"x{i % 17} = {i * 7 % 23}\n" for i in range(2000)), "utf-8")
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    sets = [*SETS, "train.checkpoint_every=1", "train.eval_every=1", "train.max_steps=100000"]
    fresh = [sys.executable, "-m", "glassgpt", "train", "--preset", "cpu-tiny", "--data",
             str(data), "--out", str(out), "--set", *sets]  # fmt: skip
    resume = [sys.executable, "-m", "glassgpt", "train", "--resume", str(out)]
    rng = random.Random(0)
    kills = 0
    while kills < 5:  # (each kill is ~5 s of the suite: five land in writes often enough)
        cmd = resume if find_any(out) else fresh
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        start = latest_step(out)
        while latest_step(out) < start + 2:  # running: checkpoints and best swaps every step
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere inside a write, or between writes
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    final = subprocess.run([*resume, "--set", f"train.max_steps={latest_step(out) + 2}"],
                           env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert final.returncode == 0, final.stderr
    names = sorted(p.name for p in (out / "ckpt").iterdir())
    assert all(n in ("best", "latest") or n.startswith("step_") for n in names), names


def find_any(out: Path) -> bool:
    return bool(step_folders(out / "ckpt")) if (out / "ckpt").is_dir() else False


def latest_step(out: Path) -> int:
    steps = step_folders(out / "ckpt") if (out / "ckpt").is_dir() else []
    return int(steps[0].name.split("_")[1]) if steps else 0
