"""The flags every ``glassgpt`` command spells the same way, added by one helper each.

- ``-c/--checkpoint DIR``: a run folder, its ``ckpt/`` folder, one checkpoint folder, or a
  Hugging Face GPT-2 folder with tokenizer files (opened by
  :func:`glassgpt.checkpoint.open_run`).
- ``-o/--output PATH`` (``--out`` is the same flag): where a command writes.
- ``--preset NAME`` | ``--config FILE``, then ``--set KEY=VALUE [KEY=VALUE ...]``
  (repeatable, several values each): a run config resolved by
  :func:`glassgpt.train.resolve.resolve_run`.
- ``--device``, ``--dtype``, ``--tokenizer FILE``, ``--prompt TEXT`` | ``--prompt-file FILE``
  (read by :func:`read_prompt`; the stages encode it with the tokenizer's ``encode_prompt``,
  which puts a model family's BOS first), ``--chat-template``, ``--json``, ``--no-progress``,
  ``--seed``.

Light at import (argparse only): ``glassgpt --help`` builds no command's parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from glassgpt.errors import InputFileError

DEVICE_HELP = "cpu, cuda, cuda:N or mps"
DTYPE_HELP = "float32, bf16 (weights and compute), int8 or int4 (weights; CPU)"


def add_checkpoint(p: Any, *, required: bool = True, help: str | None = None) -> None:
    """``-c/--checkpoint DIR`` (into ``args.checkpoint``) on a parser or argument group."""
    p.add_argument(
        "-c",
        "--checkpoint",
        metavar="DIR",
        required=required,
        help=help
        or "run folder, checkpoint folder, HF model folder (GPT-2, Llama, Mistral, Qwen, Gemma, "
        "GPT-NeoX), or hf:ORG/NAME[@REVISION] from the HF cache",
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


def add_device(p: Any, *, default: str | None = "cpu", help: str | None = None) -> None:
    """``--device DEV`` (into ``args.device``)."""
    p.add_argument("--device", metavar="DEV", default=default, help=help or DEVICE_HELP)


def add_dtype(p: Any, *, default: str | None = "float32", help: str | None = None) -> None:
    """``--dtype NAME`` (into ``args.dtype``): what ``glassgpt.load(dtype=...)`` takes."""
    p.add_argument("--dtype", metavar="NAME", default=default, help=help or DTYPE_HELP)


def add_tokenizer(p: Any) -> None:
    """``--tokenizer FILE`` (into ``args.tokenizer``): for a folder without one."""
    p.add_argument(
        "--tokenizer",
        metavar="FILE",
        type=Path,
        default=None,
        help="a tokenizer file (when the folder has none)",
    )


def add_prompt(
    p: Any,
    *,
    required: bool = False,
    help: str = "the text to continue",
    file_help: str = "read the prompt from FILE (UTF-8)",
) -> argparse._MutuallyExclusiveGroup:
    """``--prompt/-p TEXT`` | ``--prompt-file FILE`` (one of them; :func:`read_prompt` gives
    the text). Returns the exclusive group, so that a command may add another source."""
    source = p.add_mutually_exclusive_group(required=required)
    source.add_argument("--prompt", "-p", metavar="TEXT", help=help)
    source.add_argument("--prompt-file", metavar="FILE", type=Path, help=file_help)
    return source


def read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt of ``--prompt`` or ``--prompt-file`` (None when neither was given); a file
    that is missing, unreadable or not UTF-8 is one line naming it.

    >>> read_prompt(argparse.Namespace(prompt="ROMEO:", prompt_file=None))
    'ROMEO:'
    >>> read_prompt(argparse.Namespace(prompt=None, prompt_file=Path("/nonexistent/p.txt")))
    Traceback (most recent call last):
    glassgpt.errors.InputFileError: /nonexistent/p.txt: no such prompt file
    """
    if getattr(args, "prompt_file", None) is None:
        return args.prompt
    path = Path(args.prompt_file)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such prompt file") from None
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path}: not UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the prompt ({e.strerror or e})") from None


def add_chat_template(p: Any) -> None:
    """``--chat-template FILE|plain`` (into ``args.chat_template``): for a model without one."""
    p.add_argument(
        "--chat-template",
        metavar="FILE|plain",
        default=None,
        help="a Jinja chat template, instead of the model's (tokenizer_config.json); plain: "
        "glassgpt's 'role: content' lines, for a model trained without one",
    )


def add_json(p: Any, *, help: str = "print one JSON object") -> None:
    """``--json`` (into ``args.json``): machine-readable output on stdout."""
    p.add_argument("--json", action="store_true", help=help)


def add_no_progress(p: Any, *, help: str = "no progress bar") -> None:
    """``--no-progress`` (into ``args.no_progress``)."""
    p.add_argument("--no-progress", action="store_true", help=help)


def add_seed(p: Any, *, default: int | None = None, help: str = "random seed") -> None:
    """``--seed N`` (into ``args.seed``)."""
    p.add_argument("--seed", type=int, default=default, help=help)
