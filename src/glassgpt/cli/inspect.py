"""``glassgpt inspect``: a checkpoint and a prompt in, one self-contained HTML report out.

The page (:func:`glassgpt.inspect.report.build_report`): predictions and per-token loss, logit
lens, direct logit attribution, attention patterns, head scores, composition scores and one
head's QK/OV circuits.

    glassgpt inspect -c runs/shakespeare --prompt "ROMEO:" [--layer 1 --head 2] [-o report.html]

Over a series of checkpoints (:mod:`glassgpt.inspect.series`), the head scores against the
training step, as a PNG and a JSON beside it:

    glassgpt inspect --over-checkpoints "hf:EleutherAI/pythia-70m@step{1000..143000..1000}"
    glassgpt inspect --over-checkpoints runs/shakespeare -o circuits_over_steps.png
"""

from __future__ import annotations

import argparse

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import (
    add_checkpoint,
    add_device,
    add_output,
    add_prompt,
    add_tokenizer,
    read_prompt,
)
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.inspect.report import build_report, default_output, write_report
from glassgpt.inspect.series import expand_series, scores_over_checkpoints, write_series


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a trained model on a prompt and write one self-contained HTML page: "
        "predictions and per-token loss, logit lens, direct logit attribution, attention "
        "patterns, head scores, composition scores and one head's QK/OV circuits."
    )
    add_checkpoint(parser, required=False)
    add_prompt(
        parser,
        required=False,
        help="the text to inspect",
        file_help="read the text from FILE (UTF-8)",
    )
    add_output(
        parser,
        metavar="FILE",
        help="where to write the page (default: report.html in the run folder); with "
        "--over-checkpoints the PNG (default: head_scores_over_checkpoints.png), JSON beside it",
    )
    parser.add_argument(
        "--over-checkpoints",
        metavar="SERIES",
        help="draw the head scores against the training step over a series of checkpoints: "
        "hf:ORG/NAME@step{1000..143000..1000} (a range with a step), @step{0,512,1000} or "
        "@step1000,step2000 (lists), or a run folder (its step_* checkpoints); no --prompt",
    )
    parser.add_argument("--layer", type=int, help="layer of the head whose circuits are detailed")
    parser.add_argument(
        "--head", type=int, help="head (in --layer) to detail; default: best induction"
    )
    parser.add_argument(
        "--activations",
        nargs="+",
        default=[],
        metavar="NAME",
        help="activations to summarise (names or sites, e.g. blocks.0.attn.z or resid_post)",
    )
    parser.add_argument(
        "--seq-len", type=int, help="length of the random sequences for head scores (repeated)"
    )
    add_device(parser)
    add_tokenizer(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.over_checkpoints is not None:
        return run_series(args)
    prompt = read_prompt(args)
    if args.checkpoint is None or prompt is None:
        raise GlassError(
            "inspect needs -c/--checkpoint and --prompt (or --over-checkpoints SERIES)"
        )
    device = parse_device(args.device)  # a device this machine lacks: before any loading
    loaded = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device)
    tokenizer = loaded.needs_tokenizer()
    html = build_report(
        loaded.model,
        tokenizer,
        prompt,
        layer=args.layer,
        head=args.head,
        names=args.activations,
        seq_len=args.seq_len,
        title=f"glassgpt inspect: {args.checkpoint}",
    )
    out = write_report(args.output or default_output(args.checkpoint), html)
    print(f"wrote {out} ({len(html) / 1e6:.1f} MB, {html.count('<img ')} figures)")
    return 0


def run_series(args: argparse.Namespace) -> int:
    """``--over-checkpoints``: head scores of every checkpoint of the series, drawn and saved."""
    if args.checkpoint is not None or read_prompt(args) is not None:
        raise GlassError("--over-checkpoints takes the series alone (no -c, no --prompt)")
    device = parse_device(args.device)
    points = expand_series(args.over_checkpoints)
    records = scores_over_checkpoints(points, seq_len=args.seq_len, device=device)
    png, data = write_series(
        records, args.output or "head_scores_over_checkpoints.png", args.over_checkpoints
    )
    print(f"wrote {png} and {data} ({len(records)} checkpoints)")
    return 0
