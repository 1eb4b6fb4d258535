"""watch_objects with ``on_event``: each watch event by key, the list as a whole set."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from foundation.kube import DATASETS, Selection, watch_objects
from foundation.objects import RawObject
from tests.test_scaler_hostile5_kube import _STOP, api_server, named, page


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
        for line in (event("ADDED", "b", "1"), event("MODIFIED", "a", "2")):
            await response.write(line)
        await response.write(event("DELETED", "a", "2"))
        await request.app[_STOP].wait()
        return response

    sets: list[dict[str, RawObject]] = []
    events: list[tuple[str, RawObject | None]] = []
    heard = asyncio.Event()

    def on_event(key: str, obj: RawObject | None) -> None:
        events.append((key, obj))
        heard.set()

    async with api_server(tmp_path, handle) as access:
        task = asyncio.create_task(
            watch_objects(access, Selection(DATASETS), sets.append, on_event=on_event)
        )
        try:
            async with asyncio.timeout(30):  # a cap against hangs, not a timing check
                while len(events) < 3:
                    heard.clear()
                    await heard.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert [set(s) for s in sets] == [{"n/a"}], "the list alone, as a whole set"
    assert [(key, obj and obj["spec"]["version"]) for key, obj in events] == [
        ("n/b", "1"),
        ("n/a", "2"),
        ("n/a", None),
    ]
