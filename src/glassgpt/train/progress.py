"""What the terminal shows while training runs: a progress bar whose rate and ETA are honest.

    s/step = median over the last WINDOW steps of each step's seconds
    tok/s  = tokens a step / s/step          ETA = (total − step) · s/step

One window gives all three, so tok/s × s/step is the tokens of a step. The first ``WARMUP``
steps of a run (or of a resumption) never count: they include one-time costs (the allocator
growing its heap, kernels chosen for each new shape, a compilation) that later steps do not
pay. The median smooths the ETA: a pause (an evaluation, a checkpoint, a sample) is one long
step, which moves a mean over the window (an ETA of 7 minutes read as an hour while it was in
it) but not the median; a lasting change of speed moves it within WINDOW / 2 steps. The ETA
so counts steps, not the pauses between them.

>>> eta_seconds([(0.0, 3), (1.0, 13)], total=113)
10.0
>>> eta_seconds([(0.0, 3), (0.5, 4), (60.5, 5), (61.0, 6)], total=26)  # a 60 s pause: no effect
10.0
>>> eta_seconds([(0.0, 3)], total=100) is None
True
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

WINDOW = 50  # steps the rate is measured over
WARMUP = 3  # steps after a start or resume that are never measured


def seconds_per_step(marks: Sequence[tuple[float, int]]) -> float | None:
    """The median of the seconds per step between consecutive (time, step) marks, each gap
    counted once per step it spans; None until two marks are apart.

    >>> seconds_per_step([(0.0, 1), (1.0, 2), (1.5, 3), (2.0, 4)])
    0.5
    """
    per_step: list[tuple[float, int]] = [
        ((t1 - t0) / (s1 - s0), s1 - s0)
        for (t0, s0), (t1, s1) in itertools.pairwise(marks)
        if s1 > s0 and t1 >= t0
    ]
    per_step.sort()
    half, seen = sum(n for _, n in per_step) / 2, 0
    for seconds, n in per_step:
        seen += n
        if seen >= half:
            return seconds or None  # (a clock that has not moved yet)
    return None


def eta_seconds(marks: Sequence[tuple[float, int]], total: int) -> float | None:
    """Seconds left to step ``total`` at :func:`seconds_per_step` of the (time, step) marks;
    None until two marks are apart."""
    rate = seconds_per_step(marks)
    return None if rate is None else (total - marks[-1][1]) * rate


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``.

    >>> format_duration(3725), format_duration(65.2)
    ('1:02:05', '1:05')
    """
    s = round(seconds)
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class StepTimes:
    """Notices a step that takes far longer than the fastest recent steps.

        slow(t_k)  ⇔  t_k > RATIO · min_w median(w)     (after WARMUP + 10 steps)

    over the windows w of SHORT consecutive steps among the last WINDOW. The best recent
    window, not the median of all of them: a run that starts under contention (another
    process, or more threads than free cores) has mostly slow steps, whose median is slow
    too; the fast stretches between show what the cores give when free. The note says so
    once per ``quiet`` steps, with what to try.

    >>> times = StepTimes(threads=2)
    >>> [times.add(k, 0.1) for k in range(1, 15)].count(None)
    14
    >>> print(times.add(15, 0.5))
    step 15 took 0.5 s, 5.0× the median of the fastest 5 recent steps (0.1 s): is another process busy on these cores? With 2 threads, try fewer (OMP_NUM_THREADS=1 or --set train.threads=1)
    >>> times.add(16, 0.5) is None  # once per quiet steps
    True

    A run whose steps were slow from the start but for five of them is told, too:

    >>> times = StepTimes(threads=1)
    >>> notes = [times.add(k, 0.1 if 4 <= k < 9 else 0.5) for k in range(1, 20)]
    >>> [k for k, note in enumerate(notes, start=1) if note]
    [14]
    """

    RATIO = 3.0
    SHORT = 5  # steps in a window: one fast step alone is no evidence

    def __init__(self, threads: int, quiet: int = 200) -> None:
        self.threads, self.quiet = threads, quiet
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.seen = 0
        self.last_note = -quiet

    def best(self) -> float:
        """The smallest median of SHORT consecutive recorded steps."""
        t, n = list(self.times), self.SHORT
        return min(sorted(t[i : i + n])[n // 2] for i in range(len(t) - n + 1))

    def add(self, step: int, seconds: float) -> str | None:
        """Record step ``step``'s time; the note to show, or None."""
        self.seen += 1
        if self.seen <= WARMUP:
            return None
        note = None
        if len(self.times) >= 10 and step - self.last_note >= self.quiet:
            best = self.best()
            if seconds > self.RATIO * best:
                self.last_note = step
                advice = (
                    f"With {self.threads} threads, try fewer (OMP_NUM_THREADS=1 or --set "
                    "train.threads=1)"
                    if self.threads > 1
                    else "Free a core, or wait"
                )
                note = (
                    f"step {step} took {seconds:.3g} s, {seconds / best:.1f}× the median of "
                    f"the fastest {self.SHORT} recent steps ({best:.3g} s): is another process "
                    f"busy on these cores? {advice}"
                )
        self.times.append(seconds)
        return note


@dataclass
class StepClock:
    """tok/s over the steps since the last logged one, timed on the device's own clock (a
    GPU's events), so that reading a step late does not skew it."""

    since: Any  # a device Stamp (glassgpt.train.device)
    tokens: int
    start: float = field(default_factory=time.perf_counter)
    cpu_start: float = field(default_factory=time.process_time)


class Progress:
    """A tqdm bar over optimizer steps with ``loss``, ``tok/s``, ``s/step`` and ``ETA``.

    Given ``tokens_per_step``, tok/s is that over :func:`seconds_per_step`, the window of
    s/step and the ETA; otherwise it is the ``tok_s`` that :meth:`metrics` is given."""

    def __init__(
        self,
        total: int,
        initial: int,
        *,
        enabled: bool,
        log: Callable[[str], None],
        tokens_per_step: int | None = None,
    ):
        self.total = total
        self.tokens_per_step = tokens_per_step
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5 if sys.stderr.isatty() else 30.0,  # a log file gets few lines
            disable=not enabled,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
        )
        self.write = self.bar.write if not self.bar.disable else log
        self.marks: deque[tuple[float, int]] = deque(maxlen=WINDOW + 1)
        self.first = initial + WARMUP
        self.loss: float | None = None
        self.tok_s: float | None = None  # the caller's, without tokens_per_step
        self.text = (
            ""  # a caller's own numbers, after loss and tok/s (", L0 12.3"); reset by metrics
        )

    def step(self, step: int) -> None:
        """One more step launched (``step`` steps done)."""
        if step >= self.first:
            self.marks.append((time.perf_counter(), step))
        self.bar.update(1)
        self._show()

    def metrics(self, loss: float, tok_s: float | None = None) -> None:
        self.loss, self.tok_s, self.text = loss, tok_s, ""
        self._show()

    def postfix(self) -> str:
        """What the bar shows after the elapsed time."""
        rate = seconds_per_step(self.marks)
        tok_s = self.tok_s
        if self.tokens_per_step is not None:
            tok_s = None if rate is None else self.tokens_per_step / rate
        head = [] if self.loss is None else [f"loss {self.loss:.4f}"]
        if tok_s is not None:
            head.append(f"{tok_s:,.0f} tok/s")
        shown = (", ".join(head) + self.text).removeprefix(", ")
        if rate is not None:
            left = (self.total - self.marks[-1][1]) * rate
            tail = f"{rate:.3g} s/step, ETA {format_duration(left)}"
        else:
            tail = "ETA after the first steps"
        return f"{shown}, {tail}" if shown else tail

    def _show(self) -> None:
        self.bar.set_postfix_str(self.postfix(), refresh=False)

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """SIGINT/SIGTERM call ``stop(signum)`` (the loop ends at the next step, with a
    checkpoint); a second signal interrupts at once. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if seen:  # a second signal: stop now
            raise KeyboardInterrupt
        seen.append(signum)
        stop(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
