"""``glassgpt sweep``: train every run of a TOML grid or built-in study; finished runs are
skipped when it starts again.

    glassgpt sweep --grid scaling-cpu -o sweeps/cpu [--executor local|slurm|ray]
    glassgpt sweep --status sweeps/cpu
    glassgpt sweep --list
"""

from __future__ import annotations

import argparse
from typing import Any

from glassgpt.cli.arguments import add_no_progress, add_output
from glassgpt.errors import GlassError
from glassgpt.scaling.executors import make_executor
from glassgpt.scaling.grid import Grid, study_description, study_names
from glassgpt.scaling.status import format_status, sweep_status
from glassgpt.scaling.sweep import run_sweep


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train every run of a TOML grid or built-in study; finished runs are skipped when "
        "restarted."
    )
    parser.add_argument(
        "--grid",
        metavar="FILE|NAME",
        help=f"a grid TOML file, or a built-in study: {', '.join(study_names())}",
    )
    add_output(parser, metavar="DIR", help="the sweep folder")
    parser.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="train every run on these files or prepared folder instead of the grid's data",
    )
    parser.add_argument("--list", action="store_true", help="list the built-in studies and exit")
    add_no_progress(parser)
    parser.add_argument(
        "--status", metavar="DIR", help="show every point's state in a sweep folder and exit"
    )
    e = parser.add_argument_group("executor", "where the points train (over the grid's [executor])")  # fmt: skip
    e.add_argument(
        "--executor",
        choices=("local", "slurm", "ray"),
        help="processes here (default), one Slurm job per point, or one Ray task per point",
    )
    e.add_argument("--partition", help="slurm: the partition")
    e.add_argument("--gpus", type=int, metavar="N", help="GPUs per point (slurm, ray)")
    e.add_argument("--cpus", type=int, metavar="N", help="CPUs (train.threads) per point")
    e.add_argument("--time", metavar="LIMIT", help="slurm: time limit, minutes or HH:MM:SS")
    e.add_argument("--mem", metavar="SIZE", help="slurm: memory per point, e.g. 32G")
    e.add_argument(
        "--slurm-local",
        action="store_true",
        help="slurm: run the jobs through submitit's local executor, on this machine",
    )
    e.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="ray: the cluster to join (auto: this machine's; default: start a local Ray)",
    )
    parser.set_defaults(func=run)


def executor_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The executor flags given, in the terms of the grid's ``[executor]`` table."""
    return {
        "kind": args.executor,
        "partition": args.partition,
        "gpus": args.gpus,
        "cpus": args.cpus,
        "time": args.time,
        "mem": args.mem,
        "cluster": "local" if args.slurm_local else None,
        "address": args.ray_address,
    }


def run(args: argparse.Namespace) -> int:
    if args.status is not None:
        print(format_status(sweep_status(args.status)))
        return 0
    if args.list:
        for name in study_names():
            print(f"{name:12} {study_description(name)}")
        return 0
    if args.grid is None or args.output is None:
        raise GlassError("sweep needs --grid FILE|NAME and --output DIR (or --list)")
    grid = Grid.resolve(args.grid)
    if args.data:
        grid = grid.with_data(args.data)
    executor = make_executor(grid.executor, parallel=grid.parallel, **executor_flags(args))
    results = run_sweep(grid, args.output, progress=not args.no_progress, executor=executor)
    print(f"{len(results)} runs finished; table in {args.output}/results.md")
    return 0
