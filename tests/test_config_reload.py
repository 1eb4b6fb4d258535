"""Hot reload from a mounted ConfigMap directory: kubelet ``..data`` symlink swaps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from exporter.app import ExporterServer
from exporter.config import load_config
from exporter.config import parse_config as parse_exporter
from foundation import reload
from foundation.errors import ConfigError
from foundation.reload import ConfigSource, ConfigStore, parse_configmap_ref
from scaler.config import ScalerConfig
from scaler.config import load_config as load_scaler_config
from scaler.config import parse_config as parse_scaler
from scaler.server import ScalerServer
from tests.conftest import eventually
from tests.kubelet_volume import KubeletVolume

SCALER_BEFORE = """
max-signal-age: 30s
signal-sources:
  - address: 127.0.0.1:1
"""
SCALER_AFTER = """
max-signal-age: 10s
signal-sources:
  - address: 127.0.0.1:2
  - address: 127.0.0.1:3
"""


@pytest.fixture
def volume(tmp_path):
    return KubeletVolume(tmp_path / "config")


async def scaler_on(volume, text):
    volume.write({"config.yaml": text})
    path = volume.path("config.yaml")
    source = ConfigSource(path, poll_interval=0.05)
    server = ScalerServer(load_scaler_config(path), "127.0.0.1:0", source=source)
    await server.start()
    return server


async def test_the_scaler_follows_a_kubelet_symlink_swap(volume):
    server = await scaler_on(volume, SCALER_BEFORE)
    try:
        assert server.watched_sources == ["127.0.0.1:1"]
        volume.write({"config.yaml": SCALER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.config.max_signal_age == 10.0
        assert server.registry._default_max_age == 10.0
        assert server.watched_sources == ["127.0.0.1:2", "127.0.0.1:3"]
        assert server.configs.errors == 0
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("max-signal-age: [", "not valid YAML", id="broken-yaml-is-refused"),
        pytest.param("max-signal-agee: 5s\n", "max-signal-agee", id="an-unknown-key-is-named"),
        pytest.param("max-signal-age: -5s\n", "max-signal-age", id="a-bad-value-is-named"),
        pytest.param(
            "signal-sources: [{address: ''}]\n", "signal-sources.0.address", id="nested-keys-named"
        ),
    ],
)
async def test_a_bad_update_keeps_the_last_good_config(volume, caplog, text, fragment):
    server = await scaler_on(volume, SCALER_BEFORE)
    before = server.config
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            volume.write({"config.yaml": text})
            await eventually(lambda: server.configs.errors == 1, "refused update")
        assert server.config is before
        assert server.watched_sources == ["127.0.0.1:1"]
        assert fragment in server.configs.last_error
        assert any(fragment in r.getMessage() for r in caplog.records)
        # A good update after a bad one applies and clears the error.
        volume.write({"config.yaml": SCALER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert server.configs.last_error == ""
    finally:
        await server.stop(grace=0)


EXPORTER_BEFORE = """
interval: 1s
timeout: 500ms
deployments:
  - {namespace: team-a, deployment: llama, targets: ["127.0.0.1:1"]}
  - {namespace: team-a, deployment: qwen, targets: ["127.0.0.1:2"]}
"""
EXPORTER_AFTER = """
interval: 2s
timeout: 1s
stable-window: 30s
deployments:
  - {namespace: team-a, deployment: llama, targets: ["127.0.0.1:1", "127.0.0.1:3"]}
  - {namespace: team-b, deployment: mistral, targets: ["127.0.0.1:4"]}
