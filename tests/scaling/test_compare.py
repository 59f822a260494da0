from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.scaling.compare import compare_results
from glassgpt.scaling.sweep import write_table

RNG = np.random.default_rng(0)
VOCABS = [257, 1024, 8192]
SEEDS = [0, 1, 2, 3]


def synthetic_sweep(root: Path) -> dict[int, np.ndarray]:
    """A sweep folder whose runs/*/result.json vary data.vocab_size × seed (random metrics)."""
    metrics = {v: RNG.normal(2.0, 0.1, len(SEEDS)) for v in VOCABS}
    results = []
    for v in VOCABS:
        for i, seed in enumerate(SEEDS):
            name = f"data.vocab_size={v},seed={seed}"
            r = {
                "name": name,
                "val_bpb": float(metrics[v][i]),
                "val_loss": float(metrics[v][i]) * 3,
                "best_val_loss": float(metrics[v][i]) * 3 - 0.01,
                "n_params": 1000 + v,
                "tokens": 4096,
                "wall_s": 10.0 + i,
                "overrides": {"train.lr": 0.005, "data.vocab_size": v, "seed": seed},
            }
            (root / "runs" / name).mkdir(parents=True)
            (root / "runs" / name / "result.json").write_text(json.dumps(r), "utf-8")
            results.append(r)
    write_table(results, root)
    return metrics


def test_mean_and_standard_error_match_numpy(tmp_path: Path, capsys) -> None:
    metrics = synthetic_sweep(tmp_path)
    assert main(["scaling", "compare", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "comparison.md").read_text("utf-8")
    assert table in out and (tmp_path / "comparison.png").stat().st_size > 1000
    rows = [line for line in table.splitlines() if line.startswith("| data.vocab_size=")]
    assert [r.split(" | ")[0] for r in rows] == [f"| data.vocab_size={v}" for v in VOCABS]
    for row, v in zip(rows, VOCABS):
        cells = [c.strip() for c in row.strip("|").split("|")]
        want = metrics[v]
        assert int(cells[1]) == len(SEEDS)
        assert float(cells[2]) == pytest.approx(want.mean(), abs=1e-4)
        assert float(cells[3]) == pytest.approx(want.std(ddof=1) / np.sqrt(len(want)), abs=1e-4)
        assert cells[4] == f"{1000 + v:,}" and cells[6] == "12"  # mean of 10, 11, 12, 13 = 11.5


def test_compare_by_one_key_and_other_metrics(tmp_path: Path) -> None:
    metrics = synthetic_sweep(tmp_path)
    from glassgpt.scaling.sweep import load_results

    results = load_results(tmp_path)
    c = compare_results(results, metric="val_loss", by="data.vocab_size")
    assert c.keys == ("data.vocab_size",)
    for p, v in zip(c.points, VOCABS):
        assert p.mean == pytest.approx(3 * metrics[v].mean())
        assert p.se == pytest.approx(3 * metrics[v].std(ddof=1) / 2)
    # a key that is the same in every run pools everything into one point
    (pooled,) = compare_results(results, by="train.lr").points
    assert pooled.n == 12
    assert pooled.mean == pytest.approx(np.mean(list(metrics.values())))


def test_single_seed_has_no_standard_error() -> None:
    (p,) = compare_results([{"overrides": {"seed": 0}, "val_bpb": 1.5}]).points
    assert p.n == 1 and p.mean == 1.5 and np.isnan(p.se)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metric", "accuracy"], "unknown metric 'accuracy'"),
        (["--by", "model.nope"], "unknown key 'model.nope'"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path: Path, capsys, args, message) -> None:
    synthetic_sweep(tmp_path)
    assert main(["scaling", "compare", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_no_results_and_missing_overrides_are_errors(tmp_path: Path, capsys) -> None:
    (tmp_path / "runs").mkdir()
    assert main(["scaling", "compare", str(tmp_path)]) == 2
    assert "no finished runs" in capsys.readouterr().err
    with pytest.raises(GlassError, match="records no grid overrides"):
        compare_results([{"name": "x", "val_bpb": 1.0}])
    with pytest.raises(GlassError, match="no val_bpb"):
        compare_results([{"name": "x", "val_bpb": None, "overrides": {}}])
