"""foundation.heap: collections between passes scan what a pass made, not the whole view."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from foundation.heap import PassHeap


class Cyclic:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Leave the test process's heap as it was: nothing frozen."""
    yield
    gc.unfreeze()
    gc.collect()


def in_generation_two(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(generation=2))


def test_what_lives_through_a_settle_is_frozen_out_of_later_collections():
    heap = PassHeap(clock=lambda: 0.0)
    alive = Cyclic()
    heap.settle()
    gc.collect()
    assert not in_generation_two(alive)
    assert gc.get_freeze_count() > 0


def test_a_cycle_a_pass_made_and_dropped_is_freed_by_the_next_settle():
    now = [0.0]
    heap = PassHeap(full_every=3600, clock=lambda: now[0])
    heap.settle()
    made = Cyclic()
    gone = weakref.ref(made)
    del made
    now[0] = 1.0
    heap.settle()
    assert gone() is None
    assert heap.full == 1, "only the first settle scanned the whole heap"


def test_a_cycle_frozen_alive_and_dropped_since_is_freed_by_the_periodic_full_settle():
    now = [0.0]
    heap = PassHeap(full_every=3600, clock=lambda: now[0])
    kept = Cyclic()
    heap.settle()  # frozen while alive
    gone = weakref.ref(kept)
    del kept
    now[0] = 3599.0
    heap.settle()
    assert gone() is not None, "a settle does not scan what it froze"
    now[0] = 3600.0
    heap.settle()
    assert gone() is None
    assert (heap.settles, heap.full) == (3, 2)
