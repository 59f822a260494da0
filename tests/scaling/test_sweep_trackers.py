"""A sweep logs one tracker run per grid point, grouped under the sweep's name: one MLflow
experiment named after the sweep folder (MLflow's client reads it back), one TensorBoard
folder per run under ``runs/``, and ``log.group`` in every run's table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from glassgpt.scaling.grid import Grid
from glassgpt.scaling.sweep import CONFIGS, run_sweep

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))


@pytest.mark.slow
def test_a_sweep_logs_one_run_per_point_grouped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: its file store, on request
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        """
preset = "cpu-tiny"
data = ["corpus.txt"]
[set]
"model.n_ctx" = 16
"model.n_layers" = 1
"train.batch_size" = 4
"train.max_steps" = 2
"train.warmup_steps" = 2
"train.eval_every" = 1
"train.eval_batches" = 2
"train.sample_tokens" = 0
"log.to" = ["mlflow"]
[grid]
"model.d_model" = [8, 16]
""",
        encoding="utf-8",
    )
    out = tmp_path / "sweep-a"
    results = run_sweep(Grid.load(grid), out, progress=False, log=lambda s: None)
    names = sorted(r["name"] for r in results)
    assert len(names) == 2
    for name in names:
        table = tomllib.loads((out / CONFIGS / f"{name}.toml").read_text())
        assert table["log"]["group"] == "sweep-a"
    client = MlflowClient(tracking_uri=(out / "runs" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("sweep-a")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == names
    for r in runs:  # each point's own curve: its val losses at steps 1 and 2
        history = client.get_metric_history(r.info.run_id, "val_loss")
        assert sorted(m.step for m in history) == [1, 2]
        assert r.data.tags["glassgpt.group"] == "sweep-a"
