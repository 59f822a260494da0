"""The ``glassgpt`` command: wiring only.

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
from glassgpt.inspect import commands as inspect_commands
from glassgpt.inspect import patch_commands, study_commands
from glassgpt.interop import commands as interop_commands
from glassgpt.sample import commands as sample_commands
from glassgpt.scaling import commands as scaling_commands
from glassgpt.serve import commands as serve_commands
from glassgpt.tokenizer import commands as tokenizer_commands
from glassgpt.train import commands as train_commands
from glassgpt.train import describe_command as model_commands
from glassgpt.version import __version__

COMMAND_MODULES = (
    tokenizer_commands,
    model_commands,
    data_commands,
    train_commands,
    sample_commands,
    inspect_commands,
    study_commands,
    patch_commands,
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
