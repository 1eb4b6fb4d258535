"""The scaler under faults: stale or partial data, restarts, two replicas, broken sources."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import grpc
import pytest

from foundation.signals import EngineSignals, Snapshot, WindowSignals
from foundation.signals_wire import encode
from protos.externalscaler import externalscaler_pb2 as keda
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler import service
from scaler.config import ScalerConfig, SignalSourceConfig
from scaler.registry import ScaledObject, ScaledObjectRegistry
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from scaler.sources import receive, watch_signals
from tests.conftest import T0, FakeClock, engine_signals, ref
from tests.test_signal_sources import start_publisher, wait_for


def metrics_request(scaled: keda.ScaledObjectRef) -> keda.GetMetricsRequest:
    return keda.GetMetricsRequest(scaledObjectRef=scaled, metricName="unitscale-desired-replicas")


async def desired(stub: keda_grpc.ExternalScalerStub, **metadata: str) -> float:
    response = await stub.GetMetrics(metrics_request(ref(**metadata)))
    return response.metricValues[0].metricValueFloat


async def test_the_unavailable_message_tells_the_signals_age_now(scaler, clock, stub, caplog):
    receive(scaler.store, engine_signals(queue=0.0, running=20.0, at=T0))
    assert await desired(stub) == 2
    caplog.set_level(logging.INFO, logger="scaler.registry")
    ages = []
    for later in (31, 41, 61):
        clock.now = T0 + later
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetMetrics(metrics_request(ref()))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        ages.append(caught.value.details().split("(SOURCE_EXPORTER ")[1].split(" old")[0])
    assert ages == ["31s", "41s", "1m1s"]
    # One log line when the signals went stale, not one per KEDA call.
    assert sum("stale" in r.getMessage() for r in caplog.records) == 1


def engine(at: float, replicas: int, up: int, running: float, partial: bool) -> Snapshot:
    window = WindowSignals(60.0, 1.0, 16_000.0 * running / 16, 1_600.0 * running / 16, 0.0)
    signals = EngineSignals(
        at, replicas, up, 0.0, running, None, window, window, None, None, False, partial
    )
    return Snapshot(("team-a", "llama", ""), signals)


@pytest.mark.parametrize(
    ("up", "running", "partial", "settles"),
    [
        pytest.param(
            4, 16.0, False, lambda n: n == 1, id="complete-signals-of-less-load-scale-down"
        ),
        pytest.param(1, 16.0, True, lambda n: n == 4, id="a-partial-scrape-never-lowers-the-count"),
        pytest.param(1, 200.0, True, lambda n: n > 4, id="a-partial-scrape-may-still-raise-it"),
    ],
)
async def test_partial_signals_only_raise_the_count(
    scaler, clock, stub, up, running, partial, settles
):
    # A fleet settled at 4 on complete signals, then 400 s of the case at hand.
    for step in range(0, 400, 5):
        clock.now = T0 + step
        scaler.store.update(engine(T0 + step, 4, 4, 64.0, False))
    assert await desired(stub) == 4
    for step in range(400, 800, 5):
        clock.now = T0 + step
        scaler.store.update(engine(T0 + step, 4, up, running, partial))
    assert settles(await desired(stub))


async def scaler_answers(config: ScalerConfig, clock: FakeClock, feed) -> list[float]:
    server = ScalerServer(config, "127.0.0.1:0", clock=clock)
    await server.start()
    answers = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            for at, snapshot in feed:
                clock.now = at
                server.store.update(snapshot)
                answers.append(await desired(stub))
    finally:
        await server.stop(grace=0)
    return answers


FEED = [(T0 + s, engine(T0 + s, 4, 4, 16.0 * (1 + (s // 60) % 4), False)) for s in range(0, 600, 5)]


async def test_two_scaler_replicas_fed_the_same_signals_answer_alike():
    config = ScalerConfig(max_signal_age=30.0)
    first, second = await asyncio.gather(
        scaler_answers(config, FakeClock(T0), FEED), scaler_answers(config, FakeClock(T0), FEED)
    )
    assert first == second
    assert len(set(first)) > 1  # the feed moves the answer: the comparison means something


async def test_a_restarted_scaler_answers_as_before_once_it_has_seen_the_signals():
    config = ScalerConfig(max_signal_age=30.0)
    before = await scaler_answers(config, FakeClock(T0), FEED)
    # Restarted half way: it has no history, and gets the signals from there on.
    after = await scaler_answers(config, FakeClock(T0), FEED[len(FEED) // 2 :])
    tail = len(after) // 2  # after the scale-down window of a fresh start, answers agree
    assert after[-tail:] == before[-tail:]


async def test_a_source_that_keeps_failing_is_logged_once_until_it_recovers(caplog):
    caplog.set_level(logging.DEBUG, logger="scaler.sources")
    store = SignalStore(FakeClock())
    server, publisher, port = await start_publisher()
    await server.stop(grace=0)  # nothing listens there now
    config = SignalSourceConfig(address=f"127.0.0.1:{port}", reconnect_min=0.01, reconnect_max=0.02)
    attempts = asyncio.Event()
    seen = 0

    class Count(logging.Handler):
        def emit(self, record):
            nonlocal seen
            seen += 1
            if seen >= 6:
                attempts.set()

    counter = Count(level=logging.DEBUG)
    logging.getLogger("scaler.sources").addHandler(counter)
    task = asyncio.create_task(watch_signals(config, store))
    try:
        async with asyncio.timeout(30):
            await attempts.wait()
        server, publisher, _ = await start_publisher(port)
        await publisher.queue.put(engine_signals(running=1.0, at=T0))
        await wait_for(store, lambda: store.get(("team-a", "llama", "")) is not None, within=30)
    finally:
        logging.getLogger("scaler.sources").removeHandler(counter)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=0)
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    failures = [r for r in loud if "failed" in r.getMessage() or "unreachable" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in loud]
    assert any("watching signals" in r.getMessage() for r in loud)


def test_an_undecodable_message_is_refused_with_a_warning(caplog):
    store = SignalStore(FakeClock())
    message = encode(engine(T0, 1, 1, 1.0, False))
    message.ClearField("engine")
    assert not receive(store, message)
    assert store.keys() == []


async def test_calls_beyond_the_concurrency_bound_are_refused_not_queued(clock):
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock, max_concurrent_rpcs=3)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            receive(server.store, engine_signals(queue=0.0, running=1.0, at=T0))
            # Three push streams hold the three slots (KEDA keeps one per ScaledObject);
            # each says `true` first, the target being active: the server holds it then.
            streams = [stub.StreamIsActive(ref()) for _ in range(3)]
            for stream in streams:
                assert (await stream.read()).result is True
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetMetrics(metrics_request(ref()), timeout=10)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            streams[0].cancel()
            async with asyncio.timeout(10):
                while True:  # the slot frees once the server has seen the cancel
                    try:
                        assert await desired(stub) == 1
                        break
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for stream in streams[1:]:
                stream.cancel()
    finally:
        await server.stop(grace=0)


async def test_streams_are_bounded_apart_from_the_calls_so_short_calls_keep_their_slots(clock):
    """One client holding idle streams took every call slot, and KEDA's GetMetrics was
    refused for every ScaledObject (issue 27, hostile pass 11). Streams have their own
    bounds, in all and per ScaledObject and kind, below the server's; past them a stream
    is RESOURCE_EXHAUSTED and counted, and a stream closed gives its place back."""
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock, max_concurrent_rpcs=8)
    await server.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(service, "MAX_STREAMS", 5)
            patch.setattr(service, "MAX_STREAMS_PER_OBJECT", 2)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = keda_grpc.ExternalScalerStub(channel)
                receive(server.store, engine_signals(queue=0.0, running=1.0, at=T0))

                async def refused(stream: grpc.aio.UnaryStreamCall) -> bool:
                    try:
                        await stream.read()
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        return True
                    return False

                held = [stub.StreamIsActive(ref()) for _ in range(2)]
                assert [await refused(s) for s in held] == [False, False]
                assert await refused(stub.StreamIsActive(ref()))  # a third for one object
                held.append(stub.StreamMetricSpec(ref()))  # another kind has its own
                assert not await refused(held[-1])
                held += [stub.StreamMetricSpec(ref(f"m{i}")) for i in range(2)]
                assert [await refused(s) for s in held[-2:]] == [False, False]
                assert await refused(stub.StreamMetricSpec(ref("m9")))  # six in all
                assert await desired(stub) == 1  # short calls are still served
                assert server.registry.errors["streams"] == 2
                held[0].cancel()
                async with asyncio.timeout(10):
                    while await refused(stub.StreamMetricSpec(ref("m9"))):
                        pass  # the place frees once the server has seen the cancel
                for stream in held:
                    stream.cancel()
    finally:
        await server.stop(grace=0)


class _RefusedError(Exception):
    pass


class _From:
    """A call's context as the service reads it: its peer, and abort."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _RefusedError(code, details)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        pytest.param("ipv4:10.0.0.7:4711", "ipv4:10.0.0.7", id="an IPv4 peer's port is dropped"),
        pytest.param("ipv6:[fd00::7]:4711", "ipv6:[fd00::7]", id="an IPv6 peer's port too"),
        pytest.param("unix:/run/keda.sock", "unix:/run/keda.sock", id="a socket path stays"),
        pytest.param("", "", id="no peer is one host of its own"),
    ],
)
def test_a_peer_is_its_host(peer, host):
    assert service.peer_host(peer) == host


