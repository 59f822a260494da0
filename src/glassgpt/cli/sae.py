"""``glassgpt sae``: sparse autoencoders and transcoders on one activation of a trained model.

    glassgpt sae train -c RUN --hook blocks.1.resid_post --width 512 --arch topk -k 32 -o DIR
    glassgpt sae train -c RUN --arch clt [--clt-arch jumprelu|topk] [-k K] --width 512 -o DIR
    glassgpt sae eval -c DIR [--json]
    glassgpt sae features -c DIR [--data PATH…] [-o FILE] [--tokens N] [--top K]
    glassgpt sae export -c DIR --format saelens -o OUT
    glassgpt sae import SAELENS_DIR -o DIR [--model RUN]
    glassgpt sae label DIR --endpoint URL [--explainer NAME] [--features 0-99|1/0-99|all-live]

The jobs live in :mod:`glassgpt.features` (``job.train_command``, ``folders``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import (
    add_checkpoint,
    add_device,
    add_json,
    add_no_progress,
    add_output,
    add_overrides,
    add_seed,
)
from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT_ARCHS
from glassgpt.features.clt_pages import eval_clt, export_circuit_tracer, is_clt, write_clt_pages
from glassgpt.features.folders import eval_sae, export_sae, import_sae, write_pages
from glassgpt.features.job import train_command
from glassgpt.features.label_job import label_folder
from glassgpt.features.metrics import EVAL_TOKENS
from glassgpt.features.sae import ARCHS

SAE_DIR = "the SAE folder (sae train's -o, or its sae/)"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a sparse dictionary (SAE or transcoder) on one activation of a trained model, "
        "from the run's own data shards, and measure it."
    )
    sub = parser.add_subparsers(dest="sae_command", metavar="SUBCOMMAND")

    p = sub.add_parser(
        "train",
        help="train an SAE on one hook of a run",
        description="Train an SAE (or transcoder) on the activation --hook of the model in -c, "
        "streamed from the run's data shards through a shuffling buffer (nothing written to "
        "disk). Checkpoints in -o DIR/ckpt; the SAE in DIR/sae (with the model's identity, "
        "which serve --sae and sae features check); metrics in DIR/metrics.jsonl; the closing "
        "line is sae eval's measurement (DIR/eval.json). --arch clt trains a cross-layer "
        "transcoder instead: features reading every layer's MLP input, each writing to its "
        "own and every later layer's MLP output (DIR/clt; no --hook).",
    )
    add_checkpoint(p, required=False, help="the run (or checkpoint) whose model the SAE reads")
    p.add_argument("--hook", help="the activation, e.g. blocks.1.resid_post (or blocks.1.hook_resid_post); a transcoder: blocks.L.mlp_out")  # fmt: skip
    p.add_argument("--width", type=int, help="latents (d_sae; a CLT: features per layer)")
    p.add_argument("--arch", choices=(*ARCHS, "clt"),
                   help="the architecture (transcoder: reads the MLP's input, predicts its output; clt: a cross-layer transcoder over every layer)")  # fmt: skip
    p.add_argument("--clt-arch", choices=CLT_ARCHS, default=None,
                   help="a CLT's activation (default: topk with -k, else jumprelu with the tanh penalty)")  # fmt: skip
    p.add_argument("-k", type=int, default=None, help="latents kept per token (topk, batchtopk, transcoder; a topk CLT: per token and layer)")  # fmt: skip
    add_output(p, metavar="DIR", help="the SAE's folder")
    p.add_argument("--tokens", type=int, default=None, help="training tokens (train.tokens)")
    p.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: the run's own shards)")  # fmt: skip
    p.add_argument("--resume", metavar="DIR", help="continue a killed or stopped training")
    p.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    add_no_progress(p)
    add_overrides(p, example="train.lr=3e-4 sae.aux_coeff=0.1")
    p.set_defaults(func=run_train)

    e = sub.add_parser(
        "eval",
        help="L0, FVU, CE loss recovered, dead and dense latents of an SAE (or a CLT, per layer)",
        description="Measure an SAE on its model: L0, fraction of variance unexplained, CE "
        "loss recovered ((L_zero − L_sae)/(L_zero − L_clean), the SAE spliced in against the "
        "clean model and the zeroed activation), and the dead and dense latent fractions. A CLT "
        "folder: FVU and L0 per layer besides, its CE loss recovered with every MLP output "
        "replaced at once, against every MLP output zeroed.",
    )
    add_checkpoint(e, help=SAE_DIR)
    e.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on; another, e.g. a fine-tune, is measured with a note)")  # fmt: skip
    e.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: its data's val split)")  # fmt: skip
    e.add_argument("--tokens", type=int, default=EVAL_TOKENS, help=f"tokens to measure on (default {EVAL_TOKENS:,}, as sae train's closing line)")  # fmt: skip
    e.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's n_ctx, at most 256)")  # fmt: skip
    add_device(e)
    add_json(e)
    e.set_defaults(func=run_eval)

    f = sub.add_parser(
        "features",
        help="feature pages: top contexts, histogram, density and logit effect of every latent",
        description="Compute, for every latent of an SAE, its top-activating contexts (with the "
        "activation at every token), a histogram of its nonzero activations (log-spaced bins), "
        "its density and its logit effect (the decoder direction through the final norm and "
        "W_U), from one pass over a corpus; written to one file the explorer reads. A CLT "
        "folder: every layer's features, each page with its decoder norm per target layer.",
    )
    add_checkpoint(f, help=SAE_DIR)
    f.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on; it must be that model, e.g. moved)")  # fmt: skip
    f.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: the SAE's data)")  # fmt: skip
    f.add_argument("--split", default="train", help="the split of a prepared folder (default train)")  # fmt: skip
    f.add_argument("--tokens", type=int, default=1_000_000, help="tokens to read (default 1,000,000)")  # fmt: skip
    f.add_argument("--seq-len", type=int, default=None, help="window length (default: n_ctx, at most 256)")  # fmt: skip
    f.add_argument("--batch", type=int, default=None, help="windows per forward (default: ~4,096 tokens)")  # fmt: skip
    f.add_argument("--top", type=int, default=20, help="top contexts kept per latent (default 20)")
    f.add_argument("--context", type=int, nargs=2, default=(12, 4), metavar=("BEFORE", "AFTER"),
                   help="tokens shown before and after each top token (default 12 4)")  # fmt: skip
    add_device(f)
    add_output(f, metavar="FILE", help="the pages' file (default SAE_DIR/features.safetensors)")
    f.set_defaults(func=run_features)

    x = sub.add_parser(
        "export",
        help="write an SAE in SAELens's format (cfg.json + sae_weights.safetensors)",
        description="Write the SAE of -c in SAELens's format, which sae_lens loads with "
        "SAE.load_from_disk(DIR) and which computes the same codes. Hook names are written "
        "TransformerLens's way; the model kwargs say center_writing_weights=false (load the "
        "model with HookedTransformer.from_pretrained_no_processing).",
    )
    add_checkpoint(x, help=SAE_DIR)
    x.add_argument("--format", choices=("saelens", "circuit-tracer"), default="saelens",
                   help="saelens (an SAE or transcoder), or circuit-tracer (a JumpReLU CLT: its load_clt reads the folder)")  # fmt: skip
    add_output(x, required=True, metavar="DIR", help="the folder to write")
    x.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on; a transcoder needs it)")  # fmt: skip
    x.add_argument("--model-name", metavar="NAME", help="metadata.model_name (e.g. gpt2)")
    x.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    x.set_defaults(func=run_export)

    i = sub.add_parser(
        "import",
        help="read an SAELens SAE folder as a glassgpt SAE",
        description="Read an SAE saved by sae_lens (cfg.json + sae_weights.safetensors) and "
        "write it as a glassgpt SAE folder that sae eval, features and the explorer read. "
        "With --model (e.g. a GPT-2 imported from HF), the SAE is checked against it and, when "
        "it was trained on TransformerLens's processed model (centred residual stream, folded "
        "value biases, ln2.hook_normalized), folded to read the model's own activations.",
    )
    i.add_argument("source", metavar="DIR", help="the SAELens folder")
    add_output(i, required=True, metavar="SAE_DIR", help="the glassgpt SAE folder to write")
    i.add_argument("--model", metavar="DIR", help="the model the SAE reads (checked; needed for hook_z and transcoders)")  # fmt: skip
    proc = i.add_mutually_exclusive_group()
    proc.add_argument("--processed", dest="processed", action="store_true", default=None,
                      help="it read TransformerLens's from_pretrained processing (default: as cfg.json says)")  # fmt: skip
    proc.add_argument("--no-processed", dest="processed", action="store_false",
                      help="it read unprocessed activations (from_pretrained_no_processing)")  # fmt: skip
    i.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    i.set_defaults(func=run_import)
    register_label(sub)


def summary(r: dict[str, Any]) -> str:
    """One line of an SAE's metrics (``sae train``'s and ``sae eval``'s output)."""
    return (
        f"L0 {r['l0']:.1f} | FVU {r['fvu']:.4f} | CE loss recovered {r['ce_recovered']:.4f} "
        f"(clean {r['ce_clean']:.4f}, SAE {r['ce_sae']:.4f}, zero {r['ce_zero']:.4f}) | dead "
        f"{r['dead_fraction']:.1%}, dense {r['dense_fraction']:.1%} | {r['tokens']:,} tokens"
    )


