"""``glassgpt train``: argument parsing only (the job lives in :mod:`glassgpt.train.run`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from glassgpt.arguments import add_output, add_run_source


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
    add_run_source(
        p,
        preset_help="a preset (default: default; glassgpt presets lists them)",
        example="train.max_steps=500 model.n_layers=2",
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        nargs="+",
        action="extend",
        help="text files or folders, or one prepared data folder (default: the stdlib corpus)",
    )
    add_output(p, metavar="DIR", help="run folder (default: runs/<preset>)")
    p.add_argument("--resume", metavar="DIR", help="continue a run from its latest checkpoint")
    p.add_argument(
        "--init-from",
        metavar="DIR",
        help="fine-tune: start from a glassgpt run or an HF GPT-2 folder (its weights, "
        "architecture and tokenizer); --set may change only shape-free model fields",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --output already holds (a fresh run never mixes with an old one)",
    )
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    from glassgpt.train.run import train_main

    return train_main(
        preset=args.preset,
        config_file=args.config,
        data_paths=args.data,
        out=args.output,
        overrides=args.overrides,
        resume=args.resume,
        argv=sys.argv,
        overwrite=args.overwrite,
        init_from=args.init_from,
    )
