"""``log.to``: every number of ``metrics.jsonl`` read back from each tracker by its own reader
(TensorBoard's EventAccumulator, the records of wandb's offline run file, MLflow's client on a
file store, the csv module), the config, the samples and the plots; a missing package is one
line naming the extra."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.train.test_run import TINY as RUN_TINY
from tests.train.test_run import text_file

from glassgpt.cli import main
from glassgpt.train.metrics import read_metrics
from glassgpt.train.trackers import flatten, numbers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = [  # test_run's tiny run, 2 layers (so head scores in layer 1), 6 steps
    *RUN_TINY,
    *("model.n_ctx=16", "model.d_model=16", "model.n_layers=2"),
    *("train.max_steps=6", "train.eval_every=3", "train.checkpoint_every=6"),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One 6-step run logged to all four trackers (wandb offline, MLflow's default store)."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("trackers")
    out = root / "runs" / "tiny"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("WANDB_PROJECT", raising=False)
        sets = [*TINY, "log.to=csv,tensorboard,wandb,mlflow", "log.group=sweep-a"]
        code = main(["train", "--data", str(text_file(root)), "-o", str(out), "--set", *sets])
        assert code == 0
        yield out


def expected(out: Path) -> dict[int, dict[str, float]]:
    """{step: {name: value}}: the numbers metrics.jsonl holds (head scores included)."""
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert "induction/L1H0" in records[2] and "val_loss" in records[2]  # probed at evaluations
    return {r["step"]: numbers(r) for r in records}


def test_tensorboard_event_accumulator_reads_every_scalar(run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    want = expected(run)
    tags = acc.Tags()
    assert set(tags["scalars"]) == {k for rec in want.values() for k in rec}
    for tag in tags["scalars"]:
        got = {e.step: e.value for e in acc.Scalars(tag)}
        steps = {s: rec[tag] for s, rec in want.items() if tag in rec}
        assert set(got) == set(steps), tag
        for s, value in steps.items():  # TensorBoard keeps scalars as float32
            assert got[s] == float(np.float32(value)), (tag, s)
    texts = set(tags["tensors"])  # text summaries are tensors of strings
    assert any("config" in t for t in texts) and any("sample" in t for t in texts)
    assert {"plots/loss", "plots/circuits"} <= set(tags["images"])


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a wandb run file: a 7-byte header, then LevelDB-style blocks of
    32 KiB holding chunks (CRC 4 bytes, length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


def test_wandb_offline_run_folder_holds_every_metric(run: Path) -> None:
    (path,) = run.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(path)
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert start.project == "glassgpt" and start.run_group == "sweep-a"
    assert start.display_name == "tiny"
    config = {u.key: json.loads(u.value_json) for u in start.config.update}
    saved = tomllib.loads((run / "config.toml").read_text())
    assert config["model"]["n_layers"] == saved["model"]["n_layers"] == 2
    assert config["log"]["to"] == ["csv", "tensorboard", "wandb", "mlflow"]
    rows: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row: dict[str, Any] = {}
            for i in r.history.item:  # a media file is nested: ("plots/loss", "_type"), …
                key, *inner = list(i.nested_key) or [i.key]
                if inner:
                    row.setdefault(key, {})[inner[0]] = json.loads(i.value_json)
                else:
                    row[key] = json.loads(i.value_json)
            rows.setdefault(int(row["_step"]), {}).update(row)
    for step, want in expected(run).items():
        got = rows[step]
        for key, value in want.items():
            assert got[key] == value, (key, step)
    samples = [r["sample"] for r in read_metrics(run / "metrics.jsonl") if "sample" in r]
    assert [rows[s]["sample"] for s in (3, 6)] == samples
    assert rows[6]["plots/loss"]["_type"] == "image-file"  # loss.png, at the last step
    assert rows[6]["plots/circuits"]["_type"] == "image-file"


def test_mlflow_file_store_holds_every_metric_the_config_and_files(run: Path) -> None:
    from mlflow.tracking import MlflowClient

    state = json.loads((run / "trackers.json").read_text())["mlflow"]
    store = run.parent / "mlruns"
    assert state["uri"] == store.as_uri() and store.is_dir()
    client = MlflowClient(tracking_uri=store.as_uri())
    mlrun = client.get_run(state["run_id"])
    experiment = client.get_experiment(mlrun.info.experiment_id)
    assert experiment.name == "sweep-a" and mlrun.info.run_name == "tiny"
    assert mlrun.info.status == "FINISHED"
    want = expected(run)
    keys = {k for rec in want.values() for k in rec}
    assert set(mlrun.data.metrics) == keys
    for key in keys:
        got = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, key)}
        assert got == {s: rec[key] for s, rec in want.items() if key in rec}, key
    saved = tomllib.loads((run / "config.toml").read_text())
    params = mlrun.data.params
    for key, value in flatten(saved).items():
        shown = json.dumps(value) if isinstance(value, list) else str(value)
        assert params[key] == shown, key
    files = {f.path for f in client.list_artifacts(mlrun.info.run_id)}
    assert {"config.toml", "loss.png", "circuits.png", "samples"} <= files
    texts = {f.path for f in client.list_artifacts(mlrun.info.run_id, "samples")}
    assert texts == {"samples/step_000003.txt", "samples/step_000006.txt"}


def test_csv_has_every_record(run: Path) -> None:
    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    records = read_metrics(run / "metrics.jsonl")
    assert len(rows) == len(records)
    for row, record in zip(rows, records, strict=True):
        for key, value in record.items():
            if isinstance(value, str):
                assert row[key] == value
            elif value is not None:
                assert math.isclose(float(row[key]), value, rel_tol=0, abs_tol=0), key
        assert all(row[k] == "" for k in row if k not in record)


def test_a_missing_package_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    out = tmp_path / "run"
    sets = [*TINY, "log.to=csv,wandb"]
    assert main(["train", "--data", str(text_file(tmp_path)), "-o", str(out), "--set", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "glassgpt: error: log.to: wandb needs the wandb package: pip install 'glassgpt[trackers]'"
    ]
    assert not (out / "metrics.jsonl").exists()  # before any work


def test_an_unknown_tracker_names_the_known_ones() -> None:
    from glassgpt.errors import ConfigError
    from glassgpt.train.config import load_run_config

    with pytest.raises(ConfigError, match=r"log.to: unknown tracker 'neptune'; known: csv, "):
        load_run_config(preset="cpu-tiny", overrides=["log.to=csv,neptune"])
    assert load_run_config(preset="cpu-tiny", overrides=["log.to=csv,mlflow"]).log.to == (
        "csv",
        "mlflow",
    )


def test_tensorboard_says_once_where_its_logs_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboard")
    from glassgpt.train.trackers import RunInfo, Trackers

    out = tmp_path / "my runs" / "tiny"
    out.mkdir(parents=True)  # (the trainer makes the run folder first)
    info = RunInfo(out, "tiny", "glassgpt", None, {}, "[train]\n")
    trackers = Trackers(["csv", "tensorboard"], info)
    trackers.log({"step": 1, "loss": 2.0})
    trackers.log({"step": 2, "loss": 1.5})
    trackers.close()
    folder = out / "tensorboard"
    assert capsys.readouterr().err == (
        f"glassgpt: note: TensorBoard logs go to {folder}; see them with: "
        f"tensorboard --logdir '{folder}'\n"
    )
    assert any(p.name.startswith("events.out.tfevents") for p in folder.iterdir())
