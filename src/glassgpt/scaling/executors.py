"""Sweep executors: where each grid point trains — processes here, Slurm jobs, or Ray tasks.

    point p  →  train_point(OUT, p)  →  OUT/runs/p/{result.json | ckpt/ | failed.json}

Every executor runs the same unit of work, ``sweep.train_point``, which reads the point's
config from ``OUT/configs/p.toml`` and writes only into the sweep folder; the folder is the
single source of truth. A point with ``result.json`` is finished (skipped), one with a
checkpoint is resumed, one with ``failed.json`` failed (its exit code and its log's last
lines; it is tried again on the next start), whichever executor ran it before.

- ``local``: ``parallel`` processes on this machine (threads).
- ``slurm``: one job per point, submitted as one array through ``submitit`` (partition, GPUs,
  time, memory and CPUs per point); ``cluster = "local"`` runs the same jobs through
  submitit's local executor instead (tests, a dry run on a laptop).
- ``ray``: one Ray task per point on the cluster ``ray.init(address=...)`` finds, or on a
  local Ray started here; at most ``parallel`` tasks at once.

The ``[executor]`` table of a grid (or the ``glassgpt sweep`` flags, which win)::

    [executor]
    kind = "slurm"        # local | slurm | ray
    partition = "gpu"     # slurm: the partition
    gpus = 1              # GPUs per point (slurm, ray)
    cpus = 8              # CPUs per point: the run's train.threads (default: cores / parallel)
    time = "02:00:00"     # slurm: time limit (minutes, "HH:MM:SS" or "D-HH:MM:SS")
    mem = "32G"           # slurm: memory per point (GB, or "512M", "32G")
    cluster = "local"     # slurm: submitit's local executor instead of sbatch
    address = "auto"      # ray: the cluster (default: start a local Ray)

:mod:`glassgpt.scaling.status` reads every point's state from the folder alone.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassgpt.errors import ConfigError, GlassError
from glassgpt.scaling.status import BUSY, FAILED, JOBS, TAIL
from glassgpt.storage import atomic_write

KINDS = ("local", "slurm", "ray")
EXTRAS = {"slurm": ("submitit", "glassgpt[slurm]"), "ray": ("ray", "glassgpt[ray]")}
Point = tuple[str, dict[str, Any]]  # (name, overrides)
Work = Callable[[str, str, dict[str, Any]], "str | None"]  # sweep.train_point(out, name, overrides)


@dataclass(frozen=True)
class ExecutorConfig:
    """Where and with what each point of a sweep runs (the grid's ``[executor]`` table)."""

    kind: str = "local"
    partition: str | None = None
    gpus: int = 0
    cpus: int | None = None
    time_min: int = 60
    mem_gb: float | None = None
    cluster: str = "slurm"
    address: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("executor.kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}")  # fmt: skip
        for name in ("gpus", "cpus"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"executor.{name}", f"must be a whole number ≥ 0, got {v!r}")
        if self.cpus == 0:
            raise ConfigError("executor.cpus", "must be at least 1, got 0")
        if self.cluster not in ("slurm", "local"):
            raise ConfigError("executor.cluster", f"must be slurm or local, got {self.cluster!r}")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], **flags: Any) -> ExecutorConfig:
        """From a grid's ``[executor]`` table; ``flags`` (not None) override its entries.

        >>> ExecutorConfig.from_dict({"kind": "slurm", "time": "1:30:00", "mem": "512M"})
        ... # doctest: +ELLIPSIS
        ExecutorConfig(kind='slurm', partition=None, gpus=0, cpus=None, time_min=90, mem_gb=0.5, ...)
        """
        merged = {**table, **{k: v for k, v in flags.items() if v is not None}}
        known = ("kind", "partition", "gpus", "cpus", "time", "mem", "cluster", "address")
        unknown = sorted(set(merged) - set(known))
        if unknown:
            raise ConfigError(f"executor.{unknown[0]}", f"unknown key; known: {', '.join(known)}")
        values = dict(merged)
        if "time" in values:
            values["time_min"] = parse_minutes(values.pop("time"))
        if "mem" in values:
            values["mem_gb"] = parse_gb(values.pop("mem"))
        return cls(**values)


