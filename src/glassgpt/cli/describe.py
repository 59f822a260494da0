"""``glassgpt describe``: print the GPT function of a config as mathematics (Markdown or LaTeX).

    glassgpt describe --preset gpt2 --set n_layers=2 --format latex
    glassgpt describe -c runs/default --world-size 8

The config is a preset (``--preset gpt2``: the same list as ``glassgpt train``), a TOML file
(``--config FILE``: its ``[model]`` table if it has one, else the whole file; a
``preset = "NAME"`` key in that table starts from that preset's model), or a trained model
(``-c/--checkpoint DIR``: a run folder, a checkpoint, or an HF model folder, whose tokenizer's
map Text → V* is printed after the function: :mod:`glassgpt.tokenizer.pipeline`); then
``--set key=value`` overrides (``--set n_layers=2``; ``model.`` may be left out), resolved as
``train`` resolves them (:func:`glassgpt.train.model_config.resolve_config`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import add_checkpoint, add_output, add_run_source
from glassgpt.model.describe import describe
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.pipeline import pipeline_latex, pipeline_markdown
from glassgpt.train.model_config import resolve_config


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print f : V^n -> Delta(V)^n for a config: each map with its domain, codomain and "
        "shapes, the block equations of the chosen variants, the parameter table, FLOPs per "
        "token and training memory."
    )
    source = add_run_source(
        parser,
        required=True,
        config_help="a TOML file ([model] table), or a run folder",
        example="n_layers=2",
    )
    add_checkpoint(source, required=False)
    parser.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    parser.add_argument(
        "--seq-len", type=int, default=None, help="context T for FLOPs and memory (default n_ctx)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="batch B for the memory estimate")
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="also the memory of each of N data-parallel ranks, DDP and FSDP (B per rank)",
    )
    add_output(parser, help="write here instead of stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config_file = Path(args.config) if args.config else None
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    config, title = resolve_config(args.preset, config_file, args.overrides, checkpoint)
    text = describe(
        config,
        fmt=args.format,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        name=title,
        world_size=args.world_size,
    )
    tok = open_run(checkpoint, weights=False).tokenizer if checkpoint is not None else None
    if tok is not None and args.format == "markdown":
        text = text.rstrip("\n") + "\n\n" + pipeline_markdown(tok)
    elif tok is not None:  # the tokenizer's subsection, before \end{document}
        body, end = text.rstrip("\n").rsplit("\n", 1)
        text = f"{body}\n{pipeline_latex(tok)}\n{end}\n"
    if args.output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    atomic_write(Path(args.output), text.encode("utf-8"))
    return 0
