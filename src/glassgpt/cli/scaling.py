"""``glassgpt scaling``: fit L(N, D) = E + A/N^α + B/D^β to a sweep, compare its points over
seeds, and predict a run's loss before training it.

    glassgpt scaling fit sweeps/cpu [--holdout 1]
    glassgpt scaling compare sweeps/cpu [--by model.d_head]
    glassgpt scaling predict --law sweeps/cpu --preset cpu-small [--flops 1e15]
"""

from __future__ import annotations

import argparse

from glassgpt.cli.arguments import add_run_source, add_seed
from glassgpt.scaling.compare import compare_sweep
from glassgpt.scaling.study import fit_results, plot_report, predict_for_config, save_report
from glassgpt.scaling.sweep import load_results


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Fit L(N, D) to a sweep and predict loss."
    sub = parser.add_subparsers(dest="scaling_command", metavar="COMMAND")

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
    add_seed(f, default=0, help="random seed of the bootstrap (default 0)")
    f.set_defaults(func=run_fit)

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
    c.set_defaults(func=run_compare)

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
    q.set_defaults(func=run_predict)


def run_fit(args: argparse.Namespace) -> int:
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


def run_compare(args: argparse.Namespace) -> int:
    comparison, md, png = compare_sweep(args.sweep, by=args.by, metric=args.metric)
    print(comparison.markdown(), end="")
    print(f"table in {md}; plot in {png}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
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
