"""``glassgpt train``: train a GPT (the job: :func:`glassgpt.train.run.train_main`).

    glassgpt train                                  # a small model of the Python stdlib
    glassgpt train --preset gpt2 --data hf:NAME -o runs/gpt2 --set train.max_steps=5000
    glassgpt train --resume runs/gpt2
    torchrun --nproc_per_node=8 -m glassgpt train --preset gpt2 ...

The trainer's periodic samples (``train.sample_tokens`` tokens after each evaluation) are
drawn by :func:`glassgpt.sample.generate`: this command hands the job the sampler
(:func:`glassgpt.sample.training.periodic_sampler`), since ``train`` sits below ``sample``.
"""

from __future__ import annotations

import argparse
import sys

from glassgpt.cli.arguments import add_output, add_run_source
from glassgpt.sample.training import periodic_sampler
from glassgpt.train.run import train_main


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a GPT. With no arguments: a byte-level BPE tokenizer (512 ids) and a small GPT "
        "on this Python's standard library sources, a few minutes on 2 CPU cores. Under "
        "`torchrun --nproc_per_node=N` the same command trains with DistributedDataParallel."
    )
    add_run_source(
        parser,
        preset_help="a preset (default: default; glassgpt presets lists them)",
        example="train.max_steps=500 model.n_layers=2",
    )
    parser.add_argument(
        "--data",
        metavar="PATH",
        nargs="+",
        action="extend",
        help="text, .jsonl, .json or .parquet files, folders, datasets saved with save_to_disk, "
        "hf:NAME[:split] (--set data.text_field=…), or one prepared data folder (default: the "
        "stdlib corpus)",
    )
    add_output(parser, metavar="DIR", help="run folder (default: runs/<preset>)")
    parser.add_argument("--resume", metavar="DIR", help="continue a run from its latest checkpoint")
    parser.add_argument(
        "--init-from",
        metavar="DIR",
        help="fine-tune: start from a glassgpt run or an HF model folder (its weights, "
        "architecture and tokenizer); --set may change only shape-free model fields",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --output already holds (a fresh run never mixes with an old one)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (--set train.progress=false)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return train_main(
        preset=args.preset,
        config_file=args.config,
        data_paths=args.data,
        out=args.output,
        overrides=[*args.overrides, *(["train.progress=false"] if args.no_progress else [])],
        resume=args.resume,
        argv=sys.argv,
        overwrite=args.overwrite,
        init_from=args.init_from,
        sampler=periodic_sampler,
    )
