"""``glassgpt inspect``: a checkpoint and a prompt in, one self-contained HTML report out."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError, InputFileError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="an HTML report of a model's circuits on a prompt",
        description=(
            "Run a trained model on a prompt and write one self-contained HTML page: "
            "predictions and per-token loss, logit lens, direct logit attribution, attention "
            "patterns, head scores, composition scores and one head's QK/OV circuits."
        ),
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint or HF folder")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the text to inspect")
    src.add_argument("--prompt-file", metavar="FILE", help="read the text from FILE (UTF-8)")
    p.add_argument(
        "--output", default="report.html", metavar="FILE", help="where to write the page"
    )
    p.add_argument("--layer", type=int, help="layer of the head whose circuits are detailed")
    p.add_argument("--head", type=int, help="head (in --layer) to detail; default: best induction")
    p.add_argument(
        "--activations",
        nargs="+",
        default=[],
        metavar="NAME",
        help="activations to summarise (names or sites, e.g. blocks.0.attn.z or resid_post)",
    )
    p.add_argument(
        "--seq-len", type=int, help="length of the random sequences for head scores (repeated)"
    )
    p.add_argument(
        "--device", default="cpu", metavar="DEV", help="where to run the model: cpu, cuda, cuda:N"
    )
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    path = Path(args.prompt_file)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the prompt ({e.strerror or e})") from None


def load_model(path: str, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) through ``glassgpt.load``, on ``device``."""
    if not Path(path).exists():
        raise InputFileError(f"{path}: no such checkpoint folder")
    import glassgpt
    from glassgpt.sample.loading import parse_device

    where = parse_device(device)
    try:
        model, tokenizer = glassgpt.load(path, device=where)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("glassgpt"):
            raise GlassError(f"cannot load {path}: this build has no checkpoint loader") from None
        raise
    if tokenizer is None:
        raise GlassError(f"{path}: has no tokenizer, so a text prompt cannot be encoded")
    return model, tokenizer


def run(args: argparse.Namespace) -> int:
    from glassgpt.inspect.report import build_report, write_report

    prompt = read_prompt(args)
    model, tokenizer = load_model(args.checkpoint, args.device)
    html = build_report(
        model,
        tokenizer,
        prompt,
        layer=args.layer,
        head=args.head,
        names=args.activations,
        seq_len=args.seq_len,
        title=f"glassgpt inspect: {args.checkpoint}",
    )
    out = write_report(args.output, html)
    print(f"wrote {out} ({len(html) / 1e6:.1f} MB, {html.count('<img ')} figures)")
    return 0
