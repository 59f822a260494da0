"""``glassgpt sae train`` and ``glassgpt sae eval``: argument parsing only (the jobs live in
:mod:`glassgpt.features.training` and :func:`eval_command`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output, add_overrides
from glassgpt.features import pages_command, saelens_commands


def register(subparsers: Any) -> None:
    sae = subparsers.add_parser(
        "sae",
        help="sparse autoencoders and transcoders on a model's activations",
        description="Train a sparse dictionary (SAE or transcoder) on one activation of a "
        "trained model, from the run's own data shards, and measure it.",
    )
    sub = sae.add_subparsers(dest="sae_command", metavar="SUBCOMMAND")
    sae.set_defaults(func=lambda args: (sae.print_help(), 2)[1])

    p = sub.add_parser(
        "train",
        help="train an SAE on one hook of a run",
        description="Train an SAE (or transcoder) on the activation --hook of the model in -c, "
        "streamed from the run's data shards through a shuffling buffer (nothing written to "
        "disk). Checkpoints in -o DIR/ckpt; the SAE in DIR/sae; metrics in DIR/metrics.jsonl.",
    )
    add_checkpoint(p, required=False, help="the run (or checkpoint) whose model the SAE reads")
    p.add_argument("--hook", help="the activation, e.g. blocks.1.resid_post (or blocks.1.hook_resid_post); a transcoder: blocks.L.mlp_out")  # fmt: skip
    p.add_argument("--width", type=int, help="latents (d_sae)")
    p.add_argument("--arch", choices=("topk", "batchtopk", "jumprelu", "relu", "transcoder"),
                   help="the architecture (transcoder: reads the MLP's input, predicts its output)")  # fmt: skip
    p.add_argument("-k", type=int, default=None, help="latents kept per token (topk, batchtopk, transcoder)")  # fmt: skip
    add_output(p, metavar="DIR", help="the SAE's folder")
    p.add_argument("--tokens", type=int, default=None, help="training tokens (train.tokens)")
    p.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: the run's own shards)")  # fmt: skip
    p.add_argument("--resume", metavar="DIR", help="continue a killed or stopped training")
    p.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_overrides(p, example="train.lr=3e-4 sae.aux_coeff=0.1")
    p.set_defaults(func=_train)

    e = sub.add_parser(
        "eval",
        help="L0, FVU, CE loss recovered, dead and dense latents of an SAE",
        description="Measure an SAE on its model: L0, fraction of variance unexplained, CE "
        "loss recovered ((L_zero − L_sae)/(L_zero − L_clean), the SAE spliced in against the "
        "clean model and the zeroed activation), and the dead and dense latent fractions.",
    )
    add_checkpoint(e, help="the SAE folder (sae train's -o, or its sae/)")
    e.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on)")
    e.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: its data's val split)")  # fmt: skip
    e.add_argument("--tokens", type=int, default=65_536, help="tokens to measure on (default 65,536)")  # fmt: skip
    e.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_ctx, at most 256)")  # fmt: skip
    e.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=_eval)
    saelens_commands.register(sub)  # glassgpt sae export --format saelens, sae import
    pages_command.add_parser(sub)  # glassgpt sae features


def _train(args: argparse.Namespace) -> int:
    from glassgpt.features.job import train_command

    result = train_command(
        checkpoint=args.checkpoint, hook=args.hook, width=args.width, arch=args.arch, k=args.k,
        out=args.output, tokens=args.tokens, overrides=args.overrides, data=args.data,
        resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
        argv=sys.argv,
    )  # fmt: skip
    if result.get("ended") == "signal":
        return 130
    print(_summary(result))
    return 0


def _summary(r: dict[str, Any]) -> str:
    return (
        f"L0 {r['l0']:.1f} | FVU {r['fvu']:.4f} | CE loss recovered {r['ce_recovered']:.4f} "
        f"(clean {r['ce_clean']:.4f}, SAE {r['ce_sae']:.4f}, zero {r['ce_zero']:.4f}) | dead "
        f"{r['dead_fraction']:.1%}, dense {r['dense_fraction']:.1%} | {r['tokens']:,} tokens"
    )


def _eval(args: argparse.Namespace) -> int:
    import json

    result = eval_command(args.checkpoint, model=args.model, data=args.data, tokens=args.tokens,
                          seq_len=args.seq_len, device=args.device)  # fmt: skip
    print(json.dumps(result) if args.json else _summary(result))
    return 0


def eval_command(
    sae_dir: str,
    *,
    model: str | None = None,
    data: Sequence[str] | None = None,
    tokens: int = 65_536,
    seq_len: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The metrics of :func:`glassgpt.features.metrics.evaluate` for the SAE in ``sae_dir``."""
    import torch

    from glassgpt.data import DataDir, iter_eval_batches
    from glassgpt.devices import parse_device
    from glassgpt.errors import GlassError
    from glassgpt.features.metrics import evaluate
    from glassgpt.train.evaluate import encode_files
    from glassgpt.train.inputs import is_prepared

    where = parse_device(device)
    sae, net, tok, extra = pages_command.open_sae(sae_dir, model=model, device=device)
    model_path = model or extra["model"]
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    T = seq_len or min(net.config.n_ctx, 256)
    if not 1 <= T <= net.config.n_ctx:
        raise GlassError(f"--seq-len: must be in [1, n_ctx={net.config.n_ctx}], got {T}")
    if data and not (len(data) == 1 and is_prepared(data[0])):
        if tok is None:
            raise GlassError(f"{model_path}: has no tokenizer, so --data text cannot be encoded")
        stream, source = encode_files(tok, data)[0], ", ".join(data)
    else:
        path = data[0] if data else extra.get("data")
        if not path or not is_prepared(path):
            raise GlassError(
                f"{sae_dir}: its data folder ({path}) is gone; pass --data with a prepared data "
                "folder or text files"
            )
        folder_data = DataDir.open(path)
        split = "val" if "val" in folder_data.meta.splits and folder_data.split("val").tokens > T else "train"  # fmt: skip
        stream, source = folder_data.stream(split), f"{path}, {split} split"
    batch = 8
    max_batches = max(1, tokens // (batch * T))
    batches = ((x.to(where), y.to(where)) for x, y in
               iter_eval_batches(stream, batch_size=batch, seq_len=T, max_batches=max_batches))  # fmt: skip
    with torch.no_grad():
        result = evaluate(net, sae, batches)
    return {**result, "source": source, "hook": sae.cfg.hook, "arch": sae.cfg.arch}
