"""``glassgpt tokenizer``: train, encode, decode, stats.

    glassgpt tokenizer train  --input PATH... --vocab-size N --output tok.json
                              [--pattern gpt2|gpt4|none] [--special TOKEN...] [--kind bpe|char]
    glassgpt tokenizer encode --tokenizer tok.json  < text  > ids
    glassgpt tokenizer decode --tokenizer tok.json  < ids   > text
    glassgpt tokenizer stats  --tokenizer tok.json PATH...

Ids are written and read as whitespace-separated integers. ``--tokenizer`` takes a saved
tokenizer (either kind), an HF ``tokenizer.json`` (a model family's own: Llama 3, Qwen, Gemma
…, run by the ``tokenizers`` library as the file says) or the HF folder holding it, or a
folder holding GPT-2's ``encoder.json`` and ``vocab.bpe``; glassgpt looks nowhere else for
them. ``stats`` first prints the map
Text → V* the tokenizer computes (:mod:`glassgpt.tokenizer.pipeline`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_output
from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer import CharTokenizer, Tokenizer, open_tokenizer
from glassgpt.tokenizer.files import read_text
from glassgpt.tokenizer.pipeline import pipeline


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND", required=True)

    t = sub.add_parser("train", help="learn a tokenizer from text files")
    t.add_argument("--input", nargs="+", required=True, metavar="PATH", help="UTF-8 text files")
    add_output(t, required=True, help="where to write the tokenizer JSON")
    t.add_argument(
        "--kind", choices=["bpe", "char"], default="bpe", help="byte-level BPE or characters"
    )
    t.add_argument(
        "--vocab-size", type=int, metavar="N", help="ids in all, specials included (bpe)"
    )
    t.add_argument(
        "--pattern", choices=["gpt2", "gpt4", "none"], default="gpt2", help="pre-tokenizer"
    )
    t.add_argument(
        "--special",
        nargs="+",
        default=[],
        metavar="TOKEN",
        help="special tokens, e.g. '<|endoftext|>'",
    )
    t.set_defaults(func=run_train)

    e = sub.add_parser("encode", help="text on stdin → ids on stdout")
    _tokenizer_arg(e)
    e.add_argument(
        "--specials",
        choices=["error", "allow", "text"],
        default="error",
        help="a special token's string in the text: an error (default), its id, or plain text",
    )
    e.set_defaults(func=run_encode)

    d = sub.add_parser("decode", help="ids on stdin → text on stdout")
    _tokenizer_arg(d)
    d.set_defaults(func=run_decode)

    s = sub.add_parser("stats", help="bytes per token and vocabulary use on text files")
    _tokenizer_arg(s)
    s.add_argument("paths", nargs="+", metavar="PATH", help="UTF-8 text files")
    s.set_defaults(func=run_stats)


def _tokenizer_arg(parser: argparse.ArgumentParser) -> None:
    # required, and a folder of GPT-2's files too: not the shared --tokenizer (a file, optional)
    parser.add_argument(
        "--tokenizer",
        required=True,
        metavar="PATH",
        help="tokenizer JSON (glassgpt's or HF's), an HF folder with tokenizer.json, or a "
        "folder with GPT-2's encoder.json and vocab.bpe",
    )


def _read_stdin() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"stdin: not UTF-8 at byte offset {e.start}") from None


def run_train(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.input]
    progress = sys.stderr.isatty()
    start = time.perf_counter()
    if args.kind == "char":
        tok: Any = CharTokenizer.train(paths, special_tokens=args.special)
    else:
        if args.vocab_size is None:
            raise GlassError("tokenizer train: --vocab-size is required for --kind bpe")
        pattern = None if args.pattern == "none" else args.pattern
        tok = Tokenizer.train(
            paths, args.vocab_size, pattern=pattern, special_tokens=args.special, progress=progress
        )
    tok.save(args.output)
    print(
        f"{tok!r} trained on {len(paths)} file(s) in {time.perf_counter() - start:.1f} s -> {args.output}",
        file=sys.stderr,
    )
    return 0


def run_encode(args: argparse.Namespace) -> int:
    tok = open_tokenizer(args.tokenizer)
    policy = {"error": {}, "allow": {"allowed_special": "all"}, "text": {"disallowed_special": ()}}
    ids = tok.encode(_read_stdin(), **policy[args.specials])
    sys.stdout.write(" ".join(map(str, ids)) + "\n")
    return 0


def run_decode(args: argparse.Namespace) -> int:
    tok = open_tokenizer(args.tokenizer)
    words = _read_stdin().split()
    try:
        ids = [int(w) for w in words]
    except ValueError:
        k, bad = next((k, w) for k, w in enumerate(words) if not w.lstrip("-").isdigit())
        raise GlassError(
            f"stdin: word {k + 1} {bad[:40]!r} is not a token id (an integer)"
        ) from None
    sys.stdout.write(tok.decode(ids))
    sys.stdout.flush()
    return 0


def run_stats(args: argparse.Namespace) -> int:
    tok = open_tokenizer(args.tokenizer)
    rows, used_all, totals = [], set(), [0, 0, 0]
    for p in args.paths:
        text = read_text(p)
        ids = tok.encode(text, disallowed_special=())
        used = set(ids)
        used_all |= used
        n_bytes = len(text.encode("utf-8"))
        rows.append((str(p), n_bytes, len(text), len(ids), len(used)))
        for k, v in enumerate((n_bytes, len(text), len(ids))):
            totals[k] += v
    if len(rows) > 1:
        rows.append(("total", *totals, len(used_all)))
    width = max(len(r[0]) for r in rows)
    print(f"Text → V*, |V| = {tok.n_vocab:,}")
    for stage, what in pipeline(tok):
        print(f"  {stage:<17} {what}")
    print()
    print(
        f"{'file':<{width}}  {'bytes':>12}  {'chars':>12}  {'tokens':>12}  {'bytes/token':>11}  vocab used"
    )
    for name, n_bytes, n_chars, n_tokens, n_used in rows:
        ratio = n_bytes / n_tokens if n_tokens else float("nan")
        print(
            f"{name:<{width}}  {n_bytes:>12,}  {n_chars:>12,}  {n_tokens:>12,}  {ratio:>11.3f}  "
            f"{n_used:,} / {tok.n_vocab:,} ({100 * n_used / tok.n_vocab:.1f}%)"
        )
    return 0
