"""Experiment trackers: each record of ``metrics.jsonl`` sent on to csv, TensorBoard, wandb, MLflow.

``log.to = ["csv", "tensorboard", "wandb", "mlflow"]`` (any of them; ``--set log.to=csv,wandb``).
``metrics.jsonl`` stays the record; a tracker gets, for run r:

    config     r's resolved config (the TOML the run saved), once at the start
    log(rec)   every number of each metrics.jsonl line at step rec["step"]; ``sample`` as text
    image      ``loss.png`` and ``circuits.png`` at the end

Where each writes:

    csv          OUT/metrics.csv (one column per key; a new key rewrites the header)
    tensorboard  OUT/tensorboard/ (``tensorboard --logdir`` a sweep's folder groups its runs)
    wandb        OUT/wandb/, project ``log.project``, group ``log.group``; online or offline as
                 wandb itself is set (``WANDB_MODE``, ``wandb login``)
    mlflow       $MLFLOW_TRACKING_URI, else a file store beside the run folder (OUT/../mlruns,
                 shared by every run there; MLflow 3 opens it only with
                 MLFLOW_ALLOW_FILE_STORE=true, which the tracker sets for itself);
                 experiment ``log.group`` or else ``log.project``

A resumed run continues its wandb and MLflow runs (their ids are kept in OUT/trackers.json).
Each backend's package is imported only when asked for; a missing one is a one-line error that
names the extra, ``pip install 'glassgpt[trackers]'``.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.image import imread

from glassgpt.console import say
from glassgpt.errors import ConfigError, GlassError
from glassgpt.storage import atomic_write
from glassgpt.train.config import _flatten as flatten  # {"train": {"lr": 1}} → {"train.lr": 1}
from glassgpt.train.metrics import read_metrics

PACKAGES = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
STATE = "trackers.json"  # the wandb and MLflow run ids, for a resumed run


def require(names: Sequence[str]) -> None:
    """Raise a one-line ConfigError for the first tracker whose package is not installed.

    >>> require(["csv"])
    """
    for name in names:
        package = PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                "log.to",
                f"{name} needs the {package} package: pip install 'glassgpt[trackers]'",
            )


@dataclass
class RunInfo:
    """What every tracker is told about the run."""

    out_dir: Path
    name: str
    project: str
    group: str | None
    config: dict[str, Any]  # the resolved config, nested
    config_toml: str
    state: dict[str, Any] = field(default_factory=dict)  # OUT/trackers.json, shared


def numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record, without its step.

    >>> numbers({"step": 3, "loss": 2.5, "val_loss": None, "sample": "hi", "ok": True})
    {'loss': 2.5}
    """
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step"
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


def texts(record: Mapping[str, Any]) -> dict[str, str]:
    """The strings of a metrics record (the eval-time ``sample``)."""
    return {k: v for k, v in record.items() if isinstance(v, str)}


