"""Sweeps: train every run of a grid, one ``glassgpt train`` process per run, and tabulate.

Each run trains in ``OUT/runs/<name>/`` as its own process (so one failure or crash cannot
take the sweep down, and runs can go in parallel), then its result is written to
``result.json`` there; a run with a ``result.json`` is finished and is skipped when the sweep
is started again, and a run with a checkpoint but no result is resumed from it; a failed run
leaves ``failed.json`` (its exit code and its log's last lines) and the others go on. Where
the runs train is the executor's business (scaling/executors.py: local, Slurm, Ray); each
runs :func:`train_point`, which reads and writes only the sweep folder. The table
``OUT/results.jsonl`` (and ``results.md``) has, per run: final and best validation loss, bits
per byte, N (total and non-embedding), D (training tokens), FLOPs ≈ 6 N D, wall time and the
run's grid overrides.

Runs with the same data config (paths, tokenizer, vocab_size, val_fraction, max_bytes) share
one prepared data folder, ``OUT/data/<hash>/`` (hash = sha256 of that config), prepared once
before the runs start (a folder already there is kept) and given to each run as its data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from glassgpt.checkpoint import open_run, step_folders
from glassgpt.config import merge
from glassgpt.errors import GlassError, InputFileError
from glassgpt.model import GPTConfig
from glassgpt.model.accounting import count_parameters
from glassgpt.scaling.compute import training_flops
from glassgpt.scaling.executors import make_executor, write_failure
from glassgpt.scaling.grid import Grid, RunSpec
from glassgpt.scaling.status import BUSY, FAILED, TAIL, lock_holder
from glassgpt.storage import atomic_write
from glassgpt.train.config import dump_toml
from glassgpt.train.inputs import is_prepared, resolve_data
from glassgpt.train.metrics import read_metrics
from glassgpt.train.resolve import resolve_run

RESULT = "result.json"
COLUMNS = (
    "name",
    "val_loss",
    "best_val_loss",
    "val_bpb",
    "n_params",
    "n_params_non_embedding",
    "tokens",
    "flops",
    "wall_s",
)


DATA = "data"
CONFIGS = "configs"  # OUT/configs/<run>.toml: the table each run trains with
POINTS = "points.json"  # OUT/points.json: every point's name and overrides, in grid order


def run_configs(grid: Grid) -> list[tuple[RunSpec, Any]]:
    """Every run of the grid with its ``ResolvedRun`` (raw table and validated RunConfig),
    each checked before anything starts."""
    return [
        (
            run,
            resolve_run(
                preset=grid.preset,
                config_file=grid.config,
                data_paths=list(grid.data) or None,
                overrides=run.set_args,
            ),
        )
        for run in grid.runs()
    ]


def validate(grid: Grid) -> list[RunSpec]:
    """Every run of the grid, each checked as a full training config before anything starts."""
    return [run for run, _ in run_configs(grid)]


def data_key(data: Any) -> dict[str, Any] | None:
    """What makes two runs' prepared data the same (None: the run reads a prepared folder)."""
    if len(data.paths) == 1 and is_prepared(data.paths[0]):
        return None
    tokenizer = data.tokenizer
    if tokenizer not in ("char", "bpe"):
        tokenizer = str(Path(tokenizer).resolve())
    return {
        "paths": [str(Path(p).resolve()) for p in data.paths],
        "tokenizer": tokenizer,
        "vocab_size": data.vocab_size if tokenizer == "bpe" else None,
        "val_fraction": data.val_fraction,
        "max_bytes": data.max_bytes,
    }