def per_layer(r: dict[str, Any]) -> str:
    """A CLT's per-layer FVU and L0 (its ``sae train``'s and ``sae eval``'s second line)."""
    return "per layer: " + " | ".join(
        f"{l}: FVU {f:.4f}, L0 {z:.1f}" for l, (f, z) in enumerate(zip(r["fvu_layers"], r["l0_layers"])))  # fmt: skip


def run_train(args: argparse.Namespace) -> int:
    result = train_command(
        checkpoint=args.checkpoint, hook=args.hook, width=args.width, arch=args.arch, k=args.k,
        clt_arch=args.clt_arch, out=args.output, tokens=args.tokens, overrides=args.overrides, data=args.data,
        resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
        argv=sys.argv,
    )  # fmt: skip
    if result.get("ended") == "signal":
        return 130
    print(summary(result))
    out = Path(result["folder"])
    if "fvu_layers" in result:  # a CLT: each target layer
        print(per_layer(result))
        print(f"wrote {out / 'clt'} (the CLT), {out / 'eval.json'} and {out / 'metrics.jsonl'}")
        return 0
    print(f"wrote {out / 'sae'} (the SAE), {out / 'eval.json'} and {out / 'metrics.jsonl'}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    result = (eval_clt if is_clt(args.checkpoint) else eval_sae)(args.checkpoint, model=args.model, data=args.data, tokens=args.tokens,
                      seq_len=args.seq_len, device=args.device)  # fmt: skip
    print(json.dumps(result) if args.json else summary(result))
    if "fvu_layers" in result and not args.json:  # a CLT: each target layer
        print(per_layer(result))
    return 0


