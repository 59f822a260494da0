"""``glassgpt train`` end to end, in process, on tiny models (the real GPT and data pipeline)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

from glassgpt.checkpoint import find_resumable
from glassgpt.cli import main
from glassgpt.train.config import build_run_config
from glassgpt.train.metrics import read_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = [
    "train.progress=false",
    "train.threads=1",
    "train.batch_size=4",
    "train.eval_batches=2",
    "train.sample_tokens=8",
    "train.warmup_steps=2",
    "model.n_ctx=32",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
]


def text_file(folder: Path, name: str = "input.txt", size: int = 20_000) -> Path:
    lines = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(size // 30)]
    path = folder / name
    path.write_text("".join(lines)[:size], encoding="utf-8")
    return path


def train(*args: str) -> int:
    return main(["train", "--preset", "cpu-tiny", *args])


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassgpt: error: "), err
    return lines[0]


def test_a_run_writes_config_metrics_checkpoints_and_plot(tmp_path: Path, capsys) -> None:
    data, out = text_file(tmp_path), tmp_path / "run"
    sets = [*TINY, "train.max_steps=6", "train.eval_every=3", "train.checkpoint_every=3"]
    assert train("--data", str(data), "--out", str(out), "--set", *sets) == 0
    printed = capsys.readouterr().out
    assert f"run: {out} (the full config: {out / 'config.toml'})" in printed  # saved, not shown
    assert "sample: " in printed and "done: step 6" in printed
    config = tomllib.loads((out / "config.toml").read_text())
    info = json.loads((out / "run.json").read_text())
    assert build_run_config(config) == build_run_config(info["config"])  # TOML leaves out None
    assert info["command"] and info["glassgpt_version"] and config["model"]["n_vocab"] > 10
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    assert all(isinstance(r["loss"], float) for r in records)
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ck = find_resumable(out)
    assert ck.step == 6 and ck.files["tokenizer.json"] == (out / "data/tokenizer.json").read_bytes()
    assert tomllib.loads(ck.text("config.toml")) == config
    assert (out / "ckpt" / "best" / "model.safetensors").is_file()


def test_no_data_trains_on_the_standard_library(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    sets = [*TINY, "train.max_steps=2", "data.max_bytes=100000", "train.sample_prompt='def '"]
    assert main(["train", "--out", str(out), "--set", *sets]) == 0
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["sources"] and all(s["path"].endswith(".py") for s in meta["sources"])
    assert "sample: def " in capsys.readouterr().out


def test_resume_continues_and_refuses_another_config(tmp_path: Path, capsys) -> None:
    data, out = text_file(tmp_path), tmp_path / "run"
    sets = [*TINY, "train.max_steps=3", "train.decay_steps=6", "train.eval_every=3"]
    assert train("--data", str(data), "--out", str(out), "--set", *sets) == 0
    capsys.readouterr()
    assert train("--data", str(data), "--out", str(out), "--set", *sets) == 2
    assert "already holds a run" in one_line_error(capsys)
    assert main(["train", "--resume", str(out), "--set", "model.d_model=64"]) == 2
    line = one_line_error(capsys)
    assert "cannot resume" in line and "model.d_model" in line
    assert main(["train", "--resume", str(out), "--set", "train.max_steps=5"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    # the same preset, data and overrides as the original command are the same config
    again = [*sets, "train.max_steps=6"]
    assert train("--resume", str(out), "--data", str(data), "--set", *again) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = str(tmp_path / "out")
    assert train("--data", str(tmp_path / "absent.txt"), "--out", out, "--set", *TINY) == 2
    assert "absent.txt" in one_line_error(capsys)
    assert train("--data", str(empty), "--out", out, "--set", *TINY) == 2
    assert "empty" in one_line_error(capsys)
    (tmp_path / "not_a_run").mkdir()
    assert main(["train", "--resume", str(tmp_path / "not_a_run")]) == 2
    assert "not a checkpoint" in one_line_error(capsys)
    assert train("--out", out, "--set", *TINY, "train.nope=1") == 2
    assert "train.nope" in one_line_error(capsys)


def test_a_data_folder_made_with_another_tokenizer_is_refused(tmp_path: Path, capsys) -> None:
    from glassgpt.tokenizer import CharTokenizer

    data = text_file(tmp_path)
    prepared = tmp_path / "prepared"
    assert main(["data", "prepare", "--input", str(data), "--char", "--output", str(prepared)]) == 0
    other = tmp_path / "other.json"
    CharTokenizer.train([data.read_text() + "é"]).save(other)
    capsys.readouterr()
    args = ["--data", str(prepared), "--out", str(tmp_path / "o"), "--set", *TINY]
    assert train(*args, f"data.tokenizer={json.dumps(str(other))}") == 2
    assert "another tokenizer" in one_line_error(capsys)


def test_a_batch_too_large_for_memory_is_refused_before_the_run(tmp_path: Path, capsys) -> None:
    data, out = text_file(tmp_path), tmp_path / "run"
    sets = [*TINY, "model.n_ctx=1024", "model.d_model=768", "model.n_heads=12", "model.n_layers=12"]
    assert (
        train("--data", str(data), "--out", str(out), "--set", *sets, "train.batch_size=8192") == 2
    )
    line = one_line_error(capsys)
    assert "train.batch_size=8192" in line and "free" in line
    assert not (out / "ckpt").exists()


@pytest.mark.slow
def test_training_on_tinyshakespeare_lowers_the_val_loss(
    tmp_path: Path, shakespeare_path: Path
) -> None:
    out = tmp_path / "run"
    sets = [*TINY, "train.max_steps=120", "train.eval_every=40", "train.batch_size=8"]
    assert train("--data", str(shakespeare_path), "--out", str(out), "--set", *sets) == 0
    val = [r["val_loss"] for r in read_metrics(out / "metrics.jsonl") if "val_loss" in r]
    assert len(val) == 3
    assert val[0] > val[1] > val[2]
    # below the entropy of the character frequencies: the model predicts from context
    text = shakespeare_path.read_text(encoding="utf-8")
    counts = Counter(text)
    unigram = -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())
    assert val[2] < unigram < math.log(len(counts))


def test_the_speedrun_preset_trains_on_a_slice_of_tinyshakespeare(
    tmp_path: Path, shakespeare_text: str, capsys
) -> None:
    data, out = tmp_path / "shakespeare-slice.txt", tmp_path / "run"
    data.write_text(shakespeare_text[:60_000], encoding="utf-8")
    sets = ["train.max_steps=3", "train.progress=false", "train.sample_tokens=0"]
    args = ["--data", str(data), "--out", str(out), "--set", *sets]
    assert main(["train", "--preset", "shakespeare-char-speedrun", *args]) == 0
    config = build_run_config(tomllib.loads((out / "config.toml").read_text()))
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    per_step = config.train.batch_size * config.seq_len
    assert [r["tokens"] for r in records] == [per_step, 2 * per_step, 3 * per_step]
    warmup, lr = config.train.warmup_steps, config.train.lr
    assert [r["lr"] for r in records] == pytest.approx([lr * s / (warmup + 1) for s in (1, 2, 3)])
    # a character model starts near the uniform loss ln |V| (its vocabulary: the slice's chars)
    assert config.model.n_vocab == len(set(shakespeare_text[:60_000]))
    assert abs(records[0]["loss"] - math.log(config.model.n_vocab)) < 0.1
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [3] and math.isfinite(evals[0]["val_loss"])
