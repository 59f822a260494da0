"""``glassgpt eval --tasks``: lm-evaluation-harness tasks, on top of ``eval``'s own parser.

    glassgpt eval -c runs/gpt2 --tasks hellaswag,lambada_openai --limit 200
    glassgpt eval -c RUN --tasks my_task --include-path tasks/ -o results.json

``eval`` lives in the train stage (loss, perplexity and bits per byte on text), but the
harness needs batched generation and the KV cache, which are the sample stage's, and a stage
imports only the stages before it. So this module, registered after the train stage's, adds
the harness's flags to the parser ``train`` built and routes ``--tasks`` here (to
:mod:`glassgpt.sample.lm_eval_adapter`); without ``--tasks``, ``eval`` is what it was.
Light at import: lm_eval and torch load in the handler.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from glassgpt.cli.arguments import add_output
from glassgpt.errors import GlassError


def register(subparsers: Any) -> None:
    """Add the harness's flags to ``eval`` (which the train stage registered before)."""
    p = subparsers.choices["eval"]
    p.description += (
        " With --tasks, lm-evaluation-harness tasks (hellaswag, lambada_openai, ...; needs "
        "pip install 'glassgpt[eval]') are run on the model itself, batched on its KV cache."
    )
    g = p.add_argument_group("lm-evaluation-harness (pip install 'glassgpt[eval]')")
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
    g.add_argument("--seed", type=int, default=0,
                   help="few-shot sampling and sampled generation (default 0)")  # fmt: skip
    add_output(g, metavar="FILE", help="also write lm-eval's results as JSON to FILE")
    p.set_defaults(func=_dispatch(p.get_default("func")))


def _dispatch(plain: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        if args.tasks:
            return _tasks(args)
        for flag, value in (("--output", args.output), ("--limit", args.limit),
                            ("--num-fewshot", args.num_fewshot),
                            ("--include-path", args.include_path)):  # fmt: skip
            if value:
                raise GlassError(f"{flag} goes with --tasks (lm-evaluation-harness tasks)")
        return plain(args)

    return handle


def _tasks(args: argparse.Namespace) -> int:
    import importlib.util

    if args.data:
        raise GlassError("--data and --tasks: a task brings its own data; give one of them")
    if importlib.util.find_spec("lm_eval") is None:
        raise GlassError("lm-eval is not installed: pip install 'glassgpt[eval]'")
    from glassgpt.sample.lm_eval_adapter import run_tasks

    results = run_tasks(
        args.checkpoint, args.tasks, num_fewshot=args.num_fewshot, limit=args.limit,
        batch_size=args.batch_size, device=args.device, dtype=args.dtype,
        include_path=args.include_path, bootstrap_iters=args.bootstrap_iters, seed=args.seed,
        progress=not (args.no_progress or args.json),
    )  # fmt: skip
    text = json.dumps(results, indent=2, default=str, ensure_ascii=False) + "\n"
    if args.output:
        from glassgpt.storage import atomic_write

        atomic_write(args.output, text.encode("utf-8"))
    if args.json:
        print(json.dumps({k: results[k] for k in ("results", "n-shot", "versions")
                          if k in results}, default=str))  # fmt: skip
    else:
        from lm_eval.utils import make_table

        print(make_table(results))
        if results.get("groups"):
            print(make_table(results, "groups"))
    return 0
