"""A tick over a few requests in plain Python computes exactly what the vectorised tick does.

``replay.fleet.FEW`` picks the plain-Python tick for small fleets; both run the same float
operations in the same order, so every time, count and gauge agrees bit for bit.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replay.fleet
import replay.trace
from foundation.replica_model import LLAMA3_8B_H200
from replay.fleet import Fleet, Requests
from tests.test_fleet_admission import requests_of

TICK = 0.2
SLOTS = 3
# Four seats a replica and a small KV cache: requests queue for seats and for memory.
PROFILE = dataclasses.replace(LLAMA3_8B_H200, max_num_seqs=4, max_num_batched_tokens=2048)
FIELDS = (
    "state",
    "replica",
    "admitted",
    "prefilled",
    "generated",
    "first_token",
    "finished",
    "routed",
    "decode_time",
)

Arrival = tuple[float, int, int, int]


def run(arrivals: list[Arrival], few: int) -> tuple[Requests, list[tuple[object, ...]]]:
    """``arrivals`` (time, slot, prompt, output) through a fleet whose FEW is ``few``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay.fleet, "FEW", few)
        return _run(arrivals)


def _run(arrivals: list[Arrival]) -> tuple[Requests, list[tuple[object, ...]]]:
    ordered = sorted(arrivals)
    requests = requests_of(ordered)
    fleet = Fleet(PROFILE, requests, SLOTS)
    fleet.kv_capacity = 20_000.0
    seen: list[tuple[object, ...]] = []
    following, now = 0, 0.0
    for _ in range(150):
        while following < len(ordered) and ordered[following][0] <= now + TICK / 2:
            fleet.assign(following, ordered[following][1], now)
            following += 1
        tick = fleet.advance(now, TICK)
        seen.append(
            (
                tick.first_tokens.tolist(),
                tick.finished.tolist(),
                tick.busy.tolist(),
                tick.generated.tolist(),
                fleet.last_step.tolist(),
                fleet.kv_reserved.tolist(),
                fleet.running.tolist(),
                fleet.outstanding.tolist(),
                fleet.active.tolist(),
                list(fleet.queued),
                fleet.total_outstanding,
            )
        )
        now += TICK
    return requests, seen


arrivals = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=20, allow_nan=False),
        st.integers(min_value=0, max_value=SLOTS - 1),
        st.integers(min_value=1, max_value=6000),
        st.integers(min_value=1, max_value=400),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(arrivals)
def test_the_plain_python_tick_agrees_with_the_vectorised_one_bit_for_bit(
    arrivals: list[Arrival],
) -> None:
    vectorised, every_tick = run(arrivals, 0)
    for few in (10**9, 3):  # always plain; plain while at most 3 requests are in
        plain, every_plain_tick = run(arrivals, few)
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(plain, field), getattr(vectorised, field), field)
        assert every_plain_tick == every_tick


def test_a_burst_past_the_seats_and_the_cache_is_served_alike_both_ways() -> None:
    burst = [(0.0, slot, 3000, 200) for slot in (0, 1, 0, 2, 0, 0, 1, 0, 0, 2)]
    vectorised, ticks = run(burst, 0)
    plain, plain_ticks = run(burst, 10**9)
    assert ticks[0][9] != 0  # requests waited for a seat or for KV cache
    assert not np.isnan(plain.finished).any()
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(plain, field), getattr(vectorised, field), field)
    assert plain_ticks == ticks


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 8)), min_size=1, max_size=40))
def test_the_replays_slots_by_state_follow_every_change(changes):
    # The tick reads its slots by state a dozen times and they change a few times an
    # hour, so ``in_states`` keeps them until a slot changes: after any change, what it
    # says is the pass over the slots it stands for.
    replay_simulate = importlib.import_module(
        "replay.simulate"
    )  # the package's name is the function
    run = replay_simulate._Replay(
        replay.trace.Trace(
            "t", np.zeros(1), np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64)
        ),
        replay_simulate.SimConfig(LLAMA3_8B_H200, max_replicas=8),
    )
    masks = (
        replay_simulate._COUNTED,
        replay_simulate._HOLDING,
        replay_simulate._SERVING,
        replay_simulate._STANDBY,
        replay_simulate._LOADED,
        *replay_simulate._IS,
    )
    for slot, state in changes:
        # a mask made here each time too: kept by its value, not by an id reused
        made = replay_simulate._SERVING | replay_simulate._IS[slot % 9]
        for mask in (*masks, made):
            assert run.in_states(mask).tolist() == np.flatnonzero(mask[run.slot]).tolist()
        run.slot[slot] = state
    assert run.running() == int(np.count_nonzero(replay_simulate._COUNTED[run.slot]))