def run_features(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out, pages = (write_clt_pages if is_clt(args.checkpoint) else write_pages)(
        args.checkpoint, model=args.model, data=args.data, split=args.split, tokens=args.tokens,
        seq_len=args.seq_len, batch=args.batch, top=args.top, context=tuple(args.context),
        device=args.device, output=args.output,
    )  # fmt: skip
    alive = int((pages.count > 0).sum())
    clt = pages.meta.get("clt")
    what = f"{clt['n_layers']} layers × {clt['d_sae']:,} features" if clt else f"{pages.d_sae:,} latents"  # fmt: skip
    print(f"{what} over {pages.tokens:,} tokens ({alive:,} active) in "
          f"{time.perf_counter() - t0:.1f} s → {out}")  # fmt: skip
    return 0


def run_export(args: argparse.Namespace) -> int:
    if args.format == "circuit-tracer" or is_clt(args.checkpoint):
        if not is_clt(args.checkpoint):
            raise GlassError(f"--format circuit-tracer: {args.checkpoint} holds no CLT (clt.json); circuit-tracer's format is for cross-layer transcoders")  # fmt: skip
        if args.format != "circuit-tracer":
            raise GlassError(f"-c {args.checkpoint}: a CLT; export it with --format circuit-tracer (SAELens has no CLT format)")  # fmt: skip
        out = export_circuit_tracer(args.checkpoint, args.output, overwrite=args.overwrite)
        print(f"wrote {out} (circuit-tracer: load_clt({str(out)!r}))")
        return 0
    out = export_sae(args.checkpoint, args.output, model=args.model,
                     model_name=args.model_name, overwrite=args.overwrite)  # fmt: skip
    print(f"wrote {out} (SAELens: SAE.load_from_disk({str(out)!r}))")
    return 0


def run_import(args: argparse.Namespace) -> int:
    out = import_sae(args.source, args.output, model=args.model, processed=args.processed,
                     overwrite=args.overwrite)  # fmt: skip
    print(f"wrote {out}")
    return 0


# -- sae label ---------------------------------------------------------------------------------


def register_label(sub: Any) -> None:
    lb = sub.add_parser(
        "label",
        help="a short explanation of each feature, written by an LLM and scored by detection",
        description="Ask an OpenAI-compatible endpoint (glassgpt serve, vLLM, Ollama, a hosted "
        "API) for a short explanation of each feature from its top contexts (the feature pages: "
        "glassgpt sae features), then score it by detection as EleutherAI's delphi does: the "
        "balanced accuracy with which the endpoint, given only the label, tells held-out "
        "activating contexts from random ones where the feature is silent. Written to "
        "DIR/labels.json, which the explorer shows; a second run skips the features labelled. A CLT "
        "folder: every layer's features, labelled under the keys LAYER/i.",
    )
    lb.add_argument("folder", metavar="DIR", nargs="?", help=SAE_DIR)
    add_checkpoint(lb, required=False, help=f"{SAE_DIR}, as sae features takes it (or DIR)")
    lb.add_argument("--endpoint", required=True, metavar="URL",
                    help="the API's base URL, e.g. http://localhost:8000/v1 (glassgpt serve, vLLM) or http://localhost:11434/v1 (Ollama)")  # fmt: skip
    lb.add_argument("--explainer", metavar="NAME", help="the endpoint's model that writes and judges the labels (default: the first it lists); --model in the other sae commands is the model the SAE reads")  # fmt: skip
    lb.add_argument("--api-key-env", metavar="VAR", help="the environment variable holding the API key (sent as a bearer token)")  # fmt: skip
    lb.add_argument("--features", default="all-live", metavar="SPEC",
                    help="ids and ranges (0-99, 3,7,10-12), a CLT's as LAYER/ids (1/0-99, 0/3,1/5-9), or all-live (default: every feature active on the pages' corpus; a CLT's of every layer)")  # fmt: skip
    lb.add_argument("--contexts", type=int, default=10, metavar="N", help="top contexts shown to write the label (default 10)")  # fmt: skip
    lb.add_argument("--holdout", type=int, default=5, metavar="N",
                    help="held-out activating contexts scored, with as many silent ones (default 5; 0: no score)")  # fmt: skip
    lb.add_argument("--concurrency", type=int, default=4, metavar="N", help="requests in flight (default 4)")  # fmt: skip
    lb.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds one request may take (default 120)")  # fmt: skip
    lb.add_argument("--overwrite", action="store_true", help="label again the features labelled before")  # fmt: skip
    lb.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                    help="where the silent contexts come from: a prepared data folder or text files (default: the SAE's data)")  # fmt: skip
    lb.add_argument("--split", default="train", help="the split of a prepared folder (default train)")  # fmt: skip
    add_seed(lb, default=0, help="draws the silent contexts and the order they are asked in (default 0)")  # fmt: skip
    add_device(lb)
    lb.set_defaults(func=run_label)


def run_label(args: argparse.Namespace) -> int:
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise GlassError(f"--api-key-env {args.api_key_env}: that environment variable is not set")  # fmt: skip
    if (args.folder is None) == (args.checkpoint is None):
        raise GlassError("sae label: name the SAE folder once, as DIR or -c DIR")
    t0 = time.perf_counter()
    r = label_folder(
        args.folder or args.checkpoint, endpoint=args.endpoint, model=args.explainer, api_key=key,
        features=args.features, contexts=args.contexts, holdout=args.holdout,
        concurrency=args.concurrency, overwrite=args.overwrite, data=args.data,
        split=args.split, seed=args.seed, timeout=args.timeout, device=args.device,
    )  # fmt: skip
    scores = r["scores"]
    notes = [f"mean detection {sum(scores) / len(scores):.3f}"] if scores else []
    notes += [f"{r['unread']:,} answers unread, counted wrong"] if r.get("unread") else []
    print(f"{r['labelled']:,} features labelled" + (f" ({'; '.join(notes)})" if notes else "")
          + f"; skipped: {r['skipped']:,} labelled before, {r['dead']:,} never active "
          f"({time.perf_counter() - t0:.1f} s) → {r['file']}")  # fmt: skip
    return 0