def parse_minutes(value: Any) -> int:
    """A Slurm time limit in whole minutes: minutes, ``"MM"``, ``"HH:MM:SS"``, ``"D-HH:MM:SS"``.

    >>> parse_minutes(90), parse_minutes("02:00:00"), parse_minutes("1-00:30:00")
    (90, 120, 1470)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+)(?::(\d+))?", str(value).strip())
    if isinstance(value, str) and m:
        days, a, b, c = (int(x) if x else 0 for x in m.groups())
        if m.group(4) is not None:  # [D-]HH:MM:SS
            minutes = days * 1440 + a * 60 + b + (c + 59) // 60
        elif m.group(2) is not None:  # [D-]HH:MM
            minutes = days * 1440 + a * 60 + b
        else:  # [D-]MM (D-HH in Slurm; minutes are what people write)
            minutes = days * 1440 + b
        if minutes > 0:
            return minutes
    raise ConfigError("executor.time", f"must be minutes or HH:MM:SS, got {value!r}")


def parse_gb(value: Any) -> float:
    """Memory in GB: a number of GB, or ``"512M"``, ``"32G"``, ``"1T"`` (B optional).

    >>> parse_gb(16), parse_gb("512M"), parse_gb("32GB")
    (16.0, 0.5, 32.0)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([MGT])B?", str(value).strip(), re.IGNORECASE)
    if isinstance(value, str) and m and float(m.group(1)) > 0:
        return float(m.group(1)) * {"M": 1 / 1024, "G": 1.0, "T": 1024.0}[m.group(2).upper()]
    raise ConfigError("executor.mem", f"must be GB or a size such as 32G, got {value!r}")


def require(kind: str) -> Any:
    """Import the package an executor needs, or one line naming the extra that installs it."""
    module, extra = EXTRAS[kind]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise GlassError(
            f"the {kind} executor needs {module}, which is not installed: pip install '{extra}'"
        ) from None


def make_executor(
    table: Mapping[str, Any] | ExecutorConfig, *, parallel: int = 1, **flags: Any
) -> LocalExecutor | SlurmExecutor | RayExecutor:
    """The executor of a grid's ``[executor]`` table (or a config), with ``flags`` over it;
    its package and its cluster are checked here, before anything starts."""
    config = table if isinstance(table, ExecutorConfig) else ExecutorConfig.from_dict(table, **flags)  # fmt: skip
    if config.kind == "slurm":
        return SlurmExecutor(config, parallel)
    if config.kind == "ray":
        return RayExecutor(config, parallel)
    return LocalExecutor(config, parallel)


class LocalExecutor:
    """``parallel`` points at once, each a ``glassgpt train`` process on this machine."""

    def __init__(self, config: ExecutorConfig = ExecutorConfig(), parallel: int = 1) -> None:
        self.config, self.parallel = config, parallel
        self.threads = config.cpus or max(1, (os.cpu_count() or 1) // parallel)

    def run(
        self, out: Path, points: Sequence[Point], work: Work
    ) -> Iterator[tuple[str, str | None]]:
        """Run ``work(out, name, overrides)`` for every point; yield (name, None or its
        failure) as each ends."""
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            futures = {pool.submit(work, str(out), n, o): n for n, o in points}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


class SlurmExecutor:
    """One Slurm job per point (one job array), through ``submitit``; ``cluster = "local"``:
    the same jobs through submitit's local executor. Job files and logs: ``OUT/slurm/``."""

    def __init__(self, config: ExecutorConfig, parallel: int = 1) -> None:
        self.config, self.parallel = config, parallel
        self.threads = config.cpus or 1
        self.submitit = require("slurm")
        if config.cluster == "slurm" and shutil.which("sbatch") is None:
            raise GlassError(
                "the slurm executor found no Slurm here (sbatch is not on PATH); run the sweep "
                'on a Slurm login node, or set [executor] cluster = "local" to run its jobs here'
            )

    def parameters(self) -> dict[str, Any]:
        """The job's parameters, in submitit's ``AutoExecutor`` terms (``slurm_`` ones are
        Slurm's alone; the local executor ignores them)."""
        c = self.config
        params: dict[str, Any] = {
            "name": "glassgpt-sweep",
            "timeout_min": c.time_min,
            "cpus_per_task": self.threads,
            "gpus_per_node": c.gpus,
            "tasks_per_node": 1,
            "nodes": 1,
            "slurm_array_parallelism": self.parallel,
        }
        if c.mem_gb is not None:
            params["mem_gb"] = c.mem_gb
        if c.partition is not None:
            params["slurm_partition"] = c.partition
        return params

    def executor(self, out: Path) -> Any:
        """The submitit executor for a sweep folder, its parameters set."""
        ex = self.submitit.AutoExecutor(folder=out / "slurm" / "%j", cluster=self.config.cluster)
        ex.update_parameters(**self.parameters())
        return ex

    def submit(self, out: Path, points: Sequence[Point], work: Work) -> list[tuple[str, Any]]:
        """Submit every point as one job array; each job's id is kept in ``OUT/jobs/``."""
        ex = self.executor(out)
        with ex.batch():
            jobs = [(n, ex.submit(work, str(out), n, o)) for n, o in points]
        (out / JOBS).mkdir(exist_ok=True)
        for name, job in jobs:
            record = {"executor": f"slurm ({self.config.cluster})", "job": str(job.job_id)}
            atomic_write(out / JOBS / f"{name}.json", json.dumps(record).encode())
        return jobs

    def run(
        self, out: Path, points: Sequence[Point], work: Work
    ) -> Iterator[tuple[str, str | None]]:
        if not points:
            return
        jobs = self.submit(out, points, work)
        by_job = {id(job): name for name, job in jobs}
        try:
            poll_s = 0.5 if self.config.cluster == "local" else 15.0  # sacct is shared
            for job in self.submitit.helpers.as_completed(
                [j for _, j in jobs], poll_frequency=poll_s
            ):
                name = by_job[id(job)]
                try:
                    err = job.result()
                except Exception as e:  # the job itself died: time limit, memory, node
                    err = f"{name}: slurm job {job.job_id} failed: {_first_line(e)}"
                    _write_job_tail(out, name, job)
                (out / JOBS / f"{name}.json").unlink(missing_ok=True)
                yield name, err
        except BaseException:  # Ctrl-C: do not leave the array running behind the sweep
            for _, job in jobs:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)
            raise


