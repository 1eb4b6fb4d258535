"""Admission under the seventh hostile pass (issue 27): its HTTP port bounds what a client
holds, the adaptive LoRA density forgets models no Workload names any more, and a card
UUID from a tenant's pod annotation is quoted wherever a problem names it.

The controller's ``/metrics`` and ``/healthz`` were served with aiohttp's defaults after
the sixth pass put the exporter's and the scaler's ports behind
``foundation.http_guard`` (S6-H3): 300 connections trickling unfinished request heads
were all still open 12 s later (~2 MiB each at aiohttp's 128 lines of 8,190 bytes, held
for good), and each malformed request wrote an ERROR with a traceback. It now listens
through the same guard: ``HEAD_TIMEOUT`` for a whole head, ``MAX_HEADERS`` lines of
``MAX_FIELD_SIZE`` bytes, at most ``max_connections`` open, a malformed request one
DEBUG line, each refusal counted in ``unitscale_admission_http_refused_total{reason}``.

The controller kept each base model's adaptive density for good once a Workload had
named it: tenants naming a new model each, then deleted, grew it without bound (200,000
models: 65 MiB, sorted every pass). A density now stays while a Workload names its model.

A pod's ``hami.io/vgpu-devices-allocated`` is a tenant's text: a 200 KB card UUID holding
newlines went whole into the controller's WARNING (a forged CRITICAL line among them), once
for each change of the annotation. ``admission.hami`` now names a UUID as written only when
it is a plain name, else quoted (64 characters, escaped), and at most four of them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission import hami
from admission.config import AdmissionConfig
from admission.controller import Controller, Snapshot
from admission.density import LORA_INTERVAL
from admission.metrics import AdmissionMetrics, MetricsServer
from admission.parameters import LoraParameters, Parameters
from foundation.http_guard import MAX_FIELD_SIZE, MAX_HEADERS
from foundation.kube import KubeAccess
from tests.conftest import read_until_closed, send_raw
from tests.test_admission_decide import CHECK, MIB, NOW, node, running, workload
from tests.test_admission_density import INSTANCE, MODEL, tenant_pod


@pytest.fixture
async def served() -> AsyncIterator[MetricsServer]:
    """The admission controller's HTTP port on 127.0.0.1:0, its guard quick and small."""
    server = MetricsServer(AdmissionMetrics(), "127.0.0.1:0", lambda: (True, {"problem": None}))
    server.guard.head_timeout = 0.2  # quick; the served one is HEAD_TIMEOUT
    server.guard.max_connections = 4
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: b", id="a scrape's head left open"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n", id="a probe's head left open"),
        pytest.param(b"", id="a connection that sends nothing"),
    ],
)
async def test_an_unfinished_head_is_closed_at_the_head_timeout(
    served: MetricsServer, head: bytes
) -> None:
    reader, writer = await send_raw(served.port, head)
    assert await read_until_closed(reader) == b""  # closed, nothing answered
    writer.close()
    assert served.guard.refused["slow-head"] == 1


