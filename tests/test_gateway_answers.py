"""Answers that are no answers (issue 27, hostile pass 62).

A replica that answers at once without answering (a 200 that is not a completion, a
refusal, a stream of lines without tokens) won most of the traffic from least-outstanding
routing, each answer judged within the SLO; one slipping a success between its failures
was never ejected; a stray replica listing another model made every request for the
configured one a 404 never counted. Real servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from serving import gateway as gateway_module
from serving.gateway import EJECT_AFTER, Gateway, overrun
from serving.gateway_replicas import EJECT_WINDOW
from serving.gateway_settings import GatewaySettings
from serving.routing import ReplicaView, is_unserved
from serving.slo import (
    JSON_BODY_LIMIT,
    PARSED_BYTES,
    PARSED_BYTES_PER_EVENT,
    TOKEN_LESS_LINES,
    ResponseMeter,
    SloTargets,
    choices,
)
from tests.conftest import eventually
from tests.test_gateway_faults import Behaviour, Fake, upstream_errors
from tests.test_gateway_isolation import StandIn, gateway_for

COMPLETION = {"model": "sim-llama", "prompt": "x"}
LABELS = ("a", "llama")


def slo(gateway: Any, result: str, why: str) -> float:
    return gateway.gateway.metrics._slo.labels(*LABELS, result, why)._value.get()


async def post(gateway: Any, body: dict[str, Any]) -> int | str:
    url = f"http://127.0.0.1:{gateway.port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
            await r.read()
            return r.status
    except aiohttp.ClientError as err:
        return type(err).__name__


@contextlib.asynccontextmanager
async def fakes(*behaviours: Behaviour) -> AsyncIterator[list[Fake]]:
    started = [await Fake(b).start() for b in behaviours]
    try:
        yield started
    finally:
        for fake in started:
            await fake.stop()


async def answers(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"choices": [{"text": "ok"}]})


async def garbage(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.Response(text="<html>hello</html>", content_type="text/html")


async def padded_object(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"id": "x" * 70_000})


async def error_object(request: web.Request, fake: Fake) -> web.StreamResponse:
    return web.json_response({"object": "error", "message": "nope"})


async def streams_nothing(request: web.Request, fake: Fake) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: [DONE]\n\n")
    return response


async def floods(request: web.Request, fake: Fake) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        for _ in range(4 * TOKEN_LESS_LINES // 1000):
            await response.write(b"data: {}\n" * 1000)
        await response.write(b"data: [DONE]\n\n")
    return response


async def overruns(request: web.Request, fake: Fake) -> web.StreamResponse:
    """Far more token events than the request's one token, at once."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(b'data: {"choices": [{"text": "t"}]}\n\n' * 100)
        await response.write(b"data: [DONE]\n\n")
    return response


PADDING = b":" + b"p" * 300_000 + b"\n"
"""A comment line of 300 KB: four of them take a stream past its parse budget."""


async def padded_then_overruns(request: web.Request, fake: Fake) -> web.StreamResponse:
    """Its first lines past the parse budget, then far more events than one token's."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(PADDING * 4)
        await response.write(b'data: {"choices": [{"text": "t"}]}\n\n' * 100)
        await response.write(b"data: [DONE]\n\n")
    return response


async def padded_then_trickles(request: web.Request, fake: Fake) -> web.StreamResponse:
    """Its first lines past the parse budget, one token, then a byte of comment at a
    time, each within the gateway's gap, never another event."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(PADDING * 4 + b'data: {"choices": [{"text": "t"}]}\n\n')
        for _ in range(600):
            await asyncio.sleep(0.1)
            await response.write(b":")
    return response


def streams_error(code: object) -> Behaviour:
    """vLLM's error event in a 200 stream: what it answers a request it checks late."""

    async def answer(request: web.Request, fake: Fake) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        error = {"message": "logprobs: at most 20", "type": "BadRequestError", "code": code}
        await response.write(
            b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"error": error}).encode()
        )
        return response

    return answer


def status(code: int) -> Behaviour:
    async def answer(request: web.Request, fake: Fake) -> web.StreamResponse:
        return web.json_response({"object": "error", "message": "refused"}, status=code)

    return answer


