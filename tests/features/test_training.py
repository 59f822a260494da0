"""``glassgpt sae train`` / ``sae eval`` on a tiny run: it learns, it resumes bit-exactly, its
buffer is a permutation of the activations, and its bad input is one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from glassgpt.cli import main
from glassgpt.features.buffer import ActivationBuffer
from glassgpt.features.sae import SAE
from glassgpt.features.sites import read, resolve_site
from glassgpt.features.training import geometric_median

FAST = ["train.batch_size=256", "train.buffer_tokens=2048", "train.model_batch=16",
        "train.log_every=5", "train.checkpoint_every=10", "train.warmup_steps=5",
        "train.eval_batches=1", "train.median_samples=512", "train.lr=2e-3"]  # fmt: skip


def sae_train(run: Path, out: Path, *extra: str, arch: str = "topk", tokens: int = 12_800) -> int:
    args = ["sae", "train", "-c", str(run), "--hook", "blocks.1.hook_resid_post", "--width", "48",
            "--arch", arch, "-o", str(out), "--tokens", str(tokens), "--no-progress", "--set", *FAST, *extra]  # fmt: skip
    if arch in ("topk", "batchtopk", "transcoder"):
        args[8:8] = ["-k", "4"]
    return main(args)


def test_a_short_training_lowers_the_fvu(tiny_run: Path, tmp_path: Path, capsys) -> None:
    assert sae_train(tiny_run, tmp_path / "s", arch="topk") == 0
    records = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    first, final = records[0], records[-1]
    assert first["fvu"] > 1.3 * final["fvu"]  # the first 5 steps: random directions
    assert final["fvu"] < 0.35 and final["l0"] == 4.0  # the stated bound, on validation windows
    assert final["ce_recovered"] == pytest.approx(final["ce_recovered"])  # a number, not null
    assert "FVU" in capsys.readouterr().out
    assert main(["sae", "eval", "-c", str(tmp_path / "s"), "--json", "--tokens", "2000"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fvu"] < 0.35 and shown["hook"] == "blocks.1.resid_post"


@pytest.mark.parametrize("arch", ["relu", "jumprelu", "batchtopk", "transcoder"])
def test_every_architecture_learns(tiny_run: Path, tmp_path: Path, arch: str) -> None:
    extra = ["sae.l1_coeff=0.05"] if arch == "relu" else []
    if arch == "transcoder":
        args = ["sae", "train", "-c", str(tiny_run), "--hook", "blocks.0.mlp_out", "--width", "48",
                "--arch", arch, "-k", "4", "-o", str(tmp_path / arch), "--tokens", "6400",
                "--no-progress", "--set", *FAST]  # fmt: skip
        assert main(args) == 0
    else:
        assert sae_train(tiny_run, tmp_path / arch, *extra, arch=arch, tokens=6400) == 0
    records = [json.loads(x) for x in (tmp_path / arch / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "loss" in r]  # the objective falls (relu trades FVU for L1)
    assert trained[-1]["loss"] < 0.9 * trained[0]["loss"], (trained[0], trained[-1])
    assert records[-1]["fvu"] < 0.9
    sae = SAE.load(tmp_path / arch)
    if sae.cfg.unit_decoder:
        assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(48), atol=1e-5)


class Killed(Exception):
    """Stands in for SIGKILL: the process ends mid-step, with no checkpoint of its own."""


def cut_and_resume(train, folder: Path, monkeypatch, how: str) -> None:
    """``train(folder)`` stopped by SIGINT at batch 17 (``how`` "signal") or killed at batch 14
    (steps 11-13 done, lost: step_000010 remains), then resumed with ``sae train --resume``."""
    original = ActivationBuffer.next_batch
    calls = {"n": 0}

    def interrupting(self):
        calls["n"] += 1
        if calls["n"] == 17 and how == "signal":  # mid-round, between checkpoints
            os.kill(os.getpid(), signal.SIGINT)
        if calls["n"] == 14 and how == "kill":
            raise Killed
        return original(self)

    monkeypatch.setattr(ActivationBuffer, "next_batch", interrupting)
    if how == "signal":
        assert train(folder) == 130
    else:
        with pytest.raises(Killed):
            train(folder)
    monkeypatch.setattr(ActivationBuffer, "next_batch", original)
    assert not (folder / "sae").exists() and not (folder / "clt").exists()
    step = 17 if how == "signal" else 10
    assert (folder / "ckpt" / "latest").read_text().strip() == f"step_{step:06d}"
    assert main(["sae", "train", "--resume", str(folder), "--no-progress"]) == 0


def same_logs(a: Path, b: Path) -> bool:
    """The two folders' metrics.jsonl agree but for the measured speed."""
    logs = [
        [{k: v for k, v in json.loads(x).items() if k != "tok_s"}
         for x in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (a, b)
    ]  # fmt: skip
    return logs[0] == logs[1]


@pytest.mark.parametrize("how", ["signal", "kill"])
def test_resume_after_an_interrupt_is_bit_exact(
    tiny_run: Path, tmp_path: Path, monkeypatch, how: str
) -> None:
    assert sae_train(tiny_run, tmp_path / "whole", tokens=7680) == 0  # 30 steps
    cut_and_resume(lambda out: sae_train(tiny_run, out, tokens=7680), tmp_path / "cut", monkeypatch, how)  # fmt: skip
    a = (tmp_path / "whole" / "sae" / "sae.safetensors").read_bytes()
    b = (tmp_path / "cut" / "sae" / "sae.safetensors").read_bytes()
    assert a == b
    assert same_logs(tmp_path / "whole", tmp_path / "cut")


def test_the_buffer_is_a_permutation_of_the_windows_activations(tiny_run: Path) -> None:
    from glassgpt.checkpoint import load
    from glassgpt.data import BatchSampler, DataDir

    model, _ = load(tiny_run)
    site = resolve_site(model, "blocks.0.resid_mid")
    data = DataDir.open(tiny_run / "data")
    buf = ActivationBuffer(model, site, data.stream("train"), batch_tokens=64,
                           buffer_tokens=512, seq_len=16, model_batch=8, seed=3)  # fmt: skip
    assert buf.per_round == 8  # 32 windows of 16 = 512 rows, 8 batches of 64
    got = torch.cat([buf.next_batch()[0] for _ in range(8)])
    sampler = BatchSampler(data.stream("train"), batch_size=8, seq_len=16, seed=3)
    want = torch.cat([read(model, sampler.next_batch()[0], site)[0].reshape(-1, 16) for _ in range(4)])  # fmt: skip
    key = lambda t: np.lexsort(t.numpy().T[::-1])  # noqa: E731
    assert torch.equal(got[key(got)], want[key(want)])  # the same rows, shuffled
    assert not torch.equal(got, want)
    state = buf.state_dict()  # round 0 ended: the next call starts round 1
    after = [buf.next_batch()[0] for _ in range(3)]
    again = ActivationBuffer(model, site, data.stream("train"), batch_tokens=64,
                             buffer_tokens=512, seq_len=16, model_batch=8, seed=3)  # fmt: skip
    again.load_state_dict(state)
    assert all(torch.equal(a, again.next_batch()[0]) for a in after)


def test_the_geometric_median_minimises_the_sum_of_distances() -> None:
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(200, 5, generator=gen, dtype=torch.float64)
    y[:20] += 50.0  # outliers drag the mean, not the median
    m = geometric_median(y, iters=500, tol=1e-14)
    grad = ((m - y) / (m - y).norm(dim=-1, keepdim=True)).sum(0)  # ∇ Σ‖yᵢ − m‖
    assert grad.norm() < 1e-6
    cost = lambda c: float((y - c).norm(dim=-1).sum())  # noqa: E731
    assert cost(m) < cost(y.mean(0)) and m.norm() < 5.0


def test_bad_input_is_one_line(tiny_run: Path, tmp_path: Path, capsys) -> None:
    cases = [
        (["--hook", "blocks.9.resid_post", "--width", "8", "--arch", "relu"], "blocks.9.resid_post: no such activation"),
        (["--hook", "blocks.0.resid_post", "--width", "8", "--arch", "topk", "-k", "9"], "-k: must be in [1, --width=8], got 9"),
        (["--hook", "blocks.0.resid_post", "--width", "0", "--arch", "relu"], "--width: must be in [1"),
        (["--hook", "blocks.0.resid_post", "--width", "8", "--arch", "relu", "--set", "train.lr=-1"], "train.lr: must be > 0"),
    ]  # fmt: skip
    for args, message in cases:
        code = main(["sae", "train", "-c", str(tiny_run), "-o", str(tmp_path / "x"), *args])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, err
    bare = tmp_path / "bare"  # a run folder without shards
    (bare / "ckpt").mkdir(parents=True)
    os.symlink(tiny_run / "ckpt" / "step_000001", bare / "ckpt" / "step_000001")
    assert main(["sae", "train", "-c", str(bare), "--hook", "blocks.0.resid_post", "--width",
                 "8", "--arch", "relu", "-o", str(tmp_path / "y")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "has no data shards" in err and "pass --data" in err and err.count("\n") == 1


def test_an_sae_of_another_model_is_refused_naming_both(
    tiny_run: Path, make_run, tmp_path: Path, capsys
) -> None:
    assert sae_train(tiny_run, tmp_path / "s", tokens=2560) == 0
    wide = make_run(tmp_path / "wide", d_model=24, text_chars=400)
    assert main(["sae", "eval", "-c", str(tmp_path / "s"), "--model", str(wide)]) == 2
    err = capsys.readouterr().err
    assert "[d_in=16]" in err and "[24]" in err and err.count("\n") == 1
