"""``glassgpt sample``: stream text from a trained checkpoint or an HF folder to the terminal.

    glassgpt sample --checkpoint runs/shakespeare --prompt "ROMEO:" --temperature 0.8 --top-p 0.95

The prompt comes from ``--prompt``, ``--prompt-file`` or, with ``--interactive``, one line at
a time from stdin; with none of them generation starts from ``<|endoftext|>`` (or the first
symbol of a character vocabulary). Each sample prints the prompt, then the new text as it is
sampled. Light at import: the handler loads torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint

SMALL_MODEL = 8_000_000  # parameters; below this a decoding step is too short to split


def register(subparsers: Any) -> None:
    """Add ``sample`` to the ``glassgpt`` parser."""
    p = subparsers.add_parser(
        "sample",
        help="generate text from a checkpoint, streamed to the terminal",
        description="Sample text from a trained glassgpt checkpoint (a run folder, its ckpt/ "
        "folder or one checkpoint folder) or an exported HF GPT-2 folder.",
    )
    add_checkpoint(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", "-p", metavar="TEXT", help="the text to continue")
    src.add_argument("--prompt-file", metavar="FILE", type=Path, help="read the prompt from FILE")
    src.add_argument("--interactive", "-i", action="store_true",
                     help="read prompts from stdin, one per line (empty line or EOF quits)")  # fmt: skip
    p.add_argument("--num-samples", "-n", type=int, default=1, help="samples per prompt")
    p.add_argument("--max-new-tokens", "-m", type=int, default=256)
    p.add_argument("--temperature", "-t", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus: keep mass p, in (0, 1]")
    p.add_argument("--min-p", type=float, default=None, help="keep p_i ≥ min_p · p_max")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL's; 1 = off")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="z_i − f·count_i")
    p.add_argument("--stop", metavar="TEXT", action="append", default=[],
                   help="stop before this text (repeatable; \\n escapes allowed)")  # fmt: skip
    p.add_argument("--no-stop-eos", action="store_true",
                   help="keep going after <|endoftext|> (by default it ends a sample)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="sample i uses seed + i")
    p.add_argument("--dtype", default="float32",
                   help="float32, bf16 (weights and compute) or int8 (weights; CPU)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    p.add_argument("--tokenizer", metavar="FILE", type=Path, default=None,
                   help="a tokenizer file (when the folder has none)")  # fmt: skip
    p.add_argument("--overflow", choices=("slide", "truncate", "error"), default="slide",
                   help="context full: slide the window (default); truncate: also keep the end "
                   "of a prompt longer than the context; error: stop")  # fmt: skip
    p.add_argument("--window", type=int, default=None,
                   help="tokens kept when the window slides (default 3/4 of n_ctx)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for models under 8M parameters, whose steps are "
                   "too short to share, else all cores)")  # fmt: skip
    p.add_argument("--stats", action="store_true", help="print tokens/s to stderr")
    p.add_argument("--steer", metavar="FILE:HOOK:ALPHA", action="append", default=[],
                   help="add ALPHA × the vector in FILE (.safetensors, .npy, .pt) to the "
                   "activation HOOK (e.g. blocks.1.resid_post) at every position; "
                   "repeatable")  # fmt: skip
    p.set_defaults(func=run_sample)
    register_steer(subparsers)


def register_steer(subparsers: Any) -> None:
    """Add ``steer`` (a steering vector from contrastive prompts) to the ``glassgpt`` parser."""
    from glassgpt.cli.arguments import add_output

    p = subparsers.add_parser(
        "steer",
        help="make a steering vector from contrastive prompts (for sample/serve --steer)",
        description="v = mean over positive prompts of the activation at HOOK − the same mean "
        "over negative prompts (each prompt run alone; its last position or the mean over its "
        "positions). Use it with: glassgpt sample --steer FILE:HOOK:ALPHA.",
    )
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
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    p.add_argument("--tokenizer", metavar="FILE", type=Path, default=None,
                   help="a tokenizer file (when the folder has none)")  # fmt: skip
    p.set_defaults(func=run_steer)


def run_steer(args: argparse.Namespace) -> int:
    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.errors import GlassError
    from glassgpt.sample.steering import canonical_hook, contrastive_vector, save_vector

    out = Path(args.output)
    if out.suffix.lower() not in (".safetensors", ".npy", ".pt", ".pth"):
        raise GlassError(f"{out}: unknown vector format (use .safetensors, .npy or .pt)")
    model, tok = load(args.checkpoint, tokenizer=args.tokenizer, device=parse_device(args.device))
    if tok is None:
        raise GlassError(f"{args.checkpoint}: has no tokenizer; pass --tokenizer FILE")
    hook = canonical_hook(args.hook)
    positive = [_unescape(t) for t in args.positive]
    negative = [_unescape(t) for t in args.negative]
    v = contrastive_vector(model, tok, positive, negative, hook, pos=args.pos)
    meta = {"hook": hook, "pos": args.pos, "positive": str(len(positive)),
            "negative": str(len(negative))}  # fmt: skip
    save_vector(out, v, metadata=meta)
    where = "mean over positions" if args.pos == "mean" else "last position"
    print(f"glassgpt: wrote {out}: {hook} ({where}), |v| = {float(v.norm()):.4g} "
          f"from {len(positive)} positive − {len(negative)} negative prompts; use it as "
          f"--steer {out}:{hook}:ALPHA", file=sys.stderr)  # fmt: skip
    return 0


def _unescape(s: str) -> str:
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape")


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The generation options of the flags (validated: a bad value names its flag)."""
    from glassgpt.errors import ConfigError
    from glassgpt.sample.generation import GenerationConfig

    opts = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "frequency_penalty": args.frequency_penalty,
        "stop": tuple(_unescape(s) for s in args.stop),
        "overflow": args.overflow,
        "window": args.window,
    }
    try:
        GenerationConfig(**opts)
    except ConfigError as e:
        raise ConfigError("--" + e.field.replace("_", "-"), str(e).split(": ", 1)[1]) from None
    if args.num_samples < 1:
        raise ConfigError("--num-samples", f"must be ≥ 1, got {args.num_samples}")
    if args.seed is not None and not -(2**63) <= args.seed <= 2**64 - args.num_samples:
        raise ConfigError("--seed", f"must be from -2**63 to 2**64 - 1 (a 64-bit generator "
                          f"seed; sample i uses seed + i), got {args.seed}")  # fmt: skip
    return opts


