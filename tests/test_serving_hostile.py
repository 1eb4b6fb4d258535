"""The serving side under hostile input (issue 27's second hostile pass, findings S-1..S-18).

Each test injects what one finding found, at the boundary where it enters: a client that
stops reading or trickles its body, a DNS lookup or a replica check that hangs, a replica
that lies about its usage, its wakes or its headers, a scaler whose plan is old, a
directory the recorder cannot tidy, a config with absurd numbers. Real servers on
127.0.0.1 port 0; times that matter are injected or are the gateway's own deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

import serving.gateway_replicas as gateway_replicas
import serving.gateway_signals as gateway_signals_module
from foundation.configfile import load_mapping
from foundation.errors import ConfigError
from foundation.signals import GatewaySignals
from foundation.timestamps import to_timestamp
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from serving.arrival_recorder import _Files
from serving.arrivals import (
    MAX_SEQUENCE,
    ArrivalSettings,
    file_name,
    next_sequence,
    ring_order,
    to_delete,
)
from serving.config import parse_config
from serving.gateway_settings import GatewaySettings
from serving.gateway_signals import MAX_BUCKETS, EventWindow, TrafficStats, gateway_signals
from serving.gateway_standby import NoPlan, StandbyClient
from serving.slo import ResponseMeter, SloTargets, output_token_limit
from tests.conftest import T0, eventually
from tests.test_gateway_faults import Fake, upstream_errors
from tests.test_gateway_isolation import AWAKE, StandIn, gateway_for

LABELS = ("a", "llama")


def counter(gateway, metric: str, *labels: str) -> float:
    """A counter of the gateway's metrics, by its attribute on ``GatewayMetrics``."""
    return getattr(gateway.gateway.metrics, metric).labels(*LABELS, *labels)._value.get()