async def test_one_host_holding_a_scaled_objects_streams_never_refuses_another_hosts():
    """Hostile pass 12: any client holding four streams with KEDA's ref of a ScaledObject
    refused KEDA's own stream for it (RESOURCE_EXHAUSTED). Places are per peer host."""
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    llama = registry.resolve("llama", "team-a", {**ref().scalerMetadata})
    streams = service.ExternalScalerService(registry)
    async with contextlib.AsyncExitStack() as held:
        for port in range(4):  # four connections from the squatter's host
            squatter = _From(f"ipv4:10.0.0.66:{4000 + port}")
            await held.enter_async_context(streams._stream("StreamIsActive", llama, squatter))
        with pytest.raises(_RefusedError, match="at most 4 a ScaledObject"):
            async with streams._stream("StreamIsActive", llama, _From("ipv4:10.0.0.66:1")):
                pass
        async with streams._stream("StreamIsActive", llama, _From("ipv4:10.0.0.7:5000")):
            assert streams.streams == 5
        assert registry.errors["streams"] == 1
    assert streams.streams == 0  # every place given back


async def test_one_host_may_hold_every_place_and_a_refused_stream_makes_no_room():
    """Hostile pass 14: a stream refused for its ScaledObject made room first, so each
    attempt from a host holding fewer ended one of KEDA's streams; and one host held at
    most half the places, fewer than a KEDA operator's two for each of 10,000
    ScaledObjects."""
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    llama = registry.resolve("llama", "team-a", {**ref().scalerMetadata})
    objects = [
        registry.resolve(f"so-{n}", "team-a", {**ref(f"d{n}").scalerMetadata}) for n in range(8)
    ]
    streams = service.ExternalScalerService(registry)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "MAX_STREAMS", 12)
        async with contextlib.AsyncExitStack() as held:
            keda = _From("ipv4:10.0.0.7:5000")
            kept = [
                await held.enter_async_context(streams._stream(kind, so, keda))
                for so in objects[:6]
                for kind in ("StreamIsActive", "StreamMetricSpec")
            ]
            assert streams.streams == 12  # every place, one host's
            for port in range(4):
                squatter = _From(f"ipv4:10.0.0.66:{port}")
                await held.enter_async_context(streams._stream("StreamIsActive", llama, squatter))
            assert sum(g.is_set() for g in kept) == 4  # four given up for a host holding fewer
            for _ in range(5):
                with pytest.raises(_RefusedError, match="at most 4 a ScaledObject"):
                    async with streams._stream("StreamIsActive", llama, _From("ipv4:10.0.0.66:9")):
                        pass
            assert sum(g.is_set() for g in kept) == 4  # the refused made no room
            assert registry.errors["streams_given_up"] == 4
            assert registry.errors["streams"] == 5


