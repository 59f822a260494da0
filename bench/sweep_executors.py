"""A 4-point sweep's wall time with each executor: processes here, Slurm jobs through
submitit's local executor, and Ray tasks on a local Ray, same grid, same machine.

The grid is 2 widths × 2 seeds of a 1-layer GPT (6 steps of 4 × 16 tokens), 2 points at once
with 1 thread each, so the training itself is a few seconds and what differs between the
rows is what each executor adds: submitit pickles each call and starts a controller process
per job, Ray starts (or joins) a cluster and a worker process per task. It prints the load
average first (the figures mean little on a busy machine), then per executor the sweep's
wall time, the median point's time (``wall_s``: its ``glassgpt train`` process) and the
difference to the first row (the local executor); every row's losses must equal the local row's. Run from
the repository root:

    PYTHONPATH=src python bench/sweep_executors.py
    PYTHONPATH=src python bench/sweep_executors.py --executors local slurm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from glassgpt.scaling.executors import make_executor
from glassgpt.scaling.grid import Grid
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
FLAGS = {"local": {}, "slurm": {"kind": "slurm", "cluster": "local"}, "ray": {"kind": "ray"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executors", nargs="+", choices=tuple(FLAGS), default=list(FLAGS))
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "corpus.txt").write_text(TEXT, "utf-8")
        (root / "grid.toml").write_text(GRID, "utf-8")
        grid = Grid.load(root / "grid.toml")
        print(f"{'executor':10} {'sweep s':>8} {'point s':>8} {'vs first':>9}  losses")
        first: tuple[float, list[float]] | None = None
        for name in args.executors:
            executor = make_executor(grid.executor, parallel=grid.parallel, **FLAGS[name])
            out = root / name
            start = time.perf_counter()
            run_sweep(grid, out, progress=False, log=lambda _: None, executor=executor)
            wall = time.perf_counter() - start
            rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
            losses = [r["val_loss"] for r in rows]
            point = statistics.median(r["wall_s"] for r in rows)
            first = first or (wall, losses)
            same = "same as first row" if losses == first[1] else "DIFFERENT"
            print(f"{name:10} {wall:8.1f} {point:8.1f} {wall - first[0]:+9.1f}  {same}")


if __name__ == "__main__":
    main()
