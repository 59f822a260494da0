"""The ``glassgpt`` command: a table of commands, each read top to bottom in its own module.

``COMMANDS`` lists every command with its one-line help. ``glassgpt --help`` is printed from
the table alone: no command module (and no stage, no torch) is imported. ``glassgpt NAME …``
imports ``glassgpt.cli.MODULE``, whose ``register(parser)`` adds its flags and sets
``func``, then parses and runs it. A :class:`~glassgpt.errors.GlassError` ends as one line on
stderr and exit status 2 (with ``--debug`` or ``GLASSGPT_DEBUG=1``, the whole traceback); any
other exception is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import os
import sys
import typing
from collections.abc import Sequence
from typing import NamedTuple

from glassgpt.errors import GlassError
from glassgpt.version import __version__


class Command(NamedTuple):
    name: str
    module: str  # glassgpt.cli.<module>
    help: str


COMMANDS = (
    Command("tokenizer", "tokenizer", "train, apply and inspect tokenizers"),
    Command("describe", "describe", "print the GPT function of a config as mathematics"),
    Command("data", "data", "prepare token shards from text"),
    Command("train", "train", "train a GPT on text (no arguments: a small model of the Python stdlib)"),
    Command("presets", "presets", "list the presets of train and describe, one line each"),
    Command("eval", "eval", "loss, perplexity and bits per byte of a model on text files"),
    Command("sample", "sample", "generate text from a checkpoint, streamed to the terminal"),
    Command("steer", "steer", "make a steering vector from contrastive prompts (for sample/serve --steer)"),
    Command("inspect", "inspect", "an HTML report of a model's circuits on a prompt"),
    Command("study", "study", "a built-in interpretability study (induction)"),
    Command("patch", "patch", "activation patching heat maps (clean into corrupted)"),
    Command("ablate", "ablate", "the effect of ablating heads, MLPs or neurons on a prompt"),
    Command("sae", "sae", "sparse autoencoders and transcoders on a model's activations"),
    Command("graph", "graph", "the attribution graph of a prompt through transcoders (circuit-tracer's JSON)"),
    Command("sweep", "sweep", "train a grid of runs (sizes × token budgets × any config field × seeds)"),
    Command("scaling", "scaling", "fit L(N, D) to a sweep and predict loss"),
    Command("export", "export", "write a checkpoint as an HF model folder or a .tiktoken file"),
    Command("serve", "serve", "serve a checkpoint: OpenAI-compatible API and an explorer page"),
)  # fmt: skip
BY_NAME = {c.name: c for c in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The ``glassgpt`` parser with every command's flags (imports every command module)."""
    return parsers()[0]


def parsers(
    commands: Sequence[str] | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``glassgpt`` parser, with a sub-parser per command; only ``commands`` (default:
    all) get their flags, from their modules. Returns it and the sub-parsers by name."""
    parser = argparse.ArgumentParser(
        prog="glassgpt", description="The decoder-only GPT, exactly as its mathematics."
    )
    parser.add_argument("--version", action="version", version=f"glassgpt {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or GLASSGPT_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    by_name = {c.name: sub.add_parser(c.name, help=c.help) for c in COMMANDS}
    for name in COMMANDS if commands is None else [BY_NAME[n] for n in commands]:
        name = name.name if isinstance(name, Command) else name
        importlib.import_module(f"glassgpt.cli.{BY_NAME[name].module}").register(by_name[name])
    return parser, by_name


def command_of(argv: Sequence[str]) -> str | None:
    """The command named in ``argv``: its first word that is not an option.

    >>> command_of(["--debug", "train", "--preset", "cpu-tiny"]), command_of(["--help"])
    ('train', None)
    """
    return next((a for a in argv if not a.startswith("-")), None)


def config_keys() -> list[str]:
    """Every ``section.field`` of a run config (what ``--set`` takes).

    >>> "train.max_steps" in config_keys() and "model.n_layers" in config_keys()
    True
    """
    # the error path only: --help stays free of the config's stages
    from glassgpt.train.config import RunConfig

    keys = []
    for name, kind in typing.get_type_hints(RunConfig).items():
        if dataclasses.is_dataclass(kind):
            keys += [f"{name}.{f.name}" for f in dataclasses.fields(kind)]
        else:
            keys.append(name)
    return keys


def unknown_flags(sub: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """The error for arguments ``sub`` does not know, with the nearest flag or config key.

    >>> sub = argparse.ArgumentParser(prog="glassgpt sample")
    >>> _ = sub.add_argument("--prompt"); _ = sub.add_argument("--set")
    >>> unknown_flags(sub, ["--promt", "x"])
    'unrecognized arguments: --promt x (did you mean --prompt?)'
    >>> unknown_flags(sub, ["--max-steps", "5"])
    'unrecognized arguments: --max-steps 5 (did you mean --set train.max_steps=5?)'
    """
    message = f"unrecognized arguments: {' '.join(extras)}"
    first = next((i for i, a in enumerate(extras) if a.startswith("--")), None)
    if first is None:
        return message
    flag, *value = extras[first].split("=", 1)
    after = extras[first + 1 : first + 2]
    if not value and after and not after[0].startswith("-"):
        value = after  # --max-steps 5
    known = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    if close:
        return f"{message} (did you mean {close[0]}?)"
    if "--set" in known:
        name = flag[2:].replace("-", "_")
        keys = [k for k in config_keys() if k.rsplit(".", 1)[-1] == name]
        if keys:
            return f"{message} (did you mean --set {keys[0]}={value[0] if value else ''}?)"
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    return f"{message} (did you mean {close[0]}?)" if close else message


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = command_of(argv)
    parser, by_name = parsers([name] if name in BY_NAME else [])
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = by_name.get(args.command) if args.command else None
        if sub is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        sub.error(unknown_flags(sub, extras))
    if not getattr(args, "func", None):
        # a bare group (`glassgpt sae`) prints its own help; a bare `glassgpt`, the table's
        (by_name[args.command] if args.command else parser).print_help()
        return 0 if args.command is None and not argv else 2
    debug = args.debug or os.environ.get("GLASSGPT_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except GlassError as e:
        if debug:
            raise
        print(f"glassgpt: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("glassgpt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `glassgpt tokenizer encode | head`
        return 0
