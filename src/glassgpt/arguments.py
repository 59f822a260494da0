"""The flags every ``glassgpt`` command spells the same way, added by one helper each.

- ``-c/--checkpoint DIR``: a run folder, its ``ckpt/`` folder, one checkpoint folder, or a
  Hugging Face GPT-2 folder with tokenizer files.
- ``-o/--output PATH`` (``--out`` is the same flag): where a command writes.
- ``--preset NAME`` | ``--config FILE``, then ``--set KEY=VALUE [KEY=VALUE ...]``
  (repeatable, several values each): a run config resolved by
  :func:`glassgpt.train.resolve.resolve_run`.

Light at import: argparse only.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_checkpoint(p: Any, *, required: bool = True, help: str | None = None) -> None:
    """``-c/--checkpoint DIR`` (into ``args.checkpoint``) on a parser or argument group."""
    p.add_argument(
        "-c",
        "--checkpoint",
        metavar="DIR",
        required=required,
        help=help or "run folder, checkpoint folder, or HF GPT-2 folder with tokenizer files",
    )


def add_output(
    p: argparse.ArgumentParser,
    *,
    required: bool = False,
    default: Any = None,
    metavar: str = "PATH",
    help: str = "where to write",
) -> None:
    """``-o/--output PATH``, with ``--out`` as an alias (into ``args.output``)."""
    p.add_argument(
        "-o",
        "--output",
        "--out",
        dest="output",
        metavar=metavar,
        required=required,
        default=default,
        help=help,
    )


def add_overrides(p: argparse.ArgumentParser, *, example: str = "train.max_steps=500") -> None:
    """``--set KEY=VALUE [KEY=VALUE ...]``, repeatable (into ``args.overrides``)."""
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        nargs="+",
        action="extend",
        default=[],
        help=f"override a config key, e.g. --set {example} (repeatable, several per flag)",
    )


def add_run_source(
    p: argparse.ArgumentParser,
    *,
    required: bool = False,
    preset_help: str = "a preset (glassgpt presets lists them)",
    config_help: str = "a TOML run config",
    example: str = "train.max_steps=500",
) -> argparse._MutuallyExclusiveGroup:
    """``--preset NAME`` | ``--config FILE`` and ``--set``; returns the exclusive group so a
    command may add another source to it."""
    source = p.add_mutually_exclusive_group(required=required)
    source.add_argument("--preset", metavar="NAME", help=preset_help)
    source.add_argument("--config", metavar="FILE", help=config_help)
    add_overrides(p, example=example)
    return source
