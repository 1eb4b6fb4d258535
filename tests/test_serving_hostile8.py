"""The serving side under hostile input (issue 27's eighth hostile pass, findings GU-1..).

Each test injects what one finding found, at the boundary where it enters: a replica
answering with a redirect to another host, a non-streamed answer whose usage the gateway
reads, a request body that is costly to parse. Real servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import io
import json

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from foundation.replica_model import LLAMA3_8B_H200
from serving import slo
from serving.gateway import MAX_REQUEST_JSON_ITEMS
from serving.server import GatewayServer, SimReplicaServer
from serving.slo import JSON_BODY_LIMIT, ResponseMeter, usage_in
from tests.conftest import eventually, served_app
from tests.test_gateway_isolation import gateway_for


def labelled(server: GatewayServer, metric: str, *labels: str) -> float:
    """A gateway metric's value for the gateway's own labels and ``labels``."""
    family = getattr(server.gateway.metrics, metric)
    return float(family.labels("a", "llama", *labels)._value.get())


# --- GU-1: no answer of a replica's is followed to another host ---------------------------


def elsewhere(asked: list[str]) -> web.Application:
    """Another host (a metadata service, an internal API) answering as a replica would."""

    async def answer(request: web.Request) -> web.Response:
        asked.append(f"{request.method} {request.path}")
        await request.read()
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "m", "object": "model", "max_model_len": 64}],
                "is_sleeping": True,
                "status": "awake",
                "choices": [{"text": "from elsewhere"}],
            }
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


def replica(redirected: str, to: str) -> web.Application:
    """A replica serving model ``m`` that answers ``redirected`` with a 307 to ``to``."""

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def is_sleeping(request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": False})

    async def completion(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "hi"}], "usage": {"completion_tokens": 1}})

    async def moved(request: web.Request) -> web.Response:
        await request.read()
        raise web.HTTPTemporaryRedirect(to + "/latest/meta-data")

    routes = {
        ("GET", "/health"): health,
        ("GET", "/v1/models"): models,
        ("GET", "/is_sleeping"): is_sleeping,
        ("POST", "/v1/completions"): completion,
    }
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, moved if path == redirected else handler)
    return app


@pytest.mark.parametrize(
    ("redirected", "status", "failures"),
    [
        pytest.param(
            "/v1/completions",
            502,
            ("_errors", "redirect"),
            id="a completion redirected elsewhere is the replica's 502 and the prompt stays here",
        ),
        pytest.param(
            "/v1/models",
            503,
            ("_probe_failures", "http-status"),
            id="a model list redirected elsewhere is no list and that host's is never taken",
        ),
        pytest.param(
            "/health",
            503,
            ("_probe_failures", "http-status"),
            id="a health check redirected elsewhere fails and that host's 200 is never taken",
        ),
        pytest.param(
            "/is_sleeping",
            200,
            ("_probe_failures", "http-status"),
            id="a sleep state redirected elsewhere is unread and that host's asleep never held",
        ),
    ],
)
async def test_a_replica_s_redirect_is_never_followed_to_another_host(
    redirected: str, status: int, failures: tuple[str, str]
) -> None:
    asked: list[str] = []
    async with (
        served_app(elsewhere(asked)) as other,
        served_app(replica(redirected, other)) as url,
        gateway_for([url], buffer_timeout=0.5) as server,
    ):
        checked = server.gateway.replicas[0]
        await eventually(lambda: checked.ready or checked.problem is not None, "a round")
        body = {"model": "m", "prompt": "a prompt for the replica only", "max_tokens": 1}
        headers = {"X-Api-Key": "the client's key"}
        address = f"http://127.0.0.1:{server.port}/v1/completions"
        async with (
            aiohttp.ClientSession() as client,
            client.post(address, json=body, headers=headers) as r,
        ):
            assert r.status == status
            assert "elsewhere" not in await r.text()
        assert asked == []
        assert labelled(server, *failures) >= 1


# --- GU-2: a non-streamed answer's usage is read, not the whole answer parsed -------------


def logprobs_answer(tokens: int) -> dict[str, object]:
    """vLLM's chat answer with 20 top logprobs a token, its fields in vLLM's order."""
    top = [{"token": f"t{j}", "logprob": -1.234567, "bytes": [116, 49]} for j in range(20)]
    content = [{"token": "tok", "logprob": -0.1, "bytes": [116], "top_logprobs": top}] * tokens
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "tok" * tokens},
                "logprobs": {"content": content},
                "finish_reason": "length",
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": 5, "total_tokens": tokens + 5, "completion_tokens": tokens},
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        pytest.param(
            json.dumps(logprobs_answer(2500)).encode(),
            2500,
            id="an honest 3 MB answer with 20 top logprobs a token is read at once",
        ),
        pytest.param(
            b'{"x": [' + b"{}," * (JSON_BODY_LIMIT // 3 - 10) + b'{}], "usage": {}}',
            None,
            id="4 MiB of empty objects from a hostile replica is read at once",
        ),
        pytest.param(
            b'{"usage": [' + b"{}," * (JSON_BODY_LIMIT // 3 - 10) + b"{}]}",
            None,
            id="a usage of 4 MiB is no count and is read at once",
        ),
    ],
)
def test_a_non_streamed_answer_s_usage_is_read_without_parsing_the_answer(
    body: bytes, tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parsed whole, a 4 MiB answer held the gateway's event loop 0.1-0.17 s: the JSON
    # decoder may only ever see the usage's window, never the answer.
    decoded: list[int] = []
    real = slo._DECODER

    class Recording(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> tuple[object, int]:
            decoded.append(len(s))
            return real.raw_decode(s, idx)

    monkeypatch.setattr(slo, "_DECODER", Recording())
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("the answer parsed whole"))
    meter = ResponseMeter(0.0, 10_000, 1)
    meter.begin(200, False)
    meter.feed(body, 1.0)
    assert meter.output_tokens() == tokens
    assert all(n <= slo.USAGE_WINDOW for n in decoded), decoded


@given(
    st.lists(st.text(max_size=20) | st.integers(), max_size=5),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", " ", "\n  "]),
)
def test_the_usage_read_is_the_objects_whatever_its_text_holds(
    choices: list[object], tokens: int, space: str
) -> None:
    # The text may hold '"usage": {...}' itself: a quote in a JSON string is escaped.
    fake = ['"usage": {"completion_tokens": 7}', *choices]
    usage = {"completion_tokens": tokens}
    body = json.dumps({"choices": fake, "usage": usage, "prompt_logprobs": None})
    body = body.replace('"usage": ', '"usage"' + space + ":" + space)
    assert usage_in(body.encode()) == {"usage": usage}
    assert usage_in(json.dumps([{"usage": usage}]).encode()) is None  # not an object


# --- GU-3: a request body's parse is bounded in what it costs the event loop -------------


@pytest.mark.parametrize(
    ("prompt", "status"),
    [
        pytest.param(
            b'"hi", "x": [' + b"{}," * (4 * 1024**2 // 3) + b"{}]",
            413,
            id="4 MiB of empty objects is refused before it is parsed",
        ),
        pytest.param(
            b"[" + b"[1]," * (MAX_REQUEST_JSON_ITEMS // 2) + b"[1]]",
            413,
            id="a million nested token lists are refused",
        ),
        pytest.param(
            b"[" + b"1," * (MAX_REQUEST_JSON_ITEMS - 10) + b"1]",
            503,
            id="a prompt of a million token ids is taken",
        ),
        pytest.param(
            b'"' + b"Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 275_000 + b'"',
            503,
            id="a text prompt of 15 MiB (275,000 commas) is taken",
        ),
    ],
)
async def test_a_request_body_costly_to_parse_is_refused_before_parsing(
    prompt: bytes, status: int
) -> None:
    async with gateway_for([], buffer_timeout=0.2) as server:
        address = f"http://127.0.0.1:{server.port}/v1/completions"
        body = b'{"model": "m", "prompt": ' + prompt + b"}"
        async with (
            aiohttp.ClientSession() as client,
            client.post(address, data=io.BytesIO(body)) as r,
        ):
            assert r.status == status
            if status == 413:
                assert "JSON items" in (await r.json())["message"]
        assert labelled(server, "_arrivals") == (status != 413)


# --- GU-4: the simulated replica's sleep goes on once its client left ----------------------


@pytest.mark.parametrize(
    ("mode", "tokens"),
    [
        pytest.param("wait", 100, id="a sleep waiting for a request to drain is carried out"),
        pytest.param("wait", 400, id="a sleep waiting for a long request is carried out"),
    ],
)
async def test_a_sim_sleep_whose_client_leaves_is_carried_out(mode: str, tokens: int) -> None:
    sim = SimReplicaServer(LLAMA3_8B_H200, "127.0.0.1:0", model="m")
    await sim.start()
    engine = sim.replica.engine
    try:
        async with aiohttp.ClientSession() as client:
            body = {"model": "m", "prompt": "hi", "max_tokens": tokens}
            running = asyncio.create_task(client.post(sim.url + "/v1/completions", json=body))
            await eventually(lambda: engine.running == 1, "a request runs")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):  # the client gives up: its handler is cancelled
                    await client.post(sim.url + "/sleep", params={"level": "1", "mode": mode})
            async with await running as answer:
                assert answer.status == 200
            await eventually(lambda: bool(engine.sleeping_tags), "asleep", limit=10)
            async with client.get(sim.url + "/is_sleeping") as r:
                assert (await r.json())["is_sleeping"] is True
    finally:
        await sim.stop()
