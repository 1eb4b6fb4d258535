"""The inference-demand RPC end to end: the real scaler on 127.0.0.1, the admission client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from admission.cluster import PoolDemand
from admission.demand import DemandResult, fetch_demand
from foundation.timestamps import from_timestamp, to_duration
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.sources import receive
from tests.conftest import T0, engine_signals, ref

H200 = {"pool": "h200", "acceleratorsPerReplica": "8"}


async def declare(stub, name: str, **metadata: str) -> None:
    """KEDA asking about a ScaledObject is how the scaler learns of it."""
    await stub.GetMetricSpec(ref(name, **metadata))


def address(scaler) -> str:
    return f"127.0.0.1:{scaler.port}"


async def test_fetch_demand_answers_a_pool_from_the_decision(scaler, stub):
    await declare(stub, "llama", **H200)
    receive(scaler.store, engine_signals("llama", queue=8.0, running=32.0))  # 40 in flight: 3
    result = await fetch_demand(address(scaler), "h200", 600, timeout=5)
    assert result == DemandResult({"h200": PoolDemand("h200", 8.0, 24.0)})


async def test_two_deployments_on_a_pool_add_up_and_other_pools_stay_apart(scaler, stub):
    await declare(stub, "llama", **H200)
    await declare(stub, "mistral", pool="h200", acceleratorsPerReplica="1")
    await declare(stub, "qwen", pool="a100", acceleratorsPerReplica="2")
    await declare(stub, "plain")  # no pool: not part of any
    for name, running in [("llama", 16.0), ("mistral", 32.0), ("qwen", 48.0), ("plain", 9.0)]:
        receive(scaler.store, engine_signals(name, queue=0.0, running=running))
    result = await fetch_demand(address(scaler), "", 600, timeout=5)
    assert result == DemandResult(
        {"a100": PoolDemand("a100", 2.0, 6.0), "h200": PoolDemand("h200", 9.0, 10.0)}
    )


async def test_a_scaled_object_without_signals_is_an_error_naming_it_never_a_zero(scaler, stub):
    await declare(stub, "llama", **H200)
    await declare(stub, "mistral", **H200)
    receive(scaler.store, engine_signals("llama", queue=0.0, running=16.0))
    result = await fetch_demand(address(scaler), "h200", 600, timeout=5)
    assert result.demand is None
    assert "pool 'h200'" in result.error
    assert "team-a/mistral: no signals yet for team-a/mistral" in result.error


async def test_stale_signals_turn_a_known_pool_into_an_error(scaler, clock, stub):
    await declare(stub, "llama", **H200)
    receive(scaler.store, engine_signals("llama", queue=0.0, running=16.0, at=T0))
    assert (await fetch_demand(address(scaler), "h200", 600, timeout=5)).demand is not None
    clock.now = T0 + 31  # max-signal-age is 30 s in the fixture
    result = await fetch_demand(address(scaler), "h200", 600, timeout=5)
    assert result.demand is None and "stale" in result.error


async def test_a_pool_no_scaled_object_declares_is_an_error(scaler, stub):
    await declare(stub, "llama", **H200)
    receive(scaler.store, engine_signals("llama", queue=0.0, running=16.0))
    result = await fetch_demand(address(scaler), "l4", 600, timeout=5)
    assert result.demand is None
    assert "NOT_FOUND" in result.error and "'l4'" in result.error and "h200" in result.error


async def test_all_pools_with_one_unknown_answers_the_known_and_names_the_other(scaler, stub):
    await declare(stub, "llama", **H200)
    await declare(stub, "qwen", pool="a100", acceleratorsPerReplica="2")
    receive(scaler.store, engine_signals("llama", queue=0.0, running=16.0))
    result = await fetch_demand(address(scaler), "", 600, timeout=5)
    assert result.demand == {"h200": PoolDemand("h200", 8.0, 8.0)}
    assert "pool 'a100'" in result.error and "team-a/qwen" in result.error


async def test_the_wire_answer_leaves_unknown_figures_unset_and_lists_the_parts(
    scaler, channel, stub
):
    await declare(stub, "llama", **H200)
    await declare(stub, "mistral", **H200)
    receive(scaler.store, engine_signals("llama", queue=8.0, running=32.0))
    capacity = capacity_pb2_grpc.CapacityServiceStub(channel)
    request = capacity_pb2.GetInferenceDemandRequest(pool="h200", horizon=to_duration(600))
    (pool,) = (await capacity.GetInferenceDemand(request, timeout=5)).pools
    assert pool.pool == "h200"
    assert not pool.HasField("accelerators_held") and not pool.HasField("accelerators_needed")
    assert from_timestamp(pool.decided_time) == T0
    llama, mistral = pool.deployments
    assert (llama.name, llama.deployment, llama.replicas_now, llama.replicas_forecast) == (
        "llama",
        "llama",
        1,
        3,
    )
    assert llama.accelerators_per_replica == 8.0 and "-> 3" in llama.reason
    assert llama.forecast_horizon.ToSeconds() == 60
    assert not mistral.HasField("replicas_now") and not mistral.HasField("replicas_forecast")
    assert not mistral.HasField("decided_time") and "no signals yet" in mistral.reason


async def test_a_negative_horizon_is_invalid_argument(scaler, channel, stub):
    await declare(stub, "llama", **H200)
    capacity = capacity_pb2_grpc.CapacityServiceStub(channel)
    request = capacity_pb2.GetInferenceDemandRequest(pool="h200", horizon=to_duration(-1))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await capacity.GetInferenceDemand(request, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "horizon" in (caught.value.details() or "")
    result = await fetch_demand(address(scaler), "h200", -1, timeout=5)
    assert result.demand is None and "INVALID_ARGUMENT" in result.error


async def test_the_service_is_healthy_and_listed_by_reflection(channel):
    name = "unitscale.v1.CapacityService"
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=name)
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in [await call.read()] for s in r.list_services_response.service}
    assert name in names


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_a_closed_port_is_an_error_not_an_exception(closed_port):
    # A deadline, not a measurement: the call ends by its own 2 s timeout, never waiting
    # out gRPC's reconnect backoff (which the guard would cut off as a failure).
    async with asyncio.timeout(10):
        result = await fetch_demand(f"127.0.0.1:{closed_port}", "h200", 600, timeout=2)
    assert result.demand is None
    assert f"127.0.0.1:{closed_port}" in result.error and "UNAVAILABLE" in result.error


async def test_an_address_grpc_cannot_parse_is_an_error_not_an_exception():
    result = await fetch_demand("not an address::", "h200", 600, timeout=2)
    assert result.demand is None and "not an address::" in result.error