"""


async def test_the_exporter_follows_a_kubelet_symlink_swap(volume):
    volume.write({"exporter.yaml": EXPORTER_BEFORE})
    path = volume.path("exporter.yaml")
    server = ExporterServer(load_config(path), source=ConfigSource(path, poll_interval=0.05))
    await server.start()
    try:
        exporter = server.exporter
        await eventually(lambda: exporter.cycles >= 1, "first cycle")
        llama = exporter.deployments[0]
        volume.write({"exporter.yaml": EXPORTER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload")
        assert (exporter.config.interval, exporter.config.timeout) == (2.0, 1.0)
        assert exporter.config.stable_window == 30.0
        assert [d.key for d in exporter.deployments] == [
            ("team-a", "llama", ""),
            ("team-b", "mistral", ""),
        ]
        # A deployment that stays keeps its state (histories, errors); its config is new.
        assert exporter.deployments[0] is llama
        assert llama.config.targets[-1] == "http://127.0.0.1:3/metrics"
        exposition = generate_latest(server.registry).decode()
        assert 'unitscale_config_reloads_total{result="success"} 1.0' in exposition
        assert 'unitscale_config_reloads_total{result="error"} 0.0' in exposition
    finally:
        await server.stop()


def test_a_store_ignores_an_update_that_changes_nothing():
    store = ConfigStore(load_scaler_config(None), lambda text, origin: load_scaler_config(None))
    assert not store.update("", "same")
    assert (store.reloads, store.errors) == (0, 0)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param("keda/unitscale", ("keda", "unitscale", "config.yaml"), id="key-defaults"),
        pytest.param("a/b:exporter.yaml", ("a", "b", "exporter.yaml"), id="key-after-a-colon"),
    ],
)
def test_configmap_refs(ref, expected):
    assert parse_configmap_ref(ref) == expected


@pytest.mark.parametrize(
    "ref",
    [
        pytest.param("unitscale", id="a-name-without-namespace-is-refused"),
        pytest.param("a/b/c", id="two-slashes-are-refused"),
        pytest.param("/b", id="an-empty-namespace-is-refused"),
        pytest.param("", id="an-empty-reference-is-refused"),
    ],
)
def test_bad_configmap_refs(ref):
    with pytest.raises(ConfigError, match="NAMESPACE/NAME"):
        parse_configmap_ref(ref)


def test_an_empty_configmap_flag_is_refused_not_taken_for_none():
    with pytest.raises(ConfigError, match="--config-configmap '': expected NAMESPACE/NAME"):
        ConfigSource(None, "")


def test_file_and_configmap_exclude_each_other(tmp_path):
    with pytest.raises(ConfigError, match="exclude each other"):
        ConfigSource(tmp_path / "x.yaml", "a/b")


# A duration key set to a value of the wrong type: each once killed the file watcher.
WRONG_TYPES = [
    pytest.param("~", id="null"),
    pytest.param("[1, 2]", id="a-list"),
    pytest.param("{a: 1}", id="a-mapping"),
    pytest.param("2024-01-01", id="a-date"),
]


def _errors_logged(caplog, fragment):
    return [
        r
        for r in caplog.records
        if r.name == "foundation.reload" and r.levelno == logging.ERROR and fragment in r.message
    ]


@pytest.mark.parametrize("value", WRONG_TYPES)
async def test_the_scaler_survives_a_duration_of_the_wrong_type(volume, caplog, value):
    from prometheus_client import CollectorRegistry

    from scaler.telemetry import DecisionCollector

    server = await scaler_on(volume, SCALER_BEFORE)
    before = server.config
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            volume.write({"config.yaml": f"max-signal-age: {value}\n"})
            await eventually(lambda: server.configs.errors == 1, "refused update")
        assert server.config is before
        assert len(_errors_logged(caplog, "max-signal-age")) == 1
        collectors = CollectorRegistry(auto_describe=False)
        collectors.register(DecisionCollector(server.registry, server.configs))
        assert (
            'unitscale_config_reloads_total{result="error"} 1.0'
            in generate_latest(collectors).decode()
        )
        # The watcher is still alive: a later valid config is applied.
        volume.write({"config.yaml": SCALER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload after a bad update")
        assert server.watched_sources == ["127.0.0.1:2", "127.0.0.1:3"]
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize("value", WRONG_TYPES)
async def test_the_exporter_survives_an_interval_of_the_wrong_type(volume, caplog, value):
    volume.write({"exporter.yaml": EXPORTER_BEFORE})
    path = volume.path("exporter.yaml")
    source = ConfigSource(path, poll_interval=0.05)
    server = ExporterServer(parse_exporter(await source.read(), source.origin), source=source)
    await server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            volume.write({"exporter.yaml": f"interval: {value}\n"})
            await eventually(lambda: server.configs.errors == 1, "refused update")
        assert len(_errors_logged(caplog, "interval")) == 1
        exposition = generate_latest(server.registry).decode()
        assert 'unitscale_config_reloads_total{result="error"} 1.0' in exposition
        volume.write({"exporter.yaml": EXPORTER_AFTER})
        await eventually(lambda: server.configs.reloads == 1, "reload after a bad update")
        assert server.exporter.config.interval == 2.0
    finally:
        await server.stop()


@pytest.mark.parametrize("value", WRONG_TYPES)
async def test_the_gateway_survives_a_buffer_timeout_of_the_wrong_type(volume, caplog, value):
    from serving.config import parse_config as parse_gateway
    from serving.server import GatewayServer

    volume.write({"gateway.yaml": "replicas: [http://127.0.0.1:1]\n"})
    source = ConfigSource(volume.path("gateway.yaml"), poll_interval=0.05)
    config = parse_gateway(await source.read(), source.origin)
    server = GatewayServer(
        config.replicas, config.settings(), "127.0.0.1:0", "127.0.0.1:0",
        config=config, source=source, parse=parse_gateway,
    )  # fmt: skip
    await server.start()
    configs = server.configs
    assert configs is not None
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            volume.write({"gateway.yaml": f"buffer-timeout: {value}\n"})
            await eventually(lambda: configs.errors == 1, "refused update")
        assert len(_errors_logged(caplog, "buffer-timeout")) == 1
        # The gateway still follows its replica list.
        volume.write({"gateway.yaml": "replicas: [http://127.0.0.1:2]\n"})
        await eventually(lambda: configs.reloads == 1, "reload after a bad update")
        assert [r.url for r in server.gateway.replicas] == ["http://127.0.0.1:2"]
    finally:
        await server.stop()


class BoomError(RuntimeError):
    pass


def _parse_or_explode(text: str, origin: str) -> str:
    if text.strip() == "explode":
        raise BoomError("a parser bug")
    if text.startswith("bad"):
        raise ConfigError(f"{origin}: {text}")
    return text


@pytest.mark.parametrize(
    ("updates", "current", "errors"),
    [
        pytest.param(["explode", "good"], "good", 1, id="a-parser-crash-is-refused"),
        pytest.param(["bad one", "explode", "good"], "good", 2, id="errors-of-both-kinds-count"),
        pytest.param(["good", "explode"], "good", 1, id="a-crash-keeps-the-last-good"),
        pytest.param([b"\xff\xfe", "good"], "good", 1, id="a-file-that-is-not-utf-8-is-an-error"),
    ],
)  # fmt: skip
async def test_the_file_watch_survives_any_exception_from_parsing(
    tmp_path, caplog, updates, current, errors
):
    path = tmp_path / "config.yaml"
    path.write_text("first")
    source = ConfigSource(path, poll_interval=0.01)
    store = ConfigStore(await source.read(), _parse_or_explode)
    watch = asyncio.create_task(source.follow(store))
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            for seen, text in enumerate(updates, start=1):
                if isinstance(text, bytes):
                    path.write_bytes(text + b" " * seen)  # a new size: a new fingerprint
                else:
                    path.write_text(text + " " * seen)
                await eventually(lambda n=seen: store.reloads + store.errors == n, repr(text))
        assert store.current.strip() == current
        assert (store.errors, watch.done()) == (errors, False)
        crashes = _errors_logged(caplog, "BoomError")
        assert len(crashes) == updates.count("explode")
        assert all("a parser bug" in r.message and r.exc_info is None for r in crashes)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def test_a_listener_that_raises_does_not_stop_the_watch(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text("first")
    source = ConfigSource(path, poll_interval=0.01)
    store = ConfigStore(await source.read(), _parse_or_explode)
    calls = []

    def listener(config: str) -> None:
        calls.append(config)
        if len(calls) == 1:
            raise BoomError("a listener bug")

    store.add_listener(listener)
    watch = asyncio.create_task(source.follow(store))
    try:
        with caplog.at_level(logging.ERROR, logger="foundation.reload"):
            path.write_text("second")
            await eventually(lambda: len(calls) == 1, "first listener call")
            path.write_text("third!")
            await eventually(lambda: len(calls) == 2, "the watch goes on")
        assert store.current == "third!"
        assert len(_errors_logged(caplog, "a listener bug")) == 1
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


def scripted_file(monkeypatch, states):
    """``poll_file`` over a file whose (fingerprint, text) at each poll are given; the
    event is set once every state was seen, and ``read`` lists the texts read."""
    polls, done, read, now = iter(states), asyncio.Event(), [], [states[0]]

    def fingerprint(_path):
        now[0] = next(polls, None) or now[0]
        if now[0] is states[-1]:
            done.set()
        return now[0][0]

    def read_text(*_args):
        read.append(now[0][1])
        return now[0][1]

    monkeypatch.setattr(reload, "file_fingerprint", fingerprint)
    monkeypatch.setattr(reload, "read_text", read_text)
    return done, read


GOOD, OTHER = "max-signal-age: 45s\n", "max-signal-age: 60s\n"
EMPTY, WRITTEN = ((None, 1, 0, 1), ""), ((None, 1, 20, 2), OTHER)


@pytest.mark.parametrize(
    ("states", "age", "reads", "errors"),
    [
        pytest.param(
            [EMPTY, WRITTEN, WRITTEN],
            60.0,
            [OTHER],
            0,
            id="a file truncated then written is read once it holds still, never empty",
        ),
        pytest.param(
            [EMPTY, EMPTY],
            45.0,
            [""],
            1,
            id="an empty file after one with text is refused and the last good kept",
        ),
        pytest.param(
            [((None, 1, 3, 1), "{}\n"), ((None, 1, 3, 1), "{}\n")],
            30.0,
            ["{}\n"],
            0,
            id="the defaults written as an empty mapping are taken",
        ),
    ],
)
async def test_a_file_rewritten_in_place_is_read_once_it_holds_still(
    monkeypatch, states, age, reads, errors
):
    """A poll between a truncate and the write read the empty file, valid YAML, and
    applied every default (issue 27, hostile pass 11)."""
    store = ConfigStore(parse_scaler(GOOD, "x"), parse_scaler)
    done, read = scripted_file(monkeypatch, states)
    task = asyncio.create_task(reload.poll_file(store, Path("scaler.yaml"), 0, (None, 1, 14, 0)))
    await done.wait()
    await eventually(lambda: store.reloads + store.errors >= 1, "the change applied or refused")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert read == reads  # once, when it held still
    assert (store.current.max_signal_age, store.errors) == (age, errors)


async def taken(
    monkeypatch, states, interval: float
) -> tuple[ConfigStore[ScalerConfig], list[str]]:
    """``poll_file`` over a scripted file (``scripted_file``) polled every ``interval``
    until its first config is taken: the store and the texts read."""
    store = ConfigStore(parse_scaler(GOOD, "x"), parse_scaler)
    done, read = scripted_file(monkeypatch, states)
    task = asyncio.create_task(
        reload.poll_file(store, Path("scaler.yaml"), interval, (None, 1, 14, 0))
    )
    await done.wait()
    await eventually(lambda: store.reloads >= 1, "the config taken")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return store, read


HALF, WHOLE = "max-signal-age: 60s\n", "max-signal-age: 60s\ngrace-period: 7s\n"
STAMPED = "max-signal-age: '60s'  # don't edit: stamp %d\ngrace-period: 7s\n"


def sidecar(texts, inode=lambda n: 1):
    """A file changed at every poll: four polls that only look, then one poll per text
    that reads it (the three fingerprints of a read, alike), then the last held still."""
    looks = [((None, inode(n), 20 + n, n), texts[0]) for n in range(1, 5)]
    reads = [((None, inode(n), 30 + n, 10 + n), text) for n, text in enumerate(texts)]
    return looks + [state for state in reads for _ in range(3)]


@pytest.mark.parametrize(
    ("states", "reads", "grace", "reloads"),
    [
        pytest.param(
            sidecar([WHOLE, WHOLE]),
            [WHOLE, WHOLE],
            7.0,
            1,
            id="a sidecar rewriting one config at every poll has it taken at the second read",
        ),
        pytest.param(
            sidecar([HALF, WHOLE]),
            [HALF, WHOLE, WHOLE],
            7.0,
            1,
            id="a writer adding a line at every poll has no half of its config applied",
        ),
        pytest.param(
            sidecar([HALF, WHOLE], inode=lambda n: n),
            [HALF, WHOLE],
            7.0,
            1,
            id="a file swapped whole since the last read is taken at once",
        ),
        pytest.param(
            sidecar([WHOLE + "# written 1\n", WHOLE + "# written 2  # by a sidecar\n"]),
            [WHOLE + "# written 1\n", WHOLE + "# written 2  # by a sidecar\n"],
            7.0,
            1,
            id="reads alike but for their comments agree: a sidecar's stamp (hostile pass 68)",
        ),
        pytest.param(
            sidecar([STAMPED % 1, STAMPED % 2]),
            [STAMPED % 1, STAMPED % 2],
            7.0,
            1,
            id="a stamp in a comment holding a quote is a comment still (hostile pass 69)",
        ),
        pytest.param(
            sidecar([HALF + "# 1\n", HALF + "# 1\n# 2\n", WHOLE, WHOLE]),
            [HALF + "# 1\n", HALF + "# 1\n# 2\n", WHOLE, WHOLE],
            7.0,
            1,
            id="a half grown by a comment line is no read alike (hostile pass 69)",
        ),
    ],
)
async def test_a_file_changing_at_every_poll_is_taken_once_two_reads_agree(
    monkeypatch, states, reads, grace, reloads
):
    """Waiting for a sidecar's file to hold still, its changes were never read (hostile
    pass 62); taken at one read, a line-at-a-time writer had halves applied (pass 63);
    a stamped file renamed in place was never read alike twice (pass 64)."""
    store, read = await taken(monkeypatch, states, 0)
    assert read == reads
    assert (store.current.grace_period, store.reloads, store.errors) == (grace, reloads, 0)


NOW_NS = 10**18
"""The wall clock, in ns, of the quiet test's files (``_written_within``)."""
FAKE_WALL_CLOCK = SimpleNamespace(time_ns=lambda: NOW_NS, monotonic=time.monotonic)


