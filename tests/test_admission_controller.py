"""The admission controller's shell without an API server: config, coalescing, the view."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any, cast

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client

from admission import annotations as names
from admission.app import AdmissionServer
from admission.cluster import PoolDemand
from admission.config import DEFAULT_CONTROLLER_NAME, AdmissionConfig, parse_config
from admission.controller import FRESH_SECONDS, WATCHES, Controller, _version, pool_labels
from admission.demand import DemandResult
from admission.metrics import AdmissionMetrics, MetricsServer
from admission.parameters import Headroom, Parameters, ReclaimParameters
from foundation.errors import ConfigError
from foundation.heap import PassHeap
from foundation.kube import KubeAccess
from foundation.timestamps import format_time
from tests import test_admission_decide as decided

UNITSCALE = [sys.executable, "-m", "unitscale.cli"]
NO_API = cast(client.ApiClient, None)
"""The passes here never call the API."""


# --- config ------------------------------------------------------------------------------


def test_the_defaults():
    config = parse_config("")
    assert config == AdmissionConfig()
    assert config.controller_name == DEFAULT_CONTROLLER_NAME == "unitscale.io/capacity"
    assert config.resync == 300.0
    assert config.logging.format == "text"


def test_a_full_file():
    config = parse_config(
        "controller-name: example.com/gpu\nmetrics-listen: 127.0.0.1:0\nresync: 2m\n"
        "debounce: 250ms\nlogging: {level: debug, format: json}\n"
    )
    assert config.controller_name == "example.com/gpu"
    assert config.resync == 120.0 and config.debounce == 0.25
    assert config.logging.level == "debug" and config.logging.format == "json"


def test_a_flag_overrides_the_file():
    config = parse_config(
        "controller-name: example.com/gpu\n", overrides={"controller-name": "a.b/c"}
    )
    assert config.controller_name == "a.b/c"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(
            "controller-name: Capacity Check\n", "controller-name", id="a-name-with-spaces"
        ),
        pytest.param("controller-name: capacity\n", "controller-name", id="a-name-without-a-path"),
        pytest.param(f"controller-name: a.b/{'x' * 130}\n", "controller-name", id="too-long"),
        pytest.param("metrics-listen: 9094\n", "metrics-listen", id="a-port-without-host"),
        pytest.param(
            f'metrics-listen: "{"a" * 64}é:0"\n', "metrics-listen", id="a non-ASCII host (M1)"
        ),
        pytest.param('metrics-listen: "a\\0b:0"\n', "metrics-listen", id="a host holding NUL"),
        pytest.param('metrics-listen: "[::1:0"\n', "metrics-listen", id="an unclosed IPv6 host"),
        pytest.param('metrics-listen: "[x::1]:0"\n', "metrics-listen", id="an IPv6 host not hex"),
        pytest.param("resync: 1s\n", "resync", id="a-resync-too-short"),
        pytest.param(
            "demand-timeout: 1ms\n",
            "demand-timeout",
            id="a forecast wait no answer meets over a network (pass 52)",
        ),
        pytest.param("resync: soon\n", "resync", id="not-a-duration"),
        pytest.param("write-concurrency: 0\n", "write-concurrency", id="no-writes-at-all"),
        pytest.param("logging: {format: xml}\n", "logging.format", id="an-unknown-log-format"),
        pytest.param("resync-seconds: 60\n", "resync-seconds", id="an-unknown-key"),
    ],
)
def test_a_bad_file_names_the_key(text, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_config(text, "admission.yaml")


@pytest.mark.parametrize(
    "listen",
    [
        pytest.param("[::1]:0", id="a bracketed IPv6 address"),
        pytest.param("localhost:0", id="a host name"),
    ],
)
def test_a_metrics_listen_of_an_ascii_host_or_ipv6_address_is_read(listen):
    assert parse_config(f'metrics-listen: "{listen}"\n').metrics_listen == listen


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("é..x", id="a non-ASCII host with an empty label: TypeError at bind"),
        pytest.param("a\0b", id="a host holding NUL: TypeError at bind"),
    ],
)
async def test_a_metrics_host_the_resolver_cannot_encode_is_a_config_error(host):
    """One line naming metrics-listen, not a TypeError (issue 27, M1; the config refuses
    these first, the server stands behind it)."""
    server = MetricsServer(AdmissionMetrics(), f"{host}:0", lambda: (True, {}))
    with pytest.raises(ConfigError, match="metrics-listen"):
        await server.start()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ["--controller-name", "no spaces please"],
            "key 'controller-name'",
            id="a-bad-controller-name-flag",
        ),
        pytest.param(
            ["--config", "{tmp}/missing.yaml"], "cannot read config file", id="a-missing-file"
        ),
        pytest.param(
            ["--kubeconfig", "{tmp}/no-kubeconfig", "--metrics-listen", "127.0.0.1:0"],
            "--kubeconfig",
            id="a-missing-kubeconfig",
        ),
    ],
)
def test_the_command_exits_2_naming_the_problem(tmp_path, args, expected):
    result = subprocess.run(
        [*UNITSCALE, "admission", *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


# --- the loop: coalescing and waiting for every watch ------------------------------------


class Counting(Controller):
    """A controller whose pass only records what it saw."""

    def __init__(self, **config):
        settings = {"resync": 3600, "debounce": 0.05, **config}
        super().__init__(KubeAccess(), AdmissionConfig(**settings), clock=lambda: 0.0)
        self.seen: list[int] = []
        self.synced_at_pass: list[bool] = []
        self.pass_done = asyncio.Event()

    async def reconcile(self, api):
        self.seen.append(len(self.watched["workloads"].objects))
        self.synced_at_pass.append(all(w.synced for w in self.watched.values()))
        self.pass_done.set()


def workload(i):
    return {"metadata": {"name": f"w{i}", "namespace": "team", "resourceVersion": str(i)}}


async def wait_for_pass(controller, condition):
    async with asyncio.timeout(10):
        while not condition():
            controller.pass_done.clear()
            await controller.pass_done.wait()


async def test_a_burst_of_a_thousand_changes_is_a_few_passes():
    controller = Counting()
    for name in WATCHES:
        controller._changed(name, {})
    loop = asyncio.create_task(controller._reconcile_forever(api=NO_API))
    try:
        objects = {}
        for i in range(1000):
            objects[f"team/w{i}"] = workload(i)
            controller._changed("workloads", dict(objects))
            await asyncio.sleep(0)  # let the loop run between events, as a watch does
        await wait_for_pass(controller, lambda: controller.seen and controller.seen[-1] == 1000)
    finally:
        loop.cancel()
    assert len(controller.seen) <= 3, controller.seen


async def test_a_change_after_a_quiet_spell_is_reconciled_at_once_and_passes_are_spaced():
    controller = Counting(debounce=60)  # a minute between the starts of two passes
    for name in WATCHES:
        controller._changed(name, {})
    loop = asyncio.create_task(controller._reconcile_forever(api=NO_API))
    try:
        await wait_for_pass(controller, lambda: bool(controller.seen))  # not a minute later
        controller._changed("workloads", {"team/w1": workload(1)})
        for _ in range(20):  # the loop runs between these, as between watch events
            await asyncio.sleep(0)
        assert controller.seen == [0], "a second pass within the debounce"
    finally:
        loop.cancel()


async def test_no_pass_runs_before_every_watch_has_listed():
    controller = Counting(debounce=0)  # a pass would follow a change at once
    loop = asyncio.create_task(controller._reconcile_forever(api=NO_API))
    try:
        names = list(WATCHES)
        for name in names[:-1]:
            controller._changed(name, {})
        for _ in range(10):
            await asyncio.sleep(0)
        # The last watch finds its CRD not installed: that counts as listed (empty).
        controller._failed(names[-1], client.ApiException(status=404, reason="Not Found"))
        await wait_for_pass(controller, lambda: bool(controller.seen))
    finally:
        loop.cancel()
    assert controller.synced_at_pass[0] is True


async def test_a_failing_pass_does_not_end_the_loop():
    class Failing(Counting):
        async def reconcile(self, api):
            await super().reconcile(api)
            raise RuntimeError("a bug in a pass")

    controller = Failing()
    for name in WATCHES:
        controller._changed(name, {})
    loop = asyncio.create_task(controller._reconcile_forever(api=NO_API))
    try:
        await wait_for_pass(controller, lambda: len(controller.seen) >= 1)
        controller.notify()
        await wait_for_pass(controller, lambda: len(controller.seen) >= 2)
    finally:
        loop.cancel()
    assert not loop.done() or loop.cancelled()


async def test_the_heap_is_settled_between_passes_after_a_failed_one_too():
    class Failing(Counting):
        async def reconcile(self, api):
            await super().reconcile(api)
            raise RuntimeError("a bug in a pass")

    class Heap:
        """Records how many passes had run at each settle."""

        def __init__(self) -> None:
            self.at: list[int] = []
            self.settled = asyncio.Event()

        def settle(self) -> int:
            self.at.append(len(controller.seen))
            self.settled.set()
            return 0

    heap = Heap()
    controller = Failing()
    controller._heap = cast(PassHeap, heap)
    for name in WATCHES:
        controller._changed(name, {})
    loop = asyncio.create_task(controller._reconcile_forever(api=NO_API))
    try:
        async with asyncio.timeout(10):
            while len(heap.at) < 2:
                heap.settled.clear()
                controller.notify()
                await heap.settled.wait()
    finally:
        loop.cancel()
    assert heap.at == [1, 2], "one settle after each pass, once it ended"


# --- the view ------------------------------------------------------------------------


def test_our_fresher_write_stands_in_until_the_watch_catches_up():
    controller = Counting()
    controller._changed("workloads", {"team/w": workload(5)})
    ours = {**workload(7), "status": {"ours": True}}
    controller._fresh[("workloads", "team/w")] = (ours, controller._clock())
    assert controller.snapshot().workloads["team/w"] is ours
    controller._changed("workloads", {"team/w": workload(9)})
    assert controller.snapshot().workloads["team/w"]["metadata"]["resourceVersion"] == "9"
    assert controller._fresh == {}


def test_our_write_stands_in_for_at_most_fresh_seconds_whatever_version_it_claims():
    """Hostile pass 13: an answer claiming resourceVersion 9999999999999999999 stayed newer
    than every real revision, and every pass read it instead of Kueue's changes."""
    now = [1_000.0]
    controller = Counting()
    controller._clock = lambda: now[0]
    controller._changed("workloads", {"team/w": workload(5)})
    ours = {**workload(9_999_999_999_999_999_999), "status": {"ours": True}}
    controller._fresh[("workloads", "team/w")] = (ours, now[0])
    controller._changed("workloads", {"team/w": workload(6)})
    assert controller.snapshot().workloads["team/w"] is ours
    now[0] += FRESH_SECONDS
    assert controller.snapshot().workloads["team/w"]["metadata"]["resourceVersion"] == "6"
    assert controller._fresh == {}


