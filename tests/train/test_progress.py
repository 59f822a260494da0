"""The training bar's numbers on a fake clock: tok/s and s/step from one window, an ETA that a
pause does not swing, and the contention note for a run that starts under contention."""

from __future__ import annotations

import itertools
import re

import pytest

from glassgpt.train import progress as P


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(P.time, "perf_counter", lambda: now[0])
    return now


def shown(bar: P.Progress) -> dict[str, float]:
    """tok/s, s/step and the ETA in seconds, read off the bar's text."""
    text = bar.postfix()
    out = {}
    if m := re.search(r"([\d,]+) tok/s", text):
        out["tok_s"] = float(m[1].replace(",", ""))
    if m := re.search(r"([\d.e-]+) s/step, ETA (?:(\d+):)?(\d+):(\d\d)", text):
        out["s_step"] = float(m[1])
        out["eta"] = int(m[2] or 0) * 3600 + int(m[3]) * 60 + int(m[4])
    return out


def test_tok_s_and_s_step_come_from_one_window(clock: list[float]) -> None:
    """2,048 tokens a step at 0.4 s a step, with an evaluation's 30 s pause among them, and the
    trainer's own tok/s (another window) handed in: the bar shows 2,048 / 0.4 = 5,120 tok/s."""
    bar = P.Progress(1000, 0, enabled=False, log=lambda m: None, tokens_per_step=2048)
    for step in range(1, 41):
        clock[0] += 30.4 if step == 30 else 0.4
        bar.step(step)
    bar.metrics(3.21, 32_074.0)
    got = shown(bar)
    assert got["s_step"] == pytest.approx(0.4)
    assert got["tok_s"] == pytest.approx(5120, abs=1)
    assert got["tok_s"] * got["s_step"] == pytest.approx(2048, rel=1e-3)
    assert bar.postfix().startswith("loss 3.2100, 5,120 tok/s, 0.4 s/step, ETA ")


def test_without_tokens_per_step_the_callers_tok_s_is_shown(clock: list[float]) -> None:
    bar = P.Progress(100, 0, enabled=False, log=lambda m: None)
    bar.metrics(1.5, 1234.4)
    bar.text += ", L0 12.0"  # a caller's own numbers (sae train), after tok/s
    assert bar.postfix() == "loss 1.5000, 1,234 tok/s, L0 12.0, ETA after the first steps"


def test_eta_does_not_swing_with_a_pause(clock: list[float]) -> None:
    """0.4 s a step, then one 60 s pause (a checkpoint): step by step, the ETA falls by about a
    step's time, as it should; a mean over the window jumped with the pause (7 min → 27 min)."""
    bar = P.Progress(1100, 0, enabled=False, log=lambda m: None)
    etas = []
    for step in range(1, 101):
        clock[0] += 60.4 if step == 60 else 0.4
        bar.step(step)
        if step > 20:
            etas.append(shown(bar)["eta"])
    jumps = [b - a for a, b in itertools.pairwise(etas)]
    assert max(abs(j) for j in jumps) <= 1  # seconds, on an ETA of 6–7 minutes
    assert etas[-1] == pytest.approx((1100 - 100) * 0.4, abs=1)


def test_eta_follows_a_lasting_change_of_speed(clock: list[float]) -> None:
    bar = P.Progress(10_000, 0, enabled=False, log=lambda m: None)
    for step in range(1, 200):
        clock[0] += 0.1 if step < 100 else 0.5
        bar.step(step)
    assert shown(bar)["s_step"] == pytest.approx(0.5)


def test_a_run_that_starts_under_contention_is_told() -> None:
    """Steps of 0.5 s from the start, but for a stretch of 0.1 s ones (the other process
    paused): the median of the steps before is 0.5 s, the best recent window's 0.1 s."""
    times = P.StepTimes(threads=4)
    seconds = [0.5] * 3 + [0.5] * 4 + [0.1] * 6 + [0.5] * 30
    notes = [times.add(k, s) for k, s in enumerate(seconds, start=1)]
    said = [(k, n) for k, n in enumerate(notes, start=1) if n]
    assert len(said) == 1
    k, note = said[0]
    assert seconds[k - 1] == 0.5 and k == 14  # the first slow step once 10 are recorded
    assert "5.0× the median of the fastest 5 recent steps (0.1 s)" in note
    assert "With 4 threads, try fewer" in note


def test_steady_steps_and_a_single_noisy_one_are_not_noted() -> None:
    times = P.StepTimes(threads=1, quiet=5)
    notes = [times.add(k, 0.25 if k == 30 else 0.1) for k in range(1, 60)]
    assert not any(notes)  # 2.5× the best window: within RATIO
