"""``glassgpt export``: a checkpoint as a Hugging Face model folder or a ``.tiktoken`` file.

    glassgpt export -c runs/default --format hf -o hf-model
    glassgpt export -c runs/default --format tiktoken -o tok.tiktoken

``--format hf`` writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json``, which ``transformers`` loads without glassgpt, as the family
that computes the config (GPT-2, Llama, Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3, GPT-NeoX;
``docs/interop.md``; another config is refused naming the field);
``--format tiktoken`` writes the tokenizer's ranks (``-o`` a ``.tiktoken`` file, or a folder
to hold ``tokenizer.tiktoken``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import add_checkpoint, add_output, add_tokenizer
from glassgpt.interop.export import export_hf, export_tiktoken


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Export a glassgpt checkpoint: --format hf writes a folder transformers loads "
        "(weights, config and tokenizer files) as the family that computes its config "
        "(GPT-2, Llama, Mistral, Qwen 2/3, Gemma 2/3, GPT-NeoX); --format tiktoken writes "
        "the tokenizer."
    )
    add_checkpoint(parser)
    parser.add_argument("--format", choices=("hf", "tiktoken"), required=True)
    add_output(parser, required=True, metavar="PATH", help="the folder (hf) or file (tiktoken)")
    add_tokenizer(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    found = open_run(args.checkpoint, tokenizer=args.tokenizer)
    tok = found.needs_tokenizer()
    out = Path(args.output)
    if args.format == "hf":
        written = export_hf(found.model, tok, out)
        print(f"wrote {out}: {', '.join(p.name for p in written)}")
    else:
        print(f"wrote {export_tiktoken(tok, out)}")
    return 0
