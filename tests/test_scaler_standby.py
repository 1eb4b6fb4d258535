"""The served scaler acts on the warm-tier plan: ``standby: true`` in a trigger.

The pure part (``scaler.core.standby.with_standby``) in tables; then the real scaler on
127.0.0.1: KEDA's metric is running + sleeping, the ScaledObject stays active while a
sleeper is held, and ``GetStandbyPlan`` tells the gateway both counts.
"""

from __future__ import annotations

import math
from dataclasses import replace

import grpc
import pytest

from foundation.errors import MetadataError
from foundation.replica_model import LLAMA3_8B_H200
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.core import Decision, DecisionState, Observation, Policy, decide
from scaler.core.standby import (
    STANDBY_INTERVAL,
    StandbyState,
    standby_setup,
    with_standby,
)
from scaler.core.tiers import StandbyPolicy
from scaler.core.window import Recent
from scaler.demand import Declared, pool_demand
from scaler.metadata import parse_metadata
from scaler.registry import metric_value
from scaler.sources import receive
from tests.conftest import T0, engine_signals, gateway_signals, ref

PROFILED = Policy(profile=LLAMA3_8B_H200.name)
SETUP = standby_setup(PROFILED, StandbyPolicy(), cache=False)
STANDBY = {"profile": LLAMA3_8B_H200.name, "standby": "true", "idleGrace": "60s"}


def decision(desired: int, last_activity: float, forecast: float | None = None) -> Decision:
    state = DecisionState(desired=desired, last_activity=last_activity)
    return Decision(desired, desired > 0, state, f"-> {desired}", prewarm_forecast=forecast)


def need(*levels: float) -> StandbyState:
    """Need samples every 5 s up to T0, the last sample due now."""
    start = T0 - STANDBY_INTERVAL * len(levels)
    samples = tuple((start + i * STANDBY_INTERVAL, v) for i, v in enumerate(levels))
    return StandbyState(Recent(samples), T0)


@pytest.mark.parametrize(
    ("made", "state", "setup", "sleeping", "active", "why"),
    [
        pytest.param(
            decision(0, T0 - 300), StandbyState(), SETUP, 1, True, "1 sleeping",
            id="idle at zero within the hour holds one sleeper and stays active",
        ),
        pytest.param(
            decision(0, -math.inf), StandbyState(), SETUP, 0, False, "nothing held",
            id="a workload never active holds nothing and stays inactive",
        ),
        pytest.param(
            decision(0, T0 - 3601), StandbyState(), SETUP, 0, False, "nothing held",
            id="idle past the release holds nothing: KEDA may scale to zero",
        ),
        pytest.param(
            decision(2, T0), need(*([3.0] * 50 + [2.0] * 50)), SETUP, 1, True,
            "replica 3 was needed",
            id="a third replica needed half the window sleeps beside two running",
        ),
        pytest.param(
            decision(2, T0), need(*([2.0] * 100)), SETUP, 0, True, "no replica above 2",
            id="a steady fleet holds no sleeper",
        ),
        pytest.param(
            decision(0, T0 - 300),
            StandbyState(),
            replace(SETUP, policy=StandbyPolicy(max_sleeping=0)),
            0,
            False,
            "sleeping disabled",
            id="standbyMaxSleeping 0 holds none",
        ),
        pytest.param(
            decision(0, T0 - 3601, forecast=2.0), StandbyState(), SETUP, 2, True,
            "replica 2 was needed",
            id="a confident seasonal return of two holds two sleepers past the release",
        ),
    ],
)  # fmt: skip
def test_the_plan_in_the_decision(made, state, setup, sleeping, active, why):
    planned, after = with_standby(made, state, setup, PROFILED, T0)
    assert planned.sleeping_replicas == sleeping
    assert planned.desired_replicas == made.desired_replicas  # the plan adds, never removes
    assert planned.active is active
    assert why in planned.reason and planned.reason.startswith(made.reason + "; standby: ")
    assert planned.inputs["sleeping"] == sleeping
    assert after.need.samples[-1] == (T0, float(made.desired_replicas))