def data_folder(out: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return out / DATA / digest


def prepare_shared(out: Path, data: Any, log: Callable[[str], None] = print) -> Path | None:
    """The shared prepared folder for a run's data config, prepared here if not there yet
    (by the trainer's own preparation, in a staging folder renamed when complete)."""
    key = data_key(data)
    if key is None:
        return None
    folder = data_folder(out, key)
    if is_prepared(folder):
        return folder
    what = data.tokenizer + (f" {data.vocab_size}" if data.tokenizer == "bpe" else "")
    log(f"sweep: preparing data once for every run with tokenizer {what} in {folder}")
    staging = folder.with_name(folder.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)  # an interrupted preparation
    prepared = resolve_data(data, staging).data.path
    (prepared / "sweep-data.json").write_text(json.dumps(key, indent=1), "utf-8")
    os.replace(prepared, folder)
    shutil.rmtree(staging)
    return folder


def run_table(
    resolved: Any, threads: int, data: Path | None = None, group: str | None = None
) -> dict[str, Any]:
    """The config table one run trains with: its resolved table, with the sweep's threads, no
    progress bar, ``data`` (a shared prepared folder) in place of its data paths (its
    other data keys stay, as a record of what the folder holds), and ``group`` (the sweep's
    name) as its trackers' ``log.group`` unless the grid sets one."""
    extra: dict[str, Any] = {"train": {"threads": threads, "progress": False}}
    if data is not None:
        extra["data"] = {"paths": [str(data)]}
    if group is not None and resolved.config.log.group is None:
        extra["log"] = {"group": group}
    return merge(resolved.raw, extra)


def resumable(run_dir: Path) -> bool:
    """Whether a run folder holds a complete checkpoint to resume from (a ``ckpt`` folder
    alone is not one: a run killed while writing its first checkpoint leaves only a
    temporary folder there)."""
    return bool(step_folders(run_dir / "ckpt"))


def train_command(run_dir: Path, config_file: Path | None) -> list[str]:
    """The ``glassgpt train`` command line for one run: its config file, or a resume if it
    has a checkpoint."""
    cmd = [sys.executable, "-m", "glassgpt", "train"]
    if resumable(run_dir) or config_file is None:
        return [*cmd, "--resume", str(run_dir)]
    return [*cmd, "--config", str(config_file), "--output", str(run_dir)]


def collect(run_dir: Path, wall_s: float | None = None) -> dict[str, Any]:
    """The result of a finished run, from its config (its newest checkpoint's) and
    ``metrics.jsonl``."""
    config = open_run(run_dir, which="latest", weights=False).config
    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in records if r.get("val_loss") is not None]
    if not evals:
        raise InputFileError(f"{run_dir}: the run has no evaluation in metrics.jsonl")
    model = GPTConfig.from_dict(config["model"], prefix="model.")
    n_total = count_parameters(model)
    n_non_emb = count_parameters(model, non_embedding=True)
    tokens = int(max(r.get("tokens", 0) for r in records))
    last = evals[-1]
    return {
        "name": run_dir.name,
        "val_loss": float(last["val_loss"]),
        "best_val_loss": float(min(r["val_loss"] for r in evals)),
        "val_bpb": last.get("val_bpb"),
        "step": int(last["step"]),
        "n_params": n_total,
        "n_params_non_embedding": n_non_emb,
        "tokens": tokens,
        "flops": training_flops(n_total, tokens),
        "wall_s": wall_s if wall_s is not None else records[-1].get("elapsed_s"),
        "config": config,
    }


def train_point(out: str | Path, name: str, overrides: dict[str, Any]) -> str | None:
    """Train one grid point, ``OUT/runs/<name>/``, from ``OUT/configs/<name>.toml`` (or resume
    it from its checkpoint); write its ``result.json``, or ``failed.json`` with its exit code
    and its log's last lines. None when finished, else the failure in one line.

    The unit of work of every executor (glassgpt.scaling.executors): it reads and writes only
    the sweep folder, so a point is skipped, resumed or restarted the same way wherever it
    runs. A point another live trainer holds (its ``.lock``) is left to it.
    """
    out = Path(out)
    run_dir = out / "runs" / name
    if (run_dir / RESULT).is_file():
        return None  # finished since it was submitted (by another submission of the sweep)
    holder = lock_holder(run_dir, probe=True)
    if holder is not None:
        return f"{name}: {BUSY} ({holder}); left to it"
    if run_dir.exists() and not resumable(run_dir):
        shutil.rmtree(run_dir)  # killed before its first checkpoint: start it again
    (run_dir / FAILED).unlink(missing_ok=True)
    start = time.perf_counter()
    cmd = train_command(run_dir, out / CONFIGS / f"{name}.toml")
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = proc.stdout + proc.stderr
    atomic_write(run_dir / "sweep.log", log.encode())
    if proc.returncode != 0:
        tail = log.strip().splitlines()[-TAIL:] or ["(no output)"]
        record = {"exit": proc.returncode, "tail": tail}
        atomic_write(run_dir / FAILED, json.dumps(record, indent=1).encode())
        return f"{name}: exit {proc.returncode}: {tail[-1]}"
    result = collect(run_dir, wall_s=time.perf_counter() - start)
    result["overrides"] = overrides
    atomic_write(run_dir / RESULT, json.dumps(result, indent=1).encode())
    return None


