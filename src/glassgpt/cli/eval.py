"""``glassgpt eval``: a model's loss, perplexity and bits per byte on text, or, with
``--tasks``, lm-evaluation-harness tasks run on the model itself.

    glassgpt eval -c runs/default                        # the run's own validation windows
    glassgpt eval -c runs/gpt2 --data notes.txt --json
    glassgpt eval -c runs/gpt2 --tasks hellaswag,lambada_openai --limit 200 -o results.json

The loss is :func:`glassgpt.train.evaluate.evaluate_command`'s (the trainer's evaluation
windows); the tasks are :func:`glassgpt.sample.lm_eval_adapter.run_tasks`' (batched on the
model's KV cache; needs ``pip install 'glassgpt[eval]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

from glassgpt.cli.arguments import (
    add_checkpoint,
    add_device,
    add_json,
    add_no_progress,
    add_output,
    add_seed,
)
from glassgpt.errors import GlassError
from glassgpt.sample.lm_eval_adapter import run_tasks
from glassgpt.storage import atomic_write
from glassgpt.train.evaluate import evaluate_command

TASK_FLAGS = ("--output", "--limit", "--num-fewshot", "--include-path")


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Evaluate a checkpoint (or HF model folder) on text files, or on a split of a "
        "prepared data folder: mean next-token loss, perplexity, and bits per byte (which "
        "compares models across tokenizers). Without --data, a run is evaluated on its own "
        "validation split as its trainer did (the same windows, train.eval_batches of them, "
        "and precision): the trainer's validation loss for those weights. With --tasks, "
        "lm-evaluation-harness tasks (hellaswag, lambada_openai, ...; needs pip install "
        "'glassgpt[eval]') are run on the model itself, batched on its KV cache."
    )
    add_checkpoint(parser)
    parser.add_argument(
        "--data",
        metavar="PATH",
        nargs="+",
        action="extend",
        help="text files or folders, or one prepared data folder (default: the run's own "
        "validation windows, as its trainer measured them)",
    )
    parser.add_argument(
        "--split", default="val", help="with a prepared folder: the split (default: val)"
    )
    parser.add_argument("--seq-len", type=int, default=None,
                        help="window length (default: the run's train.seq_len, else n_ctx)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=None,
                        help="windows per forward pass (default: the run's, else 8)")  # fmt: skip
    add_device(parser, default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default=None,
                        help="float32, bf16 (weights and compute) or int8 (weights; CPU); "
                        "default: float32, or on a run's own split its training precision")  # fmt: skip
    add_json(parser)
    add_no_progress(parser)
    g = parser.add_argument_group("lm-evaluation-harness (pip install 'glassgpt[eval]')")
    g.add_argument("--tasks", metavar="NAMES", action="append",
                   help="comma-separated lm-eval task names, e.g. hellaswag,lambada_openai "
                   "(`lm-eval ls tasks` lists them)")  # fmt: skip
    g.add_argument("--num-fewshot", type=int, default=None,
                   help="few-shot examples per prompt (default: each task's own)")  # fmt: skip
    g.add_argument("--limit", type=float, default=None,
                   help="at most N items per task (a fraction of each when below 1)")  # fmt: skip
    g.add_argument("--include-path", metavar="DIR", action="append", default=[],
                   help="a folder of your own task YAML files (repeatable)")  # fmt: skip
    g.add_argument("--bootstrap-iters", type=int, default=100_000,
                   help="bootstrap resamples for the standard errors (0: none)")  # fmt: skip
    add_seed(g, default=0, help="few-shot sampling and sampled generation (default 0)")
    add_output(g, metavar="FILE", help="also write lm-eval's results as JSON to FILE")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The loss mode, or with ``--tasks`` the harness's."""
    if args.tasks:
        return run_harness(args)
    for flag, value in zip(TASK_FLAGS, (args.output, args.limit, args.num_fewshot,
                                        args.include_path)):  # fmt: skip
        if value:
            raise GlassError(f"{flag} goes with --tasks (lm-evaluation-harness tasks)")
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


def run_harness(args: argparse.Namespace) -> int:
    """``--tasks``: lm-eval's results as its table (or JSON), and to ``-o FILE``."""
    if args.data:
        raise GlassError("--data and --tasks: a task brings its own data; give one of them")
    if importlib.util.find_spec("lm_eval") is None:
        raise GlassError("lm-eval is not installed: pip install 'glassgpt[eval]'")
    results = run_tasks(
        args.checkpoint, args.tasks, num_fewshot=args.num_fewshot, limit=args.limit,
        batch_size=args.batch_size, device=args.device, dtype=args.dtype,
        include_path=args.include_path, bootstrap_iters=args.bootstrap_iters, seed=args.seed,
        progress=not (args.no_progress or args.json),
    )  # fmt: skip
    text = json.dumps(results, indent=2, default=str, ensure_ascii=False) + "\n"
    if args.output:
        atomic_write(args.output, text.encode("utf-8"))
    if args.json:
        print(json.dumps({k: results[k] for k in ("results", "n-shot", "versions")
                          if k in results}, default=str))  # fmt: skip
    else:
        from lm_eval.utils import make_table  # the optional extra: glassgpt[eval]

        print(make_table(results))
        if results.get("groups"):
            print(make_table(results, "groups"))
    return 0
