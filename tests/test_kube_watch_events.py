"""watch_objects with ``on_event``: each watch event by key, the list as a whole set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web

from foundation.objects import RawObject
from tests.test_scaler_hostile5_kube import _STOP, _watch_until, api_server, named, page


def event(kind: str, name: str, version: str) -> bytes:
    obj: dict[str, Any] = {**named(name), "spec": {"version": version}}
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def test_each_watch_event_is_heard_by_key_and_the_list_as_the_whole_set(
    tmp_path: Path,
) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return page("a")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for kind, name, version in (
            ("ADDED", "b", "1"),
            ("MODIFIED", "a", "2"),
            ("DELETED", "a", "2"),
        ):
            await response.write(event(kind, name, version))
        await request.app[_STOP].wait()
        return response

    events: list[tuple[str, RawObject | None]] = []
    async with api_server(tmp_path, handle) as access:
        sets, _ = await _watch_until(
            access, lambda *_: len(events) >= 3, on_event=lambda *e: events.append(e)
        )
    assert [set(s) for s in sets] == [{"n/a"}], "the list alone, as a whole set"
    assert [(key, obj and obj["spec"]["version"]) for key, obj in events] == [
        ("n/b", "1"),
        ("n/a", "2"),
        ("n/a", None),
    ]
