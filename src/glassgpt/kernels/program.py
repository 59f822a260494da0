"""A replayed decoding step's recorded calls as one compiled call (``kernels/_program.c``).

A replayed step (``glassgpt.sample.replay``) is a list of recorded calls (fn, args,
positional): the same kernels on the same buffers at every step, the arguments at the
indices ``positional`` moved by the position n. Made from a Python loop, each call takes the
GIL back when its kernel returns, and on a server waits there for whichever thread took it
meanwhile. :func:`compile_calls` packs the list once: each kernel's C implementation (the
one its own entry point calls, so the same bits; looked up in its extension's ``_impls``
table, ``kernels/_program.h``) with its argument slots, and the slots that move with n. A
:class:`Program` run lets go of the GIL once, makes every call in order, and takes it back
once; a call with no C implementation (a soft cap's PyTorch kernel) is made from Python
between two such runs. An error inside an implementation raises what its entry point raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glassgpt.kernels.extensions import extension
from glassgpt.kernels.replay import Call

_program = extension("_program")  # not built (or hidden): None, and the Python loop replays


class Program:
    """``program(n)`` makes the recorded ``calls`` with their positions moved by n, as one
    compiled call (see the module docstring); ``names`` lists each call's kernel, None for
    a call made from Python."""

    def __init__(self, calls: Sequence[Call], ext: Any) -> None:
        self._packed = ext.build(list(calls))
        self._run = ext.run
        self.names: list[str | None] = ext.names(self._packed)

    def __call__(self, n: int) -> None:
        self._run(self._packed, n)


def compile_calls(calls: Sequence[Call]) -> Program | None:
    """The recorded ``calls`` as a :class:`Program`, or None where ``_program`` is not built."""
    return None if _program is None else Program(calls, _program)
