"""The gateway judges every request against the SLO and tells the scaler how many met it.

The judging is a pure function (``serving.slo.judge``) and a pure body reader
(``ResponseMeter``), each with its table; then real servers on 127.0.0.1: the gateway in
front of the simulated replica (fast: within) and of small aiohttp replicas that answer
late or fail (outside), with the counts read from its ``/metrics`` and its signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import grpc
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from foundation.errors import ConfigError
from foundation.net import free_port
from protos.unitscale.v1 import signals_pb2 as sig
from protos.unitscale.v1 import signals_pb2_grpc as sig_grpc
from scaler.core.model import Policy
from serving.config import GatewayConfig, parse_config
from serving.gateway_metrics import SLO_SERIES
from serving.gateway_signals import MIN_RATE_SECONDS
from serving.slo import (
    CLIENT_CLOSED,
    LEFT,
    REASONS,
    ResponseMeter,
    SloTargets,
    judge,
    latency_budget,
)
from tests.conftest import eventually
from tests.test_gateway import completion, start_gateway, start_sim, wait_ready
from tests.test_gateway_faults import Fake, fakes, stream_on_demand

TARGETS = SloTargets(ttft_seconds=2.0, itl_seconds=0.1)


S, J = True, False
"""A stream (server-sent events), and a non-streamed (JSON) response."""


@pytest.mark.parametrize(
    ("streamed", "arrival", "first_token", "end", "tokens", "status", "within", "reason"),
    [
        pytest.param(
            S, 0, 0.5, 5.5, 51, 200, True, "met", id="a-stream-on-time-with-steady-tokens"
        ),
        pytest.param(S, 0, 2.5, 3.0, 6, 200, False, "ttft", id="a-first-token-past-the-target"),
        pytest.param(S, 0, 2.0, 2.0, 1, 200, True, "met", id="a-first-token-exactly-at-the-target"),
        pytest.param(
            S, 10, 10.4, 20.9, 101, 200, False, "itl", id="a-mean-itl-of-105ms-misses-100ms"
        ),
        pytest.param(S, 10, 10.4, 20.4, 101, 200, True, "met", id="a-mean-itl-of-exactly-100ms"),
        pytest.param(
            S, 0, 2.5, 30.0, 101, 200, False, "ttft", id="late-and-slow-is-reported-as-late"
        ),
        pytest.param(S, 0, 0.5, 60.0, 1, 200, True, "met", id="one-token-is-judged-on-ttft-alone"),
        pytest.param(
            S, 0, 0.5, 60.0, None, 200, True, "met", id="an-unknown-count-is-judged-on-ttft-alone"
        ),
        pytest.param(
            J, 10, 20.9, 20.9, 101, 200, True, "met",
            id="a-long-non-streamed-answer-within-its-budget-is-within-though-its-first-byte-is-late",
        ),
        pytest.param(
            J, 0, 3.0, 3.0, 11, 200, True, "met",
            id="a-non-streamed-answer-exactly-at-its-budget-of-ttft-plus-itl-per-further-token",
        ),
        pytest.param(
            J, 10, 22.5, 22.5, 101, 200, False, "latency",
            id="a-non-streamed-answer-past-its-budget-is-outside-on-latency",
        ),
        pytest.param(
            J, 0, 1.0, 2.5, 2, 200, False, "latency",
            id="a-non-streamed-answer-is-judged-to-its-end-not-its-first-byte",
        ),
        pytest.param(
            J, 0, 2.5, 2.5, None, 200, False, "latency",
            id="a-non-streamed-answer-of-unknown-count-is-judged-against-ttft",
        ),
        pytest.param(
            J, 0, 1.9, 1.9, 1, 200, True, "met",
            id="a-non-streamed-answer-of-one-token-is-judged-against-ttft",
        ),
        pytest.param(
            J, 0, 2.5, 2.5, 0, 200, False, "latency",
            id="a-non-streamed-answer-without-tokens-is-judged-against-ttft",
        ),
        pytest.param(S, 0, 0.1, 0.2, 8, 500, False, "failed", id="an-upstream-500-however-fast"),
        pytest.param(
            J, 0, 0.1, 0.2, None, 500, False, "failed", id="a-non-streamed-500-however-fast"
        ),
        pytest.param(S, 0, None, 0.5, None, 502, False, "failed", id="a-502-before-the-headers"),
        pytest.param(S, 0, None, 120, None, 503, False, "failed", id="a-503-after-the-buffer-wait"),
        pytest.param(S, 0, None, 0.01, None, 429, False, "failed", id="a-429-from-a-full-buffer"),
        pytest.param(S, 0, 0.2, 1.0, 5, None, False, "failed", id="a-response-cut-mid-stream"),
        pytest.param(
            J, 0, 0.3, 0.3, None, 400, True, "met",
            id="a-prompt-refused-at-once-is-judged-on-timing",
        ),
        pytest.param(
            S, 0, None, 2.5, 0, 200, False, "ttft",
            id="a-stream-without-tokens-is-judged-on-its-end",
        ),
        pytest.param(
            S, 0, None, 3.0, None, 499, False, "ttft",
            id="a-client-leaving-unanswered-after-the-target-missed-it",
        ),
        pytest.param(
            S, 0, None, 0.5, None, 499, False, "left",
            id="a-client-leaving-unanswered-before-the-target-is-not-judged",
        ),
        pytest.param(
            J, 0, None, 1.9, None, 499, False, "left",
            id="a-client-leaving-before-a-json-answer-began-within-the-target-is-not-judged",
        ),
        pytest.param(
            J, 0, None, 2.1, None, 499, False, "latency",
            id="a-client-leaving-before-a-json-answer-began-past-the-target-missed-it",
        ),
        pytest.param(
            S, 0, 0.5, 0.6, 2, 499, True, "met", id="a-client-stopping-a-stream-on-time-is-no-miss"
        ),
    ],
)  # fmt: skip
def test_judge(streamed, arrival, first_token, end, tokens, status, within, reason):
    verdict = judge(TARGETS, arrival, first_token, end, tokens, status, streamed)
    assert (verdict.within, verdict.reason) == (within, reason)
    assert verdict.reason in (*REASONS, LEFT)
    assert verdict.judged == (reason != LEFT)


@pytest.mark.parametrize(
    ("tokens", "budget"),
    [
        pytest.param(None, 2.0, id="an-unknown-count-has-the-ttft"),
        pytest.param(0, 2.0, id="no-token-has-the-ttft"),
        pytest.param(1, 2.0, id="one-token-has-the-ttft"),
        pytest.param(2, 2.1, id="a-second-token-adds-one-itl"),
        pytest.param(200, 2 + 199 * 0.1, id="200-tokens-have-the-end-of-a-stream-that-met-both"),
    ],
)
def test_latency_budget(tokens, budget):
    assert latency_budget(TARGETS, tokens) == pytest.approx(budget)


def sse(*events: object) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


TEXT = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
CONTENT = {"choices": [{"index": 0, "delta": {"content": "a"}}]}
FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 12}}
WHOLE = {"choices": [{"text": "abc"}], "usage": {"completion_tokens": 3}}
LONG = {"choices": [{"text": "a" * 200}], "usage": {"completion_tokens": 200}}


@pytest.mark.parametrize(
    ("streamed", "chunks", "first_token", "tokens"),
    [
        pytest.param(
            True, [(sse(TEXT), 1.0), (sse(TEXT, TEXT), 2.0), (sse(b"[DONE]"), 3.0)], 1.0, 3,
            id="a-completions-stream-counts-its-token-events",
        ),
        pytest.param(
            True, [(sse(ROLE), 1.0), (sse(CONTENT), 2.0), (sse(FINISH, b"[DONE]"), 3.0)], 2.0, 1,
            id="a-chat-stream-s-role-and-finish-events-carry-no-token",
        ),
        pytest.param(
            True, [(sse(TEXT), 1.0), (sse(TEXT, USAGE, b"[DONE]"), 2.0)], 1.0, 12,
            id="a-stream-s-usage-counts-over-its-events",
        ),
        pytest.param(
            True, [(b'data: {"choices": [{"te', 1.0), (b'xt": "a"}]}\n\n', 2.0)], 2.0, 1,
            id="an-event-split-across-chunks-counts-when-whole",
        ),
        pytest.param(
            True, [(b": keep-alive\n\n", 1.0), (sse(b"not json", TEXT), 2.0)], 2.0, 1,
            id="comments-and-lines-that-are-not-json-are-skipped",
        ),
        pytest.param(
            True, [(sse(FINISH, b"[DONE]"), 1.0)], None, 0,
            id="a-stream-with-no-token-has-no-first-token",
        ),
        pytest.param(
            True, [(sse(TEXT).replace(b"\n", b"\r"), 1.0), (sse(TEXT).replace(b"\n", b"\r"), 2.0)],
            1.0, 2, id="cr-line-ends-count-as-the-sse-spec-allows-them",
        ),
        pytest.param(
            True, [(b'data: {"choices": [{"text": "a"}]}\r', 1.0), (b"\n\r\n", 2.0),
                   (sse(TEXT).replace(b"\n", b"\r\n"), 3.0)],
            1.0, 2, id="a-crlf-split-between-chunks-counts-its-event-once",
        ),
        pytest.param(
            False, [(json.dumps(WHOLE).encode()[:10], 4.0), (json.dumps(WHOLE).encode()[10:], 5.0)],
            4.0, 3, id="a-json-answer-s-first-byte-and-usage",
        ),
        pytest.param(
            False, [(b"Internal Server Error", 1.0)], 1.0, None,
            id="a-body-that-is-not-json-has-no-count",
        ),
    ],
)  # fmt: skip
def test_response_meter(streamed, chunks, first_token, tokens):
    meter = ResponseMeter(0.0)
    meter.begin(200, streamed)
    for chunk, at in chunks:
        meter.feed(chunk, at)
    assert (meter.first_token, meter.output_tokens()) == (first_token, tokens)


@pytest.mark.parametrize(
    ("status", "within", "reason"),
    [
        pytest.param(200, False, "itl", id="a-stream-ended-long-after-its-last-token-is-slow"),
        pytest.param(
            CLIENT_CLOSED, True, "met",
            id="a-client-leaving-long-after-the-last-token-is-judged-to-that-token",
        ),
    ],
)  # fmt: skip
def test_a_stream_the_client_left_is_judged_on_its_tokens_so_far(status, within, reason):
    meter = ResponseMeter(0.0)
    meter.begin(200, True)
    meter.feed(sse(TEXT), 0.5)
    meter.feed(sse(TEXT), 0.55)
    verdict = meter.verdict(TARGETS, 30.0, status)
    assert (verdict.within, verdict.reason) == (within, reason)


@pytest.mark.parametrize(
    ("chunks", "end", "status", "within", "reason"),
    [
        pytest.param(
            [(json.dumps(WHOLE).encode(), 2.5)], 2.5, 200, False, "latency",
            id="a-json-answer-of-3-tokens-past-2-2s-misses-its-budget",
        ),
        pytest.param(
            [(json.dumps(LONG).encode(), 20.0)], 20.0, 200, True, "met",
            id="a-json-answer-of-200-tokens-at-20s-is-within-its-budget",
        ),
        pytest.param(
            [], 3.0, CLIENT_CLOSED, False, "latency",
            id="a-client-leaving-a-json-answer-unfinished-past-the-ttft-missed-it",
        ),
    ],
)  # fmt: skip
def test_a_non_streamed_response_is_judged_on_its_whole_latency(
    chunks, end, status, within, reason
):
    meter = ResponseMeter(0.0)
    meter.begin(200, False)
    for chunk, at in chunks:
        meter.feed(chunk, at)
    verdict = meter.verdict(TARGETS, end, status)
    assert (verdict.within, verdict.reason) == (within, reason)
    assert (verdict.ttft_seconds, verdict.itl_seconds) == (end, None)


ROLE_ONLY = b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'


@pytest.mark.parametrize(
    ("chunk", "left_at", "within", "reason"),
    [
        pytest.param(b": keep-alive\n\n", 30.0, False, "ttft",
                     id="a keep-alive comment then no token is a miss to a client that gave up"),
        pytest.param(ROLE_ONLY, 30.0, False, "ttft",
                     id="the role chunk then no token is a miss to a client that gave up"),
        pytest.param(b": keep-alive\n\n", 1.0, False, "left",
                     id="a comment then a client leaving within the target is not judged"),
    ],
)  # fmt: skip
def test_a_byte_that_is_no_token_is_no_first_token_to_a_client_that_left(
    chunk, left_at, within, reason
):
    """A wedged engine sending keep-alives (or its role chunk) before any token: the
    first byte stood for the first token, and a client that gave up after 30 s counted
    within the SLO (hostile pass 44)."""
    meter = ResponseMeter(0.0)
    meter.begin(200, True)
    meter.feed(chunk, 0.01)
    verdict = meter.verdict(TARGETS, left_at, CLIENT_CLOSED)
    assert (verdict.within, verdict.reason) == (within, reason)


def test_a_request_whose_response_never_began_is_judged_on_its_wait_for_a_first_token():
    verdict = ResponseMeter(0.0).verdict(TARGETS, 3.0, CLIENT_CLOSED)
    assert (verdict.within, verdict.reason, verdict.ttft_seconds) == (False, "ttft", 3.0)


def test_the_gateway_s_slo_defaults_are_the_scaler_s():
    policy, targets = Policy(), SloTargets()
    assert targets.ttft_seconds == policy.slo_ttft_seconds
    assert targets.itl_seconds == policy.slo_itl_seconds
    assert targets.attainment == policy.slo_attainment
    assert GatewayConfig().settings().slo == targets


def test_an_slo_block_sets_the_targets():
    config = parse_config("slo: {ttft: 500ms, itl: 50ms, attainment: 0.95}", "gateway.yaml")
    assert config.settings().slo == SloTargets(0.5, 0.05, 0.95)
    partial = parse_config("slo: {ttft: 1s}", "gateway.yaml")
    assert partial.settings().slo == SloTargets(1.0, 0.1, 0.99)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param("slo: {ttft: 0s}", ["key 'slo.ttft'", "equal to 0.001"], id="a-zero-ttft"),
        pytest.param("slo: {itl: -1}", ["key 'slo.itl'", "non-negative"], id="a-negative-itl"),
        pytest.param("slo: {ttft: 2h}", ["key 'slo.ttft'", "3600"], id="a-ttft-over-an-hour"),
        pytest.param(
            "slo: {attainment: 1.5}", ["key 'slo.attainment'", "less than or equal to 1"],
            id="an-attainment-above-1",
        ),
        pytest.param(
            "slo: {attainment: 0}", ["key 'slo.attainment'", "greater than 0"],
            id="an-attainment-of-0",
        ),
        pytest.param(
            "slo: {attainment: .nan}", ["key 'slo.attainment'", "finite"], id="a-nan-attainment"
        ),
        pytest.param(
            "slo: {window: 0s}",
            ["key 'slo.window'", "greater than or equal to 0.1"],
            id="a-zero-window",
        ),
        pytest.param("slo: {window: 2h}", ["key 'slo.window'", "3600"], id="a-window-over-an-hour"),
        pytest.param("slo: {p95: 1s}", ["unknown key 'slo.p95'"], id="an-unknown-slo-key"),
        pytest.param("slo: 2s", ["key 'slo'"], id="an-slo-that-is-not-a-block"),
    ],
)  # fmt: skip
def test_bad_slo_blocks_are_refused_naming_the_key(text, fragments):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "gateway.yaml")
    for fragment in fragments:
        assert fragment in str(caught.value)


# --- real servers ----------------------------------------------------------------------


def slo_counts(gateway) -> dict[tuple[str, str], float]:
    """``unitscale_gateway_slo_requests_total`` by (result, reason), from /metrics."""
    text = gateway.gateway.metrics.render().decode()
    return {
        (s.labels["result"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "unitscale_gateway_slo_requests"
        for s in family.samples
        if s.name.endswith("_total")
    }


def counted(gateway, **expected: float):
    """Whether the counts are ``expected`` (reason=count) and every other series 0."""
    counts = slo_counts(gateway)
    assert set(counts) == set(SLO_SERIES)
    return counts == {key: expected.get(key[1], 0.0) for key in SLO_SERIES}


async def post(gateway, body) -> int:
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=body) as r,
    ):
        await r.read()
        return r.status


async def test_requests_a_fast_replica_answers_are_within_and_the_signals_carry_the_rates():
    sim = await start_sim()
    gateway = await start_gateway([sim.url])
    try:
        await wait_ready(gateway, 1)
        assert await post(gateway, completion(max_tokens=16)) == 200
        streamed = completion(stream=True, max_tokens=16, stream_options={"include_usage": True})
        assert await post(gateway, streamed) == 200
        assert await post(gateway, completion(stream=True, max_tokens=4)) == 200
        await eventually(lambda: counted(gateway, met=3), "three requests counted within")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
            answer = await sig_grpc.SignalsServiceStub(channel).GetSignals(sig.GetSignalsRequest())
        published = answer.signals[0].gateway
        assert published.HasField("slo_outside_rate")  # a known 0, not unknown
        assert (published.slo_within_rate, published.slo_outside_rate) == (3 / 60, 0.0)
        # The SLO rates are over the slo block's window (60 s), arrivals over rate-window,
        # or the part of it the gateway has seen (at least a second): it is just started.
        assert 3 / 10 <= published.arrival_rate <= 3 / MIN_RATE_SECONDS
        target = "unitscale_gateway_slo_attainment_target_ratio"
        assert f'{target}{{deployment="llama",namespace="team-a"}} 0.99' in (
            gateway.gateway.metrics.render().decode()
        )
    finally:
        await gateway.stop()
        await sim.stop()


async def test_a_first_token_after_the_ttft_target_is_outside():
    (fake,) = await fakes(stream_on_demand)
    gateway = await start_gateway([fake.url], slo=SloTargets(ttft_seconds=0.2))
    try:
        await wait_ready(gateway, 1)
        async with (
            aiohttp.ClientSession() as client,
            client.post(
                f"http://127.0.0.1:{gateway.port}/v1/completions", json=completion(stream=True)
            ) as r,
        ):
            await eventually(lambda: fake.received == 1, "the replica has the request")
            held = time.monotonic()  # after the gateway's arrival: its TTFT is longer still
            await eventually(lambda: time.monotonic() - held > 0.3, "past the TTFT target")
            fake.chunks.put_nowait(sse(TEXT, TEXT, b"[DONE]"))
            fake.chunks.put_nowait(None)
            assert r.status == 200
            await r.read()
        await eventually(lambda: counted(gateway, ttft=1), "the late request counted outside")
        signals = gateway.gateway.feed.snapshot(time.time()).signals
        assert (signals.slo_within_rate, signals.slo_outside_rate) == (0.0, 1 / 60)
    finally:
        await gateway.stop()
        await fake.stop()


def unjudged(gateway) -> float:
    """``unitscale_gateway_slo_unjudged_requests_total``, from /metrics."""
    text = gateway.gateway.metrics.render().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "unitscale_gateway_slo_unjudged_requests"
        for s in family.samples
        if s.name.endswith("_total")
    )


async def test_a_client_that_leaves_before_its_first_token_within_the_target_is_not_judged():
    (fake,) = await fakes(stream_on_demand)
    gateway = await start_gateway([fake.url], slo=SloTargets(ttft_seconds=30.0))
    try:
        await wait_ready(gateway, 1)
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            asking = asyncio.ensure_future(client.post(url, json=completion(stream=True)))
            await eventually(lambda: fake.received == 1, "the replica has the request")
            asking.cancel()  # the client leaves before a token, well within 30 s
            with contextlib.suppress(asyncio.CancelledError):
                await asking
        await eventually(lambda: unjudged(gateway) == 1, "the request counted as not judged")
        assert counted(gateway)  # neither within nor outside
        signals = gateway.gateway.feed.snapshot(time.time()).signals
        assert (signals.slo_within_rate, signals.slo_outside_rate) == (0.0, 0.0)
    finally:
        fake.chunks.put_nowait(None)
        await gateway.stop()
        await fake.stop()


async def answer_json_late(request: web.Request, fake: Fake) -> web.StreamResponse:
    """A non-streamed answer of ``max_tokens`` tokens, 0.3 s after the request."""
    tokens = (await request.json())["max_tokens"]
    await asyncio.sleep(0.3)
    choice = {"index": 0, "text": "a" * tokens, "finish_reason": "length"}
    return web.json_response({"choices": [choice], "usage": {"completion_tokens": tokens}})


async def test_a_non_streamed_answer_is_judged_on_its_whole_latency_against_its_budget():
    """Both answers' first byte comes 0.3 s after arrival, past a TTFT target of 0.2 s.

    100 tokens have a budget of 0.2 + 99 * 0.1 = 10.1 s: within. One token has 0.2 s:
    outside, on its latency.
    """
    (fake,) = await fakes(answer_json_late)
    gateway = await start_gateway([fake.url], slo=SloTargets(ttft_seconds=0.2))
    try:
        await wait_ready(gateway, 1)
        assert await post(gateway, completion(max_tokens=100)) == 200
        assert await post(gateway, completion(max_tokens=1)) == 200
        await eventually(lambda: counted(gateway, met=1, latency=1), "one within, one late")
    finally:
        await gateway.stop()
        await fake.stop()


async def answer_500(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"object": "error", "message": "boom", "code": 500}, status=500)


async def test_an_upstream_500_is_outside_however_fast():
    (fake,) = await fakes(answer_500)
    gateway = await start_gateway([fake.url])
    try:
        await wait_ready(gateway, 1)
        assert await post(gateway, completion()) == 500
        await eventually(lambda: counted(gateway, failed=1), "the 500 counted outside")
        signals = gateway.gateway.feed.snapshot(time.time()).signals
        assert (signals.slo_within_rate, signals.slo_outside_rate) == (0.0, 1 / 60)
    finally:
        await gateway.stop()
        await fake.stop()


async def test_a_request_dropped_from_a_full_buffer_is_outside():
    gateway = await start_gateway([f"http://127.0.0.1:{free_port()}"], buffer_size=0)
    try:
        assert await post(gateway, completion()) == 429
        await eventually(lambda: counted(gateway, failed=1), "the drop counted outside")
    finally:
        await gateway.stop()


@pytest.mark.parametrize(
    ("streamed", "end", "tokens", "choices", "within", "reason"),
    [
        pytest.param(True, 10.4, 808, 8, True, "met", id="8 choices of 101 tokens at 100 ms"),
        pytest.param(
            True, 11.4, 808, 8, False, "itl", id="8 choices of 101 tokens at 110 ms are slow"
        ),
        pytest.param(False, 12.0, 808, 8, True, "met", id="8 whole answers at their budget"),
        pytest.param(False, 12.5, 808, 8, False, "latency", id="8 whole answers past their budget"),
        pytest.param(True, 0.4, 8, 8, True, "met", id="one token a choice is judged on ttft"),
    ],
)
def test_tokens_generated_side_by_side_are_judged_per_choice(
    streamed, end, tokens, choices, within, reason
):
    """A stream of 8 choices each 10 ms a token was judged at its 8 choices' tokens
    together: within a 4 ms target (hostile pass 65). Targets 2 s and 100 ms, first at 0.4 s."""
    first = 0.4 if streamed else end
    verdict = judge(TARGETS, 0.0, first, end, tokens, 200, streamed, choices)
    assert (verdict.within, verdict.reason) == (within, reason)


def test_a_batch_of_uneven_choices_is_paced_by_its_longest() -> None:
    """One choice of 101 tokens 100 ms apart beside seven of one token: shared evenly,
    13.5 tokens a choice over 10 s read 800 ms, outside (hostile pass 66)."""
    meter = ResponseMeter(0.0, max_tokens=200, choices=8)
    meter.bound_by(8192)
    meter.begin(200, True)
    for index in range(1, 8):
        meter.feed(b'data: {"choices": [{"index": %d, "text": "t"}]}\n\n' % index, 0.4)
    for i in range(101):
        meter.feed(b'data: {"choices": [{"index": 0, "text": "t"}]}\n\n', 0.4 + 0.1 * i)
    verdict = meter.verdict(TARGETS, 10.4, 200)
    assert verdict.reason == "met" and verdict.itl_seconds == pytest.approx(0.1)


def test_events_of_several_tokens_pace_a_batch_by_its_usage() -> None:
    """vLLM's stream interval sends 4 tokens an event: n=2 read 200 ms where each choice
    ran at 49 ms (hostile pass 67). The usage shared is the floor of the longest."""
    meter = ResponseMeter(0.0, max_tokens=400, choices=2)
    meter.bound_by(8192)
    meter.begin(200, True)
    for i in range(50):  # 50 events a choice, 4 tokens each, 200 ms apart
        for index in (0, 1):
            meter.feed(
                b'data: {"choices": [{"index": %d, "text": "tttt"}]}\n\n' % index, 0.4 + 0.2 * i
            )
    meter.feed(b'data: {"choices": [], "usage": {"completion_tokens": 400}}\n\n', 10.2)
    verdict = meter.verdict(TARGETS, 10.2, 200)  # 200 tokens a choice over 9.8 s: 49 ms
    assert verdict.reason == "met" and verdict.itl_seconds == pytest.approx(9.8 / 199)
