"""Admission under the sixth hostile pass (issue 27): a held gang's fields of another JSON
type never fail its pool, the controller's gauges are not rebuilt on every scrape, and a
failed create is counted.

The kept pool's fingerprint (``admission.incremental``) read a held gang's Workload raw,
outside the gang's own guard: ``status.admission`` a string raised in ``.get``, and a
generation, count or entry time that is a list was unhashable in the second pass's set.
Either failed every check of the pool on every pass.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from admission.metrics import MIN_REFRESH_SECONDS, AdmissionMetrics, MetricsServer
from foundation.timestamps import format_time
from tests.test_admission_controller import NO_API, Writing
from tests.test_admission_decide import CHECK, NOW, admitted, node, workload

Mutation = Callable[[dict[str, Any]], None]


def _pending(name: str) -> dict[str, Any]:
    w = workload(name, gpus=1)
    a_minute_ago = format_time(NOW - 60)
    w["metadata"]["creationTimestamp"] = a_minute_ago
    w["status"]["admissionChecks"][0]["lastTransitionTime"] = a_minute_ago
    return w


def _held() -> dict[str, Any]:
    """A gang of ours Ready a minute ago, no pods yet: it holds the node's 8 cards."""
    w = admitted("held", pods=1)
    w["metadata"].update(creationTimestamp=format_time(NOW - 120), generation=1)
    w["metadata"]["resourceVersion"] = "10"
    w["status"]["admission"] = {"podSetAssignments": [{"name": "workers", "count": 1}]}
    return w


def _passes(mutate: Mutation) -> list[dict[str, dict[str, Any]]]:
    """What each of two passes wrote: the held gang as it was, then with ``mutate`` done
    and a new pending gang (the kept pool is extended on the second pass)."""
    controller = Writing()
    check = {"metadata": {"name": CHECK}, "spec": {"controllerName": controller.name}}
    controller._changed("admissionchecks", {CHECK: check})
    for name in ("parameters", "pods", "datasets", "dataloads"):
        controller._changed(name, {})
    controller._changed("nodes", {"gpu-1": node("gpu-1")})
    held = _held()
    bad = copy.deepcopy(held)
    mutate(bad)
    written = []
    for workloads in (
        {"train/held": held, "train/a": _pending("a")},
        {"train/held": bad, "train/b": _pending("b")},
    ):
        controller._changed("workloads", workloads)
        controller.written.clear()
        asyncio.run(controller.reconcile(api=NO_API))
        written.append(dict(controller.written))
    return written


def _set(*path: str | int, to: object) -> Mutation:
    def mutate(w: dict[str, Any]) -> None:
        obj: Any = w
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = to

    return mutate


@pytest.mark.parametrize(
    ("mutate", "b_state"),
    [
        pytest.param(
            _set("metadata", "generation", to=[2]),
            "Retry",
            id="a-generation-that-is-a-list-keeps-the-gang-held-and-the-pool-decided",
        ),
        pytest.param(
            _set("metadata", "generation", to={"a": 1}),
            "Retry",
            id="a-generation-that-is-a-mapping-keeps-the-gang-held-and-the-pool-decided",
        ),
        pytest.param(
            _set("status", "admission", "podSetAssignments", 0, "count", to=[1]),
            "Retry",
            id="an-assigned-count-that-is-a-list-keeps-the-gang-held-and-the-pool-decided",
        ),
        pytest.param(
            _set("status", "admissionChecks", 0, "lastTransitionTime", to=["x"]),
            "Retry",
            id="a-ready-time-that-is-a-list-keeps-the-gang-held-and-the-pool-decided",
        ),
        pytest.param(
            _set("status", "admission", to="x"),
            "Ready",
            id="an-admission-that-is-a-string-leaves-that-workload-out-and-the-pool-decided",
        ),
        pytest.param(
            _set("status", "admission", to=[1]),
            "Ready",
            id="an-admission-that-is-a-list-leaves-that-workload-out-and-the-pool-decided",
        ),
        pytest.param(
            _set("status", "admission", "podSetAssignments", to=5),
            "Ready",
            id="assignments-that-are-a-number-leave-that-workload-out-and-the-pool-decided",
        ),
    ],
)
def test_a_held_gang_of_another_shape_never_fails_its_pool(mutate: Mutation, b_state: str) -> None:
    first, second = _passes(mutate)
    assert first["train/a"]["state"] == "Retry"  # the held gang holds all 8 cards
    assert second["train/b"]["state"] == b_state, second["train/b"]["message"]
    assert "not decided" not in second["train/b"]["message"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)
_PATHS = [
    ("metadata", "generation"),
    ("status", "admission"),
    ("status", "admission", "podSetAssignments"),
    ("status", "admission", "podSetAssignments", 0, "count"),
    ("status", "admission", "podSetAssignments", 0, "name"),
    ("status", "admissionChecks", 0, "lastTransitionTime"),
    ("status", "admissionChecks", 0, "state"),
    ("status", "admissionChecks", 0, "message"),
]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_PATHS), _JSON)
def test_any_value_in_a_held_gangs_fields_leaves_the_next_gang_decided(
    path: tuple[str | int, ...], value: object
) -> None:
    _, second = _passes(_set(*path, to=value))
    assert second["train/b"]["state"] in ("Ready", "Retry")


# --- the gauges' refresh, and creates counted ------------------------------------------------


async def test_scrapes_within_a_second_share_one_refresh_of_the_view():
    """Each scrape rebuilt the whole view in the controller's event loop (0.14 s at 500
    nodes, 5,000 pods and 5,000 Workloads): a flood of scrapes starved its passes
    (hostile pass 6, M4). Now at most one refresh a second."""
    now = [1000.0]
    refreshes = []
    metrics = AdmissionMetrics()
    metrics.refresh = lambda: refreshes.append(now[0])
    server = MetricsServer(metrics, "127.0.0.1:0", lambda: (True, {}), clock=lambda: now[0])
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def scrape() -> None:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                    assert answer.status == 200
                    assert "unitscale_admission_passes_total" in await answer.text()

            for _ in range(5):
                await scrape()
            assert refreshes == [1000.0]
            now[0] += MIN_REFRESH_SECONDS
            await scrape()
            now[0] -= 3600.0  # a clock stepped back refreshes rather than wait an hour
            await scrape()
    finally:
        await server.stop()
    assert refreshes == [1000.0, 1000.0 + MIN_REFRESH_SECONDS, 1000.0 + MIN_REFRESH_SECONDS - 3600]


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(client.ApiException(status=500, reason="boom"), id="an-api-error"),
        pytest.param(aiohttp.ClientConnectionError("refused"), id="a-connection-error"),
    ],
)
async def test_a_failed_dataload_create_is_counted_as_a_write_error(monkeypatch, failure):
    """Warned of once and retried with the pass's backoff, but not counted (pass 5's leftover)."""

    async def failing(api: object, resource: object, body: object) -> None:
        raise failure

    monkeypatch.setattr("admission.controller.create", failing)
    controller = Writing()
    dataload = {
        "apiVersion": "data.fluid.io/v1alpha1",
        "kind": "DataLoad",
        "metadata": {"namespace": "train", "name": "weights-warmup"},
    }
    await controller._create(NO_API, dataload)
    assert controller.metrics.writes.labels("error")._value.get() == 1
    assert controller._unwritten
