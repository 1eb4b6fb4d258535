"""Admission under the fourth hostile pass (issue 27): times behind, shared answers, names.

Each field is read at one boundary that checks its domain; what fails the check is
unknown or stands in for the earliest time the API server vouches for (a Workload's
creation), never a fact that admits onto cards another gang holds.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission import density, fit, hami
from admission.cluster import PoolDemand
from admission.controller import _Once
from admission.demand import DemandResult, fetch_demand
from admission.manager import reclaim_all
from admission.parameters import Headroom, Parameters, parse_parameters
from admission.workload import times_before_creation
from foundation.errors import ConfigError
from foundation.timestamps import format_time
from tests.test_admission_controller import NO_API, Writing
from tests.test_admission_decide import CHECK, NOW, node, running, workload
from tests.test_admission_decide import decide as decided
from tests.test_admission_reclaim import admitted, h200, pod_of
from tests.test_admission_reclaim import cluster as reclaim_cluster

# --- H1: a Ready entry's time behind the Workload's creation, missing or unreadable ----

CREATED_90_S_AGO = format_time(NOW - 90)


def _new_gang_beside_a_ghost(ready_at: str | None) -> str:
    """The verdict on a new 8-card gang beside ``ghost``, Ready with no pod, 90 s old."""
    ghost = workload("ghost", gpus=8, state="Ready", created=CREATED_90_S_AGO)
    entry = ghost["status"]["admissionChecks"][0]
    entry.pop("lastTransitionTime", None)
    if ready_at is not None:
        entry["lastTransitionTime"] = ready_at
    (decision,) = decided([workload("new", gpus=8)], [node("gpu-1")], others=[ghost])
    return decision.state


@pytest.mark.parametrize(
    "ready_at",
    [
        pytest.param(format_time(NOW - 60), id="a Ready a minute ago holds the gang's cards"),
        pytest.param(
            format_time(NOW - 600), id="a Ready before the creation counts from the creation"
        ),
        pytest.param("1970-01-01T00:00:00Z", id="a Ready dated 1970 counts from the creation"),
        pytest.param("0001-01-01T00:00:00Z", id="a Ready dated year 1 counts from the creation"),
        pytest.param("x", id="an unreadable Ready time counts from the creation"),
        pytest.param(None, id="a missing Ready time counts from the creation"),
    ],
)
def test_a_ready_gang_without_pods_holds_its_cards_at_least_300_s_from_its_creation(ready_at):
    """A Ready dated 1970 or missing ended the hold at once: a second gang was admitted
    onto the same 8 cards (issue 27, pass 4, H1)."""
    assert _new_gang_beside_a_ghost(ready_at) == "Retry"


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)).map(
            lambda d: d.replace(microsecond=0).isoformat() + "Z"
        ),
        st.text(max_size=30),
    )
)
def test_any_ready_time_holds_a_gang_created_within_the_hold(ready_at):
    assert _new_gang_beside_a_ghost(ready_at) == "Retry"


# --- M2: an Admitted time behind the Workload's creation ------------------------------

HOUR = 3600.0


def _reclaimed(admitted_at: str) -> list[tuple[str, str]]:
    """Who a 2-card shortfall reclaims: ``old`` (admitted 2 h ago, 4 cards) or ``new``
    (created 90 min ago, admitted at ``admitted_at``, 2 cards)."""
    old = admitted("old", ago=2 * HOUR)
    new = admitted("new", ago=HOUR)
    old["metadata"]["creationTimestamp"] = format_time(NOW - 3 * HOUR)
    new["metadata"]["creationTimestamp"] = format_time(NOW - 1.5 * HOUR)
    new["status"]["conditions"][-1]["lastTransitionTime"] = admitted_at
    pods = [pod_of("old", range(4)), pod_of("new", range(4, 6)), running("s", "gpu-1", range(6, 8))]
    taken = reclaim_all(reclaim_cluster([old, new], pods, demand=h200(2, 4)), NOW)
    return [(d.workload, d.message) for d in taken]


@pytest.mark.parametrize(
    ("admitted_at", "ago"),
    [
        pytest.param(format_time(NOW - HOUR), "60 min", id="the newest admitted is taken first"),
        pytest.param(
            "1970-01-01T00:00:00Z", "90 min", id="an admission dated 1970 reads as the creation"
        ),
        pytest.param(
            "0001-01-01T00:00:00Z", "90 min", id="an admission dated year 1 reads as the creation"
        ),
        pytest.param(
            format_time(NOW - 2.5 * HOUR), "90 min",
            id="an admission an hour before the creation reads as the creation",
        ),
    ],
)  # fmt: skip
def test_an_admission_before_the_creation_never_shields_its_workload(admitted_at, ago):
    """Dated 1970, ``new`` read as the oldest: ``old`` was taken instead, and decades of
    card-hours went on the counter (issue 27, pass 4, M2)."""
    [(name, message)] = _reclaimed(admitted_at)
    assert name == "new" and f"admitted {ago} ago" in message, message


@settings(max_examples=40, deadline=None)
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(2025, 12, 29, 7, 40)))
def test_any_admission_before_the_creation_reads_as_the_creation(when):
    [(name, message)] = _reclaimed(when.replace(microsecond=0).isoformat() + "Z")
    assert name == "new" and "admitted 90 min ago" in message, message


# --- H4: a GPU container's name in the fit's cache key -------------------------------


def _with_container_name(name: object, gpus: int = 1) -> dict[str, Any]:
    w = workload(f"w-{hash(str(name)) & 0xFFFF}", gpus=gpus)
    w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["name"] = name
    return w


@pytest.mark.parametrize(
    ("name", "state"),
    [
        pytest.param("trainer", "Ready", id="a container name of a DNS label is read"),
        pytest.param("x" * 63, "Ready", id="a name of 63 characters is read"),
        pytest.param(
            "x" * 64, "Rejected", id="a name past 63 characters rejects the workload naming it"
        ),
        pytest.param("x" * 250_000, "Rejected", id="a 250 KB name rejects the workload"),
        pytest.param(5, "Rejected", id="a name that is no text rejects the workload"),
    ],
)
def test_a_gpu_container_s_name_is_a_dns_label_or_the_workload_is_rejected(name, state):
    (decision,) = decided([_with_container_name(name)], [node("gpu-1")])
    assert decision.state == state, decision.message
    if state == "Rejected":
        assert "containers" in decision.message and "name" in decision.message
        assert len(decision.message) < 1000


def test_container_names_are_no_part_of_the_fit_s_cache_key():
    """1,000 Workloads with 250 KB names were kept by the cache after they were gone:
    282 MiB, 1 GiB at its 4,096 entries (issue 27, pass 4, H4)."""
    fit._key_bound.cache_clear()
    for i in range(5):
        decided([_with_container_name(f"trainer-{i}")], [node("gpu-1")])
    assert fit._key_bound.cache_info().currsize == 1


# --- H5: a scaler address gRPC cannot encode ----------------------------------------


def _headroom_object(scaler: str) -> dict[str, Any]:
    return {
        "kind": "CapacityCheckParameters",
        "metadata": {"name": "p"},
        "spec": {"inferenceHeadroom": {"scaler": scaler, "pool": "h200"}},
    }


@pytest.mark.parametrize(
    ("scaler", "accepted"),
    [
        pytest.param("unitscale-scaler.unitscale:9090", True, id="a service name is an address"),
        pytest.param("[::1]:9090", True, id="a bracketed IPv6 address is an address"),
        pytest.param("\udcff:9090", False, id="a lone surrogate is refused naming the field"),
        pytest.param("a\x00b:9090", False, id="a NUL is refused naming the field"),
        pytest.param("é.example:9090", False, id="a host beyond ASCII is refused naming it"),
    ],
)
def test_a_scaler_address_is_printable_ascii_host_port(scaler, accepted):
    if accepted:
        assert parse_parameters(_headroom_object(scaler)).inference_headroom is not None
    else:
        with pytest.raises(ConfigError, match=r"spec\.inferenceHeadroom\.scaler="):
            parse_parameters(_headroom_object(scaler))


async def test_an_ask_gRPC_cannot_make_is_that_ask_s_error_never_the_pass_s():
    """``\\udcff:9090`` raised UnicodeEncodeError from the channel, out of ``_demand``:
    every reconcile pass failed for every check (issue 27, pass 4, H5)."""
    result = await fetch_demand("\udcff:9090", "h200", 600.0, timeout=1.0)
    assert result.demand is None and "UnicodeEncodeError" in result.error
    controller = Writing()
    bad = Parameters(inference_headroom=Headroom("\udcff:9090", "h200"))
    known, error = await controller._demand([bad])
    assert known is None and "UnicodeEncodeError" in error


# --- M3: the answers of several asks ---------------------------------------------------

OURS = Parameters(inference_headroom=Headroom("ours:9090", "h200"))


def _asked(answers: dict[tuple[str, int], dict[str, PoolDemand]]) -> Any:
    async def demand(scaler: str, pool: str, horizon: float, **_: Any) -> DemandResult:
        return DemandResult(answers[scaler, int(horizon)])

    return demand


@pytest.mark.parametrize(
    ("others", "answers", "h200", "error"),
    [
        pytest.param(
            [], {("ours:9090", 600): {"h200": PoolDemand("h200", 16, 16)}},
            PoolDemand("h200", 16, 16), "", id="our ask alone is read",
        ),
        pytest.param(
            [Headroom("zz-other:9090", "l4")],
            {
                ("ours:9090", 600): {"h200": PoolDemand("h200", 16, 16)},
                ("zz-other:9090", 600): {
                    "h200": PoolDemand("h200", 0, 0), "l4": PoolDemand("l4", 1, 1)
                },
            },
            PoolDemand("h200", 16, 16), "",
            id="another check's scaler listing our pool is not read for it",
        ),
        pytest.param(
            [Headroom("ours:9090", "h200", horizon_seconds=60)],
            {
                ("ours:9090", 600): {"h200": PoolDemand("h200", 16, 16)},
                ("ours:9090", 60): {"h200": PoolDemand("h200", 16, 16)},
            },
            PoolDemand("h200", 16, 16), "", id="two asks of one pool that agree are read",
        ),
        pytest.param(
            [Headroom("ours:9090", "h200", horizon_seconds=60)],
            {
                ("ours:9090", 600): {"h200": PoolDemand("h200", 16, 16)},
                ("ours:9090", 60): {"h200": PoolDemand("h200", 16, 0)},
            },
            PoolDemand("h200", 16, 16), "",
            id="two asks of one pool that disagree each read their own (pass 5, M3)",
        ),
    ],
)  # fmt: skip
async def test_each_check_reads_only_the_pool_it_asked_never_the_last_answer(
    others, answers, h200, error
):
    """Another check's scaler listed h200 with held 0, needed 0, and our check read that
    (issue 27, pass 4, M3)."""
    controller = Writing(demand=_asked(answers))
    checks = [OURS, *(Parameters(inference_headroom=h) for h in others)]
    known, errors = await controller._demand(checks)
    assert (known or {}).get(("ours:9090", "h200", 600)) == h200
    assert error in errors


# --- M5: one tenant's instance label naming another model's instance -----------------


def _tenant(
    name: str, model: str, *, ready: object = None, template: object = None
) -> dict[str, Any]:
    w = workload(
        name,
        gpus=1,
        state="Ready" if ready is not None else "Pending",
        template_annotations={names.LORA_BASE_MODEL: model},
    )
    if ready is not None:
        w["status"]["admissionChecks"][0]["podSetUpdates"] = [
            {"name": "workers", "labels": {names.LORA_INSTANCE: ready}}
        ]
    if template is not None:
        w["spec"]["podSets"][0]["template"]["metadata"]["labels"] = {names.LORA_INSTANCE: template}
    return w


A = _tenant("a", "model-a", ready="model-a-1")


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        pytest.param([], {"model-a-1": "model-a"}, id="a tenant's instance is its model's"),
        pytest.param(
            [_tenant("b", "model-b", template="model-a-1")], {"model-a-1": "model-a"},
            id="another model's template label naming our instance does not take it",
        ),
        pytest.param(
            [_tenant("b", "model-b", ready="model-a-1")], {"model-a-1": "model-a"},
            id="another model's entry naming our instance does not take it",
        ),
        pytest.param(
            [_tenant("b", "model/a", template="model-a-1")], {},
            id="an instance two models claim through a shared slug is unknown",
        ),
        pytest.param(
            [_tenant("b", "model-b", template="model-b-" + "9" * 70)], {"model-a-1": "model-a"},
            id="a label that is no label value is no instance",
        ),
    ],
)  # fmt: skip
def test_an_instance_belongs_only_to_the_model_it_is_named_for(others, expected):
    """A tenant of model B labelled with model A's instance took A's step readings: A's
    overload went unseen and B's density fell (issue 27, pass 4, M5)."""
    assert density.instance_models([A, *others]) == expected


