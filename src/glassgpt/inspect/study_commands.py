"""``glassgpt study induction``: the induction circuit of a run, found and tested, in one command.

Without ``-c`` it first trains the preset (``induction-2l``: a 2-layer attention-only GPT on
the embedded corpus) into ``OUT/run`` (continuing it if a run is already there), then runs
:func:`glassgpt.inspect.induction.run_induction_study` and writes its figures and
``results.json`` into ``OUT``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output, add_overrides

PRESET = "induction-2l"


def register(sub: Any) -> None:
    study = sub.add_parser(
        "study",
        help="a built-in interpretability study (induction)",
        description="Rerun one of glassgpt's documented studies (docs/experiments.md).",
    )
    studies = study.add_subparsers(dest="study", metavar="STUDY", required=True)
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
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random sequences (default: %(default)s)"
    )
    p.add_argument(
        "--device", default="cpu", metavar="DEV", help="where to run the study: cpu, cuda, cuda:N"
    )
    p.set_defaults(func=run_induction)


def train_preset(out: Path, preset: str, overrides: list[str]) -> Path:
    """Train ``preset`` into ``out / "run"`` (continue it if it holds a run); the run folder."""
    from glassgpt.train.run import train_main

    run = out / "run"
    resume = str(run) if (run / "ckpt").is_dir() else None
    status = train_main(
        preset=None if resume else preset,
        out=str(run),
        overrides=overrides,
        resume=resume,
        argv=sys.argv,
    )
    if status:
        raise SystemExit(status)
    return run


def run_induction(args: argparse.Namespace) -> int:
    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.inspect.induction import run_induction_study

    out = Path(args.output)
    if args.synthetic:
        from glassgpt.inspect.induction import train_synthetic

        model = train_synthetic().to(parse_device(args.device))
        seq_len = args.seq_len or model.config.n_ctx // 2
    else:
        checkpoint = args.checkpoint or train_preset(out, args.preset, args.overrides)
        model, _ = load(checkpoint, device=parse_device(args.device))
        seq_len = args.seq_len
    r = run_induction_study(model, out, seq_len=seq_len, batch=args.batch, seed=args.seed)
    print(summary(r))
    print(f"wrote {out / 'results.json'} and {len(r['figures'])} figures in {out}")
    return 0


def summary(r: dict[str, Any]) -> str:
    """A few lines: the pair, its scores and what each intervention found."""
    (l1, h1), (l2, h2) = r["heads"]["previous_token"], r["heads"]["induction"]
    k = r["composition"]["k"]
    lines = [
        f"previous-token head L{l1}H{h1} (score {r['head_scores']['previous_token'][l1][h1]:.2f}), "
        f"induction head L{l2}H{h2} (score {r['head_scores']['induction'][l2][h2]:.2f})",
        f"loss on r r: first copy {r['loss']['first_half']:.2f}, repeated copy "
        f"{r['loss']['second_half']:.2f} nats",
        f"K-composition L{l1}H{h1} → L{l2}H{h2}: {k['pair']:.3f} (random matrices "
        f"{k['random_mean']:.3f} ± {k['random_std']:.3f})",
    ]
    gap = r["patching_metric"]["gap"]
    if gap < 1.0:
        lines.append(
            f"note: the clean run predicts the repeated tokens only {gap:.2f} nats better than "
            "the corrupted one: there is little induction to localise, and the normalised "
            "patching and ablation shares below are dominated by noise"
        )
    a = r["activation_patching"]
    if "pair" in a:
        lines.append(
            f"activation patching (z, all positions): previous-token {a['pair']['previous_token']:.2f}, "
            f"induction {a['pair']['induction']:.2f}, best other head {a['best_other_head']:.2f}"
        )
    p = r["path_patching"]
    if "k" in p:
        lines.append(
            f"path patching L{l1}H{h1} → L{l2}H{h2}: q {p['q']:.2f}, k {p['k']:.2f}, v {p['v']:.2f}"
        )
    b = r["ablation"].get("mean")
    if b:
        lines.append(
            "share of the in-context loss drop kept (mean ablation): pair ablated "
            f"{b['pair ablated']['drop_kept']:.0%}, only the pair kept "
            f"{b['only the pair kept']['drop_kept']:.0%}"
        )
    return "\n".join(lines)
