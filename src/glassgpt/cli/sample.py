"""``glassgpt sample``: stream text from a trained checkpoint or an HF folder to the terminal.

    glassgpt sample --checkpoint runs/shakespeare --prompt "ROMEO:" --temperature 0.8 --top-p 0.95

The prompt comes from ``--prompt``, ``--prompt-file`` or, with ``--interactive``, one line at
a time from stdin; with none of them generation starts from ``<|endoftext|>`` (or the first
symbol of a character vocabulary). The prompt is encoded as the model was trained to see one
(``encode_prompt``: a Llama's or Gemma's BOS first). Each sample prints the prompt, then the
new text as it is sampled; generation ends at ``<|endoftext|>`` or the model's end-of-turn id.

With ``--chat`` the prompt is the user's message (after ``--system TEXT``), rendered by the
model's chat template (``tokenizer_config.json``; ``--chat-template FILE|plain`` for a model
without one) as ``serve``'s ``/v1/chat/completions`` renders it, and only the reply is
printed.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import (
    add_chat_template,
    add_checkpoint,
    add_device,
    add_dtype,
    add_prompt,
    add_seed,
    add_tokenizer,
    read_prompt,
)
from glassgpt.console import say
from glassgpt.devices import parse_device
from glassgpt.errors import ConfigError, GlassError
from glassgpt.model.precision import parse_dtype
from glassgpt.sample.engine import is_small
from glassgpt.sample.generation import ContextWarning, GenerationConfig, stream
from glassgpt.sample.steering import parse_steer, steered
from glassgpt.sample.stops import unescape
from glassgpt.tokenizer.chat import PLAIN, chosen_template
from glassgpt.tokenizer.special import stop_ids
from glassgpt.tokenizer.streaming import stream_text


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Sample text from a trained glassgpt checkpoint (a run folder, its ckpt/ folder or one "
        "checkpoint folder) or an HF model folder."
    )
    p = parser
    add_checkpoint(p)
    src = add_prompt(p, file_help="read the prompt from FILE")
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
    add_seed(p, help="sample i uses seed + i")
    add_dtype(p)
    add_device(p)
    add_tokenizer(p)
    p.add_argument("--chat", action="store_true",
                   help="the prompt is a user message, rendered by the model's chat template; "
                   "print the reply")  # fmt: skip
    p.add_argument("--system", metavar="TEXT", default=None,
                   help="with --chat: the system message first")  # fmt: skip
    add_chat_template(p)
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    steers = [parse_steer(spec) for spec in args.steer]  # files read before the model loads
    prompt = read_prompt(args)
    if (args.system is not None or args.chat_template) and not args.chat:
        flag = "--system" if args.system is not None else "--chat-template"
        raise GlassError(f"{flag}: only with --chat")
    threads = torch.get_num_threads()  # restored at the end: main() may run in-process
    with warnings.catch_warnings():
        warnings.showwarning = _show
        warnings.simplefilter("default")
        warnings.simplefilter("ignore", ContextWarning)  # said once, before the text (Printer)
        try:
            model, tok, chat = _open(args)
            if not args.no_stop_eos:  # <|endoftext|>, a family's end-of-turn ids
                opts["stop_ids"] = stop_ids(tok)
            if chat is PLAIN:
                opts["stop"] = (*opts["stop"], *PLAIN.stops)
            printer = Printer(model, tok, opts, args.num_samples, args.seed, args.stats)
            printer.chat, printer.system = chat, args.system
            with steered(model, steers):  # (no steers: no hooks, the fast decoding paths)
                if not args.interactive:
                    printer.samples(prompt or "")
                    return 0
                for line in _lines():
                    printer.samples(unescape(line))
                return 0
        finally:
            torch.set_num_threads(threads)


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The generation options of the flags (validated: a bad value names its flag)."""
    opts = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "frequency_penalty": args.frequency_penalty,
        "stop": tuple(unescape(s) for s in args.stop),
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


def _show(message: Any, category: Any, *rest: Any, **kw: Any) -> None:
    say(str(message), kind="warning")


