"""``glassgpt train --init-from`` a tiny HF folder of each family, and a hub id from a hub
cache laid out as huggingface_hub writes one (network off), for a few steps on text with
``train.inspect_every`` on: the run keeps the family's function (its fields in the saved
config, its weights before the first step equal to the folder's), and the head scores it
logs at a step equal what ``glassgpt.inspect`` measures on that step's checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from tests.families import FAMILIES, family_folder
from tests.test_hub import add_snapshot

import glassgpt
from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.inspect import head_scores
from glassgpt.train.metrics import read_metrics

WORDS = ["the", "cat", "then", "an", "old", "tin", "hat", "in", "than", "thin", "sat", "on"]
SETS = ["train.progress=false", "train.threads=1", "train.batch_size=4", "train.max_steps=4",
        "train.eval_every=2", "train.eval_batches=1", "train.checkpoint_every=2",
        "train.keep_last=0", "train.inspect_every=2", "train.sample_tokens=0",
        "train.warmup_steps=1", "train.precision=fp32", "model.dropout=0.0"]  # fmt: skip


def text_file(folder: Path) -> Path:
    rng = random.Random(0)
    path = folder / "text.txt"
    path.write_text(" ".join(rng.choice(WORDS) for _ in range(3000)) + "\n")
    return path


def finetune(source: str, out: Path, data: Path) -> None:
    assert main(["train", "--init-from", source, "--data", str(data), "-o", str(out),
                 "--set", *SETS]) == 0  # fmt: skip


def check_run(out: Path, source: str) -> None:
    """The run's model has the source's family fields, and its logged head scores are
    inspect's on the checkpoints of the probed steps."""
    base = open_run(source).model_config
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    probed = [s for s, r in records.items() if "induction/L0H0" in r]
    assert probed == [2, 4]
    for step in probed:
        model, _ = glassgpt.load(out / "ckpt" / f"step_{step:06d}")
        cfg = model.config
        assert cfg.family_fields() == base.family_fields() and cfg.kv_heads == base.kv_heads
        for name, table in head_scores(model).as_dict().items():
            for layer in range(cfg.n_layers):
                for head in range(cfg.n_heads):  # H query heads, also where G < H
                    got = records[step][f"{name}/L{layer}H{head}"]
                    assert got == pytest.approx(float(table[layer, head]), abs=1e-6), name
    assert (out / "circuits.png").read_bytes()[:4] == b"\x89PNG"
    assert records[4]["loss"] < records[1]["loss"]  # it trains


@pytest.mark.parametrize("family", FAMILIES)
def test_init_from_an_hf_folder(family, tmp_path: Path) -> None:
    folder = family_folder(tmp_path / family, family, n_ctx=32)
    finetune(str(folder), tmp_path / "run", text_file(tmp_path))
    check_run(tmp_path / "run", str(folder))


def test_init_from_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--init-from hf:ORG/NAME@REV``: the snapshot of that revision, not main's."""
    cache = tmp_path / "home" / "hub"
    for family, commit, ref in (("qwen3", "a" * 40, "main"), ("neox", "b" * 40, "step2")):
        add_snapshot(cache, "tiny-org/tiny", commit, family_folder(tmp_path / family, family,
                     n_ctx=32), [ref])  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    data = text_file(tmp_path)
    finetune("hf:tiny-org/tiny@step2", tmp_path / "run", data)
    check_run(tmp_path / "run", "hf:tiny-org/tiny@step2")
    model, _ = glassgpt.load(tmp_path / "run" / "ckpt" / "step_000002")
    assert model.config.parallel_residual  # NeoX's, from the revision asked for
    with torch.no_grad():  # two steps of a small learning rate: still near the revision's
        start, _ = glassgpt.load(tmp_path / "neox")
        moved = [(a - b).abs().max() for a, b in zip(model.parameters(), start.parameters(), strict=True)]  # fmt: skip
    assert max(moved) < 0.05
