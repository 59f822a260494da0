"""Python's garbage collector during training (``glassgpt.train.collector``): frozen and off
inside the loop, young generations collected every so many steps, everything restored after,
also on an error; and ``Trainer.fit`` runs its steps that way."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from glassgpt.train.collector import StepCollector, collect_between_steps


class Cycle:
    """An object in a reference cycle: only the collector frees it."""

    freed = 0

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        Cycle.freed += 1


def test_inside_the_collector_is_off_and_the_old_objects_frozen() -> None:
    assert gc.isenabled()
    with collect_between_steps(every=3) as collector:
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 1000  # at least the modules imported so far
        Cycle.freed = 0
        Cycle()
        collector.step(), collector.step()
        assert Cycle.freed == 0  # no automatic collection, and not yet the third step
        collector.step()
        assert Cycle.freed == 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_it_restores_a_disabled_collector_and_survives_an_error() -> None:
    gc.disable()
    try:
        with pytest.raises(RuntimeError), collect_between_steps():
            raise RuntimeError("a step failed")
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="every must be at least 1"):
        StepCollector(0)


def test_fit_runs_its_steps_with_the_collector_off(tmp_path: Path) -> None:
    from tests.train.test_trainer import make

    trainer = make(tmp_path / "run", max_steps=4, eval_every=2, checkpoint_every=0)
    seen: list[tuple[bool, int]] = []
    step = trainer.launch_step

    def watched():
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return step()

    trainer.launch_step = watched  # type: ignore[method-assign]
    trainer.fit()
    assert len(seen) == 4 and all(not on and frozen > 0 for on, frozen in seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_callers_own_freeze_is_left_in_place() -> None:
    """An object the caller froze stays frozen (out of every generation the collector
    walks). The freeze count alone can drop by objects that die meanwhile."""
    mine = [object()]  # a container, tracked by the collector
    gc.freeze()
    try:
        assert not any(o is mine for o in gc.get_objects())
        with collect_between_steps():
            pass
        assert not any(o is mine for o in gc.get_objects()) and gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())  # the check sees an unfrozen one