async def test_a_host_holding_the_most_streams_gives_its_oldest_up_for_one_holding_fewer():
    """Hostile pass 13: two hosts holding half the places each refused every stream from
    a third, KEDA's own. Past ``MAX_STREAMS`` the host holding the most gives its oldest
    stream up for a host holding fewer; a host holding as many as any is refused."""
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    streams = service.ExternalScalerService(registry)
    objects = [
        registry.resolve(f"so-{n}", "team-a", {**ref(f"d{n}").scalerMetadata}) for n in range(4)
    ]
    woken: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "MAX_STREAMS", 4)
        async with contextlib.AsyncExitStack() as held:
            gone = []
            for n, host in enumerate(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]):
                gone.append(
                    await held.enter_async_context(
                        streams._stream(
                            "StreamMetricSpec",
                            objects[n],
                            _From(f"ipv4:{host}:{n}"),
                            functools.partial(woken.append, f"stream {n}"),
                        )
                    )
                )
            with pytest.raises(_RefusedError):  # as many as the most already: refused
                async with streams._stream(
                    "StreamMetricSpec", objects[0], _From("ipv4:10.0.0.2:9")
                ):
                    pass
            keda = _From("ipv4:10.0.0.7:5000")
            async with streams._stream("StreamIsActive", objects[0], keda) as mine:
                assert [g.is_set() for g in gone] == [True, False, False, False]
                assert woken == ["stream 0"] and not mine.is_set()
            assert registry.errors["streams_given_up"] == 1
            assert registry.errors["streams"] == 1
        assert streams.streams == 0