async def test_connections_past_the_cap_are_answered_503(served: MetricsServer) -> None:
    held = [await send_raw(served.port, b"GET /metrics HTTP/1.1\r\n") for _ in range(4)]
    reader, writer = await send_raw(served.port, b"")
    assert (await read_until_closed(reader)).startswith(b"HTTP/1.1 503")
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    assert served.guard.refused["too-many-connections"] == 1


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_FIELD_SIZE + 1) + b"\r\n\r\n",
            id="a header line over MAX_FIELD_SIZE is a 400",
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * (MAX_HEADERS + 8) + b"\r\n",
            id="more header lines than MAX_HEADERS is a 400",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", id="a malformed header is a 400"
        ),
    ],
)
async def test_a_malformed_or_oversized_head_is_a_400_counted_with_no_traceback(
    served: MetricsServer, head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await send_raw(served.port, head)
    assert (await read_until_closed(reader)).startswith(b"HTTP/1.")
    writer.close()
    assert served.guard.refused["malformed-http"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_metrics_and_health_are_served_and_count_what_was_refused(
    served: MetricsServer,
) -> None:
    reader, writer = await send_raw(served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    assert await read_until_closed(reader) == b""  # a slow head, refused
    writer.close()
    answers = {}
    for path in ("/metrics", "/healthz"):
        reader, writer = await send_raw(
            served.port, b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode()
        )
        answers[path] = await read_until_closed(reader)
        writer.close()
    assert answers["/healthz"].startswith(b"HTTP/1.1 200")
    assert answers["/metrics"].startswith(b"HTTP/1.1 200")
    assert b'unitscale_admission_http_refused_total{reason="slow-head"} 1.0' in answers["/metrics"]


# --- the adaptive LoRA density --------------------------------------------------------------

ADAPTIVE = {
    CHECK: Parameters(
        lora=LoraParameters(tenants_per_instance=5, adaptive=True, step_time_slo_seconds=3.0)
    )
}


def _tenant(name: str, model: str, instance: str) -> dict[str, Any]:
    """A Workload fine-tuning ``model`` whose pods are labelled as ``instance``'s."""
    found = workload(name, template_annotations={names.LORA_BASE_MODEL: model})
    found["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {names.LORA_INSTANCE: instance}
    return found


def _view(*workloads: dict[str, Any], pods: Sequence[dict[str, Any]] = ()) -> Snapshot:
    named = {f"train/{w['metadata']['name']}": w for w in workloads}
    return Snapshot({}, {}, named, [node("gpu-1")], list(pods), [], [])


@pytest.mark.parametrize("models", [10, 1_000], ids=["ten models", "a thousand models"])
def test_a_density_goes_with_the_last_workload_naming_its_model(models: int) -> None:
    controller = Controller(KubeAccess(), AdmissionConfig())
    for i in range(models):  # each pass: one tenant naming a new model, the last one gone
        model = f"org/model-{i}"
        tenant = _tenant(f"t{i}", model, f"org-model-{i}-1")
        assert controller._step_density(_view(tenant), ADAPTIVE, NOW + i) == {model: 5}
    assert list(controller._density) == [f"org/model-{models - 1}"]
    assert controller._step_density(_view(), ADAPTIVE, NOW + models) == {}
    assert controller._density == {}


def test_a_model_still_named_keeps_its_density_while_its_instance_is_contested() -> None:
    """A model whose only instance another model's tenant claims too is left out of the
    readings (pass 4, M5): its learned density must stay, not start again at the ceiling."""
    controller = Controller(KubeAccess(), AdmissionConfig())
    seated = _tenant("seated", MODEL, INSTANCE)
    pressed = [tenant_pod("a", int(MIB * 0.95), "1.0")]
    assert controller._step_density(_view(seated, pods=pressed), ADAPTIVE, NOW) == {MODEL: 4}
    rival = _tenant("rival", MODEL.upper(), INSTANCE)  # the same slug: the instance contested
    claimed = _view(seated, rival, pods=pressed)
    assert controller._step_density(claimed, ADAPTIVE, NOW + LORA_INTERVAL) == {MODEL: 4}


# --- a tenant's card UUIDs in the controller's log ------------------------------------------

FORGED = "GPU-x\n2026-12-03 04.00.00 CRITICAL admission.controller forged " + "A" * 200_000


def _holding(allocated: str) -> dict[str, Any]:
    """A running pod on gpu-1 whose allocation annotation is ``allocated``."""
    pod = running("tenant", "gpu-1", range(1))
    pod["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = allocated
    return pod


@pytest.mark.parametrize(
    "allocated",
    [
        pytest.param(FORGED + ",NVIDIA,lots,10:;", id="a forged UUID before a memory no number"),
        pytest.param(FORGED + ",NVIDIA,1,-3:;", id="a forged UUID before negative cores"),
        pytest.param(FORGED + ",,1,1:;", id="a forged UUID with no device type"),
    ],
)
def test_a_forged_uuid_is_one_short_warning(
    allocated: str, caplog: pytest.LogCaptureFixture
) -> None:
    controller = Controller(KubeAccess(), AdmissionConfig())
    caplog.set_level(logging.WARNING)
    controller._check_objects(_view(pods=[_holding(allocated)]))
    (record,) = [r for r in caplog.records if "pod/serve/tenant" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message and len(message) < 500, message[:300]
    assert "CRITICAL" in message  # quoted, escaped: still there to read


def test_cards_a_node_does_not_register_are_named_quoted_a_few() -> None:
    uses = ":".join(f"GPU-{i}\nforged,NVIDIA,1,1" for i in range(1000)) + ":;"
    pool = hami.inventory([node("gpu-1")], [_holding(uses)], now=NOW)
    (problem,) = [p for p in pool.problems if p.subject == "pod/serve/tenant"]
    assert "\n" not in problem.reason and len(problem.reason) < 500, problem.reason[:300]
    assert f"and {1000 - hami.MAX_NAMED_UUIDS} more" in problem.reason


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=3000).filter(lambda t: not set(t) & set(",:;")))
def test_any_uuid_is_named_within_bounds_on_one_line(uuid: str) -> None:
    found = hami.unreadable("pod", _holding(f"{uuid},NVIDIA,lots,10:;"))
    assert found is not None
    assert "\n" not in found[1] and "\r" not in found[1] and len(found[1]) < 500


def test_an_object_checked_before_is_not_read_again_and_a_problem_warns_as_it_changes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass reads an object only in a version it has not checked, and a new version
    warns only when its problem changed (issue 28 keeps what was checked across passes
    rather than building it again each pass)."""
    from admission import controller as module

    reads: list[str] = []
    unreadable = module._unreadable

    def counted(kind: str, obj: Any) -> Any:
        reads.append(obj["metadata"]["name"])
        return unreadable(kind, obj)

    monkeypatch.setattr(module, "_unreadable", counted)
    controller = Controller(KubeAccess(), AdmissionConfig())
    caplog.set_level(logging.WARNING)
    bad = _holding("not-an-allocation")
    view = _view(pods=[bad])
    controller._check_objects(view)
    controller._check_objects(view)  # the very objects again: nothing read
    assert reads == ["gpu-1", "tenant"]
    again = _holding("not-an-allocation")  # a new version, the same problem
    again["metadata"]["resourceVersion"] = "2"
    controller._check_objects(_view(pods=[again]))
    worse = _holding("GPU-x,NVIDIA,lots,10:;")  # a new version, another problem
    worse["metadata"]["resourceVersion"] = "3"
    controller._check_objects(_view(pods=[worse]))
    assert reads == ["gpu-1", "tenant", "tenant", "tenant"]  # a new node, the same version
    warned = [r.getMessage() for r in caplog.records if "pod/serve/tenant" in r.getMessage()]
    assert len(warned) == 2, warned
