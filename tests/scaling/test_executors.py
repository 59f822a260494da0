"""Sweep executors: Slurm (through submitit's local executor) and Ray give the local
executor's results.jsonl, losses included; a sweep killed half-way and restarted trains no
point twice; --status reads the folder; a missing package or cluster is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glassgpt.cli import main
from glassgpt.errors import ConfigError, GlassError
from glassgpt.scaling import sweep as sweep_module
from glassgpt.scaling.executors import ExecutorConfig, SlurmExecutor, make_executor
from glassgpt.scaling.grid import Grid
from glassgpt.scaling.status import TAIL, sweep_status
from glassgpt.scaling.sweep import run_sweep

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))
GRID = """
preset = "cpu-tiny"
data = ["corpus.txt"]
seeds = [0, 1]
parallel = 2
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
[executor]
cpus = 1
[grid]
size = [{ "model.d_model" = 8, "model.n_heads" = 2 }, { "model.d_model" = 16, "model.n_heads" = 2 }]
"""


def write_grid(folder: Path, text: str = GRID) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (folder / "grid.toml").write_text(text, encoding="utf-8")
    return folder / "grid.toml"


def rows(out: Path) -> list[dict[str, Any]]:
    """results.jsonl without the wall time (the one column that may differ)."""
    lines = (out / "results.jsonl").read_text("utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The grid file and the local executor's results on it (4 points: 2 sizes × 2 seeds)."""
    root = tmp_path_factory.mktemp("reference")
    grid_path = write_grid(root)
    out = root / "local"
    run_sweep(Grid.load(grid_path), out, progress=False, log=quiet)
    table = rows(out)
    assert len(table) == 4 and len({r["val_loss"] for r in table}) == 4
    return grid_path, table


