"""A snapshot refused for a target the store does not keep leaves nothing per name behind.

Issue 27, hostile pass 6, S6-H4: ``SignalStore.report`` remembered a problem per (target,
source) for every refused snapshot (dated ahead of the clock, impossible replica counts)
and for every snapshot refused because the store was full, before the room check. Such a
target is never stored, so ``_forget`` never dropped its problem: a source naming a new
target in each snapshot (a skewed clock, a broken exporter) grew the scaler by ~600 B and
one WARNING line per name, for good (200,000 names: +121 MiB, 200,000 WARNINGs). Now such a
problem is remembered once per source (``NEW_TARGETS``), logged once, and forgotten by
``evict_idle`` so that it is logged again, once, if it goes on.
"""

from __future__ import annotations

import logging

import pytest

from protos.unitscale.v1 import signals_pb2 as sig
from scaler.signals import NEW_TARGETS, SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals

NAMES = 2000


def _future(name: str) -> sig.Signals:
    return engine_signals(deployment=name, at=T0 + 3600)


def _impossible_counts(name: str) -> sig.Signals:
    message = engine_signals(deployment=name, at=T0)
    message.engine.replicas_scraped, message.engine.replicas_up = 2, 5
    return message


def _impossible_value(name: str) -> sig.Signals:
    return engine_signals(deployment=name, at=T0, queue=-1.0)


@pytest.mark.parametrize(
    ("make", "max_targets", "stored"),
    [
        pytest.param(_future, 20_000, 0, id="snapshots dated an hour ahead for new names"),
        pytest.param(_impossible_counts, 20_000, 0, id="impossible replica counts for new names"),
        pytest.param(_impossible_value, 10, 10, id="new names past a full store"),
    ],
)
def test_refused_new_targets_leave_one_problem_and_one_warning_per_source(
    make, max_targets: int, stored: int, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    store = SignalStore(clock, max_targets=max_targets)
    with caplog.at_level(logging.INFO, logger="scaler.signals"):
        for n in range(NAMES):
            receive(store, make(f"d{n}"), "exporter:9090")
    assert len(store.keys()) == stored
    assert len(store._problems) <= stored + 1  # one per kept target, one for the rest
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= stored + 2


def test_a_kept_target_still_has_its_own_problem_and_recovery() -> None:
    clock = FakeClock(T0)
    store = SignalStore(clock)
    receive(store, engine_signals(at=T0))
    key = ("team-a", "llama", "")
    receive(store, engine_signals(at=T0 + 3600))
    assert (key, "exporter") in store._problems
    receive(store, engine_signals(at=T0 + 1))
    assert (key, "exporter") not in store._problems


def test_the_problem_of_new_targets_is_logged_again_after_eviction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(T0)
    store = SignalStore(clock)
    with caplog.at_level(logging.WARNING, logger="scaler.signals"):
        receive(store, _future("a"))
        receive(store, _future("b"))
        store.evict_idle(600.0)
        receive(store, _future("c"))
    assert len(caplog.records) == 2
    assert all(r.getMessage().startswith(f"signals for {NEW_TARGETS}") for r in caplog.records)