@settings(max_examples=100, deadline=None)
@given(st.just("model-a-1") | st.text(max_size=80))
def test_no_label_of_another_model_s_tenant_moves_our_load(label):
    models = density.instance_models([A, _tenant("b", "model-b", template=label)])
    pod = {
        "metadata": {
            "name": "a-pod",
            "namespace": "train",
            "labels": {names.LORA_INSTANCE: "model-a-1"},
            "annotations": {density.STEP_SECONDS: "100"},
        },
        "spec": {"nodeName": "gpu-1"},
        "status": {"phase": "Running"},
    }
    loads = density.model_loads([pod], hami.inventory([node("gpu-1")], [], now=NOW), models, 10.0)
    assert models["model-a-1"] == "model-a" and loads["model-a"].step_seconds == 100.0


# --- L3: the decision histogram's wait --------------------------------------------------


@pytest.mark.parametrize(
    "pending_at",
    [
        pytest.param(format_time(NOW - 60), id="a check Pending a minute ago waited a minute"),
        pytest.param("0001-01-01T00:00:00Z", id="one Pending since year 1 waited from creation"),
        pytest.param("1970-01-01T00:00:00Z", id="one Pending since 1970 waited from creation"),
    ],
)
async def test_the_decision_histogram_counts_the_wait_from_the_creation_at_the_earliest(
    pending_at,
):
    """A Pending dated year 1 went into the histogram as 6e10 s (issue 27, pass 4, L3)."""
    controller = Writing()
    check = {"metadata": {"name": CHECK}, "spec": {"controllerName": controller.name}}
    w = workload("a", gpus=1)
    w["metadata"]["creationTimestamp"] = format_time(NOW - 60)
    w["status"]["admissionChecks"][0]["lastTransitionTime"] = pending_at
    controller._changed("admissionchecks", {CHECK: check})
    controller._changed("workloads", {"train/a": w})
    controller._changed("nodes", {"gpu-1": node("gpu-1")})
    controller._changed("pods", {})
    await controller.reconcile(api=NO_API)
    assert controller.written["train/a"]["state"] == "Ready"
    waited = controller.metrics.registry.get_sample_value(
        "unitscale_admission_check_latency_seconds_sum", {"check": CHECK, "outcome": "Ready"}
    )
    assert waited == 60.0