@pytest.mark.parametrize(
    ("desired", "max_replicas", "sleeping"),
    [
        pytest.param(3, 4, 1, id="one pod left below maxReplicas holds one sleeper of two"),
        pytest.param(4, 4, 0, id="running at maxReplicas holds no sleeper"),
        pytest.param(2, 10, 2, id="room below maxReplicas holds what the plan says"),
    ],
)
def test_sleepers_are_pods_within_max_replicas(desired, max_replicas, sleeping):
    # The need said 5-6 replicas for most of the window: the plan wants two sleepers.
    policy = replace(PROFILED, max_replicas=max_replicas)
    state = need(*([desired + 2.0] * 90 + [float(desired)] * 10))
    planned, _ = with_standby(decision(desired, T0), state, SETUP, policy, T0)
    assert planned.sleeping_replicas == sleeping
    assert planned.desired_replicas + planned.sleeping_replicas <= max_replicas
    assert planned.inputs["sleeping"] == sleeping
    if sleeping < 2:
        assert f"maxReplicas {max_replicas}" in planned.reason


def test_the_need_is_sampled_every_interval_not_every_decision():
    state = StandbyState()
    for second in range(12):
        _, state = with_standby(decision(1, T0), state, SETUP, PROFILED, T0 + second)
    assert [t - T0 for t, _ in state.need] == [0.0, 5.0, 10.0]


def test_a_count_that_falls_keeps_its_pods_asleep_for_as_long_as_a_start_costs():
    """Two per running replica: 6 running hold 18 pods. At 5 the plan asked for 15 and a
    sleeper was stopped, to be started again (25 s of an accelerator from the cache) when
    the count came back; now the drained replica sleeps, the 18 kept for 1,225 s
    (``kept_seconds``), then let go: the pods kept are not recorded as wanted."""
    setup = replace(SETUP, policy=StandbyPolicy(max_sleeping=16, burst_sleepers=2.0))
    state = StandbyState()
    planned, state = with_standby(decision(6, T0), state, setup, PROFILED, T0)
    assert (planned.sleeping_replicas, state.pods.samples) == (12, ((T0, 18),))
    for later, sleeping in ((5.0, 13), (1220.0, 13), (1230.0, 10)):
        planned, state = with_standby(decision(5, T0 + later), state, setup, PROFILED, T0 + later)
        assert planned.sleeping_replicas == sleeping, later
    assert "pods wanted within" not in planned.reason


def test_a_step_up_takes_a_kept_sleeper_and_starts_none_to_keep_it():
    """At most 16 asleep: 11 running held 27 pods; at 6, 22 (16 asleep, the rest
    stopped). A step up to 7 wakes one of them: the pods stay 22, and no sleeper is started
    to keep 16 (a start would be stopped again at the next step down, as the cap allows
    16 asleep). Not knowing the pods held, the plan keeps 16."""
    setup = replace(SETUP, policy=StandbyPolicy(max_sleeping=16, burst_sleepers=2.0))
    state = StandbyState()
    for later, running, sleeping in ((0.0, 11, 16), (5.0, 6, 16), (10.0, 7, 15), (15.0, 6, 16)):
        now = T0 + later
        planned, state = with_standby(decision(running, now), state, setup, PROFILED, now)
        assert planned.sleeping_replicas == sleeping, later
    unknown = replace(state, pods_held=None)
    planned, _ = with_standby(decision(7, T0 + 20), unknown, setup, PROFILED, T0 + 20)
    assert planned.sleeping_replicas == 16


def test_standby_without_a_profile_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="standby needs a profile"):
        standby_setup(Policy(), StandbyPolicy(), cache=False)


def test_a_fluid_dataset_makes_starts_cache_warm_and_a_speedup_shortens_the_wakes():
    cached = standby_setup(replace(PROFILED, profile_speedup=10.0), StandbyPolicy(), cache=True)
    assert cached.policy.cache and not SETUP.policy.cache
    assert cached.tiers.sleeping_wake_seconds == pytest.approx(
        SETUP.tiers.sleeping_wake_seconds / 10
    )
    assert SETUP.tiers.cold_wake_seconds == PROFILED.forecast_horizon_seconds


