"""What a new user hit trying the README, each fixed: tiny runs through ``glassgpt.cli.main``.

Oracles: the trainer's own metrics.jsonl (for ``eval``), transformers' AutoTokenizer and
GPT2LMHeadModel (for the export), the files a run leaves, and argparse's own usage text.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from glassgpt.cli import main
from glassgpt.train.metrics import read_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = [
    "train.batch_size=4",
    "train.eval_batches=2",
    "train.sample_tokens=4",
    "train.warmup_steps=2",
    "model.n_ctx=32",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
]


def text_file(folder: Path, size: int = 20_000) -> Path:
    lines = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(size // 30)]
    path = folder / "input.txt"
    path.write_text("".join(lines)[:size], encoding="utf-8")
    return path


def summary_lines(lines: list[str]) -> list[str]:
    """The lines that are neither a step's nor a sample's (a sample's text may hold newlines:
    it runs until the next step or the closing line)."""
    out, in_sample = [], False
    for x in lines:
        if x.startswith(("step ", "done: ", "interrupted: ")):
            in_sample = False
        if x.startswith("sample: "):
            in_sample = True
        if not (in_sample or x.startswith("step ")):
            out.append(x)
    return out


def train(*args: str, threads: bool = True) -> int:
    sets = [*TINY, *(["train.threads=1"] if threads else [])]
    return main(["train", "--preset", "cpu-tiny", "--no-progress", *args, "--set", *sets])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny character run (bf16 autocast, as a CPU with bf16 would train)."""
    folder = tmp_path_factory.mktemp("new-user")
    out = folder / "run"
    sets = ["train.max_steps=6", "train.eval_every=3", "train.precision=bf16"]
    threads = torch.get_num_threads()
    try:
        assert train("--data", str(text_file(folder)), "-o", str(out), "--set", *sets) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def test_train_prints_a_summary_and_saves_the_config(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert train("--data", str(text_file(tmp_path)), "-o", str(out), "--set",
                 "train.max_steps=2") == 0  # fmt: skip
    printed = capsys.readouterr()
    assert "[train]" not in printed.out and "max_steps = " not in printed.out
    lines = printed.out.splitlines()
    assert len(summary_lines(lines)) <= 6, lines
    assert f"run: {out} (the full config: {out / 'config.toml'})" in lines
    model = next(x for x in lines if x.startswith("model: "))
    assert "1 layer, d_model 32, 2 heads, n_ctx 32: " in model and " parameters | " in model
    assert any(x.startswith("train: 2 steps, adamw lr ") for x in lines)
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["train"]["max_steps"] == 2 and config["model"]["d_model"] == 32
    assert config["train"]["progress"] is False  # --no-progress
    assert "%|" not in printed.err  # no bar


def test_a_second_run_without_o_takes_a_fresh_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    data = str(text_file(tmp_path))
    assert train("--data", data, "--set", "train.max_steps=1") == 0
    capsys.readouterr()
    assert train("--data", data, "--set", "train.max_steps=1") == 0
    err = capsys.readouterr().err
    first, second = Path("runs/cpu-tiny"), Path("runs/cpu-tiny-2")
    assert f"{first} already holds a run; this one goes to {second}" in err
    assert (first / "config.toml").is_file() and (second / "ckpt" / "best").is_dir()
    assert train("--data", data, "-o", str(first), "--set", "train.max_steps=1") == 2  # -o: refused
    assert "already holds a run" in capsys.readouterr().err


def test_eval_without_data_is_the_trainers_val_loss(run: Path, capsys) -> None:
    records = read_metrics(run / "metrics.jsonl")
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    best = json.loads((run / "ckpt" / "best" / "state.json").read_text())["val_loss"]
    assert best == min(vals)
    assert main(["eval", "-c", str(run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert abs(result["loss"] - best) < 1e-6, (result, best)
    assert result["dtype"] == "bfloat16" and "train.eval_batches=2" in result["source"]
    # all windows in float32: another number (why the README's run showed two)
    assert main(["eval", "-c", str(run), "--data", str(run / "data"), "--dtype", "float32",
                 "--json"]) == 0  # fmt: skip
    other = json.loads(capsys.readouterr().out)
    assert abs(other["loss"] - best) > 1e-4 and other["tokens"] > result["tokens"]


def test_eval_without_data_of_a_folder_with_no_run(tmp_path: Path, capsys) -> None:
    from glassgpt.interop import to_hf
    from glassgpt.model import GPT, GPTConfig

    to_hf(GPT(GPTConfig(n_vocab=8, n_ctx=8, d_model=8, n_layers=1, n_heads=2)), tmp_path / "hf")
    assert main(["eval", "-c", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glassgpt: error: ") and "pass --data" in err and "\n" not in err


def test_ctrl_c_says_interrupted_and_how_to_resume(tmp_path: Path, monkeypatch, capsys) -> None:
    from glassgpt.train.trainer import Trainer

    launch = Trainer.launch_step

    def launch_then_interrupt(self: Trainer):  # Ctrl-C during step 3
        out = launch(self)
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, "launch_step", launch_then_interrupt)
    out = tmp_path / "my run"
    code = train("--data", str(text_file(tmp_path)), "-o", str(out), "--set", "train.max_steps=8")
    printed = capsys.readouterr().out
    assert code == 128 + signal.SIGINT
    assert "interrupted: step 3 of 8" in printed and "done:" not in printed
    assert f"continue it with: glassgpt train --resume '{out}'" in printed
    monkeypatch.undo()
    assert main(["train", "--resume", str(out)]) == 0  # the command, as printed
    assert "done: step 8" in capsys.readouterr().out


def test_omp_num_threads_is_honoured(tmp_path: Path, monkeypatch, capsys) -> None:
    from glassgpt.train.trainer import Trainer

    seen: list[int] = []
    launch = Trainer.launch_step
    monkeypatch.setattr(Trainer, "launch_step",
                        lambda self: (seen.append(torch.get_num_threads()), launch(self))[1])  # fmt: skip
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        code = train("--data", str(text_file(tmp_path)), "-o", str(tmp_path / "r"), "--set",
                     "train.max_steps=2", threads=False)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert code == 0 and seen == [1, 1]
    assert "1 thread (OMP_NUM_THREADS)" in capsys.readouterr().out


def test_a_step_far_slower_than_the_median_is_noted() -> None:
    from glassgpt.train.progress import StepTimes

    times = StepTimes(threads=2, quiet=5)
    notes = [times.add(k, 0.5 if k in (20, 22, 30) else 0.1) for k in range(1, 40)]
    said = [k for k, n in enumerate(notes, start=1) if n]
    assert said == [20, 30]  # 22 is within `quiet` steps of 20
    assert "5.0× the median" in notes[19] and "OMP_NUM_THREADS=1" in notes[19]
    assert StepTimes(threads=1).add(1, 100.0) is None  # the first steps are never judged


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["sample", "-c", "x", "--promt", "hi"], "did you mean --prompt?"),
        (["train", "--max-steps", "5"], "did you mean --set train.max_steps=5?"),
        (["eval", "-c", "x", "--seq_len=4"], "did you mean --seq-len?"),
    ],
)
def test_a_misspelt_flag_shows_the_commands_usage_and_the_nearest(argv, hint, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith(f"usage: glassgpt {argv[0]} ") and hint in err.splitlines()[-1]


@pytest.mark.parametrize("seed", [str(10**22), str(-(2**63) - 1)])
def test_a_seed_past_64_bits_is_one_line(seed: str, capsys) -> None:
    assert main(["sample", "-c", "nowhere", "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"glassgpt: error: --seed: must be from -2**63 to 2**64 - 1 (a 64-bit "
        f"generator seed; sample i uses seed + i), got {seed}\n"
    )


def test_sampling_past_the_context_says_nothing(run: Path, capsys) -> None:
    threads = torch.get_num_threads()
    try:  # the README's command: more new tokens than n_ctx=32
        code = main(["sample", "-c", str(run), "-p", "def ", "-m", "40", "--seed", "1"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr()
    assert code == 0 and printed.err == "" and printed.out.startswith("def ")


def test_export_hf_of_the_readmes_char_model(run: Path, tmp_path: Path, capsys) -> None:
    transformers = pytest.importorskip("transformers")
    from glassgpt.checkpoint import load

    config = tomllib.loads((run / "config.toml").read_text())
    assert config["model"]["bias"] is True  # biases, but b_U is off by default, as in GPT-2
    assert config["model"].get("unembed_bias", False) is False
    assert not any("unembed_bias" in s for s in TINY)  # not set by the test: the default
    out = tmp_path / "hf"
    assert main(["export", "-c", str(run), "--format", "hf", "-o", str(out)]) == 0
    model, tok = load(run)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "def f12(x):\n    return x * 3\n"  # within n_ctx = 32
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == tok.encode(text, allowed_special="all")
    assert hf_tok.decode(ids) == text
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.tensor([ids[: model.config.n_ctx]])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), atol=1e-4, rtol=1e-4)
    # and back: the exported folder samples with glassgpt too
    _, back_tok = load(out)
    assert back_tok.encode(text, allowed_special="all") == ids
