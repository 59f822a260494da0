"""Python's garbage collector during training: the young generations between steps, never a
full collection in the middle of one.

CPython collects cycles by generation. A full (generation 2) collection visits every object
the process tracks (after ``import torch`` and glassgpt, hundreds of thousands). The autograd
graph of every step allocates and frees thousands of objects, so these full collections
come every few dozen steps and land inside one: a step that meets one takes several times as
long as its neighbours.

:func:`collect_between_steps` does what long training loops do about it:

- ``gc.freeze()`` at the start moves every object alive then (modules, the model, the data)
  into a permanent generation that no collection visits again;
- automatic collection is off while the loop runs, and :meth:`StepCollector.step` collects
  generations 0 and 1 (the objects made since) every ``every`` steps, in a few milliseconds;
- on leaving, automatic collection is on again as before, and the frozen objects are
  unfrozen (unless the caller had frozen objects itself: CPython unfreezes all or nothing,
  so they then stay frozen, as the caller left them).

Nothing is leaked: a step's tensors are freed by reference counting as before; only cyclic
garbage waits, at most ``every`` steps, and a training step makes almost none.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

EVERY = 100  # steps between collections of the young generations


class StepCollector:
    """Collects generations 0 and 1 every ``every`` calls of :meth:`step`."""

    def __init__(self, every: int = EVERY) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.every = every
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            gc.collect(1)


@contextlib.contextmanager
def collect_between_steps(every: int = EVERY) -> Iterator[StepCollector]:
    """Freeze what exists, turn automatic collection off, and yield a :class:`StepCollector`
    for the loop to call once a step; restore both on the way out."""
    was_enabled = gc.isenabled()
    was_frozen = gc.get_freeze_count() > 0  # the caller's own freeze: left as it was
    gc.collect(1)  # the setup's young garbage, so that it is not frozen with the rest
    gc.freeze()
    gc.disable()
    try:
        yield StepCollector(every)
    finally:
        if was_enabled:
            gc.enable()
        if not was_frozen:
            gc.unfreeze()
