"""TRANSITION (removed when every command is in glassgpt.cli): the stages' old parsers.

Each stage's ``commands`` module adds its subcommand to the parser (importing nothing heavy)
and points it at a handler in that stage; this module parses, dispatches and turns a
:class:`~glassgpt.errors.GlassError` into one line on stderr with exit status 2 (with
``--debug`` or ``GLASSGPT_DEBUG=1``, the whole traceback instead). Any other exception is a
bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from glassgpt.data import commands as data_commands
from glassgpt.errors import GlassError
from glassgpt.features import commands as sae_commands
from glassgpt.inspect import commands as inspect_commands
from glassgpt.inspect import patch_commands, study_commands
from glassgpt.interop import commands as interop_commands
from glassgpt.sample import commands as sample_commands
from glassgpt.scaling import commands as scaling_commands
from glassgpt.serve import commands as serve_commands
from glassgpt.tokenizer import commands as tokenizer_commands
from glassgpt.version import __version__

COMMAND_MODULES = (
    tokenizer_commands,
    data_commands,
    sample_commands,
    inspect_commands,
    study_commands,
    patch_commands,
    sae_commands,
    scaling_commands,
    interop_commands,
    serve_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glassgpt",
        description="The decoder-only GPT, exactly as its mathematics.",
    )
    parser.add_argument("--version", action="version", version=f"glassgpt {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or GLASSGPT_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def config_keys() -> list[str]:
    """Every ``section.field`` of a run config (what ``--set`` takes).

    >>> "train.max_steps" in config_keys() and "model.n_layers" in config_keys()
    True
    """
    import dataclasses
    import typing

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
    import difflib

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
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        subs = parser._subparsers._group_actions[0].choices if parser._subparsers else {}  # type: ignore[union-attr]
        sub = subs.get(args.command) if args.command else None
        if sub is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        sub.error(unknown_flags(sub, extras))
    if not getattr(args, "func", None):
        parser.print_help()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def parser_of(name: str) -> argparse.ArgumentParser:
    """The old sub-parser of command ``name``."""
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