def _checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the workloads ``shape.malformed`` reads from now on."""
    from admission import shape

    read: list[str] = []
    real = shape.malformed

    def counting(kind: str, obj: object) -> str | None:
        if kind == "workload" and isinstance(obj, dict):
            read.append(obj["metadata"]["name"])
        return real(kind, obj)

    monkeypatch.setattr(shape, "malformed", counting)
    return read


def test_an_object_the_watch_did_not_replace_is_not_shape_checked_again(monkeypatch):
    """Its verdict stands while it is the same object: every pass re-read every template."""
    controller = Counting()
    controller._changed("workloads", {f"team/w{i}": workload(i) for i in range(3)})
    read = _checked(monkeypatch)
    controller.snapshot()
    assert sorted(read) == ["w0", "w1", "w2"]
    read.clear()
    controller.snapshot()
    assert read == []


@pytest.mark.parametrize(
    ("replacement", "kept"),
    [
        pytest.param(
            {"metadata": {"name": "w1", "namespace": "team"}},
            True,
            id="a well-formed change is kept",
        ),
        pytest.param(
            {"metadata": {"name": "w1", "namespace": "team"}, "spec": "x"},
            False,
            id="a change to a bad shape is left out",
        ),
    ],
)
def test_an_object_the_watch_replaced_is_checked_again(monkeypatch, replacement, kept):
    controller = Counting()
    controller._changed("workloads", {"team/w0": workload(0), "team/w1": workload(1)})
    controller.snapshot()
    read = _checked(monkeypatch)
    controller._changed(
        "workloads",
        {"team/w0": controller.watched["workloads"].objects["team/w0"], "team/w1": replacement},
    )
    view = controller.snapshot()
    assert read == ["w1"]
    assert ("team/w1" in view.workloads) is kept
    assert len(view.malformed) == (0 if kept else 1)


def test_the_verdicts_kept_are_those_of_the_objects_watched_now():
    controller = Counting()
    controller._changed("workloads", {f"team/w{i}": workload(i) for i in range(3)})
    controller.snapshot(take=True)
    controller._changed(
        "workloads", {"team/w2": controller.watched["workloads"].objects["team/w2"]}
    )
    view = controller.snapshot(take=True)
    kept = controller._shaped["workloads"]
    assert list(kept.good.values()) == [view.workloads["team/w2"]]
    assert not kept.bad
    assert view.changed["workloads"] == {"team/w0", "team/w1"}, "the two gone"


def _versioned(i: int, version: int, *, bad: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": f"w{i}", "namespace": "team", "resourceVersion": str(version)}
    }
    if bad:
        obj["spec"] = "not a mapping"
    return obj


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "put a bad shape", "delete", "our write", "relist"]),
            st.integers(0, 4),
        ),
        max_size=25,
    )
)
def test_a_view_kept_by_watch_events_is_the_view_a_list_gives(steps):
    """The same objects, by events or listed whole each time: the same view, and every
    key whose object differs from the last view is named changed."""
    by_events, by_lists = Counting(), Counting()
    objects: dict[str, dict[str, Any]] = {}
    for controller in (by_events, by_lists):
        for name in WATCHES:
            controller._changed(name, {})
    last = by_events.snapshot(take=True).workloads
    by_lists.snapshot(take=True)
    for version, (action, i) in enumerate(steps, start=1):
        key = f"team/w{i}"
        if action == "delete":
            objects.pop(key, None)
            by_events._heard("workloads", key, None)
        elif action == "our write":
            ours = _versioned(i, 10_000 + version)
            for controller in (by_events, by_lists):
                controller._fresh[("workloads", key)] = (ours, 0.0)
        elif action == "relist":
            by_events._changed("workloads", dict(objects))
        else:
            objects[key] = _versioned(i, version, bad=action == "put a bad shape")
            by_events._heard("workloads", key, objects[key])
        by_lists._changed("workloads", dict(objects))
        if action == "relist":  # a scrape's view between passes takes nothing from them
            by_events.snapshot()
        view, listed = by_events.snapshot(take=True), by_lists.snapshot(take=True)
        assert view.workloads.keys() == listed.workloads.keys()
        assert all(view.workloads[k] is listed.workloads[k] for k in listed.workloads)
        if not any(a == "put a bad shape" for a, _ in steps):
            # A watch's order, a changed object in its place (one left out for its shape
            # and then well shaped comes last, until a list).
            assert list(view.workloads) == list(listed.workloads)
        assert sorted(view.malformed) == sorted(listed.malformed)
        moved = {k for k in {*last, *view.workloads} if last.get(k) is not view.workloads.get(k)}
        assert moved <= view.changed["workloads"]
        last = view.workloads


@pytest.mark.parametrize(
    "version",
    [
        pytest.param("²", id="a superscript digit, which isdigit() takes and int() refuses"),
        pytest.param("9" * 5000, id="5,000 digits, past int()'s limit"),
        pytest.param("١٢", id="Arabic-Indic digits"),
        pytest.param(12, id="a number, not a string"),
    ],
)
@pytest.mark.parametrize("whose", ["ours", "watched"])
def test_a_resource_version_that_is_no_revision_never_fails_the_view(version, whose):
    """It reads as -1 (older than any revision); every pass failed on it (issue 27, H5)."""
    controller = Counting()
    ours, watched = workload(7), workload(5)
    (ours if whose == "ours" else watched)["metadata"]["resourceVersion"] = version
    controller._changed("workloads", {"team/w": watched})
    controller._fresh[("workloads", "team/w")] = (ours, controller._clock())
    expected = watched if whose == "ours" else ours
    assert controller.snapshot().workloads["team/w"] is expected


@given(st.one_of(st.text(max_size=40), st.integers(), st.none(), st.lists(st.integers())))
def test_any_resource_version_reads_as_a_revision_or_minus_one(version):
    number = _version({"metadata": {"resourceVersion": version}})
    assert number == -1 or 0 <= number < 10**19


def test_a_deleted_object_is_not_brought_back_by_our_write():
    controller = Counting()
    controller._fresh[("workloads", "team/w")] = (workload(7), controller._clock())
    controller._changed("workloads", {})
    assert controller.snapshot().workloads == {}


def test_a_resource_not_served_is_empty_and_reported():
    controller = Counting()
    controller._changed("datasets", {"team/d": {"metadata": {"name": "d"}}})
    controller._failed("datasets", client.ApiException(status=404, reason="Not Found"))
    assert controller.watched["datasets"].objects == {}
    healthy, details = controller.health()
    assert healthy
    assert details["absent"] == ["datasets.data.fluid.io"]


def test_a_controller_whose_watches_never_list_turns_unhealthy():
    controller = Counting()
    controller._failed("pods", client.ApiException(status=403, reason="Forbidden"))
    assert controller.health()[0]
    controller.started -= 2 * controller.config.resync + 61
    healthy, details = controller.health()
    assert not healthy
    assert "waiting for the first list" in details["problem"]
    assert "pods" in details["problem"]


def test_a_broken_connection_keeps_the_last_set():
    controller = Counting()
    controller._changed("pods", {"team/p": {"metadata": {"name": "p"}}})
    controller._failed("pods", aiohttp.ClientConnectionError("connection reset"))
    assert list(controller.watched["pods"].objects) == ["team/p"]
    assert "connection reset" in controller.health()[1]["watch_errors"]["pods"]


# --- the process's HTTP side ---------------------------------------------------------


def hami_node(name, cards):
    devices = [
        {
            "id": f"GPU-{name}-{i}",
            "index": i,
            "count": 10,
            "devmem": 143771,
            "devcore": 100,
            "type": "NVIDIA-NVIDIA H200",
            "mode": "hami-core",
            "health": True,
        }
        for i in range(cards)
    ]
    return {
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-nvidia-register": json.dumps(devices)},
        }
    }


def hami_pod(node, cards):
    allocated = "".join(f"GPU-{node}-{i},NVIDIA,143771,100:" for i in cards) + ";"
    return {
        "metadata": {
            "name": "p",
            "namespace": "team",
            "annotations": {"hami.io/vgpu-devices-allocated": allocated},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


async def test_metrics_and_health_are_served(tmp_path):
    controller = Counting(metrics_listen="127.0.0.1:0")
    server = AdmissionServer(controller.config, controller.access, controller)
    port = await server.http.start()
    try:
        controller.metrics.decided("capacity", "Ready", 12.0)
        # What a scrape computes from the view: a HAMi node of 4 cards, one pod on 1.
        controller._usable = {"capacity": Parameters()}
        controller._changed("nodes", {"gpu": hami_node("gpu", 4)})
        controller._changed("pods", {"team/p": hami_pod("gpu", [0])})
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                health = await response.json()
                status = response.status
    finally:
        await server.http.stop()
    assert 'unitscale_admission_decisions_total{check="capacity",outcome="Ready"} 1.0' in text
    # The pool's name, not the check's: this check's pool is every node HAMi registered.
    assert 'unitscale_admission_inventory_gpus{pool="*",state="total"} 4.0' in text
    assert 'unitscale_admission_inventory_gpus{pool="*",state="free"} 3.0' in text
    assert 'unitscale_admission_check_latency_seconds_bucket{check="capacity",le="30.0"' in text
    assert status == 200 and health["healthy"] is True and health["synced"] is False


def test_json_logging_writes_one_object_a_line():
    import io
    import json
    import logging

    from admission.app import configure_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    formatters = [(h, h.formatter) for h in root.handlers]
    try:
        configure_logging(parse_config("logging: {level: warning, format: json}\n"))
        assert root.level == logging.WARNING
        logging.getLogger("admission.controller").warning("check %s is not active", "capacity")
    finally:
        for each, formatter in formatters:  # pytest's own handlers, too
            each.setFormatter(formatter)
        root.removeHandler(handler)
        root.setLevel(level)
    entry = json.loads(stream.getvalue().splitlines()[-1])
    assert entry["level"] == "warning"
    assert entry["logger"] == "admission.controller"
    assert entry["message"] == "check capacity is not active"


def test_the_command_lines_log_level_wins_over_the_files():
    import logging

    from admission.app import configure_logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    try:
        configure_logging(parse_config("logging: {level: error}\n"), keep_level=True)
        assert root.level == logging.INFO
    finally:
        root.setLevel(level)


# --- what a pass tells a Workload ---------------------------------------------------------


class Writing(Controller):
    """A controller whose status writes land in ``written`` (its pass is the real one)."""

    def __init__(self, **kw) -> None:
        config = AdmissionConfig(resync=3600)
        super().__init__(KubeAccess(), config, clock=lambda: decided.NOW, **kw)
        self.written: dict[str, dict[str, Any]] = {}

    async def _apply(self, api, resource, name, key, body):
        if name == "workloads":
            self.written[key] = body["status"]["admissionChecks"][0]
        return True

    async def _event(self, api, event):
        return None


async def test_a_workload_naming_a_dataset_is_told_fluid_is_not_installed():
    controller = Writing()
    check = {"metadata": {"name": decided.CHECK}, "spec": {"controllerName": controller.name}}
    wanting = decided.workload("a", gpus=1, annotations={names.DATASET: "weights"})
    # Pending a minute ago (the fixture's times lie ahead of the clock, which counts as 0)
    a_minute_ago = format_time(decided.NOW - 60)
    wanting["metadata"]["creationTimestamp"] = a_minute_ago
    wanting["status"]["admissionChecks"][0]["lastTransitionTime"] = a_minute_ago
    controller._changed("admissionchecks", {decided.CHECK: check})
    controller._changed("workloads", {"train/a": wanting})
    controller._changed("nodes", {"gpu-1": decided.node("gpu-1")})
    controller._changed("pods", {})
    # The list of Datasets answers 404: the resource, not one object, is not served.
    controller._failed("datasets", client.ApiException(status=404, reason="Not Found"))
    await controller.reconcile(api=NO_API)
    entry = controller.written["train/a"]
    assert entry["state"] == "Pending"
    assert entry["message"].startswith("Fluid is not installed"), entry["message"]
    assert "does not exist" not in entry["message"]


def on(selector: str, pool: str | None = None, **kw) -> Parameters:
    """A check's parameters: nodes labelled ``gpu=<selector>``, the scaler's ``pool``."""
    headroom = Headroom("scaler:9090", pool, when_unavailable="Ignore") if pool else None
    return Parameters(pool_node_selector={"gpu": selector}, inference_headroom=headroom, **kw)


@pytest.mark.parametrize(
    ("checks", "labels"),
    [
        pytest.param(
            {"capacity": Parameters()}, ["*"], id="every-registered-node-is-the-pool-star"
        ),
        pytest.param(
            {"capacity": on("h200", "h200"), "gpu-l4": on("l4")},
            ["h200", "gpu=l4"],
            id="a-pool-is-named-by-the-scaler-else-by-its-selector-never-by-the-check",
        ),
        pytest.param(
            {"training": on("h200", "h200"), "lora": on("h200", "h200")},
            ["h200"],
            id="two-checks-on-one-pool-share-its-one-series",
        ),
        pytest.param(
            {"a": on("h200-a", "h200"), "b": on("h200-b", "h200")},
            ["h200/gpu=h200-a", "h200/gpu=h200-b"],
            id="one-name-over-two-selectors-gives-each-its-own-series",
        ),
    ],
)
def test_the_inventory_is_labelled_by_the_pool(checks, labels):
    assert sorted(pool_labels(checks)) == sorted(labels)


def test_the_inventory_gauge_names_pools_not_checks():
    controller = Writing()
    controller._usable = {"training": on("h200", "h200"), "lora": on("h200", "h200")}
    h200 = decided.node("gpu-1", 4, labels={"gpu": "h200"})
    controller._changed("nodes", {"gpu-1": h200})
    controller._changed("pods", {})
    controller.observe()
    samples = [
        (s.labels["pool"], s.labels["state"], s.value)
        for m in controller.metrics.registry.collect()
        for s in m.samples
        if s.name == "unitscale_admission_inventory_gpus"
    ]
    assert sorted(samples) == [("h200", "free", 4.0), ("h200", "total", 4.0)]


async def test_two_reclaiming_checks_on_one_pool_each_keep_their_plan_gauges(monkeypatch):
    """Each plans by its own policy: neither's allowance overwrites the other's."""
    reclaiming = {
        "strict": on("h200", "h200", reclaim=ReclaimParameters(enabled=True)),
        "roomy": on("h200", "h200", reclaim=ReclaimParameters(enabled=True, headroom_cards=2)),
    }
    monkeypatch.setattr(
        "admission.controller.params.check_parameters",
        lambda check, objects: reclaiming[check["metadata"]["name"]],
    )

    async def demand(scaler, pool, horizon, **_):
        return DemandResult({"h200": PoolDemand("h200", 0, 2)})

    controller = Writing(demand=demand)
    controller._changed(
        "admissionchecks",
        {
            name: {"metadata": {"name": name}, "spec": {"controllerName": controller.name}}
            for name in reclaiming
        },
    )
    controller._changed("workloads", {})
    controller._changed("nodes", {"gpu-1": decided.node("gpu-1", 8, labels={"gpu": "h200"})})
    controller._changed("pods", {})
    await controller.reconcile(api=NO_API)
    sample = controller.metrics.registry.get_sample_value
    allowance = "unitscale_admission_training_allowance_accelerators"
    strict = sample(allowance, {"pool": "h200", "check": "strict"})
    roomy = sample(allowance, {"pool": "h200", "check": "roomy"})
    assert (strict, roomy) == (6.0, 4.0)  # 8 cards - 2 needed, less 2 kept free for roomy


async def test_a_demand_answer_no_check_asks_for_goes_once_it_expires(monkeypatch):
    """One entry per edit of a check's scaler, pool or horizon was kept for good."""
    clock = [1000.0]
    monkeypatch.setattr("admission.controller.time.monotonic", lambda: clock[0])
    asked: list[tuple[str, str, float]] = []

    async def demand(scaler, pool, horizon, **_):
        asked.append((scaler, pool, horizon))
        return DemandResult({pool: PoolDemand(pool, 0, 1)})

    controller = Writing(demand=demand)
    for horizon in range(60, 60 + 50):  # an administrator editing the horizon, 50 times
        await controller._demand([Parameters(inference_headroom=asking(horizon))])
        clock[0] += 1.0
    assert len(controller._demand_cache) <= controller.config.demand_cache + 1
    clock[0] += controller.config.demand_cache
    await controller._demand([])
    assert controller._demand_cache == {}
    # The answer a check still asks for is kept for its time, and used.
    kept = [Parameters(inference_headroom=asking(300))]
    await controller._demand(kept)
    await controller._demand(kept)
    assert asked.count(("scaler:9090", "h200", 300.0)) == 1