def run_sweep(
    grid: Grid,
    out: str | Path,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
    executor: Any = None,
) -> list[dict[str, Any]]:
    """Train every unfinished run of ``grid`` in ``out``; return all results (finished ones too).

    ``executor`` (glassgpt.scaling.executors) says where the points train; None: the grid's
    ``[executor]`` table, by default processes on this machine."""
    out = Path(out).resolve()
    configs = run_configs(grid)
    if executor is None:
        executor = make_executor(grid.executor, parallel=grid.parallel)
    runs = [run for run, _ in configs]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / CONFIGS).mkdir(exist_ok=True)
    (out / "grid.json").write_text(json.dumps([r.overrides for r in runs], indent=1), "utf-8")
    points = [{"name": r.name, "overrides": r.overrides} for r in runs]
    atomic_write(out / POINTS, json.dumps(points, indent=1).encode())
    threads = executor.threads
    todo = [r for r in runs if not (out / "runs" / r.name / RESULT).is_file()]
    if len(todo) < len(runs):
        log(f"sweep: {len(runs) - len(todo)} of {len(runs)} runs already finished, skipped")
    shared: dict[str, Path | None] = {}
    for run, resolved in configs:
        if run in todo and not resumable(out / "runs" / run.name):
            shared[run.name] = prepare_shared(out, resolved.config.data, log)
    for run, resolved in configs:
        if run in todo:
            table = run_table(resolved, threads, shared.get(run.name), out.resolve().name)
            atomic_write(out / CONFIGS / f"{run.name}.toml", dump_toml(table).encode())
    failures: list[str] = []
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), disable=not progress, unit="run")
    for name, err in executor.run(out, [(r.name, r.overrides) for r in todo], train_point):
        if err and BUSY in err:
            log(f"sweep: {err}")
        elif err:
            failures.append(err)
            write_failure(out, name, err)
            log(f"sweep: failed {err}")
            for line in _failure_tail(out / "runs" / name):
                log(f"    {line}")
        bar.update(1)
    bar.close()
    results = load_results(out)
    write_table(results, out)
    if failures:
        raise GlassError(
            f"{len(failures)} of {len(runs)} runs failed (logs in {out}/runs/*/sweep.log); "
            f"first: {failures[0]}"
        )
    return results


def _failure_tail(run_dir: Path) -> list[str]:
    try:
        return list(json.loads((run_dir / "failed.json").read_text("utf-8"))["tail"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def load_results(out: str | Path) -> list[dict[str, Any]]:
    """Every finished run's result in a sweep folder, sorted by name."""
    out = Path(out)
    if not out.is_dir():
        raise InputFileError(f"sweep folder not found: {out}")
    results = []
    for path in sorted((out / "runs").glob(f"*/{RESULT}")):
        try:
            results.append(json.loads(path.read_text("utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            raise InputFileError(f"{path}: unreadable result ({e})") from None
    if not results:
        raise InputFileError(f"{out}: no finished runs (no runs/*/{RESULT})")
    return results


def write_table(results: Sequence[dict[str, Any]], out: str | Path) -> None:
    """``results.jsonl`` (one run a line, without the config) and a markdown ``results.md``."""
    out = Path(out)
    rows = [{k: r.get(k) for k in (*COLUMNS, "overrides")} for r in results]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r[c]) for c in COLUMNS) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n", "utf-8")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
