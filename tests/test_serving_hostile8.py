"""The serving side under hostile input (issue 27's eighth hostile pass, findings GU-1..).

Each test injects what one finding found, at the boundary where it enters: a replica
answering with a redirect to another host. Real servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from serving.server import GatewayServer
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
