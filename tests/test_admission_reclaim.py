"""Reclaim through Kueue: the capacity manager's plan over the API's JSON, and its Retries.

Tables over one pool of HAMi nodes: what ``admission.reclaim`` reads (card shares, the
admitted training and its shares), which admitted workloads ``manager.reclaim_all`` sets
to Retry when inference's forecast rises, the allowance step 5 of ``decide_all`` adds,
the parameters, and the write a reclaim makes (``workload.reclaim_body``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission import hami, reclaim
from admission.cluster import Cluster, Pending, PoolDemand
from admission.decide import decide_all
from admission.manager import plan_pools, reclaim_all
from admission.parameters import (
    Headroom,
    Parameters,
    ReclaimParameters,
    parse_parameters,
)
from admission.workload import reclaim_body, reclaim_guard
from foundation.errors import ConfigError
from foundation.timestamps import format_time
from tests.test_admission_decide import CHECK, MIB, NOW, node, running, workload

HOUR = 3600.0
RECLAIM = Parameters(
    retry_after_seconds=45,
    inference_headroom=Headroom("scaler:9090", "h200", when_unavailable="Ignore"),
    reclaim=ReclaimParameters(enabled=True, min_run_seconds=600, max_priority=0),
)


def admitted(
    name: str, *, ago: float, priority: int = 0, gpus: int = 1, check: str = CHECK
) -> dict[str, Any]:
    """A Workload Kueue admitted ``ago`` seconds before NOW through ``check`` (Ready)."""
    w = workload(name, gpus=gpus, priority=priority, state="Ready")
    w["status"]["admissionChecks"][0]["name"] = check
    w["status"]["conditions"].append(
        {"type": "Admitted", "status": "True", "lastTransitionTime": format_time(NOW - ago)}
    )
    return w


def pod_of(name: str, cards: range, on: str = "gpu-1") -> dict[str, Any]:
    """A running pod of workload ``name``'s Job, holding whole ``cards`` on ``on``."""
    return running(f"{name}-0", on, cards, owner=f"job-{name}")


def cluster(
    workloads: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    *,
    demand: dict[str, PoolDemand] | None,
    demand_error: str = "",
    params: Parameters = RECLAIM,
    nodes: list[dict[str, Any]] | None = None,
) -> Cluster:
    return Cluster(
        nodes=nodes or [node("gpu-1")],
        pods=pods,
        workloads=workloads,
        datasets=[],
        dataloads=[],
        demand=demand,
        demand_error=demand_error,
        our_checks=frozenset({CHECK}),
        check_parameters={CHECK: params},
    )


def h200(held: float, needed: float) -> dict[str, PoolDemand]:
    return {"h200": PoolDemand("h200", accelerators_held=held, accelerators_needed=needed)}


# --- what the manager is given: shares of cards, admitted training --------------------


def shared(on: str, uuid_index: int, memory: int, cores: int, name: str) -> dict[str, Any]:
    """A pod holding ``memory`` MiB and ``cores`` % of one card."""
    pod = running(name, on, range(0))
    pod["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = (
        f"GPU-{on}-{uuid_index},NVIDIA,{memory},{cores}:;"
    )
    return pod


