"""``ContextWarning`` names the user's line (their ``generate`` call, their loop over
``stream``), not ``return next(self._it)`` inside glassgpt."""

from __future__ import annotations

import inspect
import warnings

import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.sample import generate, stream
from glassgpt.sample.generation import ContextWarning


def tiny(n_ctx: int = 8) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_vocab=11, n_ctx=n_ctx, d_model=8, n_layers=1, n_heads=2)).eval()


def caught(fn) -> list[warnings.WarningMessage]:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [w for w in seen if issubclass(w.category, ContextWarning)]


def test_generate_warns_at_the_callers_line() -> None:
    model = tiny()
    line = [0]

    def call() -> None:
        line[0] = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        generate(model, [1, 2, 3], max_new_tokens=12, temperature=0)

    (w,) = caught(call)
    assert (w.filename, w.lineno) == (__file__, line[0])


def test_a_prompt_cut_at_the_start_warns_at_the_callers_line_too() -> None:
    model = tiny()
    (w,) = caught(lambda: generate(model, list(range(10)), max_new_tokens=2, overflow="truncate"))
    assert w.filename == __file__


def test_stream_warns_at_the_loop_over_it() -> None:
    model = tiny()
    line = [0]

    def loop() -> None:
        tokens = stream(model, [1, 2, 3], max_new_tokens=12, temperature=0)
        line[0] = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        for _ in tokens:
            pass

    (w,) = caught(loop)
    assert (w.filename, w.lineno) == (__file__, line[0])
