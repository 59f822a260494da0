"""One grammar for every command: -c/--checkpoint, -o/--output (--out), --set with several
values per flag, one preset list for train, describe and ``glassgpt presets``; and the
honest output items (ETA, sliding-window warning, report permissions)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import tomllib

from glassgpt.cli import build_parser, main
from glassgpt.train.config import preset_dict, preset_names

CHECKPOINT_COMMANDS = [
    ["sample"],
    ["inspect", "--prompt", "p"],
    ["eval", "--data", "f.txt"],
    ["export", "--format", "hf", "-o", "d"],
    ["describe"],
]
OUTPUT_COMMANDS = [
    ["train"],
    ["describe", "--preset", "gpt2"],
    ["inspect", "-c", "run", "--prompt", "p"],
    ["export", "-c", "run", "--format", "hf"],
    ["sweep"],
    ["data", "prepare", "--stdlib", "--char"],
    ["tokenizer", "train", "--input", "a.txt"],
]
SET_COMMANDS = [["train"], ["describe", "--preset", "gpt2"], ["scaling", "predict", "--law", "l"]]


@pytest.mark.parametrize("argv", CHECKPOINT_COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("flag", ["-c", "--checkpoint"])
def test_checkpoint_flag_is_the_same_everywhere(argv, flag) -> None:
    args = build_parser().parse_args([argv[0], flag, "runs/x", *argv[1:]])
    assert args.checkpoint == "runs/x"


@pytest.mark.parametrize("argv", OUTPUT_COMMANDS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("flag", ["-o", "--output", "--out"])
def test_output_flag_is_the_same_everywhere(argv, flag) -> None:
    args = build_parser().parse_args([*argv, flag, "somewhere"])
    assert str(args.output) == "somewhere"


@pytest.mark.parametrize("argv", SET_COMMANDS, ids=lambda a: a[0])
def test_set_takes_several_values_and_repeats(argv) -> None:
    args = build_parser().parse_args([*argv, "--set", "a=1", "b=2", "--set", "c=3"])
    assert args.overrides == ["a=1", "b=2", "c=3"]


def test_presets_lists_every_preset_with_its_description(capsys) -> None:
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = preset_names()
    assert [line.split()[0] for line in lines] == names
    for line, name in zip(lines, names, strict=True):
        description = preset_dict(name)["description"]
        assert description and line.endswith(description)


@pytest.mark.parametrize("name", preset_names())
def test_describe_takes_every_train_preset(name, capsys) -> None:
    assert main(["describe", "--preset", name]) == 0
    model = preset_dict(name).get("model", {})
    out = capsys.readouterr().out
    if "d_model" in model:
        assert f"d = d_model = {model['d_model']}," in out


def test_describe_takes_a_run_folder_and_a_checkpoint(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    sets = ["train.max_steps=1", "train.progress=false", "train.sample_tokens=0",
            "train.eval_every=1", "train.eval_batches=1", "model.d_model=24", "model.n_heads=3",
            "model.n_layers=1", "model.n_ctx=16", "train.batch_size=2"]  # fmt: skip
    (tmp_path / "t.txt").write_text("abcdefgh\n" * 300, encoding="utf-8")
    argv = ["train", "--preset", "cpu-tiny", "--data", str(tmp_path / "t.txt"), "-o", str(run)]
    assert main([*argv, "--set", *sets]) == 0
    saved = tomllib.loads((run / "config.toml").read_text())
    for where in (run, run / "ckpt" / "step_000001", run / "ckpt" / "best"):
        capsys.readouterr()
        assert main(["describe", "-c", str(where)]) == 0
        out = capsys.readouterr().out
        assert "d = d_model = 24, L = n_layers = 1, H = n_heads = 3" in out
        assert f"n_vocab = {saved['model']['n_vocab']}," in out  # the run's own vocabulary
    capsys.readouterr()
    assert main(["describe", "--config", str(run)]) == 0  # a run folder as --config
    assert "d_model = 24" in capsys.readouterr().out


def test_eta_excludes_warm_up_and_follows_recent_steps(monkeypatch) -> None:
    from glassgpt.train import progress as P

    clock = [0.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    bar = P.Progress(1000, 0, enabled=False, log=lambda m: None)
    for step in range(1, 15):  # 14 slow steps of 2.2 s, as a cold start can give
        clock[0] += 2.2
        bar.step(step)
    for step in range(15, 15 + P.WINDOW + 1):  # then 0.085 s a step
        clock[0] += 0.085
        bar.step(step)
    left = P.eta_seconds(bar.marks, 1000)
    assert left == pytest.approx((1000 - (15 + P.WINDOW)) * 0.085)


def test_eta_ignores_the_first_steps(monkeypatch) -> None:
    from glassgpt.train import progress as P

    clock = [0.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: clock[0])
    bar = P.Progress(100, 10, enabled=False, log=lambda m: None)  # resumed at step 10
    for step, seconds in zip(range(11, 20), [30, 30, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]):
        clock[0] += seconds
        bar.step(step)
    # steps 11 and 12 (compilation, say) are before the first measured one
    assert P.eta_seconds(bar.marks, 100) == pytest.approx((100 - 19) * 0.5)


def test_inspect_writes_into_the_run_folder_with_the_umask(tmp_path, monkeypatch) -> None:
    from glassgpt.inspect.report import write_report

    old = os.umask(0o022)
    try:
        out = write_report(tmp_path / "run" / "report.html", "<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    from glassgpt.inspect.report import default_output

    assert default_output(Path("runs/x")) == Path("runs/x/report.html")
    assert default_output(Path("runs/x/ckpt/best")) == Path("runs/x/report.html")
