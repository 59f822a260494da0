"""The generic Trainer on stand-ins (tests/train/standins.py): exactness and robustness."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from standins import TinyLM, WindowSampler, markov_tokens

from glassgpt.checkpoint import find_resumable, load_checkpoint, step_folders
from glassgpt.train.config import TrainConfig
from glassgpt.train.metrics import read_metrics
from glassgpt.train.optim import clip_gradients
from glassgpt.train.trainer import Trainer, TrainingDiverged

TOKENS = markov_tokens(4000)
VAL = markov_tokens(800, seed=1)


def eval_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(0, 640, 128):
        chunk = torch.from_numpy(VAL[i : i + 129])
        yield chunk[:-1].reshape(8, 16), chunk[1:].reshape(8, 16)


def make(out: Path | None, seed: int = 0, dropout: float = 0.1, **overrides) -> Trainer:
    torch.manual_seed(seed)
    cfg = dict(
        max_steps=30,
        batch_size=8,
        lr=1e-2,
        min_lr=1e-3,
        warmup_steps=3,
        eval_every=10,
        checkpoint_every=10,
        progress=False,
        precision="fp32",
    )
    cfg.update(overrides)
    return Trainer(
        TinyLM(dropout=dropout),
        TrainConfig(**cfg),
        WindowSampler(TOKENS, 8, 16, seed=5),
        eval_data=eval_batches,
        out_dir=out,
        bytes_per_token=1.0,
        log=lambda msg: None,
    )


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")]


def test_first_loss_is_the_models_loss_on_the_first_batch(tmp_path: Path) -> None:
    trainer = make(tmp_path, dropout=0.0)
    x, y = next(WindowSampler(TOKENS, 8, 16, seed=5))
    with torch.no_grad():
        _, expected = trainer.model(x, y)
    trainer.cfg = TrainConfig(**{**trainer.cfg.__dict__, "max_steps": 1})
    trainer.fit()
    assert losses(tmp_path)[0] == (1, pytest.approx(expected.item(), rel=1e-6))


def test_resume_from_a_checkpoint_is_bit_identical(tmp_path: Path) -> None:
    whole = make(tmp_path / "whole", decay_steps=30)
    whole.fit()
    first = make(tmp_path / "split", max_steps=20, decay_steps=30)  # same schedule, cut short
    first.fit()
    second = make(
        tmp_path / "split", seed=99, decay_steps=30
    )  # other initial weights: all must come from disk
    second.load_checkpoint(find_resumable(tmp_path / "split"))
    assert second.step == 20
    second.fit()
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")  # exact, with dropout on
    a = load_checkpoint(tmp_path / "whole" / "ckpt" / "step_000030").tensors("model.safetensors")
    b = load_checkpoint(tmp_path / "split" / "ckpt" / "step_000030").tensors("model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_gradient_accumulation_equals_the_full_batch(tmp_path: Path) -> None:
    batches = [next(WindowSampler(TOKENS, 8, 16, seed=s)) for s in range(6)]

    class Fixed:
        def __init__(self, parts: int) -> None:
            self.items = [(x[i::parts], y[i::parts]) for x, y in batches for i in range(parts)]
            self.i = 0

        def __next__(self):
            self.i += 1
            return self.items[self.i - 1]

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, state):
            self.i = state["i"]

    params = []
    for accum in (1, 4):
        torch.manual_seed(0)
        cfg = TrainConfig(
            max_steps=6,
            batch_size=8,
            grad_accum=accum,
            warmup_steps=1,
            progress=False,
            precision="fp32",
        )
        t = Trainer(TinyLM(dropout=0.0), cfg, Fixed(accum), log=lambda m: None)
        t.fit()
        params.append(torch.cat([p.detach().flatten() for p in t.model.parameters()]))
    torch.testing.assert_close(params[0], params[1], rtol=1e-5, atol=1e-6)


def test_evaluation_and_sampling_do_not_move_the_training_streams(tmp_path: Path) -> None:
    def sampler(model: torch.nn.Module, step: int) -> str:
        gen = torch.Generator().manual_seed(step)
        return str(torch.randint(0, 9, (3,), generator=gen).tolist())

    plain = make(tmp_path / "a", eval_every=1000)
    plain.fit()
    busy = make(tmp_path / "b", eval_every=3)
    busy.on_eval = sampler
    busy.fit()
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    evals = [r for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    for r in evals:
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2))
        assert r["sample"].startswith("[") and math.isfinite(r["loss"])


def test_eval_seconds_add_up_the_evaluations_before_each_record(tmp_path: Path) -> None:
    pause = 0.05

    def slow_sampler(model: torch.nn.Module, step: int) -> str:
        time.sleep(pause)  # an evaluation that takes at least this long
        return ""

    trainer = make(tmp_path, eval_every=10)
    trainer.on_eval = slow_sampler
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30]
    # each record's eval_s is the time of the evaluations before it, not its own
    assert [r["eval_s"] for r in records if r["step"] <= 10] == [0.0] * 10
    before_last = next(r for r in records if r["step"] == 21)["eval_s"]
    assert before_last >= 2 * pause
    assert trainer.eval_seconds - before_last >= pause  # the third evaluation
    spent = [r["eval_s"] for r in records]
    assert spent == sorted(spent) and all(r["elapsed_s"] >= r["eval_s"] for r in records)


def test_val_loss_is_the_token_mean_over_the_eval_windows(tmp_path: Path) -> None:
    trainer = make(None, dropout=0.0)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_batches():
            _, loss = trainer.model(x, y)
            total, count = total + loss.item() * y.numel(), count + y.numel()
    assert trainer.evaluate()["val_loss"] == pytest.approx(total / count, rel=1e-9)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    trainer = make(tmp_path, checkpoint_every=4)
    model = trainer.model
    calls = {"n": 0}
    original = model.forward

    def forward(x, y=None):
        calls["n"] += 1
        logits, loss = original(x, y)
        return logits, loss * float("nan") if calls["n"] == 7 else loss

    model.forward = forward  # the 7th training step diverges
    with pytest.raises(TrainingDiverged, match=r"nan at step 7.*step_000004"):
        trainer.fit()
    assert [p.name for p in step_folders(tmp_path / "ckpt")] == ["step_000004"]
    assert find_resumable(tmp_path).step == 4
    assert max(r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")) == 6


def test_sigint_writes_a_checkpoint_and_stops_cleanly(tmp_path: Path) -> None:
    trainer = make(tmp_path, checkpoint_every=0)
    batches = trainer.batches
    original = batches.__class__.__next__

    class Interrupting(WindowSampler):
        drawn = 0

        def __next__(self):
            Interrupting.drawn += 1
            if Interrupting.drawn == 13:
                os.kill(os.getpid(), signal.SIGINT)
            return original(self)

    batches.__class__ = Interrupting
    result = trainer.fit()
    assert result["ended"] == "signal" and result["signal"] == signal.SIGINT
    assert [p.name for p in step_folders(tmp_path / "ckpt")] == ["step_000013"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_bf16_autocast_trains_close_to_fp32(tmp_path: Path) -> None:
    results = {}
    for precision in ("fp32", "bf16"):
        t = make(
            tmp_path / precision, dropout=0.0, precision=precision, max_steps=10, eval_every=10
        )
        results[precision] = t.fit()
    assert results["bf16"]["val_loss"] == pytest.approx(results["fp32"]["val_loss"], rel=2e-2)
    assert results["bf16"]["val_loss"] < math.log(16)  # it learned


def test_fp16_on_cpu_is_refused() -> None:
    from glassgpt.errors import ConfigError

    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        make(None, precision="fp16")


def test_sampler_and_optimizer_state_are_in_the_checkpoint(tmp_path: Path) -> None:
    make(tmp_path, max_steps=10).fit()
    ck = find_resumable(tmp_path)
    assert ck.state["sampler"][0]["rng"]["state"]["state"] > 0
    opt = ck.tensors("optimizer.safetensors")
    assert set(opt) == {
        f"{n}.{k}" for n in ("E", "P", "W", "b") for k in ("step", "exp_avg", "exp_avg_sq")
    }
    assert opt["W.step"].item() == 10
    assert np.isfinite(ck.state["trainer"]["best_val_loss"])


def test_compile_defaults_to_on_for_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from glassgpt.errors import ConfigError
    from glassgpt.train.trainer import resolve_compile

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_compile(None, cpu) is False and resolve_compile(False, cuda) is False
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert resolve_compile(None, cuda) is True
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert resolve_compile(None, cuda) is False  # no C compiler: eager, as asked by nobody
    with pytest.raises(ConfigError, match=r"train\.compile"):
        resolve_compile(True, cuda)


def test_a_pending_step_reports_its_loss_and_norm() -> None:
    from glassgpt.train.trainer import PendingStep

    done = PendingStep({"step": 3, "lr": 0.1}, torch.tensor([2.5, float("nan")]))
    assert done.result() == {"step": 3, "lr": 0.1, "loss": 2.5, "grad_norm": None}
    assert PendingStep({}, torch.tensor([1.0, 0.5])).result()["grad_norm"] == 0.5


def test_a_torchrun_process_joins_a_group_even_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from glassgpt.train.distributed import DistContext, launched_by_torchrun

    assert not DistContext().enabled and DistContext(world_size=2).enabled
    assert DistContext(world_size=1, launched=True).enabled
    for var in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    assert not launched_by_torchrun()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert launched_by_torchrun()


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e9])
@pytest.mark.parametrize("poison", [False, True])
def test_clip_gradients_matches_torch_clip_grad_norm(max_norm: float, poison: bool) -> None:
    """The oracle: torch.nn.utils.clip_grad_norm_ on copies of the same gradients, with norms
    above and below max_norm, and a NaN among them."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s)) for s in [(7, 5), (5,), (3, 4, 2)]]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    if poison:
        ours[1].grad[0] = theirs[1].grad[0] = math.nan
    ours.append(torch.nn.Parameter(torch.zeros(2)))  # no gradient: left out, as torch does
    norm = clip_gradients(ours, max_norm)
    want = torch.nn.utils.clip_grad_norm_(theirs, max_norm, foreach=True)
    torch.testing.assert_close(norm, want, equal_nan=True)
    for a, b in zip(ours, theirs):  # the float64 norm's rounding: within a few float32 ulps
        torch.testing.assert_close(a.grad, b.grad, rtol=3e-7, atol=0, equal_nan=True)
    if not poison and max_norm < 1e9:  # clipped: the norm is now max_norm (within rounding)
        total = math.sqrt(sum(float(p.grad.double().square().sum()) for p in ours[:3]))
        assert total == pytest.approx(max_norm, rel=1e-6)