class RayExecutor:
    """One Ray task per point (``cpus`` CPUs and ``gpus`` GPUs each), at most ``parallel`` at
    once, on the cluster at ``address`` (``"auto"``: the one this machine belongs to) or on
    a local Ray started here. A Ray already initialised in this process is used as it is."""

    def __init__(self, config: ExecutorConfig, parallel: int = 1) -> None:
        self.config, self.parallel = config, parallel
        self.threads = config.cpus or 1
        self.ray = require("ray")
        where = config.address
        problem = _unreachable(where) if where is not None else None
        if problem is not None:  # ray.init would wait minutes for a GCS that is not there
            raise GlassError(f"no Ray cluster reachable at {where}: {problem}")

    def connect(self) -> bool:
        """Join or start Ray; True when this call started it (and so shuts it down)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        where = self.config.address
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        kwargs["logging_level"] = logging.WARNING
        if where is None:
            kwargs["num_cpus"] = max(os.cpu_count() or 1, self.threads)
        try:
            ray.init(address=where, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise GlassError(f"no Ray cluster reachable at {where}: {_first_line(e)}") from None
        return True

    def run(
        self, out: Path, points: Sequence[Point], work: Work
    ) -> Iterator[tuple[str, str | None]]:
        if not points:
            return
        ray = self.ray
        started = self.connect()
        running: dict[Any, str] = {}
        try:
            have = ray.cluster_resources()
            for what, need in (("CPU", self.threads), ("GPU", self.config.gpus)):
                if need > have.get(what, 0):
                    raise GlassError(
                        f"the Ray cluster has {have.get(what, 0):g} {what}s; a point asks for "
                        f"{need} (executor.{what.lower()}s)"
                    )
            task = ray.remote(num_cpus=self.threads, num_gpus=self.config.gpus, max_retries=0)(work)
            waiting = list(points)
            while waiting or running:
                while waiting and len(running) < self.parallel:
                    name, overrides = waiting.pop(0)
                    running[task.remote(str(out), name, overrides)] = name
                (ref,), _ = ray.wait(list(running), num_returns=1)
                name = running.pop(ref)
                try:
                    err = ray.get(ref)
                except Exception as e:  # the worker itself died
                    err = f"{name}: ray task failed: {_first_line(e)}"
                yield name, err
        finally:
            for ref in running:  # left when stopped early
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            if started:
                ray.shutdown()


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing listens at a ``host:port`` or ``ray://host:port`` address (None: it
    answers, or the address is ``auto`` or another form Ray looks up itself).

    >>> _unreachable("auto") is None
    True
    """
    m = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)", address.strip())
    if m is None:
        return None
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _write_job_tail(out: Path, name: str, job: Any) -> None:
    """A job that died before its point could say why: its own log's last lines."""
    text = ""
    with contextlib.suppress(Exception):
        text = (job.stdout() or "") + (job.stderr() or "")
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"exit": None, "tail": text.strip().splitlines()[-TAIL:]}
    atomic_write(run_dir / FAILED, json.dumps(record, indent=1).encode())


def write_failure(out: Path, name: str, err: str) -> None:
    """Keep a failure reported by the executor where no ``failed.json`` says it yet."""
    path = out / "runs" / name / FAILED
    if path.is_file() or BUSY in err:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"exit": None, "tail": [err]}, indent=1).encode())
