"""A config that flaps, or is written oddly, while the processes run (issue 27, pass 62).

A reload decided every ScaledObject at once, and one flapping every 25 ms kept a new
decision for each each time; a policy reload was answered only after the next snapshot;
a file rewritten at every poll was never read, one read that failed lost its change, a
file cut to a comment line gave every default, and an in-place rewrite with its mtime
put back went unseen. Real files; the registry's clock passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from foundation import files, reload
from foundation.errors import ConfigError
from foundation.reload import ConfigStore, holds_no_document, poll_file, watch_configmap
from scaler.config import ScalerConfig, parse_config
from scaler.core.model import Decision
from scaler.registry import PUSH_DECISION_GAP, ScaledObject, ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import T0, FakeClock, engine_signals, eventually, ref

GOOD, OTHER = "max-signal-age: 45s\n", "max-signal-age: 60s\n"


# --- the registry: a reload decides nothing until KEDA asks ------------------------------


def registry_of(count: int) -> tuple[ScaledObjectRegistry, FakeClock, list[ScaledObject]]:
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(
        store, 30.0, clock, parse_config("{}").policy_defaults(), push_gap=PUSH_DECISION_GAP
    )
    objects = []
    for i in range(count):
        receive(store, engine_signals(f"d{i}", at=T0, running=40.0, queue=24.0))
        r = ref(f"so{i}", "team-a", deployment=f"d{i}")
        objects.append(registry.resolve(r.name, r.namespace, dict(r.scalerMetadata)))
    return registry, clock, objects


def test_a_flapping_reload_decides_nothing_and_the_next_call_decides_on_the_newest():
    registry, clock, objects = registry_of(50)
    for scaled in objects:
        assert registry.current(scaled).desired_replicas == 4  # 64 in flight / 16
    decided: list[float] = []

    def hook(scaled: ScaledObject, decision: Decision, now: float) -> Decision:
        decided.append(now)
        return decision

    registry.add_decision_hook(hook)
    wide, narrow = (parse_config(f"policy: {{target-concurrency: {c}}}\n") for c in (16, 4))
    clock.now += 1
    for flap in range(200):
        config = (wide, narrow)[flap % 2]
        registry.set_default_max_signal_age(30.0 + flap % 2)
        registry.set_policy_defaults(config.policy_defaults())
    assert decided == []  # before: 50 decisions kept for each max-signal-age reload
    # The last reload (4 a replica) is answered at the next call, not the next snapshot.
    assert [registry.current(s).desired_replicas for s in objects] == [16] * 50
    assert len(decided) == 50


# --- the file watch ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def watching(
    path: Path, store: ConfigStore[ScalerConfig], interval: float = 0.01
) -> AsyncIterator[None]:
    # The file as it is now is the baseline, however late the task starts.
    task = asyncio.create_task(poll_file(store, path, interval, reload.file_fingerprint(path)))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def store_of(text: str, gap: float = 0.0) -> ConfigStore[ScalerConfig]:
    return ConfigStore(parse_config(text, "x"), parse_config, reload_gap=gap)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("# the scaler's config\n", id="a file cut to its comment line is refused"),
        pytest.param("---\n", id="a document marker alone is refused"),
        pytest.param("null\n", id="a null document is refused"),
        pytest.param(
            "\n  \n# a\n---\n~  # nothing\n", id="blanks, comments and a null are refused"
        ),
        pytest.param("--- null\n...\n", id="what yaml.safe_dump(None) writes is refused"),
        pytest.param("\ufeff# c\n", id="a byte-order mark and a comment are refused"),
        pytest.param("%YAML 1.1\n---\n", id="a directive and a marker are refused"),
        pytest.param("--- !!null ''\n", id="a tagged null is refused"),
    ],
)
async def test_a_file_holding_no_document_after_a_config_keeps_the_last_good(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    store = store_of(GOOD)
    async with watching(path, store):
        path.write_text(text)
        await eventually(lambda: store.errors == 1, "refused")
    # Before: taken as the defaults (30 s, every signal source dropped), no error.
    assert store.current.max_signal_age == 45.0 and store.reloads == 0
    assert "no YAML document" in store.last_error


@pytest.mark.parametrize(
    ("text", "blank"),
    [
        pytest.param("{}\n", False, id="the defaults written as an empty mapping are a document"),
        pytest.param("# a\nmax-signal-age: 1m\n", False, id="a comment before a key is one"),
        pytest.param("~x: 1\n", False, id="a key that begins with a tilde is one"),
        pytest.param("--- {a: 1}\n", False, id="a marker before a mapping is one"),
        pytest.param("null: 1\n", False, id="a key named null is one"),
        pytest.param(
            " " * 100_000 + "x: 1\n",
            False,
            id="a line of 100,000 blanks before a key is read in linear time",  # was cubic
        ),
        pytest.param("", True, id="nothing is none"),
    ],
)
def test_what_holds_no_document(text, blank):
    assert holds_no_document(text) is blank


async def test_a_read_that_fails_once_is_tried_again(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    store = store_of(GOOD)
    real = files.read_text
    failures: list[object] = []

    def flaky(*args):
        if not failures:
            failures.append(args)
            raise ConfigError("cannot read config file: [Errno 24] Too many open files")
        return real(*args)

    monkeypatch.setattr(reload, "read_text", flaky)
    async with watching(path, store):
        path.write_text(OTHER)
        # Before: one ERROR, and 45 s stayed in force until the next edit.
        await eventually(lambda: store.current.max_signal_age == 60.0, "applied")
    assert store.errors == 1


async def test_a_file_rewritten_at_every_poll_is_read_as_it_is(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    store = store_of(GOOD)

    async def rewrite_forever():
        for i in range(100_000):
            path.write_text(OTHER + "#" * (i % 7))  # the same config, a new fingerprint
            await asyncio.sleep(0.005)

    writer = asyncio.create_task(rewrite_forever())
    try:
        async with watching(path, store):
            # Before: never read, waiting for it to hold still, with no word of it.
            await eventually(lambda: store.current.max_signal_age == 60.0, "applied")
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def test_a_rewrite_of_the_same_size_with_its_mtime_put_back_is_seen(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    stat = path.stat()
    store = store_of(GOOD)
    async with watching(path, store):
        with path.open("r+") as file:  # in place: the same inode
            file.write(OTHER)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p, touch -r
        assert path.stat().st_mtime_ns == stat.st_mtime_ns
        await eventually(lambda: store.current.max_signal_age == 60.0, "applied")


async def test_a_flapping_file_is_applied_at_most_once_a_gap(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    gap = 0.25
    store = store_of(GOOD, gap)
    loop = asyncio.get_running_loop()

    async def flap_forever():
        for i in range(100_000):
            path.write_text((GOOD, OTHER)[i % 2])
            await asyncio.sleep(0.003)

    writer = asyncio.create_task(flap_forever())
    try:
        async with watching(path, store, interval=0.005):
            began = loop.time()
            await eventually(lambda: store.reloads >= 3, "three reloads")
            took = loop.time() - began
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    # Each reload after the first waited the gap: a scaler decided (before) or marked
    # every ScaledObject, restarted its sources, at every change.
    assert took >= 2 * gap


def test_a_reload_leaving_a_standby_without_a_profile_keeps_its_policy_and_the_rest_apply():
    """Raised out of the loop, the ScaledObjects after it kept the old policy, and the
    reload's signal sources never landed (hostile pass 63)."""
    clock = FakeClock(T0)
    store = SignalStore(clock)
    profiled = parse_config("policy: {profile: llama3-8b-h200}\n").policy_defaults()
    registry = ScaledObjectRegistry(store, 30.0, clock, profiled)
    objects = {}
    for name, extra in (("standby", {"standby": "true"}), ("plain", {}), ("other", {})):
        r = ref(name, "team-a", deployment=name, **extra)
        objects[name] = registry.resolve(r.name, r.namespace, dict(r.scalerMetadata))
    registry.set_policy_defaults(
        parse_config("policy: {target-concurrency: 8}\n").policy_defaults()
    )
    assert objects["standby"].policy.profile == "llama3-8b-h200"  # kept, logged
    assert [objects[n].policy.target_concurrency for n in ("plain", "other")] == [8.0, 8.0]