@pytest.mark.parametrize(
    ("desired", "sleeping", "current", "metric"),
    [
        pytest.param(0, 1, 1, 1.0, id="zero running and one asleep keeps one pod"),
        pytest.param(3, 1, 4, 4.0, id="three running and one asleep keep four pods"),
        pytest.param(3, 1, 3, 4.0, id="a sleeper to add scales the Deployment up by one"),
        pytest.param(2, 0, 2, 2.0, id="no sleeper: the metric is the decision's"),
    ],
)
def test_keda_is_asked_for_running_plus_sleeping(desired, sleeping, current, metric):
    made = replace(decision(desired, T0), sleeping_replicas=sleeping, current_replicas=current)
    assert metric_value(made) == metric


def test_sleeping_replicas_are_pods_not_capacity():
    # A restarted scaler holds what is ready: one awake replica, not the sleeper too.
    awake = Observation(
        now=T0,
        signal_time=T0,
        replicas_known=2,
        replicas_up=2,
        replicas_sleeping=1,
        queue_depth=0.0,
        requests_running=1.0,
    )
    assert decide(awake, Policy(), DecisionState()).desired_replicas == 1
    both = replace(awake, replicas_sleeping=0)
    assert decide(both, Policy(), DecisionState()).desired_replicas == 2


def test_a_sleeper_counts_in_the_pool_s_needed_accelerators():
    made = replace(decision(1, T0), sleeping_replicas=1, current_replicas=2)
    entry = Declared("team-a", "llama", "llama", "h200", 8.0, 10, 60.0, made, T0)
    (demand,) = pool_demand([entry]).values()
    assert (demand.accelerators_held, demand.accelerators_needed) == (16.0, 16.0)


def test_a_stepped_scale_up_and_its_sleepers_never_need_more_than_max_replicas():
    # Stepping from 3 towards the window's peak of 5, one sleeper held: 6 pods at most.
    state = DecisionState(desired=3, need_history=Recent(((T0 - 10, 5),)))
    made = Decision(3, True, state, "-> 3", {}, sleeping_replicas=1, current_replicas=3)
    entry = Declared("team-a", "llama", "llama", "h200", 1.0, 5, 60.0, made, T0)
    (demand,) = pool_demand([entry]).values()
    assert demand.accelerators_needed == 5.0


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        pytest.param(
            {"standbyMaxSleeping": "2"}, "standbyMaxSleeping needs standby: true",
            id="a standby knob without standby is refused",
        ),
        pytest.param(
            {"standby": "yes"}, "key 'standby'='yes': expected true or false",
            id="standby takes what Go's ParseBool takes",
        ),
        pytest.param(
            {"standby": "true", "standbyMaxSleeping": "-1"}, "standbyMaxSleeping",
            id="a negative sleeper count is refused",
        ),
        pytest.param(
            {"standby": "true", "standbyBurstSleepers": "nan"}, "standbyBurstSleepers",
            id="a burst share that is no number is refused",
        ),
        pytest.param(
            {"standby": "true", "standbyBurstSleepers": "1000"}, "standbyBurstSleepers",
            id="a burst share above the sleeper bound is refused",
        ),
        pytest.param(
            {"standbyBurstSleepers": "2"}, "standbyBurstSleepers needs standby: true",
            id="burst sleepers without standby are refused",
        ),
    ],
)  # fmt: skip
def test_bad_standby_keys_are_refused(extra, problem):
    with pytest.raises(MetadataError, match=problem):
        parse_metadata({"scalerAddress": "s:9090", "deployment": "llama", **extra})


