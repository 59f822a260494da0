"""``glassgpt describe``: print the GPT function of a config as mathematics (Markdown or LaTeX).

The config is a preset (``--preset gpt2``: the same list as ``glassgpt train``), a TOML file
(``--config FILE``: its ``[model]`` table if it has one, else the whole file; a
``preset = "NAME"`` key in that table starts from that preset's model), or a trained model
(``-c/--checkpoint DIR``: a run folder, a checkpoint, or an HF GPT-2 folder); then
``--set key=value`` overrides (``--set n_layers=2``; ``model.`` may be left out). Light at
import: the handler imports what it needs.

The command describes :mod:`glassgpt.model`, but it resolves a run's config as ``train`` does
(:func:`glassgpt.train.resolve.resolve_run`) and reads HF configs (:mod:`glassgpt.interop`),
so it lives in ``train``, the first stage below both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output, add_run_source

SECTIONS = ("model.", "train.", "data.", "seed")


def register(subparsers: Any) -> None:
    """Add ``describe`` to the ``glassgpt`` parser."""
    p = subparsers.add_parser(
        "describe",
        help="print the GPT function of a config as mathematics",
        description="Print f : V^n -> Delta(V)^n for a config: each map with its domain, "
        "codomain and shapes, the block equations of the chosen variants, the parameter "
        "table, FLOPs per token and training memory.",
    )
    source = add_run_source(
        p,
        required=True,
        config_help="a TOML file ([model] table), or a run folder",
        example="n_layers=2",
    )
    add_checkpoint(source, required=False)
    p.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    p.add_argument(
        "--seq-len", type=int, default=None, help="context T for FLOPs and memory (default n_ctx)"
    )
    p.add_argument("--batch-size", type=int, default=8, help="batch B for the memory estimate")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="also the memory of each of N data-parallel ranks, DDP and FSDP (B per rank)",
    )
    add_output(p, help="write here instead of stdout")
    p.set_defaults(func=run_describe)


def _sectioned(overrides: list[str]) -> list[str]:
    """``n_layers=2`` → ``model.n_layers=2``; keys with a section stay."""
    return [o if o.startswith(SECTIONS) else f"model.{o}" for o in overrides]


def _model_table(preset: str | None, config_file: Path | None) -> tuple[dict[str, Any], str]:
    """The raw run config (``[model]`` and the rest) and a title."""
    from glassgpt.config import load_toml
    from glassgpt.errors import ConfigError
    from glassgpt.train.config import preset_dict

    if config_file is None:
        raw = preset_dict(str(preset))
        raw.pop("description", None)
        return raw, str(preset)
    data = load_toml(config_file)
    data.pop("description", None)
    raw = data if "model" in data else {"model": data}
    if not isinstance(raw["model"], dict):
        raise ConfigError("model", f"{config_file}: expected a [model] table")
    name = raw["model"].pop("preset", None)
    if name is not None:
        from glassgpt.train.resolve import preset_model

        if not isinstance(name, str):
            raise ConfigError("preset", f"expected a preset name, got {name!r}")
        raw["model"] = {**preset_model(name), **raw["model"]}
    return raw, str(config_file)


def trained_model_table(path: Path) -> dict[str, Any]:
    """The ``[model]`` table of a run folder, checkpoint folder, or HF GPT-2 folder."""
    import json

    from glassgpt.config import load_toml
    from glassgpt.errors import InputFileError

    if not path.is_dir():
        raise InputFileError(f"{path}: no such run, checkpoint or model folder")
    if (path / "config.toml").is_file() and not (path / "state.json").is_file():
        return dict(load_toml(path / "config.toml").get("model", {}))
    if (path / "config.json").is_file():
        from glassgpt.interop.hf_gpt2 import config_from_hf

        return config_from_hf(json.loads((path / "config.json").read_text("utf-8"))).to_dict()
    import tomllib

    from glassgpt import checkpoint as ckpt

    chosen = ckpt.load_checkpoint(path) if (path / ckpt.STATE).is_file() else None
    chosen = chosen or ckpt.find_resumable(path)
    return dict(tomllib.loads(chosen.text("config.toml")).get("model", {}))


def resolve_config(
    preset: str | None,
    config_file: Path | None,
    overrides: list[str],
    checkpoint: Path | None = None,
) -> tuple[Any, str]:
    """The GPTConfig of a preset, TOML file, run or checkpoint, with overrides; and a title.

    Through :func:`glassgpt.train.resolve.resolve_run`, as ``train`` resolves it; errors name
    the model field without its ``model.`` prefix. Where the tokenizer decides ``n_vocab``
    (no explicit value), a BPE preset's ``vocab_size`` stands in for it.
    """
    from glassgpt.errors import ConfigError
    from glassgpt.train.resolve import resolve_run

    if config_file is not None and Path(config_file).is_dir():
        checkpoint, config_file = Path(config_file), None
    if checkpoint is not None:
        raw, title = {"model": trained_model_table(Path(checkpoint))}, str(checkpoint)
    else:
        raw, title = _model_table(preset, config_file)
    try:
        run = resolve_run(base=raw, overrides=_sectioned(overrides))
        config = run.config.model
        if not run.vocab_given and checkpoint is None:
            config = run.with_vocab(_stand_in_vocab(run.config.data)).model
    except ConfigError as e:
        if not e.field.startswith("model."):
            raise
        field = e.field.removeprefix("model.")
        raise ConfigError(field, str(e)[len(e.field) + 2 :]) from None
    return config, title


CHAR_VOCAB = 256  # shown for a character tokenizer, whose size the data decides


def _stand_in_vocab(data: Any) -> int:
    """n_vocab when the tokenizer decides it: a BPE's ``vocab_size``; for a character
    vocabulary (the data's distinct characters), 256, with a note saying so."""
    if data.tokenizer == "bpe":
        return int(data.vocab_size)
    if data.tokenizer == "char":
        print(
            f"glassgpt: note: a character tokenizer's n_vocab is the data's number of distinct "
            f"characters; shown with {CHAR_VOCAB} (--set n_vocab=N for yours)",
            file=sys.stderr,
        )
        return CHAR_VOCAB
    return 50257


def run_describe(args: argparse.Namespace) -> int:
    from glassgpt.model.describe import describe

    config_file = Path(args.config) if args.config else None
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    config, title = resolve_config(args.preset, config_file, args.overrides, checkpoint)
    text = describe(
        config,
        fmt=args.format,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        name=title,
        world_size=args.world_size,
    )
    if args.output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    from glassgpt.storage import atomic_write

    atomic_write(Path(args.output), text.encode("utf-8"))
    return 0
