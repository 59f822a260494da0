"""``glassgpt train``: argument parsing only (the job lives in :mod:`glassgpt.train.run`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a GPT on text (no arguments: a small model of the Python stdlib)",
        description=(
            "Train a GPT. With no arguments: a character-level model of this Python's standard "
            "library sources, a few minutes on 2 CPU cores. Under `torchrun --nproc_per_node=N` "
            "the same command trains with DistributedDataParallel."
        ),
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--preset", metavar="NAME", help="a run preset (default: default)")
    source.add_argument("--config", metavar="FILE", help="a TOML run config")
    p.add_argument(
        "--data",
        metavar="PATH",
        nargs="+",
        action="extend",
        help="text files or folders, or one prepared data folder (default: the stdlib corpus)",
    )
    p.add_argument("--out", metavar="DIR", help="run folder (default: runs/<preset>)")
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        help="override a config key, e.g. --set train.max_steps=500 model.n_layers=2",
    )
    p.add_argument("--resume", metavar="DIR", help="continue a run from its latest checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --out already holds (a fresh run never mixes with an old one)",
    )
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    from glassgpt.train.run import train_main

    return train_main(
        preset=args.preset,
        config_file=args.config,
        data_paths=args.data,
        out=args.out,
        overrides=args.overrides,
        resume=args.resume,
        argv=sys.argv,
        overwrite=args.overwrite,
    )
