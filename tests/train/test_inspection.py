"""Circuits over training: the head scores, lens losses and attention entropies that a run logs
at step s equal what ``glassgpt.inspect`` measures on the checkpoint of step s (head_scores,
logit_lens, patterns from run_with_cache with an explicit entropy loop); circuits.png; defaults."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.train.test_run import TINY as RUN_TINY
from tests.train.test_run import text_file

from glassgpt.checkpoint import load_checkpoint
from glassgpt.cli import main
from glassgpt.data import iter_eval_batches
from glassgpt.inspect import head_scores, logit_lens, run_with_cache
from glassgpt.model import GPT, GPTConfig
from glassgpt.train.config import load_run_config
from glassgpt.train.inspection import INSPECT_ROWS
from glassgpt.train.metrics import read_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = [  # test_run's tiny run, 2 layers, a probe and a kept checkpoint at steps 2 and 4
    *RUN_TINY,
    *("model.n_ctx=16", "model.d_model=16", "model.n_layers=2", "train.sample_tokens=0"),
    *("train.max_steps=4", "train.eval_every=2", "train.checkpoint_every=2", "train.keep_last=0"),
]


def model_at(out: Path, step: int) -> GPT:
    ck = load_checkpoint(out / "ckpt" / f"step_{step:06d}")
    model = GPT(GPTConfig.from_dict(tomllib.loads(ck.text("config.toml"))["model"]))
    model.load_state_dict(ck.tensors("model.safetensors"))
    return model.eval()


def test_logged_scores_equal_inspect_on_the_saved_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", "--data", str(text_file(tmp_path)), "-o", str(out), "--set", *TINY]) == 0
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    probed = [s for s, r in records.items() if "induction/L0H0" in r]
    assert probed == [2, 4]  # at every evaluation, by default, for a model this small
    x, y = next(iter_eval_batches(out / "data", "val", batch_size=INSPECT_ROWS, seq_len=16))
    for step in probed:
        model, logged = model_at(out, step), records[step]
        scores = head_scores(model)  # inspect's defaults: 8 sequences of n = n_ctx // 2, seed 0
        for name, table in scores.as_dict().items():
            for layer in range(2):
                for head in range(2):
                    got = logged[f"{name}/L{layer}H{head}"]
                    assert got == pytest.approx(float(table[layer, head]), abs=1e-7), name
        lens = logit_lens(model, x)  # [1 + L, B, T, V]: before block 0, after each block
        _, cache = run_with_cache(model, x, "pattern")
        for layer in range(2):
            ce = F.cross_entropy(lens.logits[layer + 1].flatten(0, 1), y.flatten())
            assert logged[f"lens_loss/L{layer}"] == pytest.approx(float(ce), abs=1e-5)
            A = cache["pattern", layer].double().numpy()  # [B, H, T, T]
            rows = [
                -sum(p * math.log(p) for p in A[b, h, i] if p > 0)
                for b in range(A.shape[0])
                for h in range(A.shape[1])
                for i in range(A.shape[2])
            ]
            assert logged[f"attn_entropy/L{layer}"] == pytest.approx(np.mean(rows), abs=1e-5)
    # the last lens loss is the model's own loss on the batch
    with torch.no_grad():
        _, loss = model_at(out, 4)(x, y)
    assert records[4]["lens_loss/L1"] == pytest.approx(float(loss), abs=1e-5)
    png = out / "circuits.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_does_not_change_the_training(tmp_path: Path) -> None:
    data = text_file(tmp_path)
    runs = {}
    for every in (0, 1):
        out = tmp_path / f"run{every}"
        sets = [*TINY, f"train.inspect_every={every}", "train.max_steps=3"]
        assert main(["train", "--data", str(data), "-o", str(out), "--set", *sets]) == 0
        runs[every] = read_metrics(out / "metrics.jsonl")
    assert not any("induction/L0H0" in r for r in runs[0])
    assert all("induction/L0H0" in r for r in runs[1])
    assert [r["loss"] for r in runs[0]] == [r["loss"] for r in runs[1]]
    assert not (tmp_path / "run0" / "circuits.png").exists()


@pytest.mark.parametrize(
    ("sets", "every"),
    [
        ([], 100),  # cpu-tiny: 2 × 2 heads, at every evaluation
        (["model.n_layers=12", "model.n_heads=8"], 0),  # 96 heads: off unless asked
        (["model.n_layers=12", "model.n_heads=8", "train.inspect_every=50"], 50),
        (["train.inspect_every=0"], 0),
    ],
)
def test_inspect_every_default(sets: list[str], every: int) -> None:
    assert load_run_config(preset="cpu-tiny", overrides=sets).inspect_every == every


def test_the_probe_and_inspect_share_one_implementation() -> None:
    import glassgpt.inspect.heads as heads
    import glassgpt.model.probes as probes

    assert heads.repeated_random_tokens is probes.repeated_random_tokens
    assert heads.pattern_scores is probes.pattern_scores
    t = probes.repeated_random_tokens(30, 5, batch=3, seed=2)
    assert torch.equal(t[:, :5], t[:, 5:]) and all(len(set(r[:5].tolist())) == 5 for r in t)
