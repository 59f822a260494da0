"""``glassgpt describe``: print the GPT function of a config as mathematics (Markdown or LaTeX).

The config is a preset (``--preset gpt2``) or a TOML file (``--config FILE``: its ``[model]``
table if it has one, else the whole file; a ``preset = "NAME"`` key in it starts from that
preset), then ``--set key=value`` overrides (``--set n_layers=2``). Light at import: the
handler imports what it needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``describe`` to the ``glassgpt`` parser."""
    p = subparsers.add_parser(
        "describe",
        help="print the GPT function of a config as mathematics",
        description="Print f : V^n -> Delta(V)^n for a config: each map with its domain, "
        "codomain and shapes, the block equations of the chosen variants, the parameter "
        "table, FLOPs per token and training memory.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", metavar="NAME", help="a named preset, e.g. gpt2, cpu-tiny")
    source.add_argument("--config", metavar="FILE", type=Path, help="a TOML file ([model] table)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model field, e.g. --set n_layers=2 (repeatable)",
    )
    p.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    p.add_argument(
        "--seq-len", type=int, default=None, help="context T for FLOPs and memory (default n_ctx)"
    )
    p.add_argument("--batch-size", type=int, default=8, help="batch B for the memory estimate")
    p.add_argument("--output", "-o", type=Path, default=None, help="write here instead of stdout")
    p.set_defaults(func=run_describe)


def resolve_config(
    preset: str | None, config_file: Path | None, overrides: list[str]
) -> tuple[Any, str]:
    """The GPTConfig named by a preset or a TOML file, with ``key=value`` overrides; and a title."""
    from glassgpt.config import apply_overrides, load_toml
    from glassgpt.errors import ConfigError
    from glassgpt.model.config import GPTConfig

    if config_file is not None:
        data = load_toml(config_file)
        table = data.get("model", data)
        if not isinstance(table, dict):
            raise ConfigError("model", f"{config_file}: expected a [model] table")
        title = str(config_file)
    else:
        table, title = {"preset": preset}, str(preset)
    keys = [item.removeprefix("model.") for item in overrides]
    table = apply_overrides(table, keys)
    name = table.pop("preset", None)
    if name is None:
        return GPTConfig.from_dict(table), title
    if not isinstance(name, str):
        raise ConfigError("preset", f"expected a preset name, got {name!r}")
    return GPTConfig.preset(name, **table), title


def run_describe(args: argparse.Namespace) -> int:
    from glassgpt.model.describe import describe

    config, title = resolve_config(args.preset, args.config, args.overrides)
    text = describe(
        config, fmt=args.format, seq_len=args.seq_len, batch_size=args.batch_size, name=title
    )
    if args.output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    from glassgpt.storage import atomic_write

    atomic_write(args.output, text.encode("utf-8"))
    return 0