@pytest.mark.parametrize(
    ("pods", "taken"),
    [
        pytest.param([], {}, id="an idle pool has every card whole and free"),
        pytest.param(
            [running("serve", "gpu-1", range(2))],
            {"gpu-1/GPU-gpu-1-0": 1.0, "gpu-1/GPU-gpu-1-1": 1.0},
            id="whole cards taken are a share of 1",
        ),
        pytest.param(
            [shared("gpu-1", 0, MIB // 2, 10, "half")],
            {"gpu-1/GPU-gpu-1-0": (MIB // 2) / MIB},
            id="half the memory is half the card",
        ),
        pytest.param(
            [shared("gpu-1", 0, 1000, 75, "compute")],
            {"gpu-1/GPU-gpu-1-0": 0.75},
            id="the larger of memory and cores is the share",
        ),
        pytest.param(
            [shared("gpu-1", 0, 1000, 1, f"slot-{i}") for i in range(10)],
            {"gpu-1/GPU-gpu-1-0": 1.0},
            id="a card with every slot taken is exclusive whatever its memory",
        ),
        pytest.param(
            [shared("gpu-1", 0, 0, 0, "bare")],
            {"gpu-1/GPU-gpu-1-0": 0.1},
            id="a container holding neither memory nor cores takes one slot's worth",
        ),
    ],
)
def test_the_pool_state_reads_each_cards_taken_share(pods, taken):
    pool = hami.inventory([node("gpu-1")], pods, now=NOW)
    state = reclaim.pool_state(pool)
    assert state.cards == 8
    assert state.taken == pytest.approx(taken)


def test_cards_of_a_cordoned_node_are_not_the_pools():
    cordoned = node("gpu-2")
    cordoned["spec"]["unschedulable"] = True
    pool = hami.inventory([node("gpu-1"), cordoned], [], now=NOW)
    assert reclaim.pool_state(pool).cards == 8


def evicted(w: dict[str, Any]) -> dict[str, Any]:
    w["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    return w


def pending_only(name: str) -> dict[str, Any]:
    return workload(name, state="Pending")


def undated(w: dict[str, Any]) -> dict[str, Any]:
    """``w`` with its Admitted condition's lastTransitionTime unreadable."""
    (cond,) = (c for c in w["status"]["conditions"] if c["type"] == "Admitted")
    cond["lastTransitionTime"] = "yesterday"
    return w


@pytest.mark.parametrize(
    ("w", "found"),
    [
        pytest.param(
            admitted("a", ago=HOUR),
            ("train/a", 0, NOW - HOUR, True, {"gpu-1/GPU-gpu-1-0": 1.0}),
            id="an admitted workload holds the cards its pods were given",
        ),
        pytest.param(
            admitted("a", ago=HOUR, priority=5),
            ("train/a", 5, NOW - HOUR, False, {"gpu-1/GPU-gpu-1-0": 1.0}),
            id="a priority above maxPriority is not preemptible",
        ),
        pytest.param(
            undated(admitted("a", ago=HOUR)),
            ("train/a", 0, 0.0, False, {"gpu-1/GPU-gpu-1-0": 1.0}),
            id="one admitted at a time unreadable is not preemptible: its run is unknown",
        ),
        pytest.param(evicted(admitted("a", ago=HOUR)), None, id="one Kueue evicts is not ours"),
        pytest.param(pending_only("a"), None, id="one not admitted is not training held"),
        pytest.param(
            admitted("a", ago=HOUR, check="someone-else"), None, id="one admitted by another check"
        ),
    ],
)
def test_admitted_training_is_read_from_workloads_and_their_pods(w, found):
    pods = [pod_of("a", range(1))]
    pool = hami.inventory([node("gpu-1")], pods, now=NOW)
    here = reclaim.admitted_in_pool([w], pods, pool, [CHECK], max_priority=0)
    if found is None:
        assert here == []
        return
    (one,) = here
    got = one.admitted
    assert (got.key, got.priority, got.admitted_at, got.preemptible, dict(got.shares)) == found
    assert one.check == CHECK


def test_an_admitted_gang_with_no_pod_placed_yet_holds_no_share():
    pool = hami.inventory([node("gpu-1")], [], now=NOW)
    (one,) = reclaim.admitted_in_pool([admitted("a", ago=HOUR)], [], pool, [CHECK], 0)
    assert one.admitted.shares == {}


# --- what is reclaimed ----------------------------------------------------------------

# One node of 8 cards: inference holds 6-7; "old" (2 h) holds 0-3, "new" (1 h) holds 4-5.
OLD, NEW = admitted("old", ago=2 * HOUR), admitted("new", ago=HOUR)
PODS = [pod_of("old", range(4)), pod_of("new", range(4, 6)), running("serve", "gpu-1", range(6, 8))]


@pytest.mark.parametrize(
    ("workloads", "demand", "reclaimed"),
    [
        pytest.param(
            [OLD, NEW], h200(2, 2), [], id="inference needing what it holds takes nothing back"
        ),
        pytest.param(
            [OLD, NEW],
            h200(2, 4),
            ["train/new"],
            id="the most recently admitted preemptible goes first",
        ),
        pytest.param(
            [OLD, NEW],
            h200(2, 8),
            ["train/new", "train/old"],
            id="reclaims go on until the shortfall is covered",
        ),
        pytest.param(
            [OLD, admitted("new", ago=HOUR, priority=10)],
            h200(2, 4),
            ["train/old"],
            id="a workload above maxPriority is left alone",
        ),
        pytest.param(
            [OLD, admitted("new", ago=300)],
            h200(2, 4),
            ["train/old"],
            id="one admitted within minRunSeconds is left alone",
        ),
        pytest.param(
            [admitted("old", ago=2 * HOUR, priority=-5), NEW],
            h200(2, 4),
            ["train/old"],
            id="the lowest priority goes first, before the most recent",
        ),
        pytest.param(
            [admitted("old", ago=2 * HOUR, priority=10), admitted("new", ago=HOUR, priority=10)],
            h200(2, 8),
            [],
            id="with nothing preemptible nothing is reclaimed",
        ),
        pytest.param(
            [OLD, NEW],
            h200(0, 2),
            [],
            id="replicas still starting hold their cards: the scalers' zero is no shortfall",
        ),
    ],
)
def test_reclaim_takes_back_from_the_right_training(workloads, demand, reclaimed):
    decisions = reclaim_all(cluster(workloads, PODS, demand=demand), NOW)
    assert [f"{d.namespace}/{d.workload}" for d in decisions] == reclaimed
    for d in decisions:
        # 0: Kueue 0.17 evicts an admitted Workload only once its requeueAfterSeconds pass.
        assert (d.check, d.state, d.requeue_after_seconds) == (CHECK, "Retry", 0)
        assert d.message.startswith("reclaimed for inference on pool h200: ")


def test_what_training_does_not_hold_is_inferences_card_by_card():
    pool = hami.inventory([node("gpu-1")], PODS, now=NOW)
    training = [a.admitted for a in reclaim.admitted_in_pool([OLD, NEW], PODS, pool, [CHECK], 0)]
    assert reclaim.pool_state(pool, "h200", training).inference_cards == pytest.approx(2.0)
    # Not told the training, everything taken reads as inference's: it errs toward less.
    assert reclaim.pool_state(pool).inference_cards == pytest.approx(8.0)


def test_a_forecast_unavailable_reclaims_nothing_and_the_plan_says_why():
    state = cluster([OLD, NEW], PODS, demand=None, demand_error="scaler 'scaler:9090': UNAVAILABLE")
    plans = plan_pools(state, NOW)
    assert reclaim_all(state, NOW) == []
    plan = plans[CHECK].plan
    assert plan.known is False and plan.allowance is None
    assert "UNAVAILABLE" in plan.reason


def test_a_pool_the_scaler_does_not_know_is_unknown_never_zero():
    plans = plan_pools(cluster([OLD, NEW], PODS, demand=h200(2, 8), params=_other_pool()), NOW)
    plan = plans[CHECK].plan
    assert plan.known is False and "l4" in plan.reason


def _other_pool() -> Parameters:
    return Parameters(
        inference_headroom=Headroom("scaler:9090", "l4"),
        reclaim=ReclaimParameters(enabled=True),
    )


def test_a_check_without_reclaim_enabled_is_not_planned():
    quiet = Parameters(inference_headroom=Headroom("scaler:9090", "h200"))
    state = cluster([OLD, NEW], PODS, demand=h200(2, 8), params=quiet)
    assert plan_pools(state, NOW) == {}
    assert reclaim_all(state, NOW) == []


def test_the_plan_publishes_the_allowance_and_the_shortfall():
    (planned,) = plan_pools(cluster([OLD, NEW], PODS, demand=h200(2, 5)), NOW).values()
    assert planned.pool == "h200"
    assert planned.plan.known
    assert planned.plan.allowance == pytest.approx(3.0)  # 8 cards - 5 needed
    assert planned.plan.training_held == pytest.approx(6.0)
    assert planned.plan.shortfall == 3
    assert planned.entries == {"train/old": CHECK, "train/new": CHECK}


def test_the_burst_headroom_lowers_the_allowance_and_reclaims_nothing_more():
    padded = replace(
        RECLAIM,
        reclaim=replace(RECLAIM.reclaim, headroom_fraction=0.5, headroom_cards=1),
    )
    state = cluster([OLD, NEW], PODS, demand=h200(2, 2), params=padded)
    (planned,) = plan_pools(state, NOW).values()
    # 8 cards - ceil(2 x 1.5) - 1 = 4: the headroom only stops admissions.
    assert planned.plan.allowance == pytest.approx(4.0)
    assert reclaim_all(state, NOW) == []


# --- step 5: admission within the allowance -------------------------------------------


def test_admission_is_held_to_the_allowance_where_the_headroom_step_lets_it_through():
    # The scaler says inference holds 4 (two replicas still being placed), HAMi shows 2:
    # the whole-GPU headroom sees 3 free after the gang, enough for 2 more; the
    # allowance (8 - 6 needed = 2, training holds 2) has no room for one more card.
    pods = [pod_of("new", range(4, 6)), running("serve", "gpu-1", range(6, 8))]
    pending = workload("next", gpus=1)
    state = cluster([NEW, pending], pods, demand=h200(4, 6))
    (decision,) = decide_all([Pending(pending, CHECK, RECLAIM, NOW - 10)], state, NOW)
    assert decision.state == "Retry" and decision.requeue_after_seconds == 45
    assert decision.message.startswith("admitting 1 GPU would take training to 3 of its 2-GPU")


def test_admission_within_the_allowance_is_ready_and_counts_gangs_of_the_same_pass():
    pods = [running("serve", "gpu-1", range(6, 8))]
    first, second = workload("first", gpus=1), workload("second", gpus=1)
    # The headroom passes both (4 held, 3 more needed, 5 then 4 whole cards free); the
    # allowance is 8 - 7 = 1 card: the first takes it.
    state = cluster([first, second], pods, demand=h200(4, 7))
    decisions = decide_all(
        [Pending(w, CHECK, RECLAIM, NOW - 10) for w in (first, second)], state, NOW
    )
    assert [(d.workload, d.state) for d in decisions] == [("first", "Ready"), ("second", "Retry")]
    assert "keeps training at 1 of its 1-GPU allowance" in decisions[0].message
    assert "would take training to 2 of its 1-GPU allowance" in decisions[1].message


def unplaced_pod_of(name: str) -> dict[str, Any]:
    """A pod of workload ``name``'s Job that HAMi has not placed yet (no allocation)."""
    pod = pod_of(name, range(0))
    pod["metadata"]["annotations"] = {}
    pod["spec"] = {}
    pod["status"] = {"phase": "Pending"}
    return pod


def test_a_gang_admitted_in_an_earlier_pass_but_not_placed_counts_against_the_allowance():
    # "placing" (1 GPU) was made Ready and admitted a pass ago; its pod is not placed yet,
    # so it holds no share. The allowance (8 - 7 needed = 1 card) is its: the next gang
    # waits, as it would had "placing"'s pod landed (the headroom step lets it through:
    # 4 held, 3 more needed, 4 whole cards free after both).
    placing = admitted("placing", ago=30)
    pending = workload("next", gpus=1)
    pods = [unplaced_pod_of("placing"), running("serve", "gpu-1", range(6, 8))]
    state = cluster([placing, pending], pods, demand=h200(4, 7))
    (decision,) = decide_all([Pending(pending, CHECK, RECLAIM, NOW - 10)], state, NOW)
    assert decision.state == "Retry", decision.message
    assert decision.message.startswith("admitting 1 GPU would take training to 2 of its 1-GPU")


def test_a_gang_partly_placed_counts_its_whole_demand_once():
    # "half" asks 2 pods of 1 GPU; one is placed (a share the plan counts), one is not:
    # training holds 2 of the 8 - 6 = 2-card allowance, so no room for another card.
    half = admitted("half", ago=30)
    half["spec"]["podSets"][0]["count"] = 2
    placed = pod_of("half", range(1))
    waiting = unplaced_pod_of("half")
    waiting["metadata"]["name"] = waiting["metadata"]["uid"] = "half-1"
    pending = workload("next", gpus=1)
    pods = [placed, waiting, running("serve", "gpu-1", range(6, 8))]
    state = cluster([half, pending], pods, demand=h200(4, 6))
    (decision,) = decide_all([Pending(pending, CHECK, RECLAIM, NOW - 10)], state, NOW)
    assert decision.state == "Retry", decision.message
    assert decision.message.startswith("admitting 1 GPU would take training to 3 of its 2-GPU")


def test_a_gang_made_ready_through_a_check_without_reclaim_on_the_pool_counts_too():
    # Two checks of ours on one pool, only one reclaiming: the plan counts the other's
    # admitted training, so a gang it makes Ready earlier in the pass counts as well.
    quiet = Parameters(
        inference_headroom=Headroom("scaler:9090", "h200", when_unavailable="Ignore")
    )
    first, second = workload("first", gpus=1, priority=1), workload("second", gpus=1)
    first["status"]["admissionChecks"][0]["name"] = "quiet"
    second["status"]["admissionChecks"][0]["name"] = CHECK
    state = replace(
        cluster([first, second], [running("serve", "gpu-1", range(6, 8))], demand=h200(4, 7)),
        our_checks=frozenset({CHECK, "quiet"}),
        check_parameters={CHECK: RECLAIM, "quiet": quiet},
    )
    decisions = decide_all(
        [Pending(first, "quiet", quiet, NOW - 10), Pending(second, CHECK, RECLAIM, NOW - 10)],
        state,
        NOW,
    )
    assert [(d.workload, d.state) for d in decisions] == [("first", "Ready"), ("second", "Retry")]
    assert decisions[1].message.startswith("admitting 1 GPU would take training to 2 of its 1")


def test_without_reclaim_the_allowance_is_not_checked():
    pods = [pod_of("new", range(4, 6)), running("serve", "gpu-1", range(6, 8))]
    pending = workload("next", gpus=1)
    quiet = Parameters(inference_headroom=Headroom("scaler:9090", "h200"))
    state = cluster([NEW, pending], pods, demand=h200(4, 6), params=quiet)
    (decision,) = decide_all([Pending(pending, CHECK, quiet, NOW - 10)], state, NOW)
    assert decision.state == "Ready"


# --- the write ------------------------------------------------------------------------


class _Retry:
    check, state, message = CHECK, "Retry", "inference on pool h200 needs 2 cards back"
    requeue_after_seconds: int | None = 45
    pod_set_updates: tuple[dict[str, Any], ...] = ()


@pytest.mark.parametrize(
    ("w", "guard"),
    [
        pytest.param(admitted("a", ago=HOUR), None, id="an admitted workload may be reclaimed"),
        pytest.param(evicted(admitted("a", ago=HOUR)), "evicted", id="an evicted one may not"),
        pytest.param(pending_only("a"), "not-admitted", id="one not admitted may not"),
    ],
)
def test_the_reclaim_write_sets_our_ready_entry_to_retry_only_when_safe(w, guard):
    assert reclaim_guard(w) == guard
    entry = w["status"]["admissionChecks"][0]
    body = reclaim_body(w, _Retry(), entry, NOW)
    if guard is not None or entry["state"] != "Ready":
        assert body is None
        return
    assert body is not None
    (written,) = body["status"]["admissionChecks"]
    assert written == {
        "name": CHECK,
        "state": "Retry",
        "lastTransitionTime": format_time(NOW),
        "message": _Retry.message,
        "requeueAfterSeconds": 45,
    }
    assert body["metadata"]["uid"] == "uid-wl-a"


# --- the parameters -------------------------------------------------------------------


def params(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "unitscale.io/v1alpha1",
        "kind": "CapacityCheckParameters",
        "metadata": {"name": "h200"},
        "spec": spec,
    }


HEADROOM_SPEC = {"scaler": "scaler:9090", "pool": "h200"}


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        pytest.param({}, ReclaimParameters(), id="reclaim is off by default"),
        pytest.param(
            {
                "inferenceHeadroom": HEADROOM_SPEC,
                "reclaim": {"enabled": True, "minRunSeconds": 0, "maxPriority": 100},
            },
            ReclaimParameters(enabled=True, min_run_seconds=0, max_priority=100),
            id="every field is read",
        ),
        pytest.param(
            {
                "inferenceHeadroom": HEADROOM_SPEC,
                "reclaim": {"enabled": True, "headroomFraction": 0.25, "headroomCards": 2},
            },
            ReclaimParameters(enabled=True, headroom_fraction=0.25, headroom_cards=2),
            id="the burst headroom is read",
        ),
    ],
)
def test_reclaim_parameters_are_read(spec, wanted):
    assert parse_parameters(params(spec)).reclaim == wanted


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        pytest.param(
            {"reclaim": {"enabled": True}},
            "spec.reclaim.enabled=true needs spec.inferenceHeadroom",
            id="reclaim without the forecast is refused",
        ),
        pytest.param(
            {"inferenceHeadroom": HEADROOM_SPEC, "reclaim": {"minRunSeconds": 86401}},
            "spec.reclaim.minRunSeconds=86401: must be between 0 and 86400",
            id="a minimum run time over a day is refused",
        ),
        pytest.param(
            {"reclaim": {"enabled": "yes"}},
            "spec.reclaim.enabled='yes': expected true or false",
            id="enabled must be a boolean",
        ),
        pytest.param(
            {"inferenceHeadroom": HEADROOM_SPEC, "reclaim": {"headroomFraction": 11}},
            "spec.reclaim.headroomFraction=11: must be between 0 and 10",
            id="a headroom over ten times the forecast is refused",
        ),
        pytest.param(
            {"inferenceHeadroom": HEADROOM_SPEC, "reclaim": {"headroomCards": -1}},
            "spec.reclaim.headroomCards=-1: must be between 0 and 100000",
            id="a negative card headroom is refused",
        ),
        pytest.param(
            {"reclaim": {"maxPriorty": 1}},
            "spec.reclaim: unknown field 'maxPriorty'",
            id="a misspelt field is named",
        ),
        pytest.param(
            {"lora": {"stepTimeSloSeconds": 0}},
            "spec.lora.stepTimeSloSeconds=0: must be between 0.001 and 86400",
            id="a zero step-time SLO is refused",
        ),
    ],
)
def test_bad_reclaim_parameters_are_refused_naming_the_field(spec, problem):
    with pytest.raises(ConfigError) as refused:
        parse_parameters(params(spec))
    assert problem in str(refused.value)


def test_the_crd_defaults_reclaim_as_the_parser_does():
    import yaml

    from tests.test_admission_parameters import CRD

    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = spec["properties"]["reclaim"]["properties"]
    defaults = {k: v["default"] for k, v in fields.items()}
    assert defaults == {
        "enabled": False,
        "minRunSeconds": 600,
        "maxPriority": 0,
        "headroomFraction": 0,
        "headroomCards": 0,
    }
    assert ReclaimParameters() == ReclaimParameters(
        enabled=defaults["enabled"],
        min_run_seconds=defaults["minRunSeconds"],
        max_priority=defaults["maxPriority"],
        headroom_fraction=defaults["headroomFraction"],
        headroom_cards=defaults["headroomCards"],
    )
    assert (fields["minRunSeconds"]["minimum"], fields["minRunSeconds"]["maximum"]) == (0, 86400)


# --- the metrics ----------------------------------------------------------------------


def test_the_plan_gauges_are_absent_while_the_forecast_is_unknown_never_zero():
    from admission.metrics import AdmissionMetrics

    metrics = AdmissionMetrics()
    known = plan_pools(cluster([OLD, NEW], PODS, demand=h200(2, 5)), NOW)[CHECK].plan
    metrics.set_plans({CHECK: ("h200", known)})
    sample = metrics.registry.get_sample_value
    labels = {"pool": "h200", "check": CHECK}
    assert sample("unitscale_admission_training_allowance_accelerators", labels) == 3
    assert sample("unitscale_admission_inference_shortfall_accelerators", labels) == 3
    unknown = plan_pools(cluster([OLD, NEW], PODS, demand=None, demand_error="down"), NOW)
    metrics.set_plans({CHECK: ("h200", unknown[CHECK].plan)})
    assert sample("unitscale_admission_training_allowance_accelerators", labels) is None
    assert sample("unitscale_admission_inference_shortfall_accelerators", labels) is None
    metrics.reclaimed("h200", 2.5)
    assert sample("unitscale_admission_reclaims_total", {"pool": "h200"}) == 1
    assert sample("unitscale_admission_reclaimed_accelerator_hours_total", {"pool": "h200"}) == 2.5
    metrics.set_lora_density({"llama-3-8b": 3})
    assert (
        sample("unitscale_admission_lora_tenants_per_instance", {"base_model": "llama-3-8b"}) == 3
    )


JOB = st.tuples(
    st.integers(min_value=-3, max_value=3),  # priority
    st.floats(min_value=0, max_value=4 * HOUR),  # admitted this long ago
    st.integers(min_value=1, max_value=2),  # whole cards
)


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(JOB, min_size=0, max_size=4),
    held=st.integers(min_value=0, max_value=2),
    more=st.floats(min_value=0, max_value=8),
)
def test_a_reclaim_only_ever_takes_preemptible_old_enough_training_of_ours(jobs, held, more):
    workloads, pods, card = [], [running("serve", "gpu-1", range(8 - held, 8))], 0
    for i, (rank, ago, cards) in enumerate(jobs):
        if card + cards > 8 - held:
            break
        workloads.append(admitted(f"j{i}", ago=ago, priority=rank))
        pods.append(pod_of(f"j{i}", range(card, card + cards)))
        card += cards
    state = cluster(workloads, pods, demand=h200(held, held + more))
    decisions = reclaim_all(state, NOW)
    by_name = {w["metadata"]["name"]: w for w in workloads}
    assert len({d.workload for d in decisions}) == len(decisions)
    for d in decisions:
        w = by_name[d.workload]
        assert w["spec"]["priority"] <= RECLAIM.reclaim.max_priority
        (cond,) = [c for c in w["status"]["conditions"] if c["type"] == "Admitted"]
        started = NOW - datetime.fromisoformat(cond["lastTransitionTime"]).timestamp()
        assert started >= RECLAIM.reclaim.min_run_seconds - 1  # times are whole seconds
        assert (d.check, d.state, d.requeue_after_seconds) == (CHECK, "Retry", 0)
    plan = plan_pools(state, NOW)[CHECK].plan
    if plan.shortfall == 0:
        assert decisions == []
