from __future__ import annotations

from pathlib import Path

import pytest

from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.scaling.grid import Grid, study_names
from glassgpt.scaling.sweep import validate
from glassgpt.train.config import build_run_config, raw_run_config
from glassgpt.train.inputs import EOT


def configs(name: str):
    grid = Grid.resolve(name)
    return grid, [
        build_run_config(raw_run_config(preset=grid.preset, overrides=r.set_args))
        for r in validate(grid)
    ]


@pytest.mark.parametrize("name", ["vocab", "vocab-bytes", "tying", "d-head", "scaling-cpu"])
def test_builtin_studies_load_and_every_run_is_a_valid_config(name: str) -> None:
    assert name in study_names()
    grid, cfgs = configs(name)
    assert grid.description and grid.parallel == 2
    assert not grid.data  # the embedded corpus: no download needed
    names = [r.name for r in grid.runs()]
    assert len(set(names)) == len(names)
    if name != "scaling-cpu":
        assert grid.seeds == (0, 1, 2)
        # the same model size and bytes for every point: only the studied axis moves
        assert len({(c.model.d_model, c.data.max_bytes) for c in cfgs}) == 1
        steps = {(c.data.vocab_size, c.train.max_steps) for c in cfgs}
        if name == "vocab-bytes":  # fewer steps of longer tokens as the vocabulary grows
            assert [s for _, s in sorted(steps)] == sorted((s for _, s in steps), reverse=True)
            assert len(steps) == 6
        else:
            assert len({s for _, s in steps}) == 1
    for c in cfgs:
        assert c.train.sample_tokens == 0
        assert c.train.eval_batches and c.train.eval_batches >= 20


def test_vocab_study_spans_the_smallest_bpe_vocabulary_to_8192() -> None:
    from glassgpt.tokenizer import Tokenizer

    _, cfgs = configs("vocab")
    sizes = sorted({c.data.vocab_size for c in cfgs})
    assert sizes[-1] == 8192 and len(sizes) == 6
    assert {c.data.tokenizer for c in cfgs} == {"bpe"}
    assert Tokenizer.train(["abcab"], sizes[0], special_tokens=[EOT]).n_vocab == sizes[0]
    with pytest.raises(GlassError):  # one less is refused: sizes[0] is the smallest
        Tokenizer.train(["abcab"], sizes[0] - 1, special_tokens=[EOT])


def test_d_head_study_keeps_n_heads_times_d_head_equal_to_d_model() -> None:
    _, cfgs = configs("d-head")
    assert sorted(c.model.d_head for c in cfgs[::3]) == [8, 16, 32, 64, 128]
    for c in cfgs:
        assert c.model.n_heads * c.model.d_head == c.model.d_model == 128


def test_tying_study_compares_tied_and_untied() -> None:
    _, cfgs = configs("tying")
    assert sorted({c.model.tie_embeddings for c in cfgs}) == [False, True]


def test_scaling_cpu_study_has_sizes_times_budgets() -> None:
    from glassgpt.model.accounting import count_parameters

    _, cfgs = configs("scaling-cpu")
    sizes = {count_parameters(c.model, non_embedding=True) for c in cfgs}
    steps = {c.train.max_steps for c in cfgs}
    assert len(cfgs) == len(sizes) * len(steps) and len(sizes) >= 4 and len(steps) >= 3


def test_unknown_study_name_is_a_one_line_error_listing_the_studies(capsys, tmp_path) -> None:
    assert main(["sweep", "--grid", "no-such-study", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no-such-study" in err and "vocab" in err and err.count("\n") == 1
    assert main(["sweep", "--grid", str(tmp_path / "missing.toml"), "--output", "o"]) == 2
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_sweep_list_names_every_study(capsys) -> None:
    assert main(["sweep", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in study_names())


def test_a_grid_file_wins_over_a_study_of_the_same_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("vocab").write_text('seeds = [5]\n[grid]\n"train.lr" = [0.1]\n', encoding="utf-8")
    assert Grid.resolve("vocab").seeds == (5,)


def test_with_data_points_every_run_at_other_data(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("hello\n", encoding="utf-8")
    grid = Grid.resolve("tying").with_data(["corpus.txt"])
    assert grid.data == (str(tmp_path / "corpus.txt"),)
    _, run = configs_of(grid)[0]
    assert run.config.data.paths == (str(tmp_path / "corpus.txt"),)


def configs_of(grid: Grid):
    from glassgpt.scaling.sweep import run_configs

    return run_configs(grid)
