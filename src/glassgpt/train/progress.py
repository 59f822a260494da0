"""What the terminal shows while training runs: a progress bar whose rate and ETA are honest.

The rate is measured over the last ``WINDOW`` steps only, and the first ``WARMUP`` steps of a
run (or of a resumption) never count: they include one-time costs (the allocator growing
its heap, kernels chosen for each new shape, a compilation) that later steps do not pay.
A mean over all steps, or tqdm's smoothed one, kept promising far too long an ETA long after
those steps were over.

>>> eta_seconds([(0.0, 3), (1.0, 13)], total=113)
10.0
>>> eta_seconds([(0.0, 3)], total=100) is None
True
"""

from __future__ import annotations

import contextlib
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


def eta_seconds(marks: Sequence[tuple[float, int]], total: int) -> float | None:
    """Seconds left to step ``total`` at the rate between the first and last (time, step)
    mark; None until two marks are apart."""
    if len(marks) < 2:
        return None
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    return (total - s1) * (t1 - t0) / (s1 - s0)


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``.

    >>> format_duration(3725), format_duration(65.2)
    ('1:02:05', '1:05')
    """
    s = round(seconds)
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class StepTimes:
    """Notices a step that takes far longer than the steps before it.

        slow(t_k)  ⇔  t_k > RATIO · median(t_{k−WINDOW} … t_{k−1})     (after WARMUP + 10 steps)

    On a CPU, a busy core (another process, or more threads than free cores) can make every
    step many times slower; the note says so once per ``quiet`` steps, with what to try.

    >>> times = StepTimes(threads=2)
    >>> [times.add(k, 0.1) for k in range(1, 15)].count(None)
    14
    >>> print(times.add(15, 0.5))
    step 15 took 0.5 s, 5.0× the median of the steps before (0.1 s): is another process busy on these cores? With 2 threads, try fewer (OMP_NUM_THREADS=1 or --set train.threads=1)
    >>> times.add(16, 0.5) is None  # once per quiet steps
    True
    """

    RATIO = 3.0

    def __init__(self, threads: int, quiet: int = 200) -> None:
        self.threads, self.quiet = threads, quiet
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.seen = 0
        self.last_note = -quiet

    def add(self, step: int, seconds: float) -> str | None:
        """Record step ``step``'s time; the note to show, or None."""
        self.seen += 1
        if self.seen <= WARMUP:
            return None
        note = None
        if len(self.times) >= 10 and step - self.last_note >= self.quiet:
            median = sorted(self.times)[len(self.times) // 2]
            if seconds > self.RATIO * median:
                self.last_note = step
                advice = (
                    f"With {self.threads} threads, try fewer (OMP_NUM_THREADS=1 or --set "
                    "train.threads=1)"
                    if self.threads > 1
                    else "Free a core, or wait"
                )
                note = (
                    f"step {step} took {seconds:.3g} s, {seconds / median:.1f}× the median of "
                    f"the steps before ({median:.3g} s): is another process busy on these "
                    f"cores? {advice}"
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
    """A tqdm bar over optimizer steps with ``loss``, ``tok/s``, ``s/step`` and ``ETA``."""

    def __init__(self, total: int, initial: int, *, enabled: bool, log: Callable[[str], None]):
        self.total = total
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
        self.text = ""

    def step(self, step: int) -> None:
        """One more step launched (``step`` steps done)."""
        if step >= self.first:
            self.marks.append((time.perf_counter(), step))
        self.bar.update(1)
        self._show()

    def metrics(self, loss: float, tok_s: float) -> None:
        self.text = f"loss {loss:.4f}, {tok_s:,.0f} tok/s"
        self._show()

    def _show(self) -> None:
        parts = [self.text] if self.text else []
        left = eta_seconds(self.marks, self.total)
        if left is not None:
            (t0, s0), (t1, s1) = self.marks[0], self.marks[-1]
            parts.append(f"{(t1 - t0) / (s1 - s0):.3g} s/step, ETA {format_duration(left)}")
        else:
            parts.append("ETA after the first steps")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)

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
