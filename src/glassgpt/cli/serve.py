"""``glassgpt serve``: one checkpoint behind the OpenAI-compatible API and the explorer.

    glassgpt serve --checkpoint runs/shakespeare [--port 8000] [--api-key KEY]

Binds to 127.0.0.1 unless ``--host`` says otherwise. The API is ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/models``; the explorer is the page at ``/``
(:func:`glassgpt.serve.app.create_app`). A chat is rendered by the model's own chat template
(``tokenizer_config.json``), or ``--chat-template FILE|plain``; without either it is a 400.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import uvicorn

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import (
    add_chat_template,
    add_checkpoint,
    add_device,
    add_dtype,
    add_tokenizer,
)
from glassgpt.console import say
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.features.identity import check_identity
from glassgpt.features.replacement import open_transcoders
from glassgpt.model.precision import cast, parse_dtype
from glassgpt.sample.engine import is_small
from glassgpt.sample.steering import parse_steer
from glassgpt.serve.app import create_app
from glassgpt.serve.features import folder_extra, load_sae
from glassgpt.serve.graph_files import graph_paths
from glassgpt.tokenizer.chat import chosen_template


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve a glassgpt checkpoint (run folder, ckpt/ folder or one checkpoint) or an HF "
        "model folder over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
        "/v1/models), with an interactive explorer at /."
    )
    p = parser
    add_checkpoint(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000)
    add_device(p)
    add_dtype(p)
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help="require Authorization: Bearer KEY on /v1 and /api")  # fmt: skip
    p.add_argument("--name", default=None, help="the model's name in the API (default: folder)")
    add_tokenizer(p)
    add_chat_template(p)
    p.add_argument("--max-batch", type=int, default=16,
                   help="sequences decoded together (KV slots; default 16)")  # fmt: skip
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="positions each KV slot holds, the longest prompt (default: the model's "
                   "n_ctx up to 4096, less if the memory does not hold that)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for models under 8M parameters, else all)")  # fmt: skip
    p.add_argument("--steer", metavar="FILE:HOOK:ALPHA", action="append", default=[],
                   help="steer every request: add ALPHA × the vector in FILE to the activation "
                   "HOOK (e.g. blocks.1.resid_post) at every position; repeatable")  # fmt: skip
    p.add_argument("--sae", metavar="DIR", default=None,
                   help="an SAE or CLT on this model (glassgpt sae train's -o): feature pages (from "
                   "glassgpt sae features), per-token activations and steering in the explorer")  # fmt: skip
    p.add_argument("--transcoders", metavar="DIR", default=None,
                   help="this model's transcoders (a CLT folder, a transcoder folder or a folder "
                   "of per-layer ones): the Graph tab traces prompts and intervenes on features")  # fmt: skip
    p.add_argument("--graph", metavar="PATH", action="append", default=[],
                   help="a graph.json (glassgpt graph's or circuit-tracer's), or a folder of "
                   "them, to open in the Graph tab; repeatable")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise GlassError(f"--port: must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise GlassError(f"--max-batch: must be ≥ 1, got {args.max_batch}")
    if args.threads is not None and args.threads < 1:
        raise GlassError(f"--threads: must be ≥ 1, got {args.threads}")
    dtype = parse_dtype(args.dtype)
    steers = [parse_steer(spec) for spec in args.steer]
    device = parse_device(args.device)
    # cast in place: float32 is the model as loaded, its products registered with the kernels
    found = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device,
                     dtype=None if args.sae else dtype)  # fmt: skip
    if args.sae:  # the model an SAE was trained on is known by its weights as loaded, uncast
        check_identity(args.sae, folder_extra(args.sae), found, what="--sae")
        found.model = cast(found.model, dtype, inplace=True)
    model, tok = found.model, found.needs_tokenizer()
    chat = chosen_template(args.chat_template, found.chat_template, tok)
    torch.set_num_threads(args.threads or (1 if is_small(model) else torch.get_num_threads()))
    name = args.name or Path(args.checkpoint).resolve().name
    sae, pages = load_sae(args.sae, model) if args.sae else (None, None)
    transcoders = open_transcoders(args.transcoders, device=device) if args.transcoders else None
    if transcoders is not None:
        transcoders.check(model)
    app = create_app(model, tok, name=name, api_key=args.api_key, slots=args.max_batch,
                     steer=steers, source=Path(args.checkpoint), sae=sae, pages=pages,
                     chat=chat, max_context=args.max_context, transcoders=transcoders,
                     graph_files=graph_paths(args.graph))  # fmt: skip
    # The scheduler thread and the event loop share the GIL: hand it over every 0.5 ms, not
    # every 5 ms, so that a finished token reaches its client without waiting for a step.
    sys.setswitchinterval(0.0005)
    for s in steers:
        say(f"steering {s.hook} by {s.alpha:g} × v (|v| = {float(s.vector.norm()):.4g})", kind=None)
    if chat is None:
        say("the model has no chat template: /v1/chat/completions answers 400 (give one with "
            "--chat-template FILE, or --chat-template plain)", kind="note")  # fmt: skip
    say(f"serving {name!r} at http://{args.host}:{args.port}/", kind=None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