async def test_a_file_written_within_the_quiet_time_is_read_again_once_it_rests(monkeypatch):
    """A writer writing a line every 70 ms once a poll interval had its first lines read
    alike twice, or taken as a file swapped whole, and applied (hostile pass 65)."""
    monkeypatch.setattr(reload, "time", FAKE_WALL_CLOCK)
    being_written = ((None, 1, 20, NOW_NS - 1_000_000), HALF)  # 1 ms ago: within 2.5 ms
    rested = ((None, 2, 40, NOW_NS - 10**10), WHOLE)  # 10 s ago
    states = [being_written] * 4 + [rested] * 4  # a look, then a read, of each
    store, read = await taken(monkeypatch, states, 0.01)
    assert read == [HALF, WHOLE]  # the half read, not taken
    assert (store.current.grace_period, store.reloads, store.errors) == (7.0, 1, 0)


async def test_a_sidecar_writing_faster_than_the_quiet_time_is_read_after_a_bound(monkeypatch):
    """A sidecar rewriting the config every 0.1 s never rested 0.2 s: its change was
    never applied (hostile pass 66). Past ``RESTLESS_POLLS`` reads refused so, the other
    rules take it: two reads alike."""
    monkeypatch.setattr(reload, "time", FAKE_WALL_CLOCK)
    fresh = NOW_NS - 1_000_000  # written 1 ms ago at every poll

    def written(n: int) -> tuple[tuple[object, ...], str]:
        return ((None, 1, len(WHOLE), fresh - n), WHOLE)  # whole each time: one size

    looks = [written(n) for n in range(1, 5)]
    reads = [written(n) for n in range(5, 5 + reload.RESTLESS_POLLS + 2) for _ in range(3)]
    store, read = await taken(monkeypatch, looks + reads, 0.01)
    assert len(read) == reload.RESTLESS_POLLS + 2  # refused 20 times, then two alike
    assert (store.current.grace_period, store.reloads) == (7.0, 1)