def _open(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model (cast to ``--dtype``), its tokenizer and, with ``--chat``, the chat template;
    the CPU threads set."""
    dtype = parse_dtype(args.dtype)
    if args.threads is not None:
        if args.threads < 1:
            raise GlassError(f"--threads: must be ≥ 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = parse_device(args.device)
    found = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device, dtype=dtype)
    if args.threads is None and is_small(found.model):
        torch.set_num_threads(1)
    tok = found.needs_tokenizer()
    chat = chosen_template(args.chat_template, found.chat_template, tok) if args.chat else None
    if args.chat and chat is None:
        raise GlassError(
            f"{args.checkpoint}: has no chat template (no chat_template in its "
            "tokenizer_config.json, no chat_template.jinja); pass --chat-template FILE, or "
            "--chat-template plain for 'role: content' lines"
        )
    return found.model, tok, chat


def _lines() -> Iterator[str]:
    """Prompts typed on stdin, up to an empty line or EOF."""
    while True:
        try:
            line = input("> " if sys.stdin.isatty() else "")
        except EOFError:
            return
        if not line:
            return
        yield line


class Printer:
    """Writes ``num_samples`` samples of each prompt to stdout, as they are sampled."""

    def __init__(self, model: Any, tok: Any, opts: dict[str, Any], num_samples: int,
                 seed: int | None, stats: bool) -> None:  # fmt: skip
        self.model, self.tok, self.opts = model, tok, opts
        self.num_samples, self.seed, self.stats = num_samples, seed, stats
        self.warned = False  # the sliding window is said once per command
        self.chat: Any = None  # --chat: the template that renders the prompt as a user turn
        self.system: str | None = None

    def encode(self, prompt: str) -> tuple[list[int], str]:
        """The prompt's ids and the text to print before the sample (with ``--chat``, none:
        the template's text is the model's business, the reply the user's)."""
        if self.chat is None:
            return list(self.tok.encode_prompt(prompt)), prompt
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        text = self.chat.render([*system, {"role": "user", "content": prompt}])
        if self.chat is PLAIN:
            return list(self.tok.encode_prompt(text)), ""
        return list(self.tok.encode(text, allowed_special="all")), ""  # the template has BOS

    def samples(self, prompt: str) -> None:
        ids, echo = self.encode(prompt)
        out = sys.stdout
        self.warn_overflow(self.model.config.n_ctx, len(ids))
        for i in range(self.num_samples):
            if i:
                out.write("\n" + "-" * 40 + "\n")
            seed = None if self.seed is None else self.seed + i
            out.write(echo)
            out.flush()
            start, count = time.perf_counter(), [0]
            tokens = stream(self.model, ids, tokenizer=self.tok, seed=seed, **self.opts)
            context = ids if self.chat is None else []  # a reply reads alone, as decode(reply)
            for piece in stream_text(self.tok, _counted(tokens, count), context):
                out.write(piece)
                out.flush()
            out.write("\n")
            out.flush()
            if self.stats:
                dt, n = time.perf_counter() - start, count[0]
                say(f"{n} tokens in {dt:.2f} s ({n / dt:.1f} tokens/s)", kind=None)

    def warn_overflow(self, n_ctx: int, n_prompt: int) -> None:
        """Once per command, before any text: the prompt is cut (a warning), or, with
        ``--stats``, the window will slide past the context (a note). Sliding is how text
        longer than the context is sampled, so by default it goes without a word."""
        opts = self.opts
        total = n_prompt + opts["max_new_tokens"]
        if total <= n_ctx or opts["overflow"] == "error" or self.warned:
            return
        if n_prompt > n_ctx and opts["overflow"] != "truncate":
            return  # an error, which names the prompt's length
        if n_prompt <= n_ctx and not self.stats:
            return
        window = min(opts["window"] or max(1, 3 * n_ctx // 4), n_ctx)
        say(
            f"{n_prompt} prompt + {opts['max_new_tokens']} new tokens exceed the model's "
            f"context n_ctx={n_ctx}: sliding the window (re-encoding the last {window} tokens "
            "when it fills; --overflow error stops instead)",
            kind="warning" if n_prompt > n_ctx else "note",
        )
        self.warned = True


def _counted(ids: Iterator[int], count: list[int]) -> Iterator[int]:
    for t in ids:
        count[0] += 1
        yield t
