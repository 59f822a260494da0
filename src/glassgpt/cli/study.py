"""``glassgpt study induction``: the induction circuit of a run, found and tested, in one command.

Without ``-c`` it first trains the preset (``induction-2l``: a 2-layer attention-only GPT on
the embedded corpus) into ``OUT/run`` (continuing it if a run is already there); with
``--synthetic`` it trains the toy model of :mod:`glassgpt.train.synthetic` instead. Then
:func:`glassgpt.inspect.induction.run_induction_study` writes its figures and
``results.json`` into ``OUT`` (docs/experiments.md).

    glassgpt study induction [-c RUN | --synthetic] [-o studies/induction]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glassgpt.checkpoint import load
from glassgpt.cli.arguments import add_checkpoint, add_device, add_output, add_overrides, add_seed
from glassgpt.devices import parse_device
from glassgpt.inspect.induction import run_induction_study, summary
from glassgpt.sample.training import periodic_sampler
from glassgpt.train.run import train_main
from glassgpt.train.synthetic import train_synthetic

PRESET = "induction-2l"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Rerun one of glassgpt's documented studies (docs/experiments.md)."
    studies = parser.add_subparsers(dest="study", metavar="STUDY", required=True)
    p = studies.add_parser(
        "induction",
        help="the induction circuit: head scores, composition, patching, ablation",
        description=(
            "Find the previous-token and induction heads of a model and test the circuit they "
            "form: head scores, K-composition against random matrices, activation and path "
            "patching on repeated random tokens, ablation. Without -c, trains the "
            f"{PRESET} preset first (into OUT/run)."
        ),
    )
    source = p.add_mutually_exclusive_group()
    add_checkpoint(
        source, required=False, help="the run to study (default: train the preset into OUT/run)"
    )
    source.add_argument(
        "--synthetic",
        action="store_true",
        help="study a toy model trained in seconds on repeated segments (32 ids, context 16)",
    )
    add_output(
        p, default="studies/induction", metavar="DIR", help="where to write (default: %(default)s)"
    )
    p.add_argument(
        "--preset", default=PRESET, help="the preset to train without -c (default: %(default)s)"
    )
    add_overrides(p, example="train.threads=1")
    p.add_argument(
        "--seq-len", type=int, help="n of the random sequences repeated (default: min(n_ctx/2, 32))"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=16,
        help="random sequences per measurement (default: %(default)s)",
    )
    add_seed(p, default=0, help="seed of the random sequences (default: %(default)s)")
    add_device(p)
    p.set_defaults(func=run_induction)


def train_preset(run: Path, preset: str, overrides: list[str]) -> int:
    """Train ``preset`` into the run folder ``run`` (continue it if it holds a run); the
    trainer's exit status."""
    resume = str(run) if (run / "ckpt").is_dir() else None
    return train_main(
        preset=None if resume else preset,
        out=str(run),
        overrides=overrides,
        resume=resume,
        argv=sys.argv,
        sampler=periodic_sampler,
    )


def run_induction(args: argparse.Namespace) -> int:
    out = Path(args.output)
    device = parse_device(args.device)
    if args.synthetic:
        model = train_synthetic().to(device)
        seq_len = args.seq_len or model.config.n_ctx // 2
    else:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = out / "run"
            status = train_preset(checkpoint, args.preset, args.overrides)
            if status:
                return status
        model, _ = load(checkpoint, device=device)
        seq_len = args.seq_len
    r = run_induction_study(model, out, seq_len=seq_len, batch=args.batch, seed=args.seed)
    print(summary(r))
    print(f"wrote {out / 'results.json'} and {len(r['figures'])} figures in {out}")
    return 0