def _clocked_streams(
    count: int,
) -> tuple[FakeClock, ScaledObjectRegistry, list[ScaledObject], service.ExternalScalerService]:
    """``count`` ScaledObjects and the stream service, on a clock the test moves."""
    clock = FakeClock(T0)
    registry = ScaledObjectRegistry(SignalStore(clock), 30.0, clock)
    objects = [
        registry.resolve(f"so-{n}", "team-a", {**ref(f"d{n}").scalerMetadata}) for n in range(count)
    ]
    return clock, registry, objects, service.ExternalScalerService(registry, clock)


async def test_a_host_whose_stream_given_room_ends_young_is_barred_from_making_room():
    """Hostile pass 15: opening a stream and closing it in a loop ended one of KEDA's
    streams a cycle (1,000 in 0.07 s). A stream given room that ends within
    ``ROOM_HELD_SECONDS`` bars its host from making room, 10 s doubling; one that holds
    its place that long clears the bar."""
    clock, registry, objects, streams = _clocked_streams(4)
    keda = _From("ipv4:10.0.0.7:5000")
    churner = _From("ipv4:10.0.0.66:1")

    async def cycle(hold: float = 0.0) -> bool:
        """One open-and-close from the churner: whether it was given a place."""
        try:
            async with streams._stream("StreamIsActive", objects[0], churner):
                clock.now += hold
        except _RefusedError:
            return False
        return True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "MAX_STREAMS", 4)
        async with contextlib.AsyncExitStack() as held:
            kept = [
                await held.enter_async_context(streams._stream("StreamMetricSpec", so, keda))
                for so in objects
            ]
            given = [await cycle()]  # room made: one of KEDA's given up, then closed at once
            given += [await cycle() for _ in range(5)]  # barred 10 s: refused, none given up
            clock.now += 10
            given.append(await cycle())  # the bar is over: room once more, barred 20 s now
            clock.now += 10
            given.append(await cycle())  # still barred
            clock.now += 10
            given.append(await cycle(hold=service.ROOM_HELD_SECONDS))  # held: bar cleared
            given.append(await cycle(hold=service.ROOM_HELD_SECONDS))
            assert given == [True, False, False, False, False, False, True, False, True, True]
            assert sum(g.is_set() for g in kept) == 4
            assert registry.errors["streams_given_up"] == 4
            assert registry.errors["streams_barred"] == 2


