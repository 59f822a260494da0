from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassgpt.cli import main
from glassgpt.errors import ConfigError
from glassgpt.scaling.grid import Grid
from glassgpt.scaling.sweep import load_results, run_sweep

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))


def tiny_grid(tmp_path: Path, extra: str = "") -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f"""
preset = "cpu-tiny"
data = ["corpus.txt"]
seeds = [0]
[set]
"model.n_ctx" = 16
"model.n_layers" = 1
"train.batch_size" = 4
"train.max_steps" = 6
"train.warmup_steps" = 2
"train.eval_every" = 3
"train.eval_batches" = 2
"train.checkpoint_every" = 3
"train.sample_tokens" = 0
{extra}
[grid]
size = [{{ "model.d_model" = 8, "model.n_heads" = 2 }}, {{ "model.d_model" = 16, "model.n_heads" = 2 }}]
""",
        encoding="utf-8",
    )
    return grid


@pytest.mark.slow
def test_sweep_end_to_end_and_resume(tmp_path: Path) -> None:
    grid_path = tiny_grid(tmp_path)
    out = tmp_path / "sweep"
    results = run_sweep(Grid.load(grid_path), out, progress=False, log=lambda s: None)
    assert len(results) == 2
    small, large = sorted(results, key=lambda r: r["n_params"])
    assert small["n_params"] < large["n_params"]
    for r in results:
        assert r["tokens"] == 6 * 4 * 16  # steps × batch × context
        assert r["flops"] == pytest.approx(6 * r["n_params"] * r["tokens"])
        assert r["val_loss"] >= r["best_val_loss"] > 0
    assert (out / "results.md").read_text().count("\n") == 4

    # Interrupt: one run loses its result (as if killed after its last checkpoint).
    finished = out / "runs" / small["name"] / "result.json"
    kept = out / "runs" / large["name"] / "result.json"
    kept_before = kept.read_text()
    finished.unlink()
    messages: list[str] = []
    again = run_sweep(Grid.load(grid_path), out, progress=False, log=messages.append)
    assert messages == ["sweep: 1 of 2 runs already finished, skipped"]
    assert kept.read_text() == kept_before  # the finished run was not rerun
    assert json.loads(finished.read_text())["val_loss"] == pytest.approx(small["val_loss"])
    assert len(again) == 2

    # fit needs 5 runs: a one-line error from the CLI.
    assert main(["scaling", "fit", str(out), "--bootstrap", "0"]) == 2


def test_unknown_field_in_grid_is_refused_before_running(tmp_path: Path) -> None:
    grid = Grid.load(tiny_grid(tmp_path, extra='"train.no_such_key" = 1'))
    with pytest.raises(ConfigError) as e:
        run_sweep(grid, tmp_path / "out", progress=False)
    assert e.value.field == "train.no_such_key"
    assert not (tmp_path / "out").exists()


def test_fit_errors_on_a_folder_without_results(tmp_path: Path, capsys) -> None:
    (tmp_path / "runs").mkdir()
    assert main(["scaling", "fit", str(tmp_path)]) == 2
    assert "no finished runs" in capsys.readouterr().err
    with pytest.raises(Exception, match="not found"):
        load_results(tmp_path / "missing")


@pytest.mark.slow
def test_runs_with_one_data_config_share_one_prepared_folder(tmp_path: Path) -> None:
    grid_path = tiny_grid(tmp_path)
    text = grid_path.read_text().replace("seeds = [0]", "seeds = [0, 1]")
    grid_path.write_text(text.replace(', { "model.d_model" = 16, "model.n_heads" = 2 }', ""))
    grid = Grid.load(grid_path)
    assert len(list(grid.runs())) == 2
    out = tmp_path / "sweep"
    messages: list[str] = []
    results = run_sweep(grid, out, progress=False, log=messages.append)
    assert len(results) == 2 and all(r["val_loss"] > 0 for r in results)
    (folder,) = (out / "data").iterdir()  # prepared once, for both seeds
    assert (folder / "meta.json").is_file()
    assert sum("preparing data" in m for m in messages) == 1
    for r in results:
        assert r["config"]["data"]["paths"] == [str(folder)]
        assert not (out / "runs" / r["name"] / "data").exists()  # no private copy


def test_shared_data_folders_follow_the_data_config(tmp_path: Path) -> None:
    from glassgpt.scaling.sweep import prepare_shared
    from glassgpt.train.config import DataConfig

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "sweep"
    a = prepare_shared(out, DataConfig(paths=(str(corpus),), tokenizer="bpe", vocab_size=260))
    b = prepare_shared(out, DataConfig(paths=(str(corpus),), tokenizer="bpe", vocab_size=270))
    c = prepare_shared(out, DataConfig(paths=(str(corpus),), tokenizer="char"))
    assert a is not None and b is not None and c is not None
    assert len({a, b, c}) == 3 and sorted(out.joinpath("data").iterdir()) == sorted([a, b, c])
    assert json.loads((b / "meta.json").read_text())["n_vocab"] == 270
    stamp = (a / "meta.json").stat().st_mtime_ns
    logs: list[str] = []
    again = DataConfig(paths=(str(corpus),), tokenizer="bpe", vocab_size=260)
    assert prepare_shared(out, again, logs.append) == a  # kept, not prepared again
    assert logs == [] and (a / "meta.json").stat().st_mtime_ns == stamp
    assert prepare_shared(out, DataConfig(paths=(str(a),))) is None  # already prepared
