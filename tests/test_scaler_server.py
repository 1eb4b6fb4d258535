"""The scaler as KEDA sees it: a real gRPC server on 127.0.0.1, generated clients."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler.sources import receive
from tests.conftest import T0, engine_signals, gateway_signals, ref
from tests.test_cli_flags import unitscale

METRIC = "unitscale-desired-replicas"


def metrics_request(so, name=METRIC):
    return keda.GetMetricsRequest(scaledObjectRef=so, metricName=name)


async def test_metric_spec_names_one_metric_with_both_target_fields(stub):
    spec = await stub.GetMetricSpec(ref())
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
        (METRIC, 1, 1.0)
    ]


@pytest.mark.parametrize(
    ("queue", "running", "replicas", "expected"),
    [
        pytest.param(8.0, 32.0, 1, 3, id="forty-in-flight-asks-for-three-replicas"),
        pytest.param(0.0, 0.0, 0, 0, id="idle-asks-for-zero-with-both-fields-zero"),
        pytest.param(0.0, 0.0, 1, 1, id="idle-on-a-restarted-scalers-first-look-keeps-its-replica"),
        pytest.param(0.0, 17.0, 1, 2, id="just-over-one-replica-asks-for-two"),
    ],
)
async def test_get_metrics_returns_desired_replicas_in_int_and_float(
    scaler, stub, queue, running, replicas, expected
):
    message = engine_signals(queue=queue, running=running)
    message.engine.replicas_up = message.engine.replicas_scraped = replicas
    receive(scaler.store, message)
    response = await stub.GetMetrics(metrics_request(ref()))
    assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in response.metricValues] == [
        (METRIC, expected, float(expected))
    ]
    assert (await stub.IsActive(ref())).result is (expected > 0)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("s0-unitscale-desired-replicas", id="keda-index-prefix-s0"),
        pytest.param("s12-unitscale-desired-replicas", id="keda-index-prefix-s12"),
    ],
)
async def test_keda_prefixed_metric_names_are_accepted_and_echoed(scaler, stub, name):
    receive(scaler.store, engine_signals(queue=1.0, running=1.0))
    response = await stub.GetMetrics(metrics_request(ref(), name))
    assert [v.metricName for v in response.metricValues] == [name]


async def test_unknown_metric_name_is_not_found(scaler, stub):
    receive(scaler.store, engine_signals(queue=1.0, running=1.0))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetrics(metrics_request(ref(), "s0-cpu"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert METRIC in caught.value.details()


@pytest.mark.parametrize(
    ("metadata", "fragment"),
    [
        pytest.param({"maxReplica": "3"}, "unknown key 'maxReplica'", id="unknown-key"),
        pytest.param({"minReplicas": "-2"}, "'minReplicas'='-2'", id="bad-value"),
        pytest.param({"deployment": ""}, "'deployment'=''", id="empty-required-key"),
    ],
)
@pytest.mark.parametrize("rpc", ["GetMetricSpec", "IsActive", "GetMetrics"])
async def test_bad_metadata_is_invalid_argument_on_every_rpc(stub, rpc, metadata, fragment):
    so = ref(**metadata)
    request = metrics_request(so) if rpc == "GetMetrics" else so
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in caught.value.details()
    assert "team-a/llama" in caught.value.details()


async def test_missing_required_key_is_invalid_argument(stub):
    so = keda.ScaledObjectRef(name="x", namespace="ns", scalerMetadata={"scalerAddress": "a:1"})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetricSpec(so)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "missing required key 'deployment'" in caught.value.details()


@pytest.mark.parametrize("rpc", ["IsActive", "GetMetrics"])
async def test_no_signals_is_unavailable_never_zero(stub, rpc):
    request = metrics_request(ref()) if rpc == "GetMetrics" else ref()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(request)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no signals yet for team-a/llama" in caught.value.details()


async def test_stale_signals_become_unavailable_and_fresh_ones_recover(scaler, clock, stub):
    receive(scaler.store, engine_signals(queue=0.0, running=20.0, at=T0))
    assert (await stub.GetMetrics(metrics_request(ref()))).metricValues[0].metricValue == 2
    clock.now = T0 + 31  # max-signal-age is 30s in the fixture
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetMetrics(metrics_request(ref()))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stale (SOURCE_EXPORTER 31s old; max 30s)" in caught.value.details()
    receive(scaler.store, engine_signals(queue=0.0, running=40.0, at=T0 + 31))
    assert (await stub.GetMetrics(metrics_request(ref()))).metricValues[0].metricValue == 3


async def test_per_object_max_signal_age_overrides_the_config(scaler, clock, stub):
    receive(scaler.store, engine_signals(queue=0.0, running=1.0, at=T0))
    clock.now = T0 + 6
    assert (await stub.IsActive(ref())).result is True
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.IsActive(ref(maxSignalAge="5s"))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_fresh_gateway_keeps_a_target_decidable_when_the_exporter_is_stale(
    scaler, clock, stub
):
    receive(scaler.store, engine_signals(queue=0.0, running=0.0, at=T0))
    clock.now = T0 + 40
    receive(scaler.store, gateway_signals(at=T0 + 40, buffered=2, arrival_rate=0.5))
    assert (await stub.IsActive(ref())).result is True
    assert (await stub.GetMetrics(metrics_request(ref()))).metricValues[0].metricValue == 1


async def test_metadata_selects_namespace_and_model_of_the_target(scaler, stub):
    receive(scaler.store, engine_signals("llama", "serving", model="m1", queue=0.0, running=64.0))
    so = ref(namespace="serving", model="m1", targetConcurrency="32")
    assert (await stub.GetMetrics(metrics_request(so))).metricValues[0].metricValue == 2
    with pytest.raises(grpc.aio.AioRpcError):  # same deployment, other model: no signals
        await stub.IsActive(ref(namespace="serving", model="m2"))


async def test_changed_metadata_takes_effect_on_the_next_call(scaler, stub):
    receive(scaler.store, engine_signals(queue=0.0, running=64.0))
    assert (await stub.GetMetrics(metrics_request(ref()))).metricValues[0].metricValue == 4
    so = ref(maxReplicas="3")
    assert (await stub.GetMetrics(metrics_request(so))).metricValues[0].metricValue == 3


async def next_push(call, within=2.0):
    return await asyncio.wait_for(call.read(), within)


async def test_stream_is_active_pushes_only_inactive_to_active_transitions(scaler, clock, stub):
    receive(scaler.store, engine_signals(queue=0.0, running=0.0))
    call = stub.StreamIsActive(ref(idleGrace="0s"))
    await asyncio.sleep(0.2)  # let the stream subscribe
    for step, running in enumerate([0.0, 4.0, 8.0, 30.0, 0.0, 0.0, 2.0], start=1):
        clock.now = T0 + step
        receive(scaler.store, engine_signals(queue=0.0, running=running, at=T0 + step))
        if step == 2:  # 0 -> 4 in flight: the one transition so far
            assert (await next_push(call)).result is True
        if step == 5:  # KEDA's poll sees the fall to zero (an active one decides when asked)
            assert not (await stub.IsActive(ref(idleGrace="0s"))).result
    # 8 and 30 stayed active: nothing more was sent; 0 -> 2 at the end is a new transition.
    assert (await next_push(call)).result is True
    with pytest.raises(asyncio.TimeoutError):
        await next_push(call, within=0.3)
    call.cancel()


async def test_stream_is_active_opens_with_true_when_already_active(scaler, stub):
    receive(scaler.store, engine_signals(queue=3.0, running=0.0))
    call = stub.StreamIsActive(ref())
    assert (await next_push(call)).result is True
    with pytest.raises(asyncio.TimeoutError):
        await next_push(call, within=0.3)
    call.cancel()


async def test_stream_is_active_reports_bad_metadata(stub):
    call = stub.StreamIsActive(ref(minReplicas="x"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stream_metric_spec_sends_the_spec_at_once_and_stays_open(stub):
    call = stub.StreamMetricSpec(ref())
    first = await asyncio.wait_for(call.read(), 2.0)
    assert [(s.metricName, s.targetSizeFloat) for s in first.metricSpecs] == [(METRIC, 1.0)]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(call.read(), 0.3)
    call.cancel()


async def test_many_scaled_objects_are_served_concurrently_and_independently(scaler, stub):
    count = 400
    for i in range(count):
        message = engine_signals(f"model-{i}", queue=0.0, running=float(i))
        if i == 0:  # idle and at zero: a restarted scaler keeps a replica it sees running
            message.engine.replicas_up = message.engine.replicas_scraped = 0
        receive(scaler.store, message)

    async def ask(i):
        so = ref(f"model-{i}", targetConcurrency="10")
        spec, value, active = await asyncio.gather(
            stub.GetMetricSpec(so),
            stub.GetMetrics(metrics_request(so)),
            stub.IsActive(so),
        )
        return spec.metricSpecs[0].metricName, value.metricValues[0].metricValue, active.result

    answers = await asyncio.gather(*(ask(i) for i in range(count)))
    assert answers == [(METRIC, -(-i // 10), i > 0) for i in range(count)]
    assert len(scaler.registry) == count


async def test_health_is_serving_and_reflection_lists_the_services(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "externalscaler.ExternalScaler"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    reply = await call.read()
    names = {s.name for s in reply.list_services_response.service}
    assert {"externalscaler.ExternalScaler", "grpc.health.v1.Health"} <= names


async def test_graceful_shutdown_reports_not_serving_first(clock):
    from scaler.config import ScalerConfig
    from scaler.server import ScalerServer

    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        health = health_pb2_grpc.HealthStub(chan)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(server.stop(grace=1.0))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        await stopping


async def test_every_decision_is_exported_for_prometheus(clock):
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    from scaler.config import ScalerConfig
    from scaler.server import ScalerServer

    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock, metrics_listen="127.0.0.1:0")
    port = await server.start()
    try:
        receive(server.store, engine_signals(queue=8.0, running=24.0))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
            stub = keda_grpc.ExternalScalerStub(chan)
            await stub.GetMetrics(metrics_request(ref()))
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.IsActive(ref("other"))  # no signals: unavailable
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{server.metrics_port}/metrics") as response:
                text = await response.text()
        samples = {
            (s.name, s.labels.get("scaled_object")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        assert samples[("unitscale_scaler_desired_replicas", "llama")] == 2.0  # 32 in flight / 16
        assert samples[("unitscale_scaler_active", "llama")] == 1.0
        assert samples[("unitscale_scaler_signals_available", "llama")] == 1.0
        assert samples[("unitscale_scaler_signals_available", "other")] == 0.0
        assert ("unitscale_scaler_desired_replicas", "other") not in samples  # never a fake 0
    finally:
        await server.stop(grace=0)


async def test_scaled_objects_keda_stopped_asking_about_are_forgotten(scaler, clock, stub):
    from tests.conftest import T0

    await stub.GetMetricSpec(ref("kept"))
    await stub.GetMetricSpec(ref("gone"))
    clock.now = T0 + 3000
    await stub.GetMetricSpec(ref("kept"))  # still polled by KEDA
    clock.now = T0 + 3700
    assert scaler.registry.evict_idle(3600.0) == [("team-a", "gone")]
    assert [s.key for s in scaler.registry.objects()] == [("team-a", "kept")]


def test_a_metrics_listen_port_in_use_is_one_line_naming_the_flag_and_status_2():
    """Bound before the gRPC server starts: no 'Event loop is closed' traceback after it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = unitscale(
            "scaler", "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"unitscale scaler: --metrics-listen '127.0.0.1:{port}': Address already in use"