def test_standby_is_off_by_default_and_its_knobs_parse():
    plain = parse_metadata({"scalerAddress": "s:9090", "deployment": "llama"})
    assert plain.standby_policy() is None
    on = parse_metadata(
        {
            "scalerAddress": "s:9090",
            "deployment": "llama",
            "standby": "true",
            "standbyMaxSleeping": "2",
            "standbyBurstSleepers": "1.5",
            "standbyReleaseAfter": "15m",
        }
    )
    assert on.standby_policy() == StandbyPolicy(
        max_sleeping=2, burst_sleepers=1.5, release_after_seconds=900.0
    )


# --- the real scaler ----------------------------------------------------------------------


async def standby_plan(channel, namespace="team-a", deployment="llama"):
    stub = capacity_pb2_grpc.CapacityServiceStub(channel)
    request = capacity_pb2.GetStandbyPlanRequest(namespace=namespace, deployment=deployment)
    return (await stub.GetStandbyPlan(request, timeout=5)).plans


def telemetry(scaler) -> dict[str, float]:
    """The scaler's /metrics samples for team-a/llama, as a scrape reads them."""
    from scaler.telemetry import DecisionCollector

    return {
        sample.name: sample.value
        for family in DecisionCollector(scaler.registry, None).collect()
        for sample in family.samples
        if sample.labels.get("scaled_object") == "llama"
    }


async def metric(stub) -> float:
    from protos.externalscaler import externalscaler_pb2 as keda

    request = keda.GetMetricsRequest(
        scaledObjectRef=ref(**STANDBY), metricName="unitscale-desired-replicas"
    )
    (value,) = (await stub.GetMetrics(request, timeout=5)).metricValues
    return value.metricValueFloat


async def test_after_traffic_one_sleeper_is_held_through_the_hour_then_released(
    scaler, clock, channel, stub
):
    await stub.GetMetricSpec(ref(**STANDBY))
    receive(scaler.store, engine_signals(queue=0.0, running=1.0, at=T0))  # one replica
    receive(scaler.store, gateway_signals(in_flight=1, arrival_rate=0.5, at=T0))
    assert await metric(stub) == 1.0
    (plan,) = await standby_plan(channel)
    assert (plan.name, plan.running, plan.sleeping) == ("llama", 1, 0)

    clock.now = T0 + 120  # idle past the 60 s grace: no replica runs, one sleeps
    receive(scaler.store, gateway_signals(arrival_rate=0.0, at=clock.now))
    assert await metric(stub) == 1.0
    assert (await stub.IsActive(ref(**STANDBY), timeout=5)).result
    (plan,) = await standby_plan(channel)
    assert (plan.running, plan.sleeping) == (0, 1)
    assert "scale to zero; standby: running 0; 1 sleeping" in plan.reason
    assert plan.decided_time.ToSeconds() == T0 + 120
    shown = telemetry(scaler)
    assert shown["unitscale_scaler_sleeping_replicas"] == 1.0
    assert shown["unitscale_scaler_desired_replicas"] == 0.0
    assert shown["unitscale_scaler_metric_value"] == 1.0
    assert shown["unitscale_scaler_active"] == 1.0

    clock.now = T0 + 3700  # an hour idle: nothing held, KEDA may scale to zero
    receive(scaler.store, gateway_signals(arrival_rate=0.0, at=clock.now))
    assert await metric(stub) == 0.0
    assert not (await stub.IsActive(ref(**STANDBY), timeout=5)).result
    (plan,) = await standby_plan(channel)
    assert (plan.running, plan.sleeping) == (0, 0)


async def test_a_workload_without_standby_is_not_found_and_one_without_signals_is_unset(
    scaler, channel, stub
):
    await stub.GetMetricSpec(ref("plain"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await standby_plan(channel, deployment="plain")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'team-a'/'plain' with standby: true" in (caught.value.details() or "")
    await stub.GetMetricSpec(ref(**STANDBY))
    (plan,) = await standby_plan(channel)
    assert not plan.HasField("running") and not plan.HasField("sleeping")
    assert "no signals yet" in plan.reason


async def test_standby_without_a_profile_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetricSpec(ref(standby="true"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "standby needs a profile" in (caught.value.details() or "")