async def test_a_configmap_key_holding_no_document_keeps_the_last_good(monkeypatch):
    store = store_of(GOOD)

    async def watch(access: object, selection: object, changed: Any, **kwargs: object) -> None:
        changed({"cfg": {"data": {"config.yaml": OTHER}}})
        await eventually(lambda: store.reloads == 1, "applied")
        changed({"cfg": {"data": {"config.yaml": "# config.yaml\n"}}})
        await asyncio.Event().wait()

    monkeypatch.setattr(reload, "watch_objects", watch)
    task = asyncio.create_task(watch_configmap(store, None, "ns", "cfg", "config.yaml"))  # type: ignore[arg-type]
    try:
        # Before: the defaults, every signal source dropped (pass 63).
        await eventually(lambda: store.errors == 1, "refused")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert store.current.max_signal_age == 60.0 and "no YAML document" in store.last_error


async def test_a_configmap_key_blank_at_each_resync_is_refused_once_until_it_changes(
    monkeypatch,
):
    """A ConfigMap blank from the start logged an ERROR at every event handing it over
    (pass 64, LOW)."""
    store = store_of(GOOD)
    looked = []

    def counted(text: str) -> bool:
        looked.append(text)
        return holds_no_document(text)

    async def watch(access: object, selection: object, changed: Any, **kwargs: object) -> None:
        for text in ["# config.yaml\n"] * 3 + [OTHER, "# config.yaml\n"]:
            seen = len(looked)
            changed({"cfg": {"data": {"config.yaml": text}}})
            await eventually(lambda seen=seen: len(looked) > seen, "the update looked at")
        await asyncio.Event().wait()

    monkeypatch.setattr(reload, "holds_no_document", counted)
    monkeypatch.setattr(reload, "watch_objects", watch)
    task = asyncio.create_task(watch_configmap(store, None, "ns", "cfg", "config.yaml"))  # type: ignore[arg-type]
    try:
        await eventually(lambda: len(looked) == 5, "every update looked at")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Before: 4 errors, one per blank event. The blank after a good config is refused again.
    assert (store.errors, store.reloads, store.current.max_signal_age) == (2, 1, 60.0)


async def test_an_update_refused_waits_the_gap_as_one_applied():
    """Refused (or equal) texts were parsed nonstop: 1 MiB ones at 88-100% of a core."""
    store = store_of(GOOD, gap=0.3)
    loop = asyncio.get_running_loop()
    assert not await store.update_off_loop("max-signal-age: -1s\n", "refused")
    began = loop.time()
    await store.settle()
    assert loop.time() - began >= 0.2