# --- L4: the topics warned of once ------------------------------------------------------


def test_the_topics_warned_of_once_are_bounded_and_a_recurring_one_is_still_once(caplog):
    """A topic per object whose write failed was kept until it cleared: objects deleted
    meanwhile stayed forever (issue 27, pass 4, L4)."""
    once = _Once()
    for i in range(_Once.MAX_TOPICS + 50):
        once.warn(f"apply workloads train/w{i}", "failed: %s", i)
    assert len(once._last) == _Once.MAX_TOPICS
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="admission.controller"):
        once.warn("apply workloads train/w9999", "failed: %s", 9999)  # kept: once only
        once.warn("apply workloads train/w0", "failed: %s", 0)  # forgotten: warned again
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]


# --- H1, M2: a time before the creation is warned of once and counted ---------------------


@pytest.mark.parametrize(
    ("ready_at", "admitted_at", "named"),
    [
        pytest.param(format_time(NOW - 60), format_time(NOW - 60), None, id="times after it"),
        pytest.param("1970-01-01T00:00:00Z", None, "Ready at '1970", id="a Ready dated 1970"),
        pytest.param("x", None, "Ready at 'x'", id="a Ready time unreadable"),
        pytest.param(
            format_time(NOW - 60), "0001-01-01T00:00:00Z", "Admitted at '0001",
            id="an Admitted time of year 1",
        ),
    ],
)  # fmt: skip
def test_times_before_the_creation_are_named(ready_at, admitted_at, named):
    w = workload("ghost", gpus=8, state="Ready", created=CREATED_90_S_AGO)
    w["status"]["admissionChecks"][0]["lastTransitionTime"] = ready_at
    if admitted_at is not None:
        w["status"]["conditions"].append(
            {"type": "Admitted", "status": "True", "lastTransitionTime": admitted_at}
        )
    problem = times_before_creation(w)
    assert (problem is None) if named is None else (named in str(problem))


async def test_a_ready_time_before_the_creation_is_warned_of_once_and_counted(caplog):
    controller = Writing()
    check = {"metadata": {"name": CHECK}, "spec": {"controllerName": controller.name}}
    ghost = workload("ghost", gpus=8, state="Ready", created=CREATED_90_S_AGO)
    ghost["metadata"]["resourceVersion"] = "7"
    ghost["status"]["admissionChecks"][0]["lastTransitionTime"] = "1970-01-01T00:00:00Z"
    controller._changed("admissionchecks", {CHECK: check})
    controller._changed("workloads", {"train/ghost": ghost})
    controller._changed("nodes", {"gpu-1": node("gpu-1")})
    controller._changed("pods", {})
    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await controller.reconcile(api=NO_API)
        await controller.reconcile(api=NO_API)
    warned = [r.getMessage() for r in caplog.records if "before its creation" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("workload train/ghost:"), warned
    count = controller.metrics.registry.get_sample_value(
        "unitscale_admission_unreadable_objects_total", {"kind": "workload"}
    )
    assert count == 1.0
