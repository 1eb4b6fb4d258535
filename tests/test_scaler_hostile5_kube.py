"""What the API server answers is read to a cap, and a startup ConfigMap read is one line.

Issue 27, hostile pass 5, S5-H1 and S5-M1: a list page, an error body or a write's answer
that never ends was read whole (1 GiB a second, until memory ran out); a list comes in
pages now, each at most ``MAX_ANSWER_BYTES``, and the attempt past it fails (backoff,
``on_error``). ``unitscale scaler --config-configmap`` at startup came out as a traceback
when the API server hung up or the ConfigMap's ``data`` was a list, and read an endless
answer until MemoryError; now each is a ``ConfigError`` naming the flag (exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from foundation import kube
from foundation.errors import ConfigError
from foundation.kube import DATASETS, KubeAccess, Selection, watch_objects
from foundation.objects import RawObject
from foundation.reload import configmap_text, read_configmap
from tests.conftest import served_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _kubeconfig(tmp_path: Path, url: str) -> KubeAccess:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: c, cluster: {{server: "{url}"}}}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return KubeAccess(path)


_STOP = web.AppKey("stop", asyncio.Event)


@contextlib.asynccontextmanager
async def api_server(tmp_path: Path, handler: Handler) -> AsyncIterator[KubeAccess]:
    app = web.Application()
    app[_STOP] = stop = asyncio.Event()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with served_app(app) as url:
        try:
            yield _kubeconfig(tmp_path, url)
        finally:
            stop.set()  # a held watch ends, so the server stops at once


async def endless(request: web.Request, status: int = 200, head: bytes = b"") -> web.StreamResponse:
    """An answer that never ends (until the client hangs up)."""
    response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write(head)
        while True:
            await response.write(b'{"metadata":{"name":"x"}},' * 2000)
    return response


def named(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "n"}}


def page(*names: str, token: str = "") -> web.Response:
    meta: dict[str, str] = {"resourceVersion": "7"}
    if token:
        meta["continue"] = token
    body = {"kind": "List", "metadata": meta, "items": [named(n) for n in names]}
    return web.json_response(body)


async def quiet_watch(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await request.app[_STOP].wait()
    return response


async def _watch_until(
    access: KubeAccess,
    done: Callable[[list[dict[str, RawObject]], list[Exception]], bool],
    *,
    on_event: Callable[[str, RawObject | None], None] | None = None,
) -> tuple[list[dict[str, RawObject]], list[Exception]]:
    """The sets and errors a watch hands over until ``done`` says so (``on_event``: its
    events too, each heard before ``done`` is asked again)."""
    sets: list[dict[str, RawObject]] = []
    errors: list[Exception] = []
    heard = asyncio.Event()

    def hear(into: list[Any]) -> Callable[[Any], None]:
        def append(item: Any) -> None:
            into.append(item)
            heard.set()

        return append

    def event(key: str, obj: RawObject | None) -> None:
        assert on_event is not None
        on_event(key, obj)
        heard.set()

    task = asyncio.create_task(
        watch_objects(
            access,
            Selection(DATASETS),
            hear(sets),
            reconnect_min=0.01,
            reconnect_max=0.02,
            on_error=hear(errors),
            on_event=event if on_event is not None else None,
        )
    )
    try:
        async with asyncio.timeout(30):  # a cap against hangs, not a timing check
            while not done(sets, errors):
                heard.clear()
                await heard.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return sets, errors


async def test_a_list_answer_that_never_ends_fails_the_attempt_and_the_next_list_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "MAX_ANSWER_BYTES", 256 * 1024)
    lists = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        if request.query.get("watch") == "true":
            return await quiet_watch(request)
        lists += 1
        if lists == 1:
            return await endless(request, head=b'{"metadata":{"resourceVersion":"7"},"items":[')
        return page("a")

    async with api_server(tmp_path, handle) as access:
        sets, errors = await _watch_until(access, lambda sets, _: bool(sets))
    assert isinstance(errors[0], kube.AnswerTooLargeError)
    assert set(sets[-1]) == {"n/a"}


async def test_a_list_comes_in_pages_and_every_page_is_in_the_set(tmp_path: Path) -> None:
    asked: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            return await quiet_watch(request)
        asked.append(dict(request.query))
        following = {"": ("a", "p2"), "p2": ("b", "p3"), "p3": ("c", "")}
        name, token = following[request.query.get("continue", "")]
        return page(name, token=token)

    async with api_server(tmp_path, handle) as access:
        sets, _ = await _watch_until(access, lambda sets, _: bool(sets))
    assert set(sets[0]) == {"n/a", "n/b", "n/c"}
    assert all(query["limit"] == str(kube.LIST_PAGE) for query in asked)


async def test_continue_tokens_without_end_fail_the_attempt_past_the_most_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "MAX_LISTED", 5)
    served = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        return page(f"o{served}", token=f"t{served}")

    async with api_server(tmp_path, handle) as access:
        sets, errors = await _watch_until(access, lambda _, errors: bool(errors))
    assert "over 5 objects" in str(errors[0])
    assert not sets


async def test_a_watch_adding_names_past_the_most_listed_fails_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lists were bounded, their watches not: ADDED events of new names grew memory
    # without end. Past the bound the attempt fails (backoff, relist); a change to a
    # name already held at the bound is still read.
    monkeypatch.setattr(kube, "MAX_LISTED", 3)
    events = [("MODIFIED", "a"), ("ADDED", "b"), ("MODIFIED", "b")]
    events += [("ADDED", f"new-{n}") for n in range(5)]

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return page("a", "c")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for kind, name in events:
            line = json.dumps({"type": kind, "object": {**named(name), "spec": {"k": kind}}})
            await response.write(line.encode() + b"\n")
        await request.app[_STOP].wait()
        return response

    heard: list[tuple[str, str | None]] = []

    def on_event(key: str, obj: RawObject | None) -> None:
        heard.append((key, None if obj is None else obj["spec"]["k"]))

    async with api_server(tmp_path, handle) as access:
        _, errors = await _watch_until(access, lambda _, errors: bool(errors), on_event=on_event)
    assert "over 3 objects" in str(errors[0])
    assert heard[:3] == [("n/a", "MODIFIED"), ("n/b", "ADDED"), ("n/b", "MODIFIED")]
    assert ("n/new-0", "ADDED") not in heard


@pytest.mark.parametrize(
    "token_of",
    [
        pytest.param(lambda n: f"t{n}", id="empty pages each with a new continue token"),
        pytest.param(lambda n: "again", id="empty pages with the same continue token"),
    ],
)
async def test_pages_of_nothing_without_end_fail_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token_of: Callable[[int], str]
) -> None:
    # Hostile pass 12: items alone were bounded, so pages of nothing were asked for
    # without end (14,613 in 10 s), with no error heard and no watch started.
    monkeypatch.setattr(kube, "MAX_LIST_PAGES", 5)
    served = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        return page(token=token_of(served))

    async with api_server(tmp_path, handle) as access:
        sets, errors = await _watch_until(access, lambda _, errors: bool(errors))
    assert "pages" in str(errors[0]) and not sets
    assert served <= 5 * len(errors)  # each attempt ends within its pages


@pytest.mark.parametrize(
    ("bound", "value", "token", "said"),
    [
        pytest.param(
            "MAX_CONTINUE_CHARS", 8192, "t" * 8193, "over 8,192 characters",
            id="a continue token of 8 KiB and one character fails the attempt at once",
        ),
        pytest.param(
            "MAX_LIST_BYTES", 1_000, "next", "over 1,000 bytes",
            id="pages past the list's bytes in all fail the attempt",
        ),
    ],
)  # fmt: skip
async def test_a_list_is_bounded_in_its_tokens_and_bytes_not_only_items_and_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str, value: int, token: str, said: str
) -> None:
    # Hostile pass 13: each page's token was kept whole to spot one coming again; tokens
    # of 1 MiB held 1.5 GB by page 1,000.
    monkeypatch.setattr(kube, bound, value)
    served = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        return page("x" * 300, token=f"{token}{served}")

    async with api_server(tmp_path, handle) as access:
        sets, errors = await _watch_until(access, lambda _, errors: bool(errors))
    assert said in str(errors[0]) and not sets


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param([], id="a list"),
        pytest.param(None, id="null"),
        pytest.param("ok", id="a string"),
        pytest.param({"status": {}}, id="an object without metadata"),
    ],
)
async def test_a_write_answered_with_no_object_is_a_value_error(
    tmp_path: Path, answer: object
) -> None:
    # Hostile pass 12: a proxy's [] to a status apply was returned as the object after it.
    async with api_server(tmp_path, _answer(answer)) as access, await access.client() as api:
        with pytest.raises(ValueError, match="not an object with metadata"):
            await kube.apply(
                api, DATASETS, {"metadata": {"name": "d", "namespace": "n"}}, field_manager="t"
            )


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": "d"}},
            id="a Status without metadata, as Kubernetes may answer a delete",
        ),
        pytest.param({"metadata": {"name": "d"}}, id="the object being deleted"),
        pytest.param([], id="no object at all: nothing reads a delete's answer"),
    ],
)
async def test_a_delete_answered_with_a_status_is_done(tmp_path: Path, answer: object) -> None:
    # Hostile pass 14: the delete's answer was read as a write's, so a Status with no
    # metadata raised ValueError after the object was gone.
    async with api_server(tmp_path, _answer(answer)) as access, await access.client() as api:
        await kube.delete(api, DATASETS, "n", "d", uid="u-1")


async def test_an_error_answer_that_never_ends_keeps_its_first_bytes_only(tmp_path: Path) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await endless(request, status=500)

    async with api_server(tmp_path, handle) as access:
        _, errors = await _watch_until(access, lambda _, errors: bool(errors))
    assert isinstance(errors[0], client.ApiException)
    assert errors[0].status == 500
    assert len(errors[0].body or b"") == kube.MAX_ERROR_BYTES


@pytest.mark.parametrize(
    ("status", "raised"),
    [
        pytest.param(201, kube.AnswerTooLargeError, id="a write answered without end is refused"),
        pytest.param(409, client.ApiException, id="a write refused without end keeps the status"),
    ],
)
async def test_a_write_answer_that_never_ends_is_read_to_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, raised: type[Exception]
) -> None:
    monkeypatch.setattr(kube, "MAX_ANSWER_BYTES", 256 * 1024)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await endless(request, status=status)

    async with api_server(tmp_path, handle) as access, await access.client() as api:
        with pytest.raises(raised) as caught:
            await kube.create(api, DATASETS, {"metadata": {"name": "d", "namespace": "n"}})
    if isinstance(caught.value, client.ApiException):
        assert len(caught.value.body or b"") == kube.MAX_ERROR_BYTES


def _answer(body: object) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    return handle


async def _hang_up(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def _not_json(request: web.Request) -> web.StreamResponse:
    return web.Response(text="<html>a proxy</html>", content_type="application/json")


async def _endless_configmap(request: web.Request) -> web.StreamResponse:
    return await endless(request, head=b'{"data":{"config.yaml":"')


@pytest.mark.parametrize(
    ("handler", "said"),
    [
        pytest.param(_hang_up, "Server disconnected", id="an API server that hangs up"),
        pytest.param(_not_json, "JSONDecodeError", id="an answer that is not JSON"),
        pytest.param(_answer(["x"]), "not an object", id="an answer that is a list"),
        pytest.param(_answer({"data": ["config.yaml"]}), "no mapping", id="data that is a list"),
        pytest.param(_answer({"data": "config.yaml"}), "no mapping", id="data that is a string"),
        pytest.param(
            _answer({"data": {"config.yaml": {"policy": {}}}}),
            "is no text",
            id="a key whose value is a mapping, not text",
        ),
        pytest.param(_answer({"data": {}}), "has no key", id="a ConfigMap without the key"),
        pytest.param(_endless_configmap, "AnswerTooLargeError", id="an answer without end"),
    ],
)
async def test_a_bad_configmap_answer_at_startup_is_one_config_error_naming_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handler: Handler, said: str
) -> None:
    monkeypatch.setattr(kube, "MAX_ANSWER_BYTES", 256 * 1024)
    async with api_server(tmp_path, handler) as access:
        with pytest.raises(ConfigError) as caught:
            await read_configmap(access, "ns", "cfg", "config.yaml")
    message = str(caught.value)
    assert message.startswith("--config-configmap ns/cfg: ")
    assert said in message
    assert "\n" not in message and len(message) < 2500


async def test_a_good_configmap_answer_at_startup_is_its_text(tmp_path: Path) -> None:
    body = {"kind": "ConfigMap", "data": {"config.yaml": "policy: {}\n"}}
    async with api_server(tmp_path, _answer(body)) as access:
        assert await read_configmap(access, "ns", "cfg", "config.yaml") == "policy: {}\n"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(["config.yaml"], id="a watched ConfigMap whose data is a list"),
        pytest.param("config.yaml", id="a watched ConfigMap whose data is a string"),
        pytest.param({"config.yaml": 5}, id="a watched ConfigMap whose key holds a number"),
        pytest.param({"config.yaml": None}, id="a watched ConfigMap whose key holds null"),
    ],
)
def test_a_watched_configmap_of_the_wrong_shape_is_a_config_error(data: object) -> None:
    with pytest.raises(ConfigError):
        configmap_text({"cfg": {"data": data}}, "cfg", "config.yaml")


_UNUSABLE = [
    pytest.param(
        '[{name: c, cluster: {server: "https://127.0.0.1:1", certificate-authority-data: "!!!"}}]',
        id="certificate-authority-data that is no PEM (ssl.SSLError from the client)",
    ),
    pytest.param(
        "[{name: c, cluster: {server: 12345}}]",
        id="a server that is a number (AssertionError from the client)",
    ),
]


def _unusable(tmp_path: Path, clusters: str) -> KubeAccess:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: {clusters}\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return KubeAccess(path)


@pytest.mark.parametrize("clusters", _UNUSABLE)
async def test_a_kubeconfig_the_client_cannot_build_on_is_one_config_error(
    tmp_path: Path, clusters: str
) -> None:
    with pytest.raises(ConfigError, match=r"^--kubeconfig "):
        await _unusable(tmp_path, clusters).client()


@pytest.mark.parametrize("clusters", _UNUSABLE)
async def test_a_watch_whose_kubeconfig_turns_unusable_keeps_trying_and_warns_once(
    tmp_path: Path, clusters: str, caplog: pytest.LogCaptureFixture
) -> None:
    access = _unusable(tmp_path, clusters)
    with caplog.at_level(logging.DEBUG, logger="foundation.kube"):
        _, errors = await _watch_until(access, lambda _, errors: len(errors) >= 3)
    assert all(isinstance(err, ConfigError) for err in errors)
    errors_logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors_logged) == 1  # the same problem again is not a line a try
