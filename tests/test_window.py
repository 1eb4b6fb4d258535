"""The decision core's time windows: samples kept oldest first, a window drops exactly the old."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler.core.window import Recent

times = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


def built(moments: list[float]) -> Recent[int]:
    window: Recent[int] = Recent()
    for value, now in enumerate(moments):
        window = window.add(now, value)
    return window


@given(st.lists(times, max_size=40))
def test_samples_stay_oldest_first_whatever_order_they_are_added_in(moments: list[float]) -> None:
    window = built(moments)
    kept = [t for t, _ in window]
    assert kept == sorted(moments)
    # equal times keep the order they came in
    assert [v for t, v in window] == [v for v, _ in sorted(enumerate(moments), key=lambda s: s[1])]


@given(
    st.lists(times, max_size=40),
    times,
    st.floats(min_value=0, max_value=2e6, allow_nan=False),
    st.booleans(),
)
def test_a_window_keeps_exactly_the_samples_young_enough(
    moments: list[float], now: float, seconds: float, closed: bool
) -> None:
    window = built(moments)
    expected = [(t, v) for t, v in window if (now - t <= seconds if closed else now - t < seconds)]
    assert list(window.within(now, seconds, closed=closed)) == expected


@pytest.mark.parametrize(
    ("closed", "kept"),
    [
        pytest.param(
            True, [(90.0, 2), (100.0, 3)], id="a sample exactly as old as the window stays"
        ),
        pytest.param(False, [(100.0, 3)], id="an open window drops a sample exactly its age"),
    ],
)
def test_a_window_drops_its_expired_prefix(closed: bool, kept: list[tuple[float, int]]) -> None:
    window = Recent(((70.0, 0), (80.0, 1), (90.0, 2), (100.0, 3)))
    assert list(window.within(100.0, 10.0, closed=closed)) == kept
    assert window.within(100.0, 60.0) is window  # nothing expired: no copy
    assert window.values() == [0, 1, 2, 3]
