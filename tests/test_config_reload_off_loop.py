"""A config reload never blocks the event loop (issue 27, hostile pass S-H6).

A reload's parse runs in a worker thread; text over ``MAX_CONFIG_TEXT`` is refused before
any parse; a ConfigMap handed over again at each resync is not parsed again.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest

from foundation import reload
from foundation.errors import ConfigError
from foundation.reload import MAX_CONFIG_TEXT, ConfigStore, watch_configmap
from scaler.config import parse_config
from tests.test_prometheus_source import drain


class Parser:
    """A config parser that records where it ran and how often."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self, text: str, origin: str) -> str:
        self.threads.append(threading.get_ident())
        if text.startswith("bad"):
            raise ConfigError(f"{origin}: bad config")
        return text


async def test_a_reload_parses_in_a_worker_thread_never_on_the_loop():
    parser = Parser()
    store: ConfigStore[str] = ConfigStore("first", parser)
    assert await store.update_off_loop("second", "file")
    assert store.current == "second"
    assert parser.threads and threading.get_ident() not in parser.threads


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        pytest.param("x" * (MAX_CONFIG_TEXT + 1), False,
                     id="a config over 1 MiB is refused before any parse"),
        pytest.param("x" * MAX_CONFIG_TEXT, True, id="a config of exactly 1 MiB is parsed"),
        pytest.param("bad", True, id="a bad config is parsed, refused and counted"),
    ],
)  # fmt: skip
async def test_a_reload_refuses_oversized_text_before_parsing_it(text, parsed):
    parser = Parser()
    store: ConfigStore[str] = ConfigStore("first", parser)
    changed = await store.update_off_loop(text, "file")
    assert bool(parser.threads) == parsed
    assert changed == (store.errors == 0)
    assert store.current == (text if changed else "first")


@pytest.mark.parametrize(
    ("reparse_after", "again"),
    [
        pytest.param(3600.0, False, id="a refused text handed over again is not parsed again"),
        pytest.param(0.0, True, id="a refused text is parsed again once the interval passed"),
    ],
)
async def test_a_configmap_handed_over_again_is_not_parsed_again(monkeypatch, reparse_after, again):
    # Hostile pass 15: a refused 1 MiB text was parsed again (4.4 s) at every event that
    # handed it over unchanged (a relist, an annotation stamped on the ConfigMap).
    monkeypatch.setattr(reload, "REPARSE_REFUSED_SECONDS", reparse_after)
    parser = Parser()
    store: ConfigStore[str] = ConfigStore("first", parser)
    handled = asyncio.Event()
    for name in ("update_off_loop", "reject"):
        real = getattr(store, name)

        def told(*args: Any, _real: Any = real) -> Any:
            handled.set()
            return _real(*args)

        async def told_async(*args: Any, _real: Any = real) -> Any:
            result = await _real(*args)
            handled.set()
            return result

        setattr(store, name, told_async if name == "update_off_loop" else told)
    steps = [  # (the ConfigMap's data, whether the apply task acts on it)
        ({"config.yaml": "second"}, True),
        ({"config.yaml": "second"}, False),  # a resync: the same good text
        ({"config.yaml": "bad"}, True),
        ({"config.yaml": "bad"}, again),  # refused already: again only after the interval
        ({}, True),  # the key is gone: refused without a parse
        ({"config.yaml": "third"}, True),
    ]
    done = asyncio.Event()

    async def watch(access: Any, selection: Any, changed: Any, **kwargs: Any) -> None:
        for data, acts in steps:
            handled.clear()
            changed({"cfg": {"data": data}})
            if acts:
                await handled.wait()
            else:
                for _ in range(5):  # the apply task runs on these yields, no time passes
                    await asyncio.sleep(0)
        done.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(reload, "watch_objects", watch)
    task = asyncio.create_task(watch_configmap(store, None, "ns", "cfg", "config.yaml"))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(30):
            await done.wait()
    finally:
        await drain(task)
    assert store.current == "third"
    # second, bad, (bad,) third: the resync is not parsed
    assert len(parser.threads) == (4 if again else 3)
    assert store.errors == (3 if again else 2)  # bad (twice), the missing key once


async def test_a_parse_that_never_ends_is_refused_past_the_deadline_and_the_next_applies():
    release = threading.Event()

    def parse(text: str, origin: str) -> str:
        if text == "stuck":  # a side file whose open blocks for good (S4-H2)
            release.wait()
        return text

    store: ConfigStore[str] = ConfigStore("first", parse, parse_deadline=0.05)
    try:
        assert not await store.update_off_loop("stuck", "file")
        assert store.current == "first" and store.errors == 1
        assert "not parsed within 0.05s" in store.last_error
        assert await store.update_off_loop("next", "file")
        assert store.current == "next" and store.last_error == ""
    finally:
        release.set()


async def test_a_reload_naming_a_fifo_as_ca_file_is_refused_and_the_next_applies(tmp_path):
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    store = ConfigStore(parse_config("max-signal-age: 30s\n", "live"), parse_config)
    bad = f"prometheus-source:\n  url: https://127.0.0.1:1\n  ca-file: {fifo}\n"
    assert not await store.update_off_loop(bad, "live")
    assert "not a regular file (a FIFO)" in store.last_error
    assert await store.update_off_loop("max-signal-age: 45s\n", "live")
    assert store.current.max_signal_age == 45.0
