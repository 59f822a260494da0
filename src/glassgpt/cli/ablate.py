"""``glassgpt ablate``: the effect of ablating heads, MLPs or neurons on a prompt.

The prompt's loss and its next-token distribution at the last position, before and after
replacing the listed components (zero, mean or resample; ``--keep``: everything else), by
:func:`glassgpt.inspect.ablation.run_ablated`; ``-o`` also writes them as JSON.

    glassgpt ablate -c RUN --prompt "def f(x):" --heads 0.1,1.3 [--how mean] [-o effect.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import (
    add_checkpoint,
    add_device,
    add_output,
    add_prompt,
    add_seed,
    add_tokenizer,
    read_prompt,
)
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError, InputFileError
from glassgpt.inspect import ablation, metrics
from glassgpt.inspect.cache import as_batch, evaluating, run_with_hooks
from glassgpt.inspect.report import encode_prompt
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.display import token_texts


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replace the listed components (zero, their mean or another prompt's value; with "
        "--keep every component not listed) and report the prompt's loss and the "
        "next-token distribution at its last position, before and after."
    )
    add_checkpoint(parser)
    add_prompt(
        parser, required=True, help="the text to run", file_help="read the text from FILE (UTF-8)"
    )
    parser.add_argument("--heads", default="", metavar="L.H,...", help="heads, e.g. 0.1,1.3")
    parser.add_argument("--mlps", default="", metavar="L,...", help="whole MLP layers, e.g. 0,2")
    parser.add_argument("--neurons", default="", metavar="L:I,...", help="MLP neurons, e.g. 1:17")
    parser.add_argument("--how", choices=("zero", "mean", "resample"), default="zero")
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument(
        "--reference",
        metavar="TEXT",
        help="the prompt whose activations mean/resample use (mean default: the prompt)",
    )
    ref.add_argument(
        "--reference-file",
        metavar="FILE",
        help="reference prompts, one per line (mean: averaged; resample: rows drawn at random)",
    )
    parser.add_argument("--keep", action="store_true", help="ablate everything NOT listed")
    parser.add_argument(
        "--top", type=int, default=5, metavar="K", help="next tokens shown (default 5)"
    )
    add_seed(parser, default=0, help="seed of the resampled rows")
    add_output(parser, metavar="FILE", help="also write the effect as JSON to FILE")
    add_device(parser)
    add_tokenizer(parser)
    parser.set_defaults(func=run)


def parse_list(text: str, flag: str, sep: str | None = None) -> list[Any]:
    """``"0.1,1.2"`` → [(0, 1), (1, 2)] with sep ``"."``; ``"0,2"`` → [0, 2] without sep.

    >>> parse_list("0.1, 1.2", "--heads", "."), parse_list("3:7", "--neurons", ":"), parse_list("", "--mlps")
    ([(0, 1), (1, 2)], [(3, 7)], [])
    """
    out: list[Any] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.split(sep) if sep else [item]
        try:
            numbers = [int(x) for x in parts]
        except ValueError:
            numbers = []
        if len(numbers) != (2 if sep else 1):
            form = f"L{sep}{'H' if sep == '.' else 'I'}" if sep else "L"
            raise GlassError(f"{flag}: {item!r} is not of the form {form} (integers)")
        out.append(tuple(numbers) if sep else numbers[0])
    return out


def read_references(args: argparse.Namespace) -> list[str] | None:
    """The texts of ``--reference`` or ``--reference-file`` (one per non-blank line)."""
    if args.reference is not None:
        return [args.reference]
    if args.reference_file is None:
        return None
    path = Path(args.reference_file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the references ({e.strerror or e})") from None
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise InputFileError(f"{path}: holds no reference prompt (one per line)")
    return texts


def run(args: argparse.Namespace) -> int:
    heads = parse_list(args.heads, "--heads", ".")
    mlps = parse_list(args.mlps, "--mlps")
    neurons = parse_list(args.neurons, "--neurons", ":")
    if args.top < 1:
        raise GlassError(f"--top must be at least 1, got {args.top}")
    if not (heads or mlps or neurons or args.keep):
        raise GlassError("nothing to ablate: give --heads, --mlps or --neurons (or --keep)")
    prompt = read_prompt(args)
    device = parse_device(args.device)
    loaded = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device)
    model, tokenizer = loaded.model, loaded.needs_tokenizer()
    ids = encode_prompt(model, tokenizer, prompt)
    if len(ids) < 2:
        raise GlassError("the prompt is 1 token: the loss needs at least 2 (one to predict)")
    texts = read_references(args)
    refs = None if texts is None else [encode_prompt(model, tokenizer, t) for t in texts]
    if args.how == "zero" and refs is not None:
        raise GlassError("--reference is for --how mean or resample, not zero")
    reference: Any = None
    if refs is not None and args.how == "mean":
        reference = [as_batch(model, r) for r in refs]  # batches of one prompt each
    elif refs is not None:
        short = min(len(r) for r in refs)
        if short < len(ids):
            raise GlassError(
                f"resampling needs references at least as long as the prompt ({len(ids)} "
                f"tokens); the shortest is {short}"
            )
        rows = [t for r in refs for t in r[: len(ids)]]
        reference = as_batch(model, rows).reshape(len(refs), len(ids))  # [n_refs, T]
    tokens = as_batch(model, ids)  # [1, T]
    plan = ablation.ablated_components(model, heads, mlps, neurons, args.keep)
    with evaluating(model):
        before = run_with_hooks(model, tokens, {})
        after = ablation.run_ablated(
            model,
            tokens,
            heads=heads,
            mlps=mlps,
            neurons=neurons,
            how=args.how,
            reference=reference,
            keep=args.keep,
            seed=args.seed,
            shuffle=reference is not None and args.how == "resample" and len(refs or []) > 1,
        )
    loss = metrics.loss(ids)
    loss_before, loss_after = float(loss(before)), float(loss(after))
    shift = ablation.next_token_shift(before, after, args.top)
    rows_out = [
        {"token": t, "id": i, "before": b, "after": a}
        for t, i, b, a in zip(
            token_texts(tokenizer, shift.ids), shift.ids, shift.before, shift.after, strict=True
        )
    ]
    ablated = {
        "heads": [f"{l}.{h}" for l, hs in plan.heads.items() for h in hs],
        "mlps": plan.mlps,
        "neurons": [f"{l}:{i}" for l, idx in plan.neurons.items() for i in idx],
    }
    n = len(ablated["heads"]) + len(ablated["mlps"]) + len(ablated["neurons"])
    print(
        f"ablated ({args.how}{', keep' if args.keep else ''}): {n} components"
        + "".join(
            f"; {kind} {', '.join(map(str, v))}" for kind, v in ablated.items() if v and n <= 24
        )
    )
    print(
        f"loss (mean next-token, nats): {loss_before:.4f} → {loss_after:.4f} "
        f"({loss_after - loss_before:+.4f})"
    )
    print(
        "KL(before ‖ after) of the next-token distribution at the last position: "
        f"{shift.kl:.4f} nats"
    )
    width = max(12, *(len(repr(r["token"])) + 1 for r in rows_out))
    print(f"{'next token':<{width}} {'before':>8} {'after':>8}")
    for r in rows_out:
        print(f"{r['token']!r:<{width}} {r['before']:8.4f} {r['after']:8.4f}")
    if args.output:
        out = Path(args.output)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputFileError(f"{out}: cannot write ({e.strerror or e})") from None
        doc = {
            "checkpoint": str(args.checkpoint),
            "prompt": prompt,
            "tokens": token_texts(tokenizer, ids),
            "how": args.how,
            "keep": args.keep,
            "ablated": ablated,
            "loss": {"before": loss_before, "after": loss_after},
            "kl_next_token": shift.kl,
            "next_token": rows_out,
        }
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        atomic_write(out, text.encode("utf-8"))
        print(f"wrote {out}")
    return 0