def asking(horizon: int) -> Headroom:
    return Headroom("scaler:9090", "h200", horizon_seconds=horizon)


def _listed(controller: Controller, **sets: dict[str, Any]) -> None:
    """Every watch listed: our check, and ``sets`` by watch name (others empty)."""
    check = {"metadata": {"name": decided.CHECK}, "spec": {"controllerName": controller.name}}
    for name in WATCHES:
        controller._changed(name, sets.get(name, {}))
    controller._changed("admissionchecks", {decided.CHECK: check})


def _waiting(name: str, version: int, **kw: Any) -> dict[str, Any]:
    """A Workload Pending on our check since a minute ago, at ``resourceVersion``."""
    w = decided.workload(name, **kw)
    a_minute_ago = format_time(decided.NOW - 60)
    w["metadata"]["resourceVersion"] = str(version)
    w["metadata"]["creationTimestamp"] = a_minute_ago
    w["status"]["admissionChecks"][0]["lastTransitionTime"] = a_minute_ago
    return w


async def _fail_once(controller: Controller) -> None:
    """A pass that raises after it read the view (any step not isolated)."""
    real = controller._sync_checks

    async def failing(*args: Any, **kw: Any) -> Any:
        controller._sync_checks = real  # type: ignore[method-assign]
        raise RuntimeError("a step failed")

    controller._sync_checks = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await controller.reconcile(api=NO_API)


