"""``glassgpt inspect``: a checkpoint and a prompt in, one self-contained HTML report out."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output
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
    add_checkpoint(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the text to inspect")
    src.add_argument("--prompt-file", metavar="FILE", help="read the text from FILE (UTF-8)")
    add_output(
        p, metavar="FILE", help="where to write the page (default: report.html in the run folder)"
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
    """(model, tokenizer) through ``glassgpt.sample.loading.load``, on ``device``."""
    if not Path(path).exists():
        raise InputFileError(f"{path}: no such checkpoint folder")
    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device

    model, tokenizer = load(path, device=parse_device(device))
    if tokenizer is None:
        raise GlassError(f"{path}: has no tokenizer, so a text prompt cannot be encoded")
    return model, tokenizer


def default_output(checkpoint: str | Path) -> Path:
    """``report.html`` in the run folder of a checkpoint (or in the folder given).

    >>> default_output("runs/x/ckpt/step_000100").as_posix(), default_output("hf").as_posix()
    ('runs/x/report.html', 'hf/report.html')
    """
    p = Path(checkpoint)
    if p.parent.name == "ckpt":
        p = p.parent.parent
    elif p.name == "ckpt":
        p = p.parent
    return p / "report.html"


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
    out = write_report(args.output or default_output(args.checkpoint), html)
    print(f"wrote {out} ({len(html) / 1e6:.1f} MB, {html.count('<img ')} figures)")
    return 0