async def test_streams_given_up_for_other_hosts_are_bounded_whatever_the_hosts():
    """Hostile pass 16: the bars are per host, so 4,097 hosts taking turns, or one host
    holding each stream a minute, ended KEDA's streams without end. From all hosts
    together, ``GIVE_UP_BURST`` at once and then ``GIVE_UP_RATE`` a second."""
    clock, registry, objects, streams = _clocked_streams(150)
    keda = _From("ipv4:10.0.0.7:5000")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "MAX_STREAMS", 300)
        async with contextlib.AsyncExitStack() as held:
            for so in objects:
                for kind in ("StreamIsActive", "StreamMetricSpec"):
                    await held.enter_async_context(streams._stream(kind, so, keda))

            async def from_hosts(first: int, count: int) -> int:
                placed = 0
                for n in range(first, first + count):
                    try:
                        await held.enter_async_context(
                            streams._stream(
                                "StreamIsActive",
                                objects[0],
                                _From(f"ipv4:10.1.{n // 250}.{n % 250}:1"),
                            )
                        )
                        placed += 1
                    except _RefusedError:
                        pass
                return placed

            assert await from_hosts(0, 140) == service.GIVE_UP_BURST
            clock.now += 10
            assert await from_hosts(140, 100) == 10 * service.GIVE_UP_RATE
            assert registry.errors["streams_given_up"] == 120


@pytest.mark.parametrize("kind", ["StreamMetricSpec", "StreamIsActive"])
async def test_a_stream_that_gives_its_place_up_ends_resource_exhausted(kind):
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 30.0, clock)
    receive(store, engine_signals(queue=0.0, running=1.0, at=T0))
    streams = service.ExternalScalerService(registry)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service, "MAX_STREAMS", 2)
        squatted = [getattr(streams, kind)(ref(), _From(f"ipv4:10.0.0.66:{n}")) for n in range(2)]
        for stream in squatted:
            await anext(stream)  # the spec, or the first true of an active target
        async with streams._stream(
            kind,
            registry.resolve("x", "team-a", {**ref("d").scalerMetadata}),
            _From("ipv4:10.0.0.7:1"),
        ):
            with pytest.raises(_RefusedError, match="gave its place"):
                await anext(squatted[0])
        for stream in squatted[1:]:
            await stream.aclose()
    assert streams.streams == 0


@pytest.mark.parametrize(
    ("keys", "width", "value", "code"),
    [
        pytest.param(
            300_000, 6, "", grpc.StatusCode.RESOURCE_EXHAUSTED, id="a 3 MiB ref is refused unread"
        ),
        pytest.param(
            64,
            253,
            "é" * 4096,
            grpc.StatusCode.INVALID_ARGUMENT,
            id="a ref at the metadata's bounds in two-byte characters is read and judged",
        ),
    ],
)
async def test_a_request_larger_than_any_valid_ref_is_refused_before_it_is_read(
    clock, keys, width, value, code
):
    """gRPC's default 4 MiB let a 300,000-key ref be parsed and copied before its keys
    were counted: 0.4 s of the event loop a call (issue 27, hostile pass 11)."""
    server = ScalerServer(ScalerConfig(), "127.0.0.1:0", clock=clock)
    await server.start()
    try:
        options = [("grpc.max_send_message_length", 8 << 20)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=options) as ch:
            stub = keda_grpc.ExternalScalerStub(ch)
            big = keda.ScaledObjectRef(
                name="llama",
                namespace="team-a",
                scalerMetadata={f"{i:0>{width}}": value for i in range(keys)},
            )
            assert 2 << 20 < big.ByteSize() < 8 << 20 or keys == 64
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.IsActive(big, timeout=10)
            assert caught.value.code() == code
    finally:
        await server.stop(grace=0)
