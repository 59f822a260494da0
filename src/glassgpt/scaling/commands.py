"""``glassgpt sweep`` and ``glassgpt scaling fit | compare | predict``: argument parsing only."""

from __future__ import annotations

import argparse
from typing import Any

from glassgpt.cli.arguments import add_output, add_run_source


def register(subparsers: Any) -> None:
    from glassgpt.scaling.grid import study_names

    studies = ", ".join(study_names())
    p = subparsers.add_parser(
        "sweep",
        help="train a grid of runs (sizes × token budgets × any config field × seeds)",
        description="Train every run of a TOML grid or built-in study; finished runs are "
        "skipped when restarted.",
    )
    p.add_argument(
        "--grid",
        metavar="FILE|NAME",
        help=f"a grid TOML file, or a built-in study: {studies}",
    )
    add_output(p, metavar="DIR", help="the sweep folder")
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="train every run on these files or prepared folder instead of the grid's data",
    )
    p.add_argument("--list", action="store_true", help="list the built-in studies and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--status", metavar="DIR", help="show every point's state in a sweep folder and exit"
    )
    _add_executor(p)
    p.set_defaults(func=_sweep)
    _register_scaling(subparsers)


def _add_executor(p: Any) -> None:
    e = p.add_argument_group("executor", "where the points train (over the grid's [executor])")
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


def _executor_flags(args: argparse.Namespace) -> dict[str, Any]:
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


def _register_scaling(subparsers: Any) -> None:
    s = subparsers.add_parser("scaling", help="fit L(N, D) to a sweep and predict loss")
    sub = s.add_subparsers(dest="scaling_command", metavar="COMMAND", required=True)
    f = sub.add_parser("fit", help="fit L(N, D) = E + A/N^alpha + B/D^beta to a sweep's runs")
    f.add_argument("sweep", metavar="DIR", help="a sweep folder (from glassgpt sweep)")
    f.add_argument(
        "--holdout",
        type=int,
        default=0,
        metavar="K",
        help="leave out the runs of the K largest model sizes and predict them",
    )
    f.add_argument(
        "--bootstrap",
        type=int,
        default=200,
        metavar="B",
        help="bootstrap resamples for confidence intervals (default 200)",
    )
    f.add_argument(
        "--n-kind",
        choices=("non_embedding", "total"),
        default="non_embedding",
        help="which parameter count is N (default: non_embedding, as Kaplan et al.)",
    )
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=_fit)

    c = sub.add_parser(
        "compare",
        help="mean ± standard error of a metric per grid point, over seeds",
        description="Group a sweep's runs by grid point (every override but the seed, or one "
        "key with --by); write DIR/comparison.md and DIR/comparison.png.",
    )
    c.add_argument("sweep", metavar="DIR", help="a sweep folder (from glassgpt sweep)")
    c.add_argument("--by", metavar="KEY", help="group by this override only (e.g. model.d_head)")
    c.add_argument(
        "--metric",
        default="val_bpb",
        metavar="NAME",
        help="val_bpb (default: fair across tokenizers), val_loss or best_val_loss",
    )
    c.set_defaults(func=_compare)

    q = sub.add_parser("predict", help="predict a run's loss before training it")
    q.add_argument("--law", required=True, metavar="PATH", help="law.json or its sweep folder")
    add_run_source(q, example="model.n_layers=8")
    q.add_argument(
        "--tokens",
        type=float,
        metavar="D",
        help="training tokens (default: max_steps × batch_size × seq_len)",
    )
    q.add_argument(
        "--flops",
        type=float,
        metavar="C",
        help="also print the compute-optimal N and D for this FLOP budget",
    )
    q.set_defaults(func=_predict)


def _sweep(args: argparse.Namespace) -> int:
    from glassgpt.errors import GlassError
    from glassgpt.scaling.executors import format_status, make_executor, sweep_status
    from glassgpt.scaling.grid import Grid, study_description, study_names
    from glassgpt.scaling.sweep import run_sweep

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
    executor = make_executor(grid.executor, parallel=grid.parallel, **_executor_flags(args))
    results = run_sweep(grid, args.output, progress=not args.no_progress, executor=executor)
    print(f"{len(results)} runs finished; table in {args.output}/results.md")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from glassgpt.scaling.study import fit_results, plot_report, save_report
    from glassgpt.scaling.sweep import load_results

    report = fit_results(
        load_results(args.sweep),
        n_kind=args.n_kind,
        holdout=args.holdout,
        bootstrap=args.bootstrap,
        seed=args.seed,
    )
    print(report.summary())
    path = save_report(report, args.sweep)
    plots = plot_report(report, args.sweep)
    print(f"law in {path}; plots: {', '.join(p.name for p in plots)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from glassgpt.scaling.compare import compare_sweep

    comparison, md, png = compare_sweep(args.sweep, by=args.by, metric=args.metric)
    print(comparison.markdown(), end="")
    print(f"table in {md}; plot in {png}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from glassgpt.scaling.study import predict_for_config

    print(
        predict_for_config(
            args.law,
            preset=args.preset,
            config_file=args.config,
            overrides=args.overrides,
            tokens=args.tokens,
            flops=args.flops,
        )
    )
    return 0
