"""``glassgpt export``: a checkpoint as a Hugging Face model folder, a GGUF file or a
``.tiktoken`` file.

    glassgpt export -c runs/default --format hf -o hf-model
    glassgpt export -c runs/default --format gguf -o model.gguf --gguf-type q8_0
    glassgpt export -c runs/default --format tiktoken -o tok.tiktoken

``--format hf`` writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json``, which ``transformers`` loads without glassgpt, as the family
that computes the config (GPT-2, Llama, Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3, GPT-NeoX;
``docs/interop.md``; another config is refused naming the field);
``--format gguf`` (the ``gguf`` extra) writes one file that llama.cpp, Ollama and LM Studio
run, as the llama.cpp architecture that computes the config (gpt2, llama, qwen2, qwen3,
gemma2, gemma3, gptneox; ``-o`` a ``.gguf`` file, or a folder to hold ``model.gguf``);
``--format tiktoken`` writes the tokenizer's ranks (``-o`` a ``.tiktoken`` file, or a folder
to hold ``tokenizer.tiktoken``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import add_checkpoint, add_output, add_tokenizer
from glassgpt.interop.export import export_hf, export_tiktoken
from glassgpt.interop.gguf_export import DTYPES, export_gguf


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Export a glassgpt checkpoint: --format hf writes a folder transformers loads "
        "(weights, config and tokenizer files) as the family that computes its config "
        "(GPT-2, Llama, Mistral, Qwen 2/3, Gemma 2/3, GPT-NeoX); --format gguf writes one file "
        "llama.cpp runs (pip install 'glassgpt[gguf]'); --format tiktoken writes the tokenizer."
    )
    add_checkpoint(parser)
    parser.add_argument("--format", choices=("hf", "gguf", "tiktoken"), required=True)
    parser.add_argument(
        "--gguf-type", choices=DTYPES, default="f32",
        help="the GGUF weights' type (default f32; norms and biases stay f32)",
    )  # fmt: skip
    add_output(parser, required=True, metavar="PATH",
               help="the folder (hf), or the file (gguf, tiktoken)")  # fmt: skip
    add_tokenizer(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    found = open_run(args.checkpoint, tokenizer=args.tokenizer)
    tok = found.needs_tokenizer()
    out = Path(args.output)
    if args.format == "hf":
        written = export_hf(found.model, tok, out, found.tokenizer_files)
        print(f"wrote {out}: {', '.join(p.name for p in written)}")
    elif args.format == "gguf":
        path = out if out.suffix == ".gguf" else out / "model.gguf"
        template = getattr(found.chat_template, "source", None)  # llama.cpp renders it
        path = export_gguf(found.model, tok, path, dtype=args.gguf_type, chat_template=template)
        print(f"wrote {path}")
    else:
        print(f"wrote {export_tiktoken(tok, out)}")
    return 0
