"""A prewarm write refused for good is one WARNING a change of why, not one a retry.

Issue 27, hostile pass 6, S6-M3: a DataLoad create refused for good (RBAC's 403, an
admission webhook) was retried at a backoff capped at a minute, each retry a WARNING: 65
lines an hour per ScaledObject for as long as it lasted. Now the first failure, and each
change of why, is a WARNING; the same again is DEBUG; a write that works again is INFO.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from scaler.prewarm import shell
from tests.conftest import T0
from tests.test_prewarm_hostile import Harness, fluid_dataset


@pytest.mark.parametrize(
    ("errors", "warnings"),
    [
        pytest.param([403] * 100, 2, id="a write refused for good is one WARNING per object"),
        pytest.param([403] * 5 + [500] * 5, 4, id="a change of why is one WARNING more"),
    ],
)
async def test_a_refused_write_is_warned_of_once_a_change(
    errors: list[int],
    warnings: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="scaler.prewarm.shell")
    harness = Harness(monkeypatch)
    harness.feed({f"serving/weights-{n}": fluid_dataset(f"weights-{n}") for n in "ab"}, {})
    refusals = iter([status for status in errors for _ in "ab"])  # each object's in turn

    async def create(api: Any, resource: Any, body: dict[str, Any]) -> Any:
        status = next(refusals, None)
        if status is None:
            return body
        raise ApiException(status=status, reason="refused")

    monkeypatch.setattr(shell, "create", create)
    harness.reason("a"), harness.reason("b")
    for second in range(4 * 3600):  # the write loop, each second of four hours
        harness.clock.now = T0 + 2 + second
        await harness.prewarm._write_all(api=None)  # type: ignore[arg-type]
    logged = [r for r in caplog.records if "prewarm write failed" in r.getMessage()]
    assert len([r for r in logged if r.levelno == logging.WARNING]) == warnings
    assert harness.prewarm.errors["write"] == len(logged) == len(errors) * 2


def test_the_failures_of_a_forgotten_scaled_object_go_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = Harness(monkeypatch)
    harness.prewarm._failures[("write", "serving", "gone")] = "403 Forbidden"
    harness.prewarm._replan()
    assert ("write", "serving", "gone") not in harness.prewarm._failures
