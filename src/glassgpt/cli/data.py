"""``glassgpt data``: ``prepare`` text into token shards, ``info`` on a prepared folder.

    glassgpt data prepare --input PATH... | --hf-dataset NAME[:split] | --stdlib
                          --tokenizer TOK.json | --char | --train-tokenizer VOCAB_SIZE
                          --output DIR [--val-fraction F] [--shard-tokens N]
                          [--text-field NAME] [--skip-bad]
    glassgpt data info DIR [--tokenizer TOK.json]

The work is in :mod:`glassgpt.data.prepare` (shards) and :mod:`glassgpt.data.documents`
(the inputs).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_no_progress, add_output
from glassgpt.console import say
from glassgpt.data.corpus import default_corpus_files
from glassgpt.data.documents import HF_PREFIX, Corpus
from glassgpt.data.prepare import EOT, char_tokenizer, prepare
from glassgpt.data.shards import DataDir
from glassgpt.errors import ConfigError
from glassgpt.tokenizer import Tokenizer, load_tokenizer


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    p = sub.add_parser("prepare", help="encode text files into train/val token shards")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--input",
        nargs="+",
        metavar="PATH",
        help="files or folders: text, .jsonl, .json, .parquet, or a dataset saved with "
        "save_to_disk",
    )
    src.add_argument(
        "--hf-dataset",
        metavar="NAME[:SPLIT]",
        help="a Hugging Face dataset that the datasets package can load (default split: train)",
    )
    src.add_argument(
        "--stdlib",
        action="store_true",
        help="the default corpus: this interpreter's standard library sources",
    )
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", type=Path, metavar="TOK", help="a saved tokenizer JSON")
    tok.add_argument("--char", action="store_true", help="a character vocabulary of the input")
    tok.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB_SIZE",
        help=f"train a byte-level BPE tokenizer (with {EOT}) on the input",
    )
    add_output(p, required=True, metavar="DIR", help="data folder")
    p.add_argument(
        "--val-fraction", type=float, default=0.1, help="last fraction of the text (0.1)"
    )
    p.add_argument(
        "--shard-tokens", type=int, default=100_000_000, help="tokens per shard file (1e8)"
    )
    p.add_argument(
        "--glob", default="*", metavar="PATTERN", help="files to take from folders ('*')"
    )
    p.add_argument("--max-bytes", type=int, default=None, help="with --stdlib: cap the corpus size")
    p.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="the records' text field or column (default: text)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip records that are not JSON or lack a string text field, and count them",
    )
    p.add_argument(
        "--workers", type=int, default=None, metavar="N", help="cores to encode on (all)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace prepared data in DIR")
    add_no_progress(p)
    p.set_defaults(func=run_prepare)

    i = sub.add_parser("info", help="describe a prepared data folder")
    i.add_argument("folder", type=Path, metavar="DIR")
    i.add_argument(
        "--tokenizer", type=Path, metavar="TOK", help="also check that DIR was made with TOK"
    )
    i.set_defaults(func=run_info)


def run_prepare(args: argparse.Namespace) -> int:
    if args.stdlib:
        inputs: list[Any] = list(default_corpus_files(args.max_bytes))
    else:
        if args.max_bytes is not None:
            raise ConfigError("--max-bytes", "applies only with --stdlib")
        inputs = args.input or [HF_PREFIX + args.hf_dataset]
    corpus = Corpus(inputs, text_field=args.text_field, skip_bad=args.skip_bad, pattern=args.glob)
    if corpus.text_only or args.val_fraction > 0:
        corpus.sizes()  # empty input: fail before building a tokenizer
    data = prepare(
        corpus,
        Path(args.output),
        _tokenizer(args, corpus),
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens,
        workers=args.workers,
        progress=not args.no_progress,
        overwrite=args.overwrite,
    )
    print(_describe(data))
    skipped = corpus.describe_skipped()
    if skipped:
        say(skipped, kind=None)
    return 0


def _tokenizer(args: argparse.Namespace, corpus: Corpus) -> Any:
    """The tokenizer of ``--tokenizer``, ``--char`` or ``--train-tokenizer``."""
    if args.tokenizer is not None:
        return load_tokenizer(args.tokenizer)
    if args.char:
        return char_tokenizer(corpus)
    if args.train_tokenizer < 257:
        raise ConfigError("--train-tokenizer", f"must be at least 257, got {args.train_tokenizer}")
    return Tokenizer.train(
        corpus.texts(), args.train_tokenizer, special_tokens=(EOT,), progress=not args.no_progress
    )


def run_info(args: argparse.Namespace) -> int:
    tokenizer = None if args.tokenizer is None else load_tokenizer(args.tokenizer)
    print(_describe(DataDir.open(args.folder, tokenizer)))
    return 0


def _describe(data: DataDir) -> str:
    m = data.meta
    lines = [
        f"{data.path}: {m.tokenizer_kind} tokenizer, n_vocab={m.n_vocab}, {m.dtype}, "
        f"{len(m.sources)} source files, separator {m.separator_text!r} ({m.separator_kind})"
    ]
    for name, s in m.splits.items():
        ratio = f"{s.bytes_per_token:.3f} bytes/token" if s.tokens else "empty"
        lines.append(
            f"  {name:5s} {s.tokens:>12,d} tokens {s.bytes:>13,d} bytes "
            f"{len(s.shards):>3d} shards  {ratio}"
        )
    return "\n".join(lines)