@pytest.mark.slow
def test_slurm_through_submitits_local_executor_gives_the_local_results(
    reference: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    grid_path, expected = reference
    grid = Grid.load(grid_path)
    executor = make_executor(grid.executor, parallel=grid.parallel, kind="slurm", cluster="local")
    run_sweep(grid, tmp_path / "out", progress=False, log=quiet, executor=executor)
    assert rows(tmp_path / "out") == expected  # same losses, bit for bit
    # Each point ran as its own submitit job, with its own logs.
    logs = sorted((tmp_path / "out" / "slurm").glob("*/*_log.out"))
    assert len(logs) == 4
    assert [s.state for s in sweep_status(tmp_path / "out")] == ["finished"] * 4


@pytest.mark.slow
def test_ray_on_a_local_ray_gives_the_local_results(
    reference: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'glassgpt[ray]')")
    grid_path, expected = reference
    grid = Grid.load(grid_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executor = make_executor(grid.executor, parallel=grid.parallel, kind="ray")
        run_sweep(grid, tmp_path / "out", progress=False, log=quiet, executor=executor)
        assert ray.is_initialized()  # a Ray the caller started is left running
    finally:
        ray.shutdown()
    assert rows(tmp_path / "out") == expected


@pytest.mark.slow
def test_a_sweep_killed_half_way_restarts_without_training_a_point_twice(
    reference: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    grid_path, expected = reference
    out = tmp_path / "out"
    runs = out / "runs"
    cmd = [sys.executable, "-m", "glassgpt", "sweep", "--grid", str(grid_path), "-o", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the sweep and its trainers
    )
    deadline = time.monotonic() + 600
    try:
        while True:  # two points finished, another one checkpointed: kill everything
            done = list(runs.glob("*/result.json"))
            ckpts = [p for p in runs.glob("*/ckpt/step_*") if not (p.parents[1] / "result.json").exists()]  # fmt: skip
            if len(done) >= 2 and ckpts:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the sweep ended before it could be killed half-way")
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    gone = time.monotonic() + 30  # the killed trainers take a moment to exit (and be reaped)
    while time.monotonic() < gone and any(s.state == "training" for s in sweep_status(out)):
        time.sleep(0.05)

    states = {s.name: s for s in sweep_status(out)}
    finished = sorted(n for n, s in states.items() if s.state == "finished")
    resumable = sorted(n for n, s in states.items() if s.detail.startswith("resumes from"))
    assert 2 <= len(finished) < 4 and resumable
    assert all(s.state in ("finished", "interrupted", "pending") for s in states.values()), states
    before = {n: (runs / n / "result.json").stat().st_mtime_ns for n in finished}
    metrics = {n: (runs / n / "metrics.jsonl").read_bytes() for n in finished}

    # Restart with another executor: the folder, not the executor, says what is left.
    grid = Grid.load(grid_path)
    executor = make_executor(grid.executor, parallel=grid.parallel, kind="slurm", cluster="local")
    messages: list[str] = []
    run_sweep(grid, out, progress=False, log=messages.append, executor=executor)
    assert messages[0] == f"sweep: {len(finished)} of 4 runs already finished, skipped"
    for n in finished:  # not trained again
        assert (runs / n / "result.json").stat().st_mtime_ns == before[n]
        assert (runs / n / "metrics.jsonl").read_bytes() == metrics[n]
    for n in resumable:  # resumed from its checkpoint (or found done there), not started again
        log = (runs / n / "sweep.log").read_text("utf-8")
        assert "resumed from" in log or "is already finished: step 6" in log
    assert not any(runs.glob("*/failed.json"))
    assert not [m for m in messages if "failed" in m or "already training" in m]
    assert rows(out) == expected  # an exact resume: the uninterrupted losses


def test_status_shows_every_points_state(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from glassgpt.train.lock import RunLock

    names = ["a", "b", "c", "d", "e", "f", "g"]
    out = tmp_path / "sweep"
    (out / "runs").mkdir(parents=True)
    (out / "points.json").write_text(json.dumps([{"name": n, "overrides": {}} for n in names]))
    result = {"val_loss": 2.5, "step": 6}
    (out / "runs" / "a").mkdir()
    (out / "runs" / "a" / "result.json").write_text(json.dumps(result))
    (out / "runs" / "b" / "ckpt" / "step_3").mkdir(parents=True)
    (out / "runs" / "c").mkdir()
    (out / "runs" / "c" / "failed.json").write_text(
        json.dumps({"exit": 1, "tail": ["Traceback", "RuntimeError: out of memory"]})
    )
    (out / "runs" / "d").mkdir()  # killed before its first checkpoint
    (out / "jobs").mkdir()
    (out / "jobs" / "e.json").write_text(json.dumps({"executor": "slurm (slurm)", "job": "77_4"}))
    (out / "runs" / "g").mkdir()
    (out / "runs" / "g" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    with RunLock(out / "runs" / "g"):  # a live trainer (this process)
        assert main(["sweep", "--status", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = {line.split()[0]: line.split(None, 2)[1:] for line in lines[:-1]}
    assert [line.split()[0] for line in lines[:-1]] == names  # grid order
    assert table["a"] == ["finished", "val_loss 2.5000 at step 6"]
    assert table["b"] == ["interrupted", "resumes from step_3"]
    assert table["c"] == ["failed", "exit 1: RuntimeError: out of memory"]
    assert table["d"] == ["interrupted", "before its first checkpoint; starts again"]
    assert table["e"] == ["submitted", "slurm (slurm) job 77_4"]
    assert table["f"] == ["pending"]
    assert table["g"][0] == "training" and table["g"][1].startswith(f"step 2 (pid {os.getpid()}")
    assert lines[-1] == (
        "7 points: 1 finished, 2 interrupted, 1 failed, 1 submitted, 1 pending, 1 training"
    )
    # Once the trainer is gone (its lock released), the point is no longer training.
    assert sweep_status(out)[-1].state == "interrupted"
    assert main(["sweep", "--status", str(tmp_path / "nothing")]) == 2
    assert main(["sweep", "--status", str(tmp_path)]) == 2  # not a sweep folder
    (out / "points.json").unlink()  # a sweep from before points.json: its folders
    assert [s.name for s in sweep_status(out)] == ["a", "b", "c", "d", "g"]


@pytest.mark.slow
def test_a_failed_point_is_reported_with_its_logs_last_lines_and_the_others_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid_path = write_grid(tmp_path, GRID.replace("seeds = [0, 1]", "seeds = [0]"))
    bad = "model.d_model=8,model.n_heads=2,seed=0"
    real = sweep_module.train_command

    def command(run_dir: Path, config_file: Path | None) -> list[str]:
        if run_dir.name != bad:
            return real(run_dir, config_file)
        lines = "; ".join(f"print('line {i}')" for i in range(30))
        return [sys.executable, "-c", f"{lines}; raise SystemExit('boom: no memory left')"]

    monkeypatch.setattr(sweep_module, "train_command", command)
    messages: list[str] = []
    with pytest.raises(GlassError, match=f"1 of 2 runs failed .* first: {bad}: exit 1: boom"):
        run_sweep(Grid.load(grid_path), tmp_path / "out", progress=False, log=messages.append)
    assert messages[-1] == "    boom: no memory left" and "    line 29" in messages
    failed = json.loads((tmp_path / "out" / "runs" / bad / "failed.json").read_text())
    assert failed["exit"] == 1 and failed["tail"][-2:] == ["line 29", "boom: no memory left"]
    assert len(failed["tail"]) == TAIL
    states = {s.name: s.state for s in sweep_status(tmp_path / "out")}
    assert sorted(states.values()) == ["failed", "finished"]  # the other point went on
    assert len(rows(tmp_path / "out")) == 1


def test_the_real_slurm_path_submits_the_same_job_as_an_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``sbatch`` and ``srun`` on PATH (here, stand-ins that record the job file), the
    jobs are one array with the asked resources, each running train_point on its point."""
    pytest.importorskip("submitit", reason="submitit is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/job.sh\necho "Submitted batch job 4242"\n')  # fmt: skip
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    table = {"kind": "slurm", "partition": "gpu", "gpus": 1, "cpus": 4, "time": "1:30:00", "mem": "8G"}  # fmt: skip
    executor = make_executor(table, parallel=2)
    assert isinstance(executor, SlurmExecutor) and executor.threads == 4
    out = tmp_path / "sweep"
    points = [("p0", {"seed": 0}), ("p1", {"seed": 1}), ("p2", {"seed": 2})]
    jobs = executor.submit(out, points, sweep_module.train_point)
    script = (tmp_path / "job.sh").read_text()
    for flag in (
        "--partition=gpu",
        "--gpus-per-node=1",
        "--cpus-per-task=4",
        "--time=90",
        "--mem=8GB",
        "--array=0-2%2",
        "--ntasks-per-node=1",
    ):
        assert f"#SBATCH {flag}\n" in script
    assert "submitit.core._submit" in script
    for (name, overrides), (_, job) in zip(points, jobs):
        assert job.job_id.startswith("4242_")
        delayed = job.submission()
        assert delayed.function is sweep_module.train_point
        assert delayed.args == (str(out), name, overrides)
    assert [s.detail for s in sweep_status_of(out, points)] == [
        f"slurm (slurm) job {job.job_id}" for _, job in jobs
    ]


def sweep_status_of(out: Path, points: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    (out / "points.json").write_text(json.dumps([{"name": n, "overrides": o} for n, o in points]))
    return sweep_status(out)


@pytest.mark.parametrize(("kind", "module", "extra"), [("slurm", "submitit", "glassgpt[slurm]"), ("ray", "ray", "glassgpt[ray]")])  # fmt: skip
def test_a_missing_package_names_its_extra(
    kind: str,
    module: str,
    extra: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import fails
    grid_path = write_grid(tmp_path)
    out = tmp_path / "out"
    argv = ["sweep", "--grid", str(grid_path), "-o", str(out), "--executor", kind]
    assert main([*argv, "--slurm-local"] if kind == "slurm" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pip install '{extra}'" in err and module in err
    assert not out.exists()  # refused before anything started


def test_no_slurm_or_no_ray_cluster_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("submitit", reason="submitit is not installed")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    with pytest.raises(GlassError, match=r"no Slurm here \(sbatch is not on PATH\)") as e:
        make_executor({"kind": "slurm"})
    assert "\n" not in str(e.value)
    assert isinstance(make_executor({"kind": "slurm", "cluster": "local"}), SlurmExecutor)

    pytest.importorskip("ray", reason="ray is not installed")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GlassError, match=f"no Ray cluster reachable at 127.0.0.1:{port}: ") as e:
        make_executor({"kind": "ray", "address": f"127.0.0.1:{port}"})  # before anything starts
    assert "\n" not in str(e.value)
    with pytest.raises(GlassError, match="no Ray cluster reachable at auto: ") as e:
        make_executor({"kind": "ray", "address": "auto"}).connect()  # none on this machine
    assert "\n" not in str(e.value)


def test_executor_table_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        ExecutorConfig.from_dict({"kind": "kubernetes"})
    assert e.value.field == "executor.kind"
    with pytest.raises(ConfigError) as e:
        ExecutorConfig.from_dict({"gpu": 1})
    assert e.value.field == "executor.gpu"  # unknown key, named
    for key, value in (("time", "soon"), ("mem", "lots"), ("gpus", -1), ("cpus", 0)):
        with pytest.raises(ConfigError) as e:
            ExecutorConfig.from_dict({key: value})
        assert e.value.field == f"executor.{key}"
    # Flags win over the grid's table; the local executor's threads follow cpus.
    config = ExecutorConfig.from_dict({"kind": "slurm", "gpus": 2}, kind="ray", gpus=None)
    assert (config.kind, config.gpus) == ("ray", 2)
    assert make_executor({"cpus": 3}, parallel=2).threads == 3
    assert make_executor({}, parallel=1).threads == max(1, os.cpu_count() or 1)
    grid = write_grid(tmp_path, GRID.replace("cpus = 1", 'kind = "slurm"\npartition = "gpu"'))
    assert Grid.load(grid).executor == {"kind": "slurm", "partition": "gpu"}
    with pytest.raises(ConfigError, match="executor: must be a table"):
        Grid.from_dict({"executor": "slurm"})


def test_a_point_a_live_trainer_holds_is_left_to_it(tmp_path: Path) -> None:
    import socket

    from glassgpt.train.lock import RunLock

    run_dir = tmp_path / "runs" / "p"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # no checkpoint yet
    with RunLock(run_dir):  # another trainer (another submission of the same sweep)
        err = sweep_module.train_point(tmp_path, "p", {})
    assert err == f"p: already training (pid {os.getpid()} on {socket.gethostname()}); left to it"
    assert (run_dir / "metrics.jsonl").is_file()  # its folder was not cleared
    assert not (run_dir / "failed.json").exists()


def test_a_point_killed_while_writing_its_first_checkpoint_starts_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "p"
    (run_dir / "ckpt" / ".tmp-step_000003-123").mkdir(parents=True)  # the rename never came
    config = tmp_path / "configs" / "p.toml"
    assert not sweep_module.resumable(run_dir)
    assert sweep_module.train_command(run_dir, config)[-4:] == [
        "--config", str(config), "--output", str(run_dir)
    ]  # fmt: skip
    (run_dir / "ckpt" / "step_000003").mkdir()
    assert sweep_module.resumable(run_dir)
    assert sweep_module.train_command(run_dir, config)[-2:] == ["--resume", str(run_dir)]
