"""``watch_objects`` against a hostile API server on 127.0.0.1: nothing it answers ends the loop.

A list that is not one, nesting past the JSON parser's depth, or any exception is a
failed attempt (``on_error``, backoff, retried); a malformed item or event is skipped
alone (``on_skip``), and the rest of the set stands (issue 27, hostile pass S-H5).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler

from foundation import kube
from foundation.kube import DATASETS, KubeAccess, Selection, watch_objects
from foundation.objects import RawObject

DEEP = b"[" * 100_000 + b"]" * 100_000


def listing(*items: object, version: object = "1") -> bytes:
    body = {"kind": "List", "metadata": {"resourceVersion": version}, "items": items}
    return json.dumps(body).encode()


def named(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "n"}}


GOOD = listing(named("a"))


class FakeApi:
    """Answers lists from ``lists`` in order (the last one repeats) and each watch with
    ``events`` then silence."""

    def __init__(self, lists: list[bytes], events: list[bytes] | None = None) -> None:
        self.lists = lists
        self.events = events or []
        self.listed = 0
        self.done = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for line in self.events:
                await response.write(line + b"\n")
            await self.done.wait()
            return response
        body = self.lists[min(self.listed, len(self.lists) - 1)]
        self.listed += 1
        return web.Response(body=body, content_type="application/json")

    async def start(self, tmp_path: Path) -> KubeAccess:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        port = self.runner.addresses[0][1]
        path = tmp_path / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]\n'
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        )
        return KubeAccess(path)

    async def stop(self) -> None:
        self.done.set()
        if self.runner is not None:
            await self.runner.cleanup()


class Watched:
    """What the watch told: every set, failed attempts, skipped items."""

    def __init__(self) -> None:
        self.sets: list[dict[str, RawObject]] = []
        self.errors: list[Exception] = []
        self.skips: list[str] = []
        self.changed = asyncio.Event()

    def on_change(self, objects: dict[str, RawObject]) -> None:
        self.sets.append(objects)
        self.changed.set()

    def on_error(self, err: Exception) -> None:
        self.errors.append(err)

    async def until(self, predicate: Callable[[dict[str, RawObject]], bool]) -> None:
        """Until a set satisfies ``predicate``: a cap against hangs, not a timing check."""
        async with asyncio.timeout(30):
            while not (self.sets and predicate(self.sets[-1])):
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def watching(
    api: FakeApi, tmp_path: Path
) -> AsyncIterator[tuple[Watched, asyncio.Task[None]]]:
    access = await api.start(tmp_path)
    watched = Watched()
    task = asyncio.create_task(
        watch_objects(
            access,
            Selection(DATASETS),
            watched.on_change,
            reconnect_min=0.01,
            reconnect_max=0.02,
            on_error=watched.on_error,
            on_skip=watched.skips.append,
        )
    )
    try:
        yield watched, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.stop()


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(json.dumps([json.loads(GOOD)]).encode(),
                     id="a list answer that is a JSON array fails that attempt"),
        pytest.param(listing(version=None),
                     id="a list without a resourceVersion fails that attempt"),
        pytest.param(b'{"kind": "List", "metadata": null, "items": []}',
                     id="a list whose metadata is null fails that attempt"),
        pytest.param(b'{"metadata": {"resourceVersion": "1"}, "items": "x"}',
                     id="items that are a string fail that attempt"),
        pytest.param(b'{"items":' + DEEP + b"}",
                     id="a list nested past the parser's depth fails that attempt"),
        pytest.param(b"\xff\xfe not json", id="a list that is not JSON fails that attempt"),
    ],
)  # fmt: skip
async def test_a_hostile_list_is_a_failed_attempt_and_the_watch_lists_again(first, tmp_path):
    async with watching(FakeApi([first, GOOD]), tmp_path) as (watched, task):
        await watched.until(lambda objects: "n/a" in objects)
        assert not task.done()
    assert len(watched.errors) == 1


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"name": "x"}, id="an item without metadata is skipped alone"),
        pytest.param("x", id="an item that is a string is skipped alone"),
        pytest.param({"metadata": None}, id="an item whose metadata is null is skipped alone"),
        pytest.param({"metadata": {"name": 7}},
                     id="an item whose name is no string is skipped alone"),
        pytest.param({"metadata": {"name": "x", "namespace": []}},
                     id="an item whose namespace is a list is skipped alone"),
    ],
)  # fmt: skip
async def test_a_malformed_listed_item_is_skipped_and_the_others_kept(bad, tmp_path):
    async with watching(FakeApi([listing(bad, named("a"))]), tmp_path) as (watched, task):
        await watched.until(lambda objects: "n/a" in objects)
        assert not task.done()
    assert list(watched.sets[0]) == ["n/a"]
    assert watched.skips and not watched.errors


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(b"[1, 2]", id="an event that is a JSON array is skipped alone"),
        pytest.param(b'{"type": "ADDED", "object": {"kind": "x"}}',
                     id="an event object without metadata is skipped alone"),
        pytest.param(b'{"type": "ADDED", "object": ' + DEEP + b"}",
                     id="an event nested past the parser's depth is skipped alone"),
        pytest.param(b"not json at all", id="an event that is not JSON is skipped alone"),
        pytest.param(b'{"type": "ADDED", "object": "x"}',
                     id="an event object that is a string is skipped alone"),
    ],
)  # fmt: skip
async def test_a_malformed_watch_event_is_skipped_and_later_ones_applied(event, tmp_path):
    added = json.dumps({"type": "ADDED", "object": named("b")}).encode()
    async with watching(FakeApi([GOOD], [event, added]), tmp_path) as (watched, task):
        await watched.until(lambda objects: "n/b" in objects)
        assert not task.done()
    assert watched.skips and not watched.errors and watched.sets[-1].keys() == {"n/a", "n/b"}


async def test_listed_and_watched_objects_are_kept_without_their_managed_fields(tmp_path):
    """Every writer's field sets are most of a Workload two controllers write to; nothing
    reads them, and a 10,000-object view held them all (issue 28's peak RSS)."""
    fields = [{"manager": "kueue", "fieldsV1": {"f:status": {"f:conditions": {}}}}]

    def managed(name: str) -> dict[str, Any]:
        obj = named(name)
        obj["metadata"]["managedFields"] = fields
        obj["metadata"]["labels"] = {"kept": "yes"}
        return obj

    added = json.dumps({"type": "ADDED", "object": managed("b")}).encode()
    api = FakeApi([listing(managed("a"))], [added])
    async with watching(api, tmp_path) as (watched, _):
        await watched.until(lambda objects: "n/b" in objects)
    assert {k: o["metadata"] for k, o in watched.sets[-1].items()} == {
        "n/a": {"name": "a", "namespace": "n", "labels": {"kept": "yes"}},
        "n/b": {"name": "b", "namespace": "n", "labels": {"kept": "yes"}},
    }


async def test_an_error_event_whose_object_is_a_string_is_a_failed_attempt(tmp_path):
    api = FakeApi([GOOD], [b'{"type": "ERROR", "object": "boom"}'])
    async with watching(api, tmp_path) as (watched, task):
        await watched.until(lambda objects: api.listed >= 3)
        assert not task.done()
    assert watched.errors and all("boom" in str(e) for e in watched.errors)


class SurpriseError(Exception):
    pass


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KeyError("metadata"), id="a KeyError fails one attempt only"),
        pytest.param(RecursionError(), id="a RecursionError fails one attempt only"),
        pytest.param(AttributeError("get"), id="an AttributeError fails one attempt only"),
        pytest.param(SurpriseError("any"), id="an exception of any class fails one attempt only"),
    ],
)
async def test_any_exception_in_a_list_fails_that_attempt_and_the_watch_recovers(
    error, tmp_path, monkeypatch
):
    real = kube._list
    raised: list[Exception] = []

    async def list_once_failing(*args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(error)
            raise error
        return await real(*args, **kwargs)

    monkeypatch.setattr(kube, "_list", list_once_failing)
    async with watching(FakeApi([GOOD]), tmp_path) as (watched, task):
        await watched.until(lambda objects: "n/a" in objects)
        assert not task.done()
    assert watched.errors == [error]


class RefusingWatch(FakeApi):
    """Lists fine; answers every watch as ``mode`` says: ``403`` (RBAC granting list and
    not watch), ``end`` (a proxy closing it at once) or ``410`` (expired each time)."""

    def __init__(self, mode: str) -> None:
        super().__init__([GOOD])
        self.mode = mode

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return await super().handle(request)
        if self.mode == "403":
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        gone = b'{"type": "ERROR", "object": {"kind": "Status", "code": 410}}\n'
        return web.Response(body=gone if self.mode == "410" else b"")


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "403", id="S4-M1: a watch refused 403 after a good list backs off, warned once"
        ),
        pytest.param("end", id="S4-M1: a watch ended at once is a failed attempt, backed off"),
        pytest.param("410", id="S4-M1: a watch expired at once is a failed attempt, backed off"),
    ],
)
async def test_a_watch_that_never_holds_backs_off_and_warns_once(mode, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="foundation.kube")
    api = RefusingWatch(mode)
    access = await api.start(tmp_path)
    watched = Watched()
    four = asyncio.Event()

    def failed(err: Exception) -> None:
        watched.on_error(err)
        if len(watched.errors) >= 4:
            four.set()

    task = asyncio.create_task(
        watch_objects(
            access,
            Selection(DATASETS),
            watched.on_change,
            reconnect_min=0.1,
            reconnect_max=0.4,
            on_error=failed,
        )
    )
    try:
        async with asyncio.timeout(30):  # a cap against hangs, not a timing check
            await four.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.stop()
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    delays = [float(m.rpartition("retrying in ")[2].rstrip("s")) for m in retries][:4]
    assert delays == [0.1, 0.2, 0.4, 0.4]  # doubled, capped, never reset by a good list
    assert api.listed <= len(watched.errors) + 1  # one list an attempt, not a storm
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert watched.sets and watched.sets[-1].keys() == {"n/a"}  # the listed set stands


async def test_a_cancelled_watch_aborts_its_connection_at_once(tmp_path, monkeypatch):
    """Closed, it went into TLS's close_notify exchange, which aiohttp tracks nowhere: a
    test's event loop that ended first left the socket unclosed (an intermittent CI
    failure of the admission tests, with the cores busy)."""
    aborted: list[object] = []
    real_abort = ResponseHandler.abort

    def abort(self: ResponseHandler) -> None:
        aborted.append(self)
        real_abort(self)

    monkeypatch.setattr(ResponseHandler, "abort", abort)
    added = json.dumps({"type": "ADDED", "object": named("b")}).encode()
    async with watching(FakeApi([GOOD], [added]), tmp_path) as (watched, task):
        await watched.until(lambda objects: "n/b" in objects)  # the watch streams
    assert task.cancelled()
    assert len(aborted) == 1