async def test_a_file_recreated_a_line_at_a_time_past_the_waiver_is_not_taken_at_a_half(
    monkeypatch,
):
    """Past the waiver a new inode was taken as a whole swap, and two reads alike at a
    half were taken too: a writer recreating the file a line every 90 ms had halves
    applied, 0 targets (hostile pass 67). Past it, the file's size must also have held
    at the last polls (a sidecar writing it whole keeps its size)."""
    monkeypatch.setattr(reload, "time", FAKE_WALL_CLOCK)
    part = "max-signal-age: 60s\ngrace-period: 3s\n"
    texts = [HALF, part] * (reload.RESTLESS_POLLS // 2 + 1) + [HALF, HALF, WHOLE]

    def recreated(n: int, text: str) -> tuple[tuple[object, ...], str]:
        return ((None, 100 + n, len(text), NOW_NS - 1_000_000 - n), text)  # a new inode

    looks = [recreated(n, HALF if n % 2 else part) for n in range(1, 5)]
    reads = [recreated(5 + i, t) for i, t in enumerate(texts) for _ in range(3)]
    store, _read = await taken(monkeypatch, looks + reads, 0.01)
    # Before: the part taken as a swap (grace 3), or the half read twice alike (grace 5).
    assert (store.current.grace_period, store.reloads) == (7.0, 1)
