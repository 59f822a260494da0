"""``glassgpt steer``: a steering vector from contrastive prompts, for ``sample``/``serve --steer``.

    glassgpt steer -c runs/shakespeare --positive "I love" "joy" --negative "I hate" "grief" \\
        --hook blocks.1.resid_post -o happy.safetensors
    glassgpt sample -c runs/shakespeare --steer happy.safetensors:blocks.1.resid_post:4

v = mean over the positive prompts of the activation at HOOK − the same mean over the negative
ones (:func:`glassgpt.sample.steering.contrastive_vector`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import add_checkpoint, add_device, add_output, add_tokenizer
from glassgpt.console import say
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.sample.steering import canonical_hook, contrastive_vector, save_vector
from glassgpt.sample.stops import unescape


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "v = mean over positive prompts of the activation at HOOK − the same mean over "
        "negative prompts (each prompt run alone; its last position or the mean over its "
        "positions). Use it with: glassgpt sample --steer FILE:HOOK:ALPHA."
    )
    p = parser
    add_checkpoint(p)
    p.add_argument("--positive", metavar="TEXT", nargs="+", required=True,
                   help="prompts with the property (\\n escapes allowed)")  # fmt: skip
    p.add_argument("--negative", metavar="TEXT", nargs="+", required=True,
                   help="prompts without it")  # fmt: skip
    p.add_argument("--hook", required=True, metavar="NAME",
                   help="the activation, e.g. blocks.1.resid_post (or blocks.1.hook_resid_post)")  # fmt: skip
    p.add_argument("--pos", choices=("mean", "last"), default="mean",
                   help="each prompt's activation: mean over its positions (default) or the last")  # fmt: skip
    add_output(p, required=True, metavar="FILE",
               help="the vector file (.safetensors, key 'vector'; or .npy, .pt)")  # fmt: skip
    add_device(p)
    add_tokenizer(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.suffix.lower() not in (".safetensors", ".npy", ".pt", ".pth"):
        raise GlassError(f"{out}: unknown vector format (use .safetensors, .npy or .pt)")
    device = parse_device(args.device)
    found = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device)
    tok = found.needs_tokenizer()
    hook = canonical_hook(args.hook)
    positive = [unescape(t) for t in args.positive]
    negative = [unescape(t) for t in args.negative]
    v = contrastive_vector(found.model, tok, positive, negative, hook, pos=args.pos)
    meta = {"hook": hook, "pos": args.pos, "positive": str(len(positive)),
            "negative": str(len(negative))}  # fmt: skip
    save_vector(out, v, metadata=meta)
    where = "mean over positions" if args.pos == "mean" else "last position"
    say(f"wrote {out}: {hook} ({where}), |v| = {float(v.norm()):.4g} from {len(positive)} "
        f"positive − {len(negative)} negative prompts; use it as --steer {out}:{hook}:ALPHA",
        kind=None)  # fmt: skip
    return 0