def run_sample(args: argparse.Namespace) -> int:
    import warnings

    from glassgpt.errors import InputFileError
    from glassgpt.sample.steering import parse_steer

    opts = options_from_args(args)
    steers = [parse_steer(spec) for spec in args.steer]  # files read before the model loads
    prompt = args.prompt
    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputFileError(f"{args.prompt_file}: no such prompt file") from None
        except UnicodeDecodeError as e:
            raise InputFileError(f"{args.prompt_file}: not UTF-8 (byte {e.start})") from None
        except OSError as e:
            raise InputFileError(f"{args.prompt_file}: {e.strerror}") from None

    def show(message: Any, category: Any, *rest: Any, **kw: Any) -> None:
        print(f"glassgpt: warning: {message}", file=sys.stderr)

    import torch

    threads = torch.get_num_threads()  # restored at the end: main() may run in-process
    from glassgpt.sample.generation import ContextWarning

    with warnings.catch_warnings():
        warnings.showwarning = show
        warnings.simplefilter("default")
        warnings.simplefilter("ignore", ContextWarning)  # said once, before the text (_samples)
        try:
            return _run(args, prompt, opts, steers)
        finally:
            torch.set_num_threads(threads)


def _run(
    args: argparse.Namespace, prompt: str | None, opts: dict[str, Any], steers: list[Any]
) -> int:
    from glassgpt.errors import GlassError
    from glassgpt.sample.steering import steered

    model, tok = _load(args)
    if tok is None:
        raise GlassError(f"{args.checkpoint}: has no tokenizer; pass --tokenizer FILE")
    if not args.no_stop_eos and "<|endoftext|>" in getattr(tok, "special_tokens", {}):
        opts["stop_ids"] = (tok.special_tokens["<|endoftext|>"],)
    with steered(model, steers):  # (no steers: no hooks, the fast decoding paths)
        return _prompts(args, prompt, opts, model, tok)


def _prompts(
    args: argparse.Namespace, prompt: str | None, opts: dict[str, Any], model: Any, tok: Any
) -> int:
    if not args.interactive:
        _samples(model, tok, prompt or "", opts, args)
        return 0
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            return 0
        if not line:
            return 0
        _samples(model, tok, _unescape(line), opts, args)


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.errors import GlassError
    from glassgpt.model.precision import cast, parse_dtype

    dtype = parse_dtype(args.dtype)
    if args.threads is not None:
        if args.threads < 1:
            raise GlassError(f"--threads: must be ≥ 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    model, tok = load(args.checkpoint, tokenizer=args.tokenizer, device=parse_device(args.device))
    if args.threads is None and sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)
    return cast(model, dtype), tok


def _samples(
    model: Any, tok: Any, prompt: str, opts: dict[str, Any], args: argparse.Namespace
) -> None:
    from glassgpt.sample.generation import decode_stream, stream

    ids = tok.encode(prompt, allowed_special="all")
    out = sys.stdout
    _warn_overflow(model.config.n_ctx, len(ids), opts, args)
    for i in range(args.num_samples):
        if i:
            out.write("\n" + "-" * 40 + "\n")
        seed = None if args.seed is None else args.seed + i
        out.write(prompt)
        out.flush()
        start, count = time.perf_counter(), [0]
        run = stream(model, ids, tokenizer=tok, seed=seed, **opts)
        for piece in decode_stream(tok, _counted(run, count)):
            out.write(piece)
            out.flush()
        out.write("\n")
        out.flush()
        if args.stats:
            dt, n = time.perf_counter() - start, count[0]
            print(f"glassgpt: {n} tokens in {dt:.2f} s ({n / dt:.1f} tokens/s)", file=sys.stderr)


def _warn_overflow(n_ctx: int, n_prompt: int, opts: dict[str, Any], args: Any) -> None:
    """Once per command, before any text: the prompt is cut (a warning), or, with
    ``--stats``, the window will slide past the context (a note). Sliding is how text longer
    than the context is sampled, so by default it goes without a word."""
    total = n_prompt + opts["max_new_tokens"]
    if total <= n_ctx or opts["overflow"] == "error" or getattr(args, "_warned", False):
        return
    if n_prompt > n_ctx and opts["overflow"] != "truncate":
        return  # an error, which names the prompt's length
    if n_prompt <= n_ctx and not args.stats:
        return
    window = min(opts["window"] or max(1, 3 * n_ctx // 4), n_ctx)
    kind = "warning" if n_prompt > n_ctx else "note"
    print(
        f"glassgpt: {kind}: {n_prompt} prompt + {opts['max_new_tokens']} new tokens exceed the "
        f"model's context n_ctx={n_ctx}: sliding the window (re-encoding the last {window} "
        "tokens when it fills; --overflow error stops instead)",
        file=sys.stderr,
        flush=True,
    )
    args._warned = True


def _counted(ids: Any, count: list[int]) -> Any:
    for t in ids:
        count[0] += 1
        yield t