async def raw_exchange(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` and ``body`` on a fresh connection; the status and body answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(10):
            head_in = await reader.readuntil(b"\r\n\r\n")
            lines = head_in.split(b"\r\n")
            length = next(
                (int(h.split(b":")[1]) for h in lines if h.lower().startswith(b"content-length")),
                0,
            )
            answer = await reader.readexactly(length)
    finally:
        writer.close()
    return int(lines[0].split()[1]), answer


def post_head(length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % length
    )


# --- S-1: a client that stops reading a stream ---------------------------------------


async def stream_forever(request: web.Request, fake: Fake) -> web.StreamResponse:
    """The replica streams tokens as fast as anyone reads."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    while True:
        await response.write(b'data: {"choices": [{"text": "' + b"x" * 65_536 + b'"}]}\n\n')


async def test_a_client_that_stops_reading_is_cut_counted_and_frees_its_replica():
    (fake,) = [await Fake(stream_forever).start()]
    try:
        async with gateway_for([fake.url], upstream_timeout=0.3) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            body = json.dumps({"model": "sim-llama", "prompt": "x", "stream": True}).encode()
            writer.write(post_head(len(body)) + body)
            await reader.readuntil(b"\r\n\r\n")  # the headers; then it reads no more
            await eventually(lambda: g.stats.in_flight == 1, "streaming")
            await eventually(lambda: g.stats.in_flight == 0, "the stalled client was cut")
            assert g.replicas[0].outstanding == 0
            assert counter(gateway, "_client_errors", "stalled") == 1
            assert upstream_errors(gateway) == {}  # the client's fault, not the replica's
            writer.close()
    finally:
        await fake.stop()


# --- S-2: request bodies that never finish ---------------------------------------------


@pytest.mark.parametrize(
    ("settings", "stalled", "status", "fragment"),
    [
        pytest.param(
            {"body_timeout": 0.2},
            1,
            408,
            "did not arrive within 0.2s",
            id="a-body-that-stops-short-is-408-after-the-body-timeout",
        ),
        pytest.param(
            {"buffer_bytes": 1000, "max_request_bytes": 1000},
            2,
            429,
            "reading too many request bodies",
            id="bodies-being-read-past-buffer-bytes-are-429-before-the-byte-past-is-kept",
        ),
    ],
)
async def test_a_body_that_never_finishes_is_bounded_in_time_and_bytes(
    settings, stalled, status, fragment
):
    async with gateway_for([], **settings) as gateway:
        held = []
        for _ in range(stalled - 1):  # these send 600 of their 700 bytes and wait
            _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            writer.write(post_head(700) + b"{" * 600)
            held.append(writer)
        await eventually(lambda: gateway.gateway.stats.reading_bytes == 600 * (stalled - 1))
        got, body = await raw_exchange(gateway.port, post_head(700), b"{" * 600)
        for writer in held:
            writer.close()
        assert got == status
        error = json.loads(body)
        assert error["code"] == status and fragment in error["message"]
        assert counter(gateway, "_rejected", str(status)) == 1
        await eventually(lambda: gateway.gateway.stats.reading_bytes == 0, "released")


# --- S-3 and S-8: a DNS lookup or one replica's check that hangs -----------------------


async def test_a_dns_lookup_that_hangs_never_holds_the_static_replicas(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="serving.gateway")

    async def hang(host_port):
        await asyncio.Event().wait()

    monkeypatch.setattr(gateway_replicas, "resolve_addresses", hang)
    monkeypatch.setattr(gateway_replicas, "DNS_TIMEOUT", 0.1)
    async with StandIn().serving() as replica, gateway_for([replica.url], dns="r.invalid:80") as gw:
        await eventually(lambda: gw.gateway.pool.find(replica.url).routable, "static ready")
        await eventually(lambda: any("cannot resolve" in r.getMessage() for r in caplog.records))


async def test_a_replica_whose_check_hangs_never_holds_the_others(monkeypatch):
    # Its probes get a minute (the real bound is 2 s): a round that waited for it would
    # keep a replica added meanwhile unchecked for that minute.
    monkeypatch.setattr(gateway_replicas, "PROBE_TIMEOUT", aiohttp.ClientTimeout(total=60))
    entered = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/health", hang)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    slow = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with StandIn().serving() as good, gateway_for([slow]) as gateway:
            await asyncio.wait_for(entered.wait(), 10)
            g = gateway.gateway
            g.reconfigure([slow, good.url], g.settings)
            await eventually(lambda: g.pool.find(good.url).routable, "the new replica", 10)
    finally:
        await runner.cleanup()


# --- S-4 and S-18: what sits in the arrivals directory -------------------------------


ROWS = [(T0 + i, 100, 10) for i in range(40)]  # 40 rows pass 1 KiB: each write rotates


def write_batches(directory: Path, batches: int, rows: int = 40) -> list[int]:
    files, settings = _Files(), ArrivalSettings(str(directory), 1024, 2)
    errors: list[int] = []
    files.on_delete_error = lambda: errors.append(1)
    for i in range(batches):
        files.write(settings, ROWS[:rows], T0 + i)
    files.reset()
    return errors


def regular(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file())


def test_a_directory_named_as_the_oldest_file_never_stops_rotation(tmp_path):
    (tmp_path / file_name(0, T0)).mkdir()
    errors = write_batches(tmp_path, 20)  # raised IsADirectoryError from the first rotation
    assert len(regular(tmp_path)) <= 2 and len(list(tmp_path.iterdir())) <= 3
    assert errors == []  # a directory is never a file to delete


def test_a_file_that_cannot_be_deleted_is_counted_and_logged_once(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="serving.arrival_recorder")
    stuck = tmp_path / file_name(0, T0)
    stuck.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    unlink = Path.unlink

    def refuse(path: Path, missing_ok: bool = False) -> None:
        if path.name == stuck.name:
            raise PermissionError(13, "Permission denied")
        unlink(path, missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    errors = write_batches(tmp_path, 10)
    assert len(errors) >= 10  # tried at each rotation, never failing a batch
    warnings = [r for r in caplog.records if "cannot delete" in r.getMessage()]
    assert len(warnings) == 1
    assert len(regular(tmp_path)) == 3  # the stuck file and the bound's two


def test_a_sequence_at_the_top_wraps_and_deletes_the_oldest_never_the_new(tmp_path):
    for sequence in (MAX_SEQUENCE - 1, MAX_SEQUENCE):
        (tmp_path / file_name(sequence, T0 - 10)).write_text("")
    write_batches(tmp_path, 1, rows=10)  # one file's worth
    names = [p.name for p in regular(tmp_path)]
    assert names == [file_name(0, T0), file_name(MAX_SEQUENCE, T0 - 10)]
    assert (tmp_path / file_name(0, T0)).read_text().count("\n") == 11  # header and rows


@pytest.mark.parametrize(
    ("sequences", "order"),
    [
        pytest.param({3, 1, 2}, [1, 2, 3], id="without-a-wrap-the-lowest-is-the-oldest"),
        pytest.param(
            {0, MAX_SEQUENCE, MAX_SEQUENCE - 1},
            [MAX_SEQUENCE - 1, MAX_SEQUENCE, 0],
            id="after-a-wrap-zero-is-the-newest",
        ),
    ],
)
def test_ring_order(sequences, order):
    assert ring_order(sequences) == order


@given(
    st.sets(st.integers(0, MAX_SEQUENCE), max_size=30),
    st.integers(1, 10),
)
def test_rotation_never_deletes_the_file_it_opened_and_keeps_the_bound(sequences, max_files):
    names = [file_name(s, T0) for s in sequences]
    new = file_name(next_sequence(names), T0 + 1)
    assert new not in names
    doomed = to_delete([*names, new], max_files, keep=new)
    assert new not in doomed
    assert len(names) + 1 - len(doomed) <= max(max_files, 1)


# --- S-5: the rate windows and the wall clock ------------------------------------------


@pytest.mark.parametrize(
    "wall_step",
    [
        pytest.param(-3600.0, id="a-wall-clock-an-hour-back-moves-no-rate"),
        pytest.param(+3600.0, id="a-wall-clock-an-hour-ahead-moves-no-rate"),
    ],
)
def test_the_rate_windows_keep_the_monotonic_clock(wall_step):
    stats, settings = TrafficStats(), GatewaySettings()
    for tick in range(6000):  # ten arrivals a second for ten minutes, monotonic seconds
        stats.arrivals.add(tick / 10, settings.rate_window)
    snapshot = gateway_signals(stats, settings, T0 + wall_step, 600.0)
    assert isinstance(snapshot.signals, GatewaySignals)
    assert snapshot.signals.arrival_rate == pytest.approx(10.0, rel=0.02)
    assert len(stats.arrivals._buckets) <= 2 * 1000


@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=200), st.floats(0.1, 3600))
def test_a_window_is_bounded_and_never_counts_more_than_it_saw(times, seconds):
    window = EventWindow()
    for now in sorted(times):
        window.add(now, seconds)
    end = max(times, default=0.0)
    exact = sum(1 for t in times if end - t <= seconds)
    assert exact - len(times) <= window.count(end, seconds) - len(times) <= 0
    assert len(window._buckets) <= MAX_BUCKETS


# --- S-6 and S-7: a replica's usage counts ---------------------------------------------


@pytest.mark.parametrize(
    ("usage", "max_tokens", "reason"),
    [
        pytest.param(10**400, None, "latency", id="a-400-digit-count-is-no-count"),
        pytest.param(10**15, None, "latency", id="a-count-past-max-tokens-is-no-count"),
        pytest.param(500, 8, "latency", id="a-count-past-what-the-request-allowed-is-no-count"),
        pytest.param(-1, None, "latency", id="a-negative-count-is-no-count"),
        pytest.param(True, None, "latency", id="a-boolean-is-no-count"),
        pytest.param(8, 8, "met", id="a-count-within-bounds-is-believed"),
    ],
)
def test_an_implausible_usage_count_never_turns_a_late_answer_into_a_met_one(
    usage, max_tokens, reason
):
    targets = SloTargets(ttft_seconds=1.0, itl_seconds=0.1)
    meter = ResponseMeter(0.0, max_tokens)
    meter.begin(200, False)
    body = json.dumps({"usage": {"completion_tokens": usage, "prompt_tokens": 3}}).encode()
    meter.feed(body, 1.2)
    verdict = meter.verdict(targets, 1.2, 200)  # 1.2 s: late for ttft alone, fine for 8
    assert verdict.reason == reason
    assert meter.usage_unmeasured == (reason != "met")


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        pytest.param({"max_tokens": 8}, 8, id="max-tokens-bounds-the-completion"),
        pytest.param({"max_tokens": 8, "n": 3}, 24, id="n-choices-share-the-usage"),
        pytest.param({"max_completion_tokens": 5}, 5, id="the-chat-name-counts-too"),
        pytest.param({"max_tokens": True}, None, id="a-boolean-is-no-bound"),
        pytest.param({"max_tokens": 10**30}, None, id="a-bound-past-max-tokens-is-no-bound"),
        pytest.param({}, None, id="no-bound-given"),
    ],
)
def test_output_token_limit(body, limit):
    assert output_token_limit(body) == limit


async def test_a_400_digit_usage_is_counted_unmeasured_and_the_request_judged(caplog):
    caplog.set_level(logging.ERROR)
    huge = b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1' + b"0" * 400 + b"}}"
    async with StandIn(**{"/v1/completions": huge}).serving() as replica:
        async with gateway_for([replica.url]) as gateway:
            await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            async with aiohttp.ClientSession() as client:
                for _ in range(2):
                    async with client.post(url, json={"model": "sim-llama"}) as r:
                        assert r.status == 200
                        await r.read()
            assert counter(gateway, "_usage_unmeasured") == 2
            judged = sum(
                counter(gateway, "_slo", result, why)
                for result, why in (("within", "met"), ("outside", "latency"))
            )
            assert judged == 2
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- S-9: a wake that does not hold ----------------------------------------------------


async def test_a_replica_that_says_awake_but_stays_asleep_is_backed_off():
    asleep = b'{"is_sleeping": true}'
    awake_but_not = b'{"status": "awake" }'  # not AWAKE: the stand-in stays asleep
    assert awake_but_not != AWAKE
    stand_in = StandIn(**{"/is_sleeping": asleep, "/wake_up": awake_but_not})
    async with stand_in.serving() as replica:
        async with gateway_for([replica.url], wake_retry_after=60.0, buffer_timeout=0.5) as gw:
            g = gw.gateway
            r = g.pool.find(replica.url)
            await eventually(lambda: r.ready and r.sleeping, "found asleep")
            url = f"http://127.0.0.1:{gw.port}/v1/completions"
            async with aiohttp.ClientSession() as client:
                async with client.post(url, json={"model": "sim-llama"}) as first:
                    # Its /is_sleeping, read right after the wake, says asleep: the wake
                    # failed, and nothing was routed to it (hostile pass 27: it was).
                    assert first.status == 503
                assert r.sleeping and counter(gw, "_wakes", "failed") == 1
                async with client.post(url, json={"model": "sim-llama"}) as second:
                    assert second.status == 503  # not woken again while it backs off
            assert replica.calls["/wake_up"] == 1


# --- S-10 and S-11: headers a replica sends ------------------------------------------


JSON_BODY = b'{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'


@contextlib.asynccontextmanager
async def raw_replica(answer: bytes) -> AsyncIterator[str]:
    """A replica written at the socket: healthy, one model, ``answer`` to completions."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0]
        if b"/health" in line:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif b"/v1/models" in line:
            models = b'{"data":[{"id":"sim-llama"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(models), models))
        elif b"/is_sleeping" in line:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        else:
            length = next(
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def raw_answer(headers: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (headers, len(body), body)
    )


@pytest.mark.parametrize(
    ("answer", "absent"),
    [
        pytest.param(
            raw_answer(b"X-Request-Note: a\x01b\r\n", JSON_BODY),
            "X-Request-Note",
            id="a-header-with-a-control-character-is-dropped-the-answer-relayed",
        ),
    ],
)
async def test_a_replica_s_headers_are_relayed_only_when_they_match_the_body(
    answer, absent, caplog
):
    caplog.set_level(logging.ERROR)
    async with raw_replica(answer) as url, gateway_for([url]) as gateway:
        await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
        gateway_url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        async with aiohttp.ClientSession() as client:
            async with client.post(gateway_url, json={"model": "sim-llama"}) as r:
                assert r.status == 200 and absent not in r.headers
                assert await r.read() == JSON_BODY
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- S-12: malformed HTTP from a client ------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", id="a-header-without-a-colon"
        ),
        pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", id="a-url-over-8-kib"),
        pytest.param(
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nabc",
            id="content-length-and-chunked-together",
        ),
    ],
)
async def test_malformed_http_is_a_counted_400_without_an_error_log(head, caplog):
    caplog.set_level(logging.DEBUG)
    async with gateway_for([]) as gateway:
        status, _ = await raw_exchange(gateway.port, head)
        assert status == 400
        assert counter(gateway, "_client_errors", "malformed-http") == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- S-13 and S-14: the config file ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("buffer-size: " + "9" * 5000, id="an-integer-of-5000-digits"),
        pytest.param("health-interval: 2025-02-30", id="a-date-that-does-not-exist"),
        pytest.param("health-interval: 0000-01-01", id="a-year-zero"),
    ],
)
def test_a_yaml_scalar_pyyaml_cannot_build_is_a_config_error_naming_the_file(text):
    with pytest.raises(ConfigError, match=r"^gateway\.yaml: not a usable config: ") as caught:
        load_mapping(text, "gateway.yaml")
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param("health-interval: 1ns", "health-interval", id="a-1ns-health-interval"),
        pytest.param("standby-interval: 1ns", "standby-interval", id="a-1ns-standby-interval"),
        pytest.param("rate-window: 1ns", "rate-window", id="a-1ns-rate-window"),
        pytest.param("wake-retry-after: 1ns", "wake-retry-after", id="a-1ns-wake-retry"),
        pytest.param("body-timeout: 1ns", "body-timeout", id="a-1ns-body-timeout"),
        pytest.param("slo: {window: 1ns}", "slo.window", id="a-1ns-slo-window"),
        pytest.param("buffer-size: 0x" + "f" * 5000, "buffer-size", id="a-20000-bit-buffer"),
        pytest.param("buffer-bytes: 0x" + "f" * 5000, "buffer-bytes", id="a-20000-bit-byte-cap"),
    ],
)
def test_absurd_intervals_and_sizes_are_config_errors_naming_the_key(text, key):
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        parse_config(text, "gateway.yaml")


# --- S-15 and S-16: the scaler's standby plan ------------------------------------------


class Capacity(capacity_pb2_grpc.CapacityServiceServicer):
    """A scaler stand-in: answers every GetStandbyPlan with ``plan``."""

    def __init__(self) -> None:
        self.plan = capacity_pb2.StandbyPlan(namespace="a", name="llama")

    async def GetStandbyPlan(self, request, context):
        return capacity_pb2.GetStandbyPlanResponse(plans=[self.plan])


@contextlib.asynccontextmanager
async def capacity() -> AsyncIterator[tuple[Capacity, str]]:
    servicer = Capacity()
    server = grpc.aio.server()
    capacity_pb2_grpc.add_CapacityServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    ("decided", "kind"),
    [
        pytest.param(T0 - 86_400, "stale", id="a-day-old-plan-is-no-plan"),
        pytest.param(T0 + 3_600, "future", id="a-plan-from-an-hour-ahead-is-no-plan"),
        pytest.param(None, "undated", id="a-plan-without-a-time-is-no-plan"),
        pytest.param(T0 - 10, None, id="a-plan-decided-ten-seconds-ago-is-held"),
    ],
)
async def test_the_standby_plan_s_decided_time_is_bounded(decided, kind):
    async with capacity() as (servicer, address):
        servicer.plan.running, servicer.plan.sleeping = 0, 1
        if decided is not None:
            servicer.plan.decided_time.CopyFrom(to_timestamp(decided))
        client = StandbyClient(clock=lambda: T0)
        try:
            plan = await client.plan(address, "a", "llama", 5)
        finally:
            await client.close()
    assert getattr(plan, "kind", None) == kind


async def test_a_stale_plan_is_counted_and_its_warning_logged_once_per_kind(caplog):
    caplog.set_level(logging.DEBUG, logger="serving.gateway")
    ages = iter(range(1000, 1010))

    class Ageing:
        async def plan(self, address, namespace, deployment, rpc_seconds):
            return NoPlan("stale", f"decided {next(ages)}s ago")

    async with gateway_for([]) as gateway:
        for _ in range(5):
            await gateway.gateway._standby_round(Ageing(), "unused")
        assert counter(gateway, "_plans_ignored", "stale") == 5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.getMessage() for w in warnings] == ["standby: sleeping none (decided 1000s ago)"]


async def test_a_megabyte_reason_from_the_scaler_is_clipped_before_any_log(caplog):
    caplog.set_level(logging.DEBUG, logger="serving.gateway")
    async with capacity() as (servicer, address):
        servicer.plan.reason = "x" * 1_000_000  # no counts: no decision, with its reason
        async with gateway_for([], standby_scaler=address) as gateway:
            await gateway.gateway._standby_round(StandbyClient(), address)
            assert len(gateway.gateway.standby_problem or "") < 500
    assert max(len(r.getMessage()) for r in caplog.records) < 600


# --- S-17: signal watchers -------------------------------------------------------------


async def test_signal_watchers_past_the_cap_are_refused_and_counted(monkeypatch):
    monkeypatch.setattr(gateway_signals_module, "MAX_WATCHERS", 2)
    async with gateway_for([]) as gateway:
        address = f"127.0.0.1:{gateway.grpc_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = sig_grpc.SignalsServiceStub(channel)
            watches = []
            for _ in range(3):
                watches.append(stub.WatchSignals(sig.WatchSignalsRequest()))
                if len(watches) < 3:
                    await watches[-1].read()  # its first snapshot: subscribed
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await watches[2].read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert counter(gateway, "_watchers_refused") == 1
            for watch in watches:
                watch.cancel()
