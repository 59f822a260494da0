"""Runs in separate processes: a SIGKILL and resume, and two-process DDP (gloo) training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glassgpt.train.metrics import read_metrics

SRC = Path(__file__).resolve().parents[2] / "src"
SETS = [
    "train.progress=false",
    "train.threads=1",
    "train.eval_batches=2",
    "train.sample_tokens=0",
    "train.precision=fp32",
    "model.n_ctx=32",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def glassgpt(*args: str) -> list[str]:
    return [sys.executable, "-m", "glassgpt", "train", "--preset", "cpu-tiny", *args]


def text_file(folder: Path) -> Path:
    path = folder / "input.txt"
    path.write_text("".join(f"line {i}: {i * i % 97} and {i % 13}\n" for i in range(3000)))
    return path


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")]


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tmp_path: Path) -> None:
    data = text_file(tmp_path)
    sets = [*SETS, "train.max_steps=150", "train.checkpoint_every=10", "train.eval_every=50"]
    sets += ["model.dropout=0.1"]  # the dropout stream must be restored too
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    base = ["--data", str(data), "--set", *sets]
    subprocess.run(glassgpt(*base, "--out", str(whole)), env=env(), check=True, capture_output=True)

    proc = subprocess.Popen(
        glassgpt(*base, "--out", str(killed)),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (killed / "ckpt" / "step_000020" / "state.json").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(step for step, _ in losses(killed))
    assert killed_at < 150

    resumed = subprocess.run(
        [sys.executable, "-m", "glassgpt", "train", "--resume", str(killed)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    assert losses(killed) == losses(whole)  # every step, to the last bit
    assert len(losses(whole)) == 150


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path: Path) -> None:
    data = text_file(tmp_path)
    sets = [*SETS, "train.max_steps=8", "train.batch_size=8", "train.eval_every=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    base = ["--data", str(data), "--set", *sets]
    subprocess.run(glassgpt(*base, "--out", str(one)), env=env(), check=True, capture_output=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd = [*torchrun, "-m", "glassgpt", "train", "--preset", "cpu-tiny", *base, "--out", str(two)]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 9))
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-5)
        assert rb["tokens"] == ra["tokens"]
        if "val_loss" in ra:
            assert rb["val_loss"] == pytest.approx(ra["val_loss"], abs=1e-5)
    assert b[0]["loss"] != b[-1]["loss"]  # it trained
    assert (two / "ckpt" / "step_000008" / "state.json").is_file()
    assert '"world_size": 2' in (two / "run.json").read_text()
