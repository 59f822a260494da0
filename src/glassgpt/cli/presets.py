"""``glassgpt presets``: the presets of ``train`` and ``describe`` (one list), one line each.

glassgpt presets
"""

from __future__ import annotations

import argparse

from glassgpt.train.resolve import preset_descriptions


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The presets that `glassgpt train --preset` and `glassgpt describe --preset` take "
        "(one list), each with its one-line description."
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = preset_descriptions()
    width = max(len(name) for name, _ in rows)
    for name, description in rows:
        print(f"{name:{width}}  {description}")
    return 0