class Tracker:
    """One backend: ``log`` each record, ``image`` a PNG, ``close``."""

    def log(self, record: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def image(self, name: str, path: Path, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class CsvTracker(Tracker):
    """OUT/metrics.csv: a row per record, a column per key seen so far (rows before a key's
    first appearance leave it empty). A resumed run starts from the records metrics.jsonl
    keeps."""

    def __init__(self, run: RunInfo) -> None:
        self.path = run.out_dir / "metrics.csv"
        jsonl = run.out_dir / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = read_metrics(jsonl) if jsonl.exists() else []
        self.columns: list[str] = []
        for row in self.rows:
            self._add_columns(row)
        self._rewrite()

    def _add_columns(self, record: Mapping[str, Any]) -> bool:
        new = [k for k in record if k not in self.columns]
        self.columns += new
        return bool(new)

    def _rewrite(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write(self.path, buf.getvalue().encode())

    def log(self, record: Mapping[str, Any]) -> None:
        row = {k: v for k, v in record.items() if v is not None}
        self.rows.append(row)
        if self._add_columns(row):
            self._rewrite()
            return
        buf = io.StringIO()
        csv.DictWriter(buf, self.columns, lineterminator="\n").writerow(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(buf.getvalue())


class TensorBoardTracker(Tracker):
    """OUT/tensorboard/: scalars by their metrics.jsonl names, the config and samples as text,
    the plots as images."""

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run.out_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", _code_block(run.config_toml), 0)
        say(f"TensorBoard logs go to {folder}; see them with: tensorboard --logdir {_q(folder)}")

    def log(self, record: Mapping[str, Any]) -> None:
        step = int(record["step"])
        for key, value in numbers(record).items():
            self.writer.add_scalar(key, value, step)
        for key, text in texts(record).items():
            self.writer.add_text(key, _code_block(text), step)
        self.writer.flush()

    def image(self, name: str, path: Path, step: int) -> None:
        self.writer.add_image(name, imread(path)[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A wandb run in OUT/wandb/ (online or offline as wandb is set: ``WANDB_MODE``)."""

    def __init__(self, run: RunInfo) -> None:
        import wandb

        self.wandb = wandb
        previous = run.state.get("wandb")
        self.run = wandb.init(
            project=run.project,
            group=run.group,
            name=run.name,
            dir=str(run.out_dir),
            config=run.config,
            id=previous,
            resume="allow" if previous else None,
            reinit="create_new",
        )
        run.state["wandb"] = self.run.id

    def log(self, record: Mapping[str, Any]) -> None:
        self.run.log({**numbers(record), **texts(record)}, step=int(record["step"]))

    def image(self, name: str, path: Path, step: int) -> None:
        self.run.log({name: self.wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    """An MLflow run: the config as parameters and ``config.toml``, metrics by name and step,
    samples as ``samples/step_NNNNNN.txt`` and the plots as artifacts."""

    def __init__(self, run: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # MLflow 3 keeps its file store, "in maintenance", behind this switch
            uri = (run.out_dir.resolve().parent / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        previous = run.state.get("mlflow")
        if previous and previous.get("uri") == uri:
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = run.group or run.project
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        tags = {"glassgpt.group": run.group} if run.group else {}
        self.run_id = self.client.create_run(
            experiment_id, run_name=run.name, tags=tags
        ).info.run_id
        run.state["mlflow"] = {"uri": uri, "run_id": self.run_id}
        from mlflow.entities import Param

        params = [Param(k, json.dumps(v) if isinstance(v, list) else str(v))
                  for k, v in flatten(run.config).items() if v is not None]  # fmt: skip
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, run.config_toml, "config.toml")

    def log(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["step"]), int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in numbers(record).items()]
        for i in range(0, len(metrics), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for key, text in texts(record).items():
            self.client.log_text(self.run_id, text, f"{key}s/step_{step:06d}.txt")

    def image(self, name: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type[Tracker]] = {
    "csv": CsvTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


class Trackers(Tracker):
    """The trackers of ``log.to``, each told everything, as one."""

    def __init__(self, names: Sequence[str], run: RunInfo) -> None:
        require(names)
        self.run = run
        state_path = run.out_dir / STATE
        if state_path.exists():
            run.state.update(json.loads(state_path.read_text("utf-8")))
        self.trackers: list[Tracker] = []
        for name in names:
            try:
                self.trackers.append(BACKENDS[name](run))
            except Exception as e:  # the backend's own error, in one line
                self.close()
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise GlassError(f"log.to={name}: cannot start the {name} run: {first}") from None
        if run.state:
            atomic_write(state_path, json.dumps(run.state, indent=1).encode())

    def log(self, record: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log(record)

    def image(self, name: str, path: Path, step: int) -> None:
        if path.is_file():
            for t in self.trackers:
                t.image(name, path, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def _q(path: Path) -> str:
    """``path`` as a shell word (quoted only when it must be).

    >>> _q(Path("runs/a")), _q(Path("my runs/a"))
    ('runs/a', "'my runs/a'")
    """
    return shlex.quote(str(path))


def _code_block(text: str) -> str:
    """Markdown that shows ``text`` as it is (TensorBoard renders its text as Markdown)."""
    return "\n".join("    " + line for line in text.splitlines())
