"""Issue 27's second hostile pass, the scaler's side: counts, sizes and names from outside.

- A replica count above ``MAX_REPLICAS`` (``count(up)`` of 5e9), or more sleepers than
  replicas awake, is unmeasured where it enters, never a fact; one pool whose figures
  do not encode is unknown alone, never the capacity RPC for every pool.
- The registry keeps at most ``max_objects`` ScaledObjects: a new one past it is
  RESOURCE_EXHAUSTED, counted, logged once.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.signals import MAX_REPLICAS, EngineSignals, Snapshot, checked
from foundation.signals_wire import decode
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.config import ScalerConfig
from scaler.promql import checked_answers, signals_from_answers
from scaler.registry import RegistryFullError, ScaledObjectRegistry
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, ref
from tests.test_scaler_hostile_inputs import answers

# --- replica counts: bounded where they enter ------------------------------------------


@pytest.mark.parametrize(
    ("given_answers", "unmeasured", "problem"),
    [
        pytest.param(answers(replicas=5e9, replicas_up=2, running=3), ("replicas",),
                     "replicas is above 10,000",
                     id="count(up) of 5e9 is no deployment's count and is unmeasured"),
        pytest.param(answers(replicas=2, replicas_up=1e300, running=3), ("replicas-up",),
                     "replicas-up is above 10,000",
                     id="sum(up) of 1e300 is unmeasured, never a 300-digit integer"),
        pytest.param(answers(replicas=2, replicas_up=2, replicas_sleeping=1e6),
                     ("replicas-sleeping",), "replicas-sleeping is above",
                     id="a million sleepers beside two replicas are unmeasured"),
        pytest.param(answers(replicas=10, replicas_up=10, replicas_sleeping=11),
                     ("replicas-sleeping",), "replicas-sleeping is above the replicas awake",
                     id="more sleepers than replicas up is no count"),
        pytest.param(answers(replicas=10, replicas_up=10, replicas_sleeping=10, running=20),
                     ("replicas-sleeping",), "replicas-sleeping is above the replicas awake",
                     id="every replica asleep beside running requests is no count"),
        pytest.param(answers(replicas=10, replicas_up=10, replicas_sleeping=10, running=0), (),
                     None, id="every replica asleep and nothing running is a fact"),
        pytest.param(answers(replicas=MAX_REPLICAS, replicas_up=MAX_REPLICAS, running=3), (),
                     None, id="a count at the bound is still a count"),
    ],
)  # fmt: skip
def test_impossible_replica_counts_are_unmeasured_with_a_reason(given_answers, unmeasured, problem):
    clean, problems = checked_answers(given_answers)
    for name in unmeasured:
        assert clean[(name, None)] is None
    assert (problem is None) == (not problems), problems
    if problem is not None:
        assert any(problem in p for p in problems), problems


counts = st.none() | st.floats(0, 1e308) | st.integers(0, 2**64).map(float)


@settings(max_examples=300, deadline=None)
@given(replicas=counts, up=counts, sleeping=counts, running=st.floats(0, 1e4))
def test_any_replica_counts_from_prometheus_fit_the_bound_and_never_outnumber(
    replicas, up, sleeping, running
):
    given_answers = answers(
        replicas=replicas, replicas_up=up, replicas_sleeping=sleeping, running=running
    )
    signals = signals_from_answers(given_answers, 2.0, 4.0)
    assert signals is not None
    assert 0 <= signals.replicas <= MAX_REPLICAS
    assert 0 <= signals.replicas_up <= MAX_REPLICAS
    if signals.replicas_sleeping is not None:
        assert signals.replicas_sleeping <= max(signals.replicas_up, signals.replicas)


def wire_engine(sleeping: int | None, up: int = 10, running: float = 20.0) -> EngineSignals:
    message = engine_signals(running=running, queue=0.0)
    message.engine.replicas_up = message.engine.replicas_scraped = up
    if sleeping is not None:
        message.engine.replicas_sleeping = sleeping
    signals = decode(message).signals
    assert isinstance(signals, EngineSignals)
    return signals


@pytest.mark.parametrize(
    ("sleeping", "running", "kept"),
    [
        pytest.param(4_000_000_000, 20.0, None,
                     id="four billion sleepers from the wire are unmeasured"),
        pytest.param(11, 20.0, None, id="eleven sleepers of ten replicas are unmeasured"),
        pytest.param(10, 20.0, None, id="all ten asleep beside twenty running are unmeasured"),
        pytest.param(10, 0.0, 10, id="all ten asleep with nothing running are kept"),
        pytest.param(3, 20.0, 3, id="three of ten asleep are kept"),
    ],
)  # fmt: skip
def test_the_store_unmeasures_sleepers_the_replicas_cannot_hold(sleeping, running, kept):
    signals, impossible = checked(wire_engine(sleeping, running=running))
    assert isinstance(signals, EngineSignals)
    assert signals.replicas_sleeping == kept
    assert (kept is None) == bool(impossible)


def test_impossible_sleepers_never_lower_a_busy_deployment():
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    scaled = registry.resolve("llama", "team-a", {**ref().scalerMetadata})
    message = engine_signals(running=160.0, queue=0.0)
    message.engine.replicas_up = message.engine.replicas_scraped = 10
    message.engine.replicas_sleeping = 4_000_000_000
    assert receive(store, message)
    assert registry.current(scaled).desired_replicas == 10  # 160 in flight, 16 a replica
    assert store.unmeasured[("exporter", "replicas_sleeping")] == 1


# --- the capacity RPC: one pool's figures never fail the others -------------------------


async def test_one_pools_figures_that_do_not_encode_leave_that_pool_unknown_alone(caplog):
    caplog.set_level(logging.INFO, logger="scaler.service")
    clock = FakeClock(T0)
    server = ScalerServer(ScalerConfig(max_signal_age=30.0), "127.0.0.1:0", clock=clock)

    def overflow(scaled, decision, now):  # any figure past uint32, whatever its source
        if scaled.key[1] == "bad":
            return replace(decision, current_replicas=2**40)
        return decision

    server.registry.add_decision_hook(overflow)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            keda = keda_grpc.ExternalScalerStub(channel)
            capacity = capacity_pb2_grpc.CapacityServiceStub(channel)
            for name, pool in (("good", "a100"), ("bad", "h200")):
                await keda.GetMetricSpec(ref(name, pool=pool, acceleratorsPerReplica="1"))
                receive(server.store, engine_signals(name, running=16.0, queue=0.0))
            answers = [
                await capacity.GetInferenceDemand(capacity_pb2.GetInferenceDemandRequest())
                for _ in range(3)
            ]
    finally:
        await server.stop(grace=0)
    pools = {p.pool: p for p in answers[-1].pools}
    assert pools["a100"].HasField("accelerators_needed")
    assert not pools["h200"].HasField("accelerators_needed")
    assert "do not encode" in pools["h200"].unknown_reason
    assert server.registry.errors["pool-demand"] == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "h200" in warnings[0].getMessage()


async def test_a_count_of_five_billion_leaves_every_pools_demand_answerable(scaler, stub, channel):
    capacity = capacity_pb2_grpc.CapacityServiceStub(channel)
    await stub.GetMetricSpec(ref("bad", pool="h200", acceleratorsPerReplica="1"))
    signals = signals_from_answers(
        answers(signal_time=T0, replicas=5e9, replicas_up=2, running=16), 2.0, 4.0
    )
    assert signals is not None and scaler.store.update(Snapshot(("team-a", "bad", ""), signals))
    response = await capacity.GetInferenceDemand(capacity_pb2.GetInferenceDemandRequest())
    (pool,) = response.pools
    assert pool.accelerators_held == 2.0  # the replicas up stand in for the impossible count


# --- the registry: a bounded number of ScaledObjects ------------------------------------


def test_a_new_scaled_object_past_the_bound_is_refused_and_counted(caplog):
    caplog.set_level(logging.ERROR, logger="scaler.registry")
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock, max_objects=3)
    for n in range(3):
        registry.resolve(f"so-{n}", "team-a", {**ref(f"d{n}").scalerMetadata})
    for n in range(3, 6):
        with pytest.raises(RegistryFullError, match="keeps 3 ScaledObjects already"):
            registry.resolve(f"so-{n}", "team-a", {**ref(f"d{n}").scalerMetadata})
    kept = registry.resolve("so-0", "team-a", {**ref("other").scalerMetadata})
    assert kept.target[1] == "other"  # a known one still changes
    assert len(registry) == 3 and registry.errors["full"] == 3
    assert len(caplog.records) == 1  # once a filling, not once a call
    clock.now += 3600
    registry.evict_idle(60.0)
    registry.resolve("so-9", "team-a", {**ref("d9").scalerMetadata})  # room again


async def test_the_server_answers_resource_exhausted_past_the_bound(scaler, stub, monkeypatch):
    monkeypatch.setattr(scaler.registry, "_max_objects", 1)
    await stub.GetMetricSpec(ref("first"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetricSpec(ref("second"))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "team-a/second" in caught.value.details()
