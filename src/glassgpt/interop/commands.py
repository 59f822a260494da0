"""``glassgpt export``: a checkpoint as a Hugging Face GPT-2 folder or a ``.tiktoken`` file.

    glassgpt export -c runs/default --format hf -o hf-model
    glassgpt export -c runs/default --format tiktoken -o tok.tiktoken

``--format hf`` writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json``: ``transformers``' ``AutoModelForCausalLM`` and ``AutoTokenizer``
load the folder without glassgpt (a byte-level BPE or a character tokenizer). ``--format tiktoken`` writes the tokenizer's ranks
(``-o`` a ``.tiktoken`` file, or a folder to hold ``tokenizer.tiktoken``). Light at import.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output

EOT = "<|endoftext|>"


def register(subparsers: Any) -> None:
    """Add ``export`` to the ``glassgpt`` parser."""
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint as an HF GPT-2 folder or a .tiktoken file",
        description="Export a glassgpt checkpoint: --format hf writes a folder transformers "
        "loads (weights, config and tokenizer files); --format tiktoken writes the tokenizer.",
    )
    add_checkpoint(p)
    p.add_argument("--format", choices=("hf", "tiktoken"), required=True)
    add_output(p, required=True, metavar="PATH", help="the folder (hf) or file (tiktoken)")
    p.set_defaults(func=run_export)


def _byte_level_bpe(tok: Any, what: str) -> None:
    from glassgpt.errors import GlassError

    if not hasattr(tok, "merges"):
        kind = type(tok).__name__
        raise GlassError(
            f"--format {what} needs a byte-level BPE tokenizer; this checkpoint's is a {kind} "
            "(train with --set data.tokenizer=bpe)"
        )


def export_hf(model: Any, tok: Any, out: Path) -> None:
    """Weights, ``config.json`` and the tokenizer files of an HF GPT-2 folder."""
    from glassgpt.interop import to_hf
    from glassgpt.interop.hf_tokenizers import save_tokenizer_json
    from glassgpt.storage import atomic_write

    char = not hasattr(tok, "merges")  # a character tokenizer: BPE without merges, Fuse decoder
    to_hf(model, out)
    save_tokenizer_json(tok, out / "tokenizer.json")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast" if char else "GPT2TokenizerFast",
        "model_max_length": model.config.n_ctx,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    if EOT in tok.special_tokens:
        config.update(bos_token=EOT, eos_token=EOT)
        if not char:
            config.update(unk_token=EOT)
    atomic_write(out / "tokenizer_config.json", (json.dumps(config, indent=2) + "\n").encode())


def export_tiktoken(tok: Any, out: Path) -> Path:
    from glassgpt.interop.tiktoken_format import save_tiktoken

    _byte_level_bpe(tok, "tiktoken")
    path = out if out.suffix == ".tiktoken" else out / "tokenizer.tiktoken"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tiktoken(tok, path)
    return path


def run_export(args: argparse.Namespace) -> int:
    from glassgpt.checkpoint import load
    from glassgpt.errors import GlassError

    model, tok = load(args.checkpoint)
    if tok is None:
        raise GlassError(f"{args.checkpoint}: has no tokenizer to export")
    out = Path(args.output)
    if args.format == "hf":
        export_hf(model, tok, out)
        print(f"wrote {out}: config.json, model.safetensors, tokenizer.json")
    else:
        print(f"wrote {export_tiktoken(tok, out)}")
    return 0
