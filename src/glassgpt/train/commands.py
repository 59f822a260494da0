"""``glassgpt train``: argument parsing only (the job lives in :mod:`glassgpt.train.run`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output, add_run_source


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a GPT on text (no arguments: a small model of the Python stdlib)",
        description=(
            "Train a GPT. With no arguments: a byte-level BPE tokenizer (512 ids) and a small "
            "GPT on this Python's standard library sources, a few minutes on 2 CPU cores. Under `torchrun --nproc_per_node=N` "
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
        help="text, .jsonl, .json or .parquet files, folders, datasets saved with save_to_disk, "
        "hf:NAME[:split] (--set data.text_field=…), or one prepared data folder (default: the "
        "stdlib corpus)",
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
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (--set train.progress=false)"
    )
    p.set_defaults(func=_handle)

    presets = subparsers.add_parser(
        "presets",
        help="list the presets of train and describe, one line each",
        description="The presets that `glassgpt train --preset` and `glassgpt describe "
        "--preset` take (one list), each with its one-line description.",
    )
    presets.set_defaults(func=_presets)
    register_eval(subparsers)


def register_eval(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="loss, perplexity and bits per byte of a model on text files",
        description="Evaluate a checkpoint (or HF GPT-2 folder) on text files, or on a split of a "
        "prepared data folder: mean next-token loss, perplexity, and bits per byte (which "
        "compares models across tokenizers). Without --data, a run is evaluated on its own "
        "validation split as its trainer did (the same windows, train.eval_batches of them, "
        "and precision): the trainer's validation loss for those weights.",
    )
    add_checkpoint(p)
    p.add_argument(
        "--data",
        metavar="PATH",
        nargs="+",
        action="extend",
        help="text files or folders, or one prepared data folder (default: the run's own "
        "validation windows, as its trainer measured them)",
    )
    p.add_argument(
        "--split", default="val", help="with a prepared folder: the split (default: val)"
    )
    p.add_argument("--seq-len", type=int, default=None,
                   help="window length (default: the run's train.seq_len, else n_ctx)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=None,
                   help="windows per forward pass (default: the run's, else 8)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", default=None,
                   help="float32, bf16 (weights and compute) or int8 (weights; CPU); default: "
                   "float32, or on a run's own split its training precision")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)


def _presets(args: argparse.Namespace) -> int:
    from glassgpt.train.resolve import preset_descriptions

    rows = preset_descriptions()
    width = max(len(name) for name, _ in rows)
    for name, description in rows:
        print(f"{name:{width}}  {description}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import json

    from glassgpt.train.evaluate import evaluate_command

    result = evaluate_command(
        args.checkpoint,
        args.data,
        split=args.split,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        progress=not (args.no_progress or args.json),
    )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"loss {result['loss']:.4f} | perplexity {result['perplexity']:.3f} | "
            f"{result['bits_per_byte']:.4f} bits/byte | {result['tokens']:,} tokens, "
            f"{result['bytes']:,} bytes ({result['source']})"
        )
    return 0


def _handle(args: argparse.Namespace) -> int:
    from glassgpt.train.run import train_main

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
    )
