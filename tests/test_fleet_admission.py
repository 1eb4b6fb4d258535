"""The replay fleet counts its queued requests; skipping admission while none wait is exact."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.replica_model import LLAMA3_8B_H200
from replay.fleet import QUEUED, Fleet, Requests

TICK = 0.2
SLOTS = 3
# Four seats a replica: requests queue for a seat at modest rates.
PROFILE = dataclasses.replace(LLAMA3_8B_H200, max_num_seqs=4)


def requests_of(ordered: list[tuple[float, int, int, int]]) -> Requests:
    """The fleet's requests for ``(time, slot, prompt, output)`` arrivals in time order."""
    return Requests(
        arrival=np.array([a[0] for a in ordered], dtype=np.float64),
        prompt=np.array([a[2] for a in ordered], dtype=np.int64),
        output=np.array([a[3] for a in ordered], dtype=np.int64),
    )


def run(
    arrivals: list[tuple[float, int, int, int]], *, look_every_tick: bool
) -> tuple[Requests, list[int]]:
    """``arrivals`` (time, slot, prompt, output) through a fleet; the queued count per tick."""
    ordered = sorted(arrivals)
    requests = requests_of(ordered)
    fleet = Fleet(PROFILE, requests, SLOTS)
    counted, following, now = [], 0, 0.0
    if look_every_tick:
        fleet._admit = fleet._admit_queued  # type: ignore[method-assign]  # look every tick
    for _ in range(200):
        while following < len(ordered) and ordered[following][0] <= now + TICK / 2:
            fleet.assign(following, ordered[following][1], now)
            following += 1
        fleet.advance(now, TICK)
        active = fleet.active
        assert list(fleet.queued) == active[requests.state[active] == QUEUED].tolist()
        assert fleet.total_outstanding == int(fleet.outstanding.sum())
        counted.append(len(fleet.queued))
        now += TICK
    return requests, counted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=20, allow_nan=False),
            st.integers(min_value=0, max_value=SLOTS - 1),
            st.integers(min_value=1, max_value=4000),
            st.integers(min_value=1, max_value=300),
        ),
        max_size=60,
    )
)
def test_admission_skipped_while_nothing_waits_serves_every_request_as_looking_every_tick(
    arrivals: list[tuple[float, int, int, int]],
) -> None:
    skipping, _ = run(arrivals, look_every_tick=False)
    looking, _ = run(arrivals, look_every_tick=True)
    for field in ("state", "admitted", "first_token", "finished", "generated"):
        np.testing.assert_array_equal(getattr(skipping, field), getattr(looking, field))


def test_requests_beyond_the_seats_wait_counted_and_are_admitted_as_seats_free() -> None:
    burst = [(0.0, 0, 1000, 50) for _ in range(10)]
    requests, counted = run(burst, look_every_tick=False)
    assert counted[0] == 6  # four seats taken, six wait
    assert counted[-1] == 0
    assert not np.isnan(requests.finished).any()
