"""``glassgpt serve``: one checkpoint behind the OpenAI-compatible API and the explorer.

    glassgpt serve --checkpoint runs/shakespeare [--port 8000] [--api-key KEY]

Binds to 127.0.0.1 unless ``--host`` says otherwise. Light at import: the handler loads
torch, FastAPI and uvicorn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint


def register(subparsers: Any) -> None:
    """Add ``serve`` to the ``glassgpt`` parser."""
    p = subparsers.add_parser(
        "serve",
        help="serve a checkpoint: OpenAI-compatible API and an explorer page",
        description="Serve a glassgpt checkpoint (run folder, ckpt/ folder or one checkpoint) "
        "or an HF GPT-2 folder over an OpenAI-compatible API (/v1/completions, "
        "/v1/chat/completions, /v1/models), with an interactive explorer at /.",
    )
    add_checkpoint(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    p.add_argument("--dtype", default="float32",
                   help="float32, bf16 (weights and compute) or int8 (weights; CPU)")  # fmt: skip
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help="require Authorization: Bearer KEY on /v1 and /api")  # fmt: skip
    p.add_argument("--name", default=None, help="the model's name in the API (default: folder)")
    p.add_argument("--tokenizer", metavar="FILE", type=Path, default=None,
                   help="a tokenizer file (when the folder has none)")  # fmt: skip
    p.add_argument("--max-batch", type=int, default=16,
                   help="sequences decoded together (KV slots; default 16)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for models under 8M parameters, else all)")  # fmt: skip
    p.add_argument("--steer", metavar="FILE:HOOK:ALPHA", action="append", default=[],
                   help="steer every request: add ALPHA × the vector in FILE to the activation "
                   "HOOK (e.g. blocks.1.resid_post) at every position; repeatable")  # fmt: skip
    p.add_argument("--sae", metavar="DIR", default=None,
                   help="an SAE on this model (glassgpt sae train's -o): feature pages (from "
                   "glassgpt sae features), per-token activations and steering in the explorer")  # fmt: skip
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.errors import GlassError
    from glassgpt.model.precision import attach_kernels, cast, parse_dtype
    from glassgpt.sample.commands import SMALL_MODEL
    from glassgpt.sample.steering import parse_steer
    from glassgpt.serve.app import create_app
    from glassgpt.serve.features import load_sae

    if not 0 <= args.port <= 65535:
        raise GlassError(f"--port: must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise GlassError(f"--max-batch: must be ≥ 1, got {args.max_batch}")
    if args.threads is not None and args.threads < 1:
        raise GlassError(f"--threads: must be ≥ 1, got {args.threads}")
    dtype = parse_dtype(args.dtype)
    steers = [parse_steer(spec) for spec in args.steer]
    model, tok = load(
        Path(args.checkpoint), tokenizer=args.tokenizer, device=parse_device(args.device)
    )
    if tok is None:
        raise GlassError(f"{args.checkpoint}: has no tokenizer; pass --tokenizer FILE")
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL
    torch.set_num_threads(args.threads or (1 if small else torch.get_num_threads()))
    if dtype != torch.float32:
        model = cast(model, dtype)
    else:  # the model as loaded, its products registered with the kernels in place (no copy)
        attach_kernels(model.eval())
    name = args.name or Path(args.checkpoint).resolve().name
    sae = load_sae(args.sae, model) if args.sae else (None, None)
    app = create_app(model, tok, name=name, api_key=args.api_key, slots=args.max_batch,
                     steer=steers, source=Path(args.checkpoint), sae=sae[0], pages=sae[1])  # fmt: skip
    # The scheduler thread and the event loop share the GIL: hand it over every 0.5 ms, not
    # every 5 ms, so that a finished token reaches its client without waiting for a step.
    sys.setswitchinterval(0.0005)
    for s in steers:
        norm = float(s.vector.norm())
        print(f"glassgpt: steering {s.hook} by {s.alpha:g} × v (|v| = {norm:.4g})", file=sys.stderr)
    print(f"glassgpt: serving {name!r} at http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
