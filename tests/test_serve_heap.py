"""The serving process's garbage-collector settings (``scheduler/cli/main.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scheduler.cli import main


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_settle_heap_freezes_startup_objects_and_raises_gen0(restore_gc: None) -> None:
    gc.unfreeze()
    startup = [[i] for i in range(1000)]  # tracked containers alive at start-up
    gen1, gen2 = gc.get_threshold()[1:]
    main._settle_heap()
    assert gc.get_freeze_count() >= len(startup)
    assert gc.get_threshold() == (main.GC_GEN0_THRESHOLD, gen1, gen2)
    # Frozen objects are out of the collector's generations; new ones are not.
    young = [[1]]
    assert not any(o is startup[0] for o in gc.get_objects())
    assert any(o is young[0] for o in gc.get_objects(0))
