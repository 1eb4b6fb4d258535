"""The soak's hostile neighbours answer what they claim (bench/soak_hostile.py).

The soak judges the scaler and the admission pass by what these answer; if a query the
scaler sends changed and the fake Prometheus no longer recognised it, or a hostile answer
turned harmless, the soak would pass for the wrong reason.
"""

from __future__ import annotations

import time

import pytest

from bench.soak_hostile import (
    ADMISSION_KINDS,
    ADMISSION_NODES,
    PROM_KINDS,
    RESYNC_SECONDS,
    AdmissionSoak,
    _resync_differences,
    prometheus_answer,
    signal_of,
)
from scaler.promql import DEFAULT_QUERIES, AnswerError, checked_answers, parse_answer

NOW = 1_800_000_000.0


@pytest.mark.parametrize("signal", sorted(DEFAULT_QUERIES))
def test_the_fake_prometheus_knows_every_default_query(signal):
    assert signal_of(DEFAULT_QUERIES[signal]) == signal


def answers(kind: str | None) -> dict[str, float | str | None]:
    """Each signal's value as the scaler reads it, or the error's class name."""
    out: dict[str, float | str | None] = {}
    for signal in DEFAULT_QUERIES:
        try:
            out[signal] = parse_answer(prometheus_answer(signal, kind, NOW), "q")
        except AnswerError:
            out[signal] = "AnswerError"
    return out


def test_good_answers_are_steady_numbers_dated_now():
    good = answers(None)
    assert all(isinstance(v, float) for v in good.values()), good
    assert abs(good["signal-time"] - NOW) < 1  # type: ignore[operator]


@pytest.mark.parametrize("kind", PROM_KINDS)
def test_every_hostile_answer_leaves_something_unusable(kind):
    read = answers(kind)
    numbers: dict[tuple[str, str | None], float | None] = {
        (k, None): v for k, v in read.items() if not isinstance(v, str)
    }
    clean, problems = checked_answers(numbers)
    unusable = [k for k, v in read.items() if isinstance(v, str) or v is None]
    unusable += [k for (k, _), v in clean.items() if v is None and k not in unusable]
    time_ahead = kind == "future" and read["signal-time"] > NOW + 3600  # type: ignore[operator]
    assert unusable or problems or time_ahead, read


async def test_a_calm_admission_pass_admits_a_gang_on_every_node():
    soak = AdmissionSoak()
    await soak.one_pass(time.time())
    assert soak.passes == 1 and not soak.wrong and not soak.raised


@pytest.mark.parametrize("kind", ADMISSION_KINDS)
async def test_a_hostile_node_is_named_and_never_counted(kind):
    soak = AdmissionSoak()
    await soak.one_pass(time.time())
    soak.hostile = (kind, 1)
    await soak.one_pass(time.time())
    assert soak.hostile_counted[kind] == 1
    assert soak.ready_while_hostile == ADMISSION_NODES - 1
    assert not soak.wrong and not soak.raised
    soak.hostile = None  # the node heals: every gang admitted again
    await soak.one_pass(time.time())
    assert not soak.wrong and not soak.raised


async def test_the_soaks_resync_decides_as_the_kept_state_did():
    soak = AdmissionSoak()
    for hostile in (None, ("register-deep-json", 2), None):
        soak.hostile = hostile
        await soak.one_pass(time.time())
        soak.controller._resynced = soak.controller._clock() - RESYNC_SECONDS
        await soak.one_pass(time.time())
        assert soak.controller.resync is not None
        await soak.controller.resync
    assert _resync_differences(soak.controller) == 0
    assert soak.failed_decisions == 0 and not soak.wrong and not soak.raised
