"""``glassgpt inspect``: a checkpoint and a prompt in, one self-contained HTML report out.

The page (:func:`glassgpt.inspect.report.build_report`): predictions and per-token loss, logit
lens, direct logit attribution, attention patterns, head scores, composition scores and one
head's QK/OV circuits.

    glassgpt inspect -c runs/shakespeare --prompt "ROMEO:" [--layer 1 --head 2] [-o report.html]
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
from glassgpt.inspect.report import build_report, default_output, write_report


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a trained model on a prompt and write one self-contained HTML page: "
        "predictions and per-token loss, logit lens, direct logit attribution, attention "
        "patterns, head scores, composition scores and one head's QK/OV circuits."
    )
    add_checkpoint(parser)
    add_prompt(
        parser,
        required=True,
        help="the text to inspect",
        file_help="read the text from FILE (UTF-8)",
    )
    add_output(
        parser,
        metavar="FILE",
        help="where to write the page (default: report.html in the run folder)",
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
    prompt = read_prompt(args)
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