@pytest.mark.parametrize(
    "between",
    [
        pytest.param(lambda c: c.observe(), id="a metrics scrape between the events and the pass"),
        pytest.param(_fail_once, id="a pass that failed after reading the view"),
    ],
)
async def test_what_changed_between_two_passes_is_read_by_the_next_pass_that_ends(between):
    """Workload a (8 GPUs) waits on a pool without a card; it is deleted, then a node of 8
    and Workload b arrive. A scrape's view (or a failed pass) read the changed keys and the
    next pass never did: a was decided still, took the 8 GPUs, and b was told it does not
    fit (hostile pass 43)."""
    controller = Writing()
    _listed(controller, workloads={"train/a": _waiting("a", 5, gpus=8, priority=10)})
    await controller.reconcile(api=NO_API)
    assert controller.written["train/a"]["state"] == "Retry"
    controller._heard("workloads", "train/a", None)
    controller._heard("nodes", "gpu-1", decided.node("gpu-1"))
    controller._heard("workloads", "train/b", _waiting("b", 7, gpus=8))
    result = between(controller)
    if asyncio.iscoroutine(result):
        await result
    await controller.reconcile(api=NO_API)
    assert controller.written["train/b"]["state"] == "Ready", controller.written["train/b"]
    assert list(controller._pending) == ["train/b"]