@pytest.mark.usefixtures("no_failure_weight")
@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        pytest.param(garbage, "empty", id="a 200 that is not JSON is a failure and ejects"),
        pytest.param(error_object, "empty", id="a 200 JSON object holding no choice is a failure"),
        pytest.param(
            padded_object, "empty", id="a 200 padded past its head holding no choice is one"
        ),
        pytest.param(
            streams_nothing, "empty", id="a stream holding no event but DONE is a failure"
        ),
        pytest.param(status(404), "refused", id="a 404 for a model it lists is a refusal"),
        pytest.param(status(429), "refused", id="a 429 is a refusal, and ejects"),
        pytest.param(floods, "token-less", id="a stream of lines without tokens is cut"),
        pytest.param(overruns, "overrun", id="a stream far past its bound at once ejects"),
        pytest.param(
            padded_then_overruns,
            "overrun",
            id="a stream past its bound behind padding past the parse budget ejects",
        ),
        pytest.param(status(300), "redirect", id="a 300 is no completion, the replica's 502"),
        pytest.param(
            streams_error(500), "stream-error", id="a stream's error event of a 5xx ejects"
        ),
        pytest.param(
            streams_error(None), "stream-error", id="a stream's error event of no code ejects"
        ),
    ],
)
async def test_a_replica_answering_at_once_without_an_answer_is_ejected_and_judged_failed(
    behaviour: Behaviour, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)  # however slow the machine
    # The sick one is listed first: ties of least-outstanding go to it.
    async with fakes(behaviour, answers) as (sick, well):
        async with gateway_for([sick.url, well.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            body = COMPLETION | {
                "stream": kind in ("empty", "token-less", "overrun", "stream-error"),
                "max_tokens": 1,
            }
            for _ in range(20):
                await post(gateway, body)
            # Before: every one went to the sick one, each judged within the SLO (a 429
            # outside), and it was never ejected.
            assert (sick.received, well.received) == (EJECT_AFTER, 20 - EJECT_AFTER)
            assert upstream_errors(gateway) == {kind: EJECT_AFTER}
            assert slo(gateway, "outside", "failed") == EJECT_AFTER
            assert slo(gateway, "within", "met") == 20 - EJECT_AFTER


@pytest.mark.parametrize("code", [400, 422], ids=["a 400", "a 422"])
async def test_a_stream_refusing_the_clients_request_is_no_failure_of_the_replica(
    code: int,
) -> None:
    """vLLM refuses much of a bad request in its stream (``"code": 400`` in a 200): six
    such requests ejected two of four honest replicas (hostile pass 65). Refused by
    every replica, it is the request's: spread, counted nowhere, ejecting none."""
    async with fakes(streams_error(code), streams_error(code)) as replicas:
        async with gateway_for([r.url for r in replicas]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            for _ in range(30):
                await post(gateway, COMPLETION | {"stream": True, "logprobs": 21})
            assert [r.received for r in replicas] == [15, 15]
            assert upstream_errors(gateway) == {}
            assert [r.eject_backoff.failures for r in g.replicas] == [0, 0]


async def test_a_clients_data_parallel_rank_is_not_forwarded() -> None:
    """vLLM's router picks the rank; one the replica lacks failed each stream (pass 65)."""
    seen: list[str | None] = []

    async def records(request: web.Request, fake: Fake) -> web.StreamResponse:
        seen.append(request.headers.get("X-Data-Parallel-Rank"))
        return await answers(request, fake)

    async with fakes(records) as (replica,):
        async with gateway_for([replica.url]) as gateway:
            await eventually(lambda: gateway.gateway.replicas[0].routable, "ready")
            url = f"http://127.0.0.1:{gateway.port}/v1/completions"
            headers = {"X-Data-Parallel-Rank": "5"}
            async with aiohttp.ClientSession() as client:
                async with client.post(url, json=COMPLETION, headers=headers) as r:
                    assert r.status == 200
    assert seen == [None]


@pytest.mark.usefixtures("no_failure_weight")
async def test_a_replica_slipping_a_success_between_its_failures_is_ejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)

    async def fails_two_in_three(request: web.Request, fake: Fake) -> web.StreamResponse:
        if fake.received % 3 == 0:
            return await answers(request, fake)
        return web.json_response({"object": "error"}, status=500)

    async with fakes(fails_two_in_three, answers) as (sick, well):
        async with gateway_for([sick.url, well.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            statuses = [await post(gateway, COMPLETION) for _ in range(20)]
            # 500, 500, 200, 500: three of its last four. Before: never ejected, 13 of
            # the 20 answered 500 beside an idle healthy replica.
            assert sick.received == 4 and well.received == 16
            assert statuses.count(500) == 3


@pytest.mark.parametrize(
    ("answers_", "ejected_at"),
    [
        pytest.param("FFF", [3], id="three fast failures in a row eject at the third"),
        pytest.param("FFSFFSFFS", [4], id="two in three eject once, never again while ejected"),
        pytest.param("FSSFSSF", [7], id="one in three ejects once three are in ten"),
        pytest.param("FSSSSFSSSSFSSSSFSSSS", [], id="one in five never ejects"),
        pytest.param("SSSSSSSSSSFFSSSSSSSSSSF", [], id="two failures in ten never eject"),
    ],
)
def test_fast_failures_eject_a_replica_at_three_of_its_last_ten(
    answers_: str, ejected_at: list[int]
) -> None:
    g = Gateway(["http://sick"], GatewaySettings())
    replica = g.replicas[0]
    ejections = []
    for i, answer in enumerate(answers_, start=1):
        if answer == "F":
            if g._failed_fast(replica) is not None:
                ejections.append(i)
        else:
            g._answered_well(replica)
    assert ejections == ejected_at


def test_only_a_window_without_failure_ends_the_doubling_of_ejections() -> None:
    g = Gateway(["http://sick"], GatewaySettings())
    replica = g.replicas[0]
    for _ in range(EJECT_AFTER):
        g._failed_fast(replica)
    assert replica.eject_backoff.failures == 1
    for _ in range(EJECT_WINDOW - 1):
        g._answered_well(replica)
    assert replica.eject_backoff.failures == 1  # one success no longer forgives it
    g._answered_well(replica)
    assert replica.eject_backoff.failures == 0


# --- a model configured is never a 404 --------------------------------------------------


def view(url: str, models: tuple[str, ...]) -> ReplicaView:
    return ReplicaView(url, True, 0, frozenset(models))


@pytest.mark.parametrize(
    ("replicas", "model", "unserved"),
    [
        pytest.param(
            [view("stray", ("evil",))],
            "llama",
            False,
            id="a configured model waits though the only ready replica lists another",
        ),
        pytest.param(
            [view("stray", ("evil",))],
            "other",
            True,
            id="a model neither configured nor listed by a ready replica is 404",
        ),
        pytest.param([], "llama", False, id="a configured model waits at zero"),
    ],
)
def test_a_configured_model_is_never_unserved(
    replicas: list[ReplicaView], model: str, unserved: bool
) -> None:
    known = frozenset({"llama", "evil"})
    assert is_unserved(replicas, model, known, frozenset({"llama"})) is unserved


async def test_a_stray_replica_listing_another_model_leaves_the_configured_one_waiting() -> None:
    stray = StandIn(**{"/v1/models": b'{"object": "list", "data": [{"id": "evil-model"}]}'})
    async with stray.serving():
        dead = "http://127.0.0.1:1"  # the deployment's own replica, not up yet
        async with gateway_for([dead, stray.url], models=("sim-llama",)) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[1].routable, "the stray one ready")
            request = asyncio.create_task(post(gateway, COMPLETION))
            # Before: a 404 at once, never counted, and the deployment stayed at zero.
            await eventually(lambda: g.stats.buffered == 1, "the request waits")
            assert g.stats.last_arrival is not None  # and the scaler hears of it
            request.cancel()
            assert stray.calls.get("/v1/completions") is None


# --- the meter: what holds a choice, what floods ----------------------------------------


@pytest.mark.parametrize(
    ("streamed", "body", "holds"),
    [
        pytest.param(
            True,
            b'data: {"choices": [{"text": "", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n',
            True,
            id="a stream of no token whose choice says why it stopped holds one",
        ),
        pytest.param(
            True,
            b'data: {"choices": [], "usage": {"completion_tokens": 0}}\n\n',
            False,
            id="a stream whose only event is a usage with no choice holds none",
        ),
        pytest.param(
            False, b'{"choices": [{"text": "x"}]}', True, id="a completion holds a choice"
        ),
        pytest.param(False, b"<html></html>", False, id="a body that is not JSON holds none"),
        pytest.param(
            False, b'{"object": "error"}', False, id="a JSON object without choices holds none"
        ),
        pytest.param(
            False,
            b'{"choices": [{"text": "' + b"y" * JSON_BODY_LIMIT + b'"}]}',
            True,
            id="a completion past the body's limit holds the choice it opens with",
        ),
        pytest.param(
            False,
            b'{"id": "' + b"x" * 70_000 + b'"}',
            False,
            id="padding past the head holding no choice holds none",  # pass 65
        ),
        pytest.param(
            False,
            b'{"id": "' + b"x" * (JSON_BODY_LIMIT + 1) + b'", "choices": [\n  {"text": "x"}]}',
            True,
            id="choices past the body's limit are read as they pass",
        ),
        pytest.param(
            True,
            b'data: {"id": "' + b"x" * (2 * 1024**2) + b'"}\n\n',
            False,
            id="a stream's line too long to read holding no choice holds none",  # pass 65
        ),
        pytest.param(False, b'{"choices": []}', False, id="an empty list of choices is none"),
        pytest.param(False, b'{"x": "choices"}', False, id="the word in a value is none"),
    ],
)
def test_an_answer_holds_a_choice(streamed: bool, body: bytes, holds: bool) -> None:
    meter = ResponseMeter(0.0)
    meter.begin(200, streamed)
    meter.feed(body, 1.0)
    assert meter.holds_choices() is holds


def test_an_answer_that_is_none_is_judged_failed_whatever_its_timing() -> None:
    meter = ResponseMeter(0.0)
    meter.begin(200, False)
    meter.feed(b"{}", 0.1)
    meter.unanswered = True
    assert meter.verdict(SloTargets(), 0.1, 200).reason == "failed"


@given(
    per_choice=st.integers(1, 40),
    choices=st.integers(1, 2500),
    texts=st.lists(st.booleans(), min_size=1, max_size=7),
    chunk=st.integers(1, 65536),
)
@settings(max_examples=40, deadline=None)
def test_an_honest_stream_never_floods_nor_overruns(
    per_choice: int, choices: int, texts: list[bool], chunk: int
) -> None:
    """vLLM's chat stream, as its ``serving_chat`` writes it: a role event per choice (its
    content empty), a delta per token (empty while the text is held back: a stop string,
    a byte of a character), a finish per choice, the usage, CRLF line ends. A client
    asking 2,100 choices of one token had an honest replica cut, and ejected (pass 63)."""
    events = [
        b'data: {"choices": [{"index": %d, "delta": {"role": "assistant", "content": ""}}]}' % i
        for i in range(choices)
    ]
    for t in range(per_choice):
        text = b"t" if texts[t % len(texts)] else b""
        events += [
            b'data: {"choices": [{"index": %d, "delta": {"content": "%s"}}]}' % (i, text)
            for i in range(choices)
        ]
    events += [
        b'data: {"choices": [{"index": %d, "delta": {}, "finish_reason": "length"}]}' % i
        for i in range(choices)
    ]
    events += [b'data: {"choices": [], "usage": {"completion_tokens": 1}}', b"data: [DONE]"]
    body = b"".join(e + b"\r\n\r\n" for e in events)
    meter = ResponseMeter(0.0, max_tokens=per_choice * choices, choices=choices)
    meter.bound_by(8192)
    meter.begin(200, True)
    for at in range(0, len(body), chunk):
        meter.feed(body[at : at + chunk], 1.0)
        assert not overrun(meter)
    assert not meter.flooded and meter.read_whole
    assert meter.choice_events == choices * (per_choice + 2)
    assert meter.data_lines == len(events)  # however the chunks split them


async def test_a_stream_past_its_parse_budget_is_timed_by_its_events_not_its_bytes() -> None:
    """Timed from its last byte past the parse budget, a replica sending a byte of comment
    within each gap held its request for good (hostile pass 64, left; closed in pass 65)."""
    async with fakes(padded_then_trickles) as (replica,):
        async with gateway_for([replica.url], upstream_timeout=1.0) as gateway:
            g = gateway.gateway
            await eventually(lambda: g.replicas[0].routable, "ready")
            async with asyncio.timeout(20):  # before: held for the whole minute
                status = await post(gateway, COMPLETION | {"stream": True, "max_tokens": 4})
            assert status == "ClientPayloadError"  # cut mid-stream
            assert upstream_errors(gateway) == {"stalled": 1}


def test_a_usage_claiming_fewer_tokens_than_the_stream_carried_is_no_count() -> None:
    """21 tokens 300 ms apart were within the ITL target with a usage of 1 (pass 63)."""
    meter = ResponseMeter(0.0, max_tokens=64)
    meter.begin(200, True)
    for i in range(21):
        meter.feed(b'data: {"choices": [{"text": "t"}]}\n\n', 0.5 + 0.3 * i)
    meter.feed(b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n', 6.5)
    assert meter.output_tokens() == 21
    assert meter.verdict(SloTargets(), 6.5, 200).reason == "itl"


def test_junk_in_token_events_is_parsed_up_to_a_bound_and_relayed() -> None:
    """Token events of 100 KB of junk each held the gateway's loop (pass 63)."""
    meter = ResponseMeter(0.0)
    meter.begin(200, True)
    junk = b'data: {"choices": [{"text": "t"}], "x": "' + b"j" * 100_000 + b'"}\n\n'
    for _ in range(500):
        meter.feed(junk, 1.0)
    assert not meter.read_whole and not meter.flooded
    assert meter.parsed_bytes < PARSED_BYTES + (PARSED_BYTES_PER_EVENT + len(junk)) * (
        meter.choice_events + 1
    )
    assert meter.choice_events < 40  # of 500: the rest relayed, not parsed


def test_a_flooded_stream_is_read_no_further() -> None:
    meter = ResponseMeter(0.0)
    meter.begin(200, True)
    meter.feed(b"data: {}\n" * (2 * TOKEN_LESS_LINES), 1.0)
    assert meter.flooded
    read = meter.lines
    assert read == TOKEN_LESS_LINES + 1  # it stopped at the line past the budget
    meter.feed(b'data: {"choices": [{"text": "t"}]}\n' * 100, 2.0)
    assert meter.lines == read and meter.token_events == 0


# --- what a client may ask that an honest replica answers at length (pass 64) -------------


@pytest.mark.parametrize(
    ("body", "count"),
    [
        pytest.param({"prompt": ["a", "b", "c"], "n": 2}, 6, id="a batch of prompts times n"),
        pytest.param({"prompt": [[1, 2], [3]]}, 2, id="a batch of token-id prompts"),
        pytest.param({"prompt": [1, 2, 3]}, 1, id="one prompt of token ids is one"),
        pytest.param({"messages": [], "n": 3}, 3, id="a chat request is its n"),
        pytest.param(
            {"prompt_embeds": ["e1", "e2", "e3"], "n": 2},
            6,
            id="a batch of prompt embeddings times n",  # pass 66
        ),
        pytest.param(
            {"prompt": ["a", "b"], "prompt_embeds": "e"}, 3, id="prompts beside an embedding"
        ),
        pytest.param({"prompt_embeds": "e"}, 1, id="one prompt embedding is one"),
        pytest.param(
            {"prompt": "", "prompt_embeds": ["e"] * 8},
            9,
            id="an empty prompt beside embeddings is one more, as vLLM answers",  # pass 67
        ),
    ],
)
def test_a_completions_choices_count_each_prompt_of_a_batch(
    body: dict[str, object], count: int
) -> None:
    assert choices(body) == count


def test_a_chat_requests_prompt_field_is_no_batch() -> None:
    """vLLM ignores it: 1,000 of them made a chat stream's bound 1,000 times its own and
    its ITL unjudged (pass 66)."""
    assert choices({"messages": [], "prompt": ["a"] * 1000}, chat=True) == 1


def test_an_echo_of_each_choice_before_its_tokens_is_no_overrun() -> None:
    """vLLM's chat echo sends a text event a choice: 17 choices of 1 token had honest
    streams cut, their replicas ejected by a client (hostile pass 64)."""
    meter = ResponseMeter(0.0, max_tokens=17, choices=17)
    meter.bound_by(8192)
    meter.begin(200, True)
    for _ in range(2):  # the echo, then the token
        meter.feed(b'data: {"choices": [{"delta": {"content": "t"}}]}\n\n' * 17, 1.0)
    assert meter.token_events == 34 and not overrun(meter)


def test_a_stream_past_its_parse_budget_counts_the_tokens_of_its_unread_events() -> None:
    """A client's request id of 200 KB (in every event vLLM streams) took honest streams
    past the parse budget: 120 tokens 80 ms apart judged as 8, outside ``itl`` (pass 65)."""
    meter = ResponseMeter(0.0, max_tokens=120)
    meter.bound_by(8192)
    meter.begin(200, True)
    event = b'data: {"id": "' + b"r" * 200_000 + b'", "choices": [{"text": "t"}]}\n\n'
    for i in range(120):
        meter.feed(event, 0.1 + 0.08 * i)
    meter.feed(b"data: [DONE]\n\n", 9.62)
    assert not meter.read_whole and not overrun(meter)
    verdict = meter.verdict(SloTargets(ttft_seconds=2.0, itl_seconds=0.1), 9.62, 200)
    assert verdict.reason == "met"


def test_a_long_answers_usage_before_its_prompt_logprobs_is_read() -> None:
    """vLLM writes a chat answer's prompt_logprobs after its usage, 1.4 KB a prompt
    token: past 4 MiB the usage was cut with the body's start (hostile pass 66)."""
    meter = ResponseMeter(0.0)
    meter.begin(200, False)
    body = b'{"id": "x", "choices": [{"message": {"content": "x"}}], '
    body += b'"usage": {"prompt_tokens": 6000, "completion_tokens": 500}, "prompt_logprobs": ['
    body += b'{"1": {"logprob": -1.0, "decoded_token": "usage"}}, ' * 100_000 + b"null]}"
    for at in range(0, len(body), 1000):
        meter.feed(body[at : at + 1000], 1.0)
    assert len(body) > 4 * 1024**2 and meter.output_tokens() == 500


def test_a_usage_followed_by_usage_texts_is_read() -> None:
    """16 tokens whose text is "usage" in the logprobs after it hid the count of an
    answer under 4 MiB (hostile pass 67)."""
    meter = ResponseMeter(0.0)
    meter.begin(200, False)
    body = b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 500}, "lp": ['
    body += b'{"decoded_token": "usage"}, ' * 40 + b"null]}"
    meter.feed(body, 1.0)
    assert meter.output_tokens() == 500


def test_a_long_answers_usage_is_read_from_its_end() -> None:
    """A client's request id of 4.3 MB (vLLM's answer id carries it): the body was
    dropped at 4 MiB, its 500 tokens unknown, judged against ttft alone (pass 65)."""
    meter = ResponseMeter(0.0)
    meter.begin(200, False)
    body = b'{"id": "cmpl-' + b"r" * 4_300_000 + b'", "choices": [{"text": "x"}], '
    body += b'"usage": {"prompt_tokens": 3, "completion_tokens": 500}}'
    for at in range(0, len(body), 1000):
        meter.feed(body[at : at + 1000], 1.0)
    assert meter.output_tokens() == 500


@pytest.mark.parametrize(
    ("streamed", "body"),
    [
        pytest.param(
            False,
            b'{"id": "cmpl-' + b"r" * 70_000 + b'", "choices": [{"text": "x"}]}',
            id="a long request id before the choices is not read as none",
        ),
        pytest.param(
            True,
            b'data: {"id": "' + b"r" * (2 * 1024**2) + b'", "choices": [{"text": "x"}]}\n\n',
            id="a stream whose lines were too long to read is not read as empty",
        ),
    ],
)
def test_an_answer_whose_choices_could_not_be_read_is_no_empty_one(
    streamed: bool, body: bytes
) -> None:
    meter = ResponseMeter(0.0)
    meter.begin(200, streamed)
    for at in range(0, len(body), 65536):
        meter.feed(body[at : at + 65536], 1.0)
    assert meter.holds_choices()
