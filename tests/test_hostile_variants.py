"""New variants of issue 27's classes, found by a later hostile pass, each at its boundary.

- Class 5 (sizes from input), the gateway: a replica's ``/v1/models`` listing 60,000
  names within the 1 MiB bound, and a replica that comes back with new names each time,
  grew the models the gateway remembers (kept while replicas are gone) without end. One
  answer is bounded to ``MAX_MODELS`` ids of at most ``MAX_MODEL_ID_CHARS``; what is
  remembered to ``MAX_SERVED_MODELS``.
- Class 4/5, admission: a pod's ``hami.io/vgpu-devices-allocated`` of 256 KiB of ``;``
  (262,144 empty containers; within the annotation's bound, past the parse memo's) took
  half a second to parse, every pass, per such pod. Containers and cards are counted
  before anything is split: more than ``MAX_ALLOCATION_ENTRIES`` is refused, and the pod's
  node is unmeasured as for any unreadable allocation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from admission import annotations as names
from admission.hami import (
    MAX_ALLOCATION_ENTRIES,
    MAX_ANNOTATION_CHARS,
    HamiFormatError,
    inventory,
    parse_devices_allocated,
)
from serving.gateway_replicas import MAX_SERVED_MODELS
from serving.replica_answers import (
    MAX_ANSWER_BYTES,
    MAX_MODEL_ID_CHARS,
    MAX_MODELS,
    AnswerError,
    read_models,
)
from tests.conftest import eventually, served_app
from tests.test_admission_decide import NOW, node, running
from tests.test_gateway_isolation import gateway_for, warnings_naming


def models(names: list[str]) -> bytes:
    body = {"object": "list", "data": [{"id": n} for n in names]}
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param(models([f"m{i}" for i in range(60_000)]), "60,000 models",
                     id="60,000 short names within the byte bound are refused"),
        pytest.param(models([f"m{i}" for i in range(MAX_MODELS + 1)]), f"{MAX_MODELS + 1:,}",
                     id="one model past the bound is refused naming the count"),
        pytest.param(models(["x" * (MAX_MODEL_ID_CHARS + 1)]), r"data\[0\]\.id is 513",
                     id="an id longer than any model name is refused naming it"),
    ],
)  # fmt: skip
def test_a_models_answer_past_the_bounds_is_too_large(body, words):
    assert len(body) <= MAX_ANSWER_BYTES
    with pytest.raises(AnswerError, match=words) as caught:
        read_models(body)
    assert caught.value.reason == "too-large"


def test_a_models_answer_at_the_bounds_is_read():
    names = [f"adapter-{i}" for i in range(MAX_MODELS - 1)] + ["x" * MAX_MODEL_ID_CHARS]
    assert len(read_models(models(names))) == MAX_MODELS


class Churning:
    """A replica that fails every other health check and lists new names each time back."""

    def __init__(self, per_answer: int) -> None:
        self.per_answer = per_answer
        self.answers = 0
        self.healthy = False
        self.down = False
        """Set: every health check fails from now on."""
        self.checks_down = 0
        """Health checks answered since ``down`` was set."""
        self.url = ""

    async def _health(self, request: web.Request) -> web.Response:
        self.healthy = not self.healthy and not self.down
        self.checks_down += self.down
        return web.Response(status=200 if self.healthy else 503)

    async def _awake(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": False})

    async def _models(self, request: web.Request) -> web.Response:
        start = self.answers * self.per_answer
        self.answers += 1
        body = models([f"churn-{i}" for i in range(start, start + self.per_answer)])
        return web.Response(body=body, content_type="application/json")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Churning]:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/is_sleeping", self._awake)
        async with served_app(app) as self.url:
            yield self


async def test_a_replica_listing_new_names_each_time_back_cannot_grow_what_is_remembered(
    caplog,
):
    caplog.set_level(logging.WARNING, logger="serving.gateway")
    answers = MAX_SERVED_MODELS // MAX_MODELS + 3  # past the bound, then more
    async with (
        Churning(MAX_MODELS).serving() as replica,
        gateway_for([replica.url]) as gateway,
    ):
        pool = gateway.gateway.pool
        await eventually(lambda: replica.answers >= answers, f"{answers} model listings")
        assert len(pool.served) == MAX_SERVED_MODELS
        assert "churn-0" in pool.served  # the first remembered stay
    (warning,) = warnings_naming(caplog, replica.url)
    assert f"at most {MAX_SERVED_MODELS}" in warning


async def test_past_the_bound_a_model_new_at_zero_replicas_is_buffered_not_refused():
    """The flood above left a model first listed after it unremembered: at zero replicas
    its requests got 404 at once, never counted as arrivals, so KEDA never woke it."""
    answers = MAX_SERVED_MODELS // MAX_MODELS + 1
    async with (
        Churning(MAX_MODELS).serving() as replica,
        gateway_for([replica.url], buffer_timeout=0.5) as gateway,
    ):
        pool = gateway.gateway.pool
        await eventually(lambda: replica.answers >= answers, f"{answers} model listings")
        assert pool.served_full and "new-model" not in pool.served
        replica.healthy = True  # its next check fails, and it stays down
        replica.down = True
        # A second check answered down: the first one's answer is taken, and no check
        # answered before ``down`` (ready again) is still on its way.
        await eventually(
            lambda: replica.checks_down >= 2 and not pool.routing_views()[0].ready,
            "no replica ready",
        )
        url = f"http://127.0.0.1:{gateway.port}/v1/completions"
        body = {"model": "new-model", "prompt": "hi", "max_tokens": 1}
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as r:
            assert r.status == 503, await r.text()  # buffered, then no replica in 0.5 s
        assert gateway.gateway.stats.arrivals.count(time.monotonic(), 60.0) == 1


@pytest.mark.parametrize(
    ("allocated", "words"),
    [
        pytest.param(";" * MAX_ANNOTATION_CHARS, f"{MAX_ANNOTATION_CHARS} containers",
                     id="an annotation of empty containers is refused before it is split"),
        pytest.param(":" * (MAX_ANNOTATION_CHARS - 1) + ";", f"{MAX_ANNOTATION_CHARS - 1} cards",
                     id="an annotation of empty cards is refused before it is split"),
        pytest.param("GPU-a,NVIDIA,1,1:" * (MAX_ALLOCATION_ENTRIES + 1) + ";",
                     f"{MAX_ALLOCATION_ENTRIES + 1} cards",
                     id="more cards than a pod holds, each well formed, are refused"),
    ],
)  # fmt: skip
def test_an_allocation_listing_more_entries_than_a_pod_has_is_refused(allocated, words):
    with pytest.raises(HamiFormatError, match=words):
        parse_devices_allocated(allocated)
    bad = running("bad", "gpu-1", range(1))
    bad["metadata"]["annotations"][names.HAMI_DEVICES_ALLOCATED] = allocated
    inv = inventory([node("gpu-1"), node("gpu-2")], [bad], now=NOW)
    assert [n.name for n in inv.nodes] == ["gpu-2"]  # its node unmeasured, never free


def test_an_allocation_at_the_bound_is_read():
    containers = ";" * (MAX_ALLOCATION_ENTRIES - 1) + "GPU-a,NVIDIA,1,1:;"
    assert len(parse_devices_allocated(containers)) == 1