STOPPING_WITH_A_RESYNC_UNDER_WAY = """
import asyncio, threading
from admission.decide import decide_all
from tests.test_admission_controller import NO_API, Writing, _listed, _waiting

started = threading.Event()

def hanging(pending, cluster, now):
    if threading.current_thread().name.startswith("resync"):
        started.set()
        threading.Event().wait()  # a pass from scratch that never ends
    return decide_all(pending, cluster, now)

async def main():
    controller = Writing(decide=hanging)
    _listed(controller, workloads={"train/a": _waiting("a", 5, gpus=1)})
    controller._resynced = controller._clock() - 3600
    await controller.reconcile(api=NO_API)
    await asyncio.to_thread(started.wait, 30)
    controller.resync.cancel()  # as run() does when the controller stops
    print("stopped", flush=True)

asyncio.run(main())
"""


def test_a_resync_under_way_holds_up_no_exit():
    """The executor's thread was joined at exit: a resync that hangs held the pod until its
    grace period ended (hostile pass 43). The resync runs in a daemon thread."""
    done = subprocess.run(
        [sys.executable, "-c", STOPPING_WITH_A_RESYNC_UNDER_WAY],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "stopped\n", done.stderr


def test_the_keys_kept_for_the_next_pass_are_bounded_by_the_objects():
    """Pods created and deleted while passes keep failing (or only scrapes read the view):
    10,000 keys were kept after 20 rounds of 500 (hostile pass 44). Past the objects'
    count, every key is read again instead."""
    controller = Writing()
    _listed(controller)
    controller.snapshot(take=True)
    for round_ in range(20):
        for i in range(200):
            key = f"serve/p{round_}-{i}"
            controller._heard("pods", key, {"metadata": {"name": key, "namespace": "serve"}})
            controller._heard("pods", key, None)
        controller.observe()
        kept = controller._unpassed["pods"]
        assert kept is None or len(kept) <= 64
    view = controller.snapshot(take=True)
    assert "pods" not in view.changed  # any: the pass reads every pod there is
