"""The prewarm under hostile Fluid objects, failing plans and writes, and no API access.

Issue 27's second hostile pass (S-H4, M6, M8): a watched object of the wrong shape is
unreadable alone (left out, counted, one WARNING); one ScaledObject's plan or write that
raises fails that ScaledObject alone and recovers; no Kubernetes access backs off; a
DataLoad's finish time from the future is not trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from foundation.fluid import STATUS_LAG_SECONDS, meta
from foundation.kube import KubeAccess
from foundation.signals import GatewaySignals, Snapshot
from foundation.timestamps import format_time
from scaler.prewarm import shell
from scaler.prewarm.plan import CLOCK_SLACK_SECONDS, RELOAD_RESET_SECONDS, FluidView, Track, plan
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from tests.conftest import T0, FakeClock
from tests.test_prewarm_plan import KEY, NOW, SPEC, dataset, load, view

BASE = {"scalerAddress": "x:1", "targetUtilization": "1"}


def fluid_dataset(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "serving", "uid": f"u-{name}"},
        "status": {"phase": "Bound", "cacheStates": {"cachedPercentage": "0.0%"}},
    }


class Harness:
    """Two prewarm ScaledObjects (a, b) on a registry whose clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = FakeClock(T0)
        self.store = SignalStore(self.clock)
        self.registry = ScaledObjectRegistry(self.store, 60.0, self.clock)
        self.prewarm = shell.Prewarmer(
            self.registry, KubeAccess(Path("/nonexistent/kubeconfig")), self.clock
        )
        self.scaled = {
            name: self.registry.resolve(
                f"llama-{name}",
                "serving",
                {**BASE, "deployment": f"llama-{name}", "fluidDataset": f"weights-{name}"},
            )
            for name in ("a", "b")
        }

    def feed(self, datasets: dict[str, Any], dataloads: dict[str, Any]) -> None:
        """What the two watches would hand over."""
        self.prewarm._on_change("datasets")(datasets)
        self.prewarm._on_change("dataloads")(dataloads)

    def reason(self, name: str) -> str:
        self.clock.now += 1
        target = ("serving", f"llama-{name}", "")
        self.store.update(Snapshot(target, GatewaySignals(self.clock.now, None, 1, 0)))
        return self.registry.current(self.scaled[name]).reason


def bad_status(shape: Any) -> dict[str, Any]:
    ds = fluid_dataset("weights-b")
    ds["status"] = shape
    return ds


def bad_cache(shape: Any) -> dict[str, Any]:
    ds = fluid_dataset("weights-b")
    ds["status"]["cacheStates"] = shape
    return ds


def load_of(dataset_name: str, **fields: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": "x", "namespace": "serving"},
        "spec": {"dataset": {"name": dataset_name}},
    }
    body.update(fields)
    return body


@pytest.mark.parametrize(
    ("datasets", "dataloads"),
    [
        pytest.param({"serving/weights-b": bad_status(["Bound"])}, {},
                     id="a Dataset whose status is a list is unreadable alone"),
        pytest.param({"serving/weights-b": bad_cache([{"cachedPercentage": "0%"}])}, {},
                     id="a Dataset whose cacheStates is a list is unreadable alone"),
        pytest.param({}, {"other/x": load_of("weights-b") | {"spec": "weights"}},
                     id="a DataLoad in another namespace whose spec is a string is unreadable"),
        pytest.param({}, {"serving/x": load_of("weights-b", status={"conditions": ["Complete"]})},
                     id="a DataLoad whose conditions are strings is unreadable alone"),
        pytest.param({}, {"serving/x": load_of("weights-b") | {"spec": {"dataset": "weights-b"}}},
                     id="a DataLoad whose spec.dataset is a string is unreadable alone"),
        pytest.param({}, {"serving/x": load_of("weights-b", status={"waitingFor": [1]})},
                     id="a DataLoad whose waitingFor is a list is unreadable alone"),
    ],
)  # fmt: skip
def test_a_fluid_object_of_the_wrong_shape_is_unreadable_alone(
    datasets, dataloads, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="scaler.prewarm.shell")
    harness = Harness(monkeypatch)
    good = {"serving/weights-a": fluid_dataset("weights-a")}
    for _ in range(3):  # every resync hands the same set again
        harness.feed({**good, **datasets}, dataloads)
        harness.prewarm._replan()  # raised AttributeError before, and ended the loop
    assert "prewarm" in harness.reason("a") and "creating DataLoad" in harness.reason("a")
    harness.reason("b")  # planned on what can be read: nothing raises
    assert harness.prewarm.errors["unreadable"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreadable" in warnings[0], warnings


class SurpriseError(Exception):
    pass


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(AttributeError("'list' object has no attribute 'get'"),
                     id="an AttributeError in one plan fails that ScaledObject only"),
        pytest.param(RecursionError(), id="a RecursionError in one plan fails that one only"),
        pytest.param(SurpriseError("any"), id="any exception in one plan fails that one only"),
    ],
)  # fmt: skip
def test_one_scaled_objects_failing_plan_is_its_own_and_recovers(error, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="scaler.prewarm.shell")
    harness = Harness(monkeypatch)
    harness.feed({f"serving/weights-{n}": fluid_dataset(f"weights-{n}") for n in "ab"}, {})
    failing = [True]

    def plan_failing_for_b(key: Any, *args: Any, **kwargs: Any) -> Any:
        if key[1] == "llama-b" and failing[0]:
            raise error
        return plan(key, *args, **kwargs)

    monkeypatch.setattr(shell, "plan", plan_failing_for_b)
    for _ in range(3):
        harness.prewarm._replan()
        assert "creating DataLoad" in harness.reason("a")
        assert "prewarm" not in harness.reason("b")  # its decision stands, without a note
    assert harness.prewarm.errors["plan"] >= 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "llama-b" in warnings[0].getMessage()  # once, not per call
    failing[0] = False
    assert "creating DataLoad" in harness.reason("b")
    assert "works again" in caplog.text


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(json.JSONDecodeError("Expecting value", "<html>", 0),
                     id="a create answered with HTML fails that write only"),
        pytest.param(TypeError("list indices must be integers"),
                     id="a create that raises anything fails that write only"),
        pytest.param(["not", "a", "dataload"], id="a create answered with a JSON list is ours"),
    ],
)  # fmt: skip
async def test_a_write_answer_that_is_no_dataload_fails_that_write_alone(answer, monkeypatch):
    harness = Harness(monkeypatch)
    harness.feed({f"serving/weights-{n}": fluid_dataset(f"weights-{n}") for n in "ab"}, {})
    created: list[str] = []

    async def create(api: Any, resource: Any, body: dict[str, Any]) -> Any:
        created.append(body["metadata"]["name"])
        if len(created) == 1:  # the first write, whichever ScaledObject's
            if isinstance(answer, Exception):
                raise answer
            return answer
        return body

    monkeypatch.setattr(shell, "create", create)
    harness.reason("a"), harness.reason("b")
    await harness.prewarm._write_all(api=None)  # type: ignore[arg-type]
    harness.prewarm._replan()  # the stored answer, if any, is readable
    assert len(created) == 2  # the other ScaledObject's write went on
    failed = sum(s.write_errors for s in harness.prewarm.statuses())
    assert failed == (1 if isinstance(answer, Exception) else 0)


async def test_no_kubernetes_access_is_retried_at_a_doubling_backoff_and_logged_once(
    monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, logger="scaler.prewarm.shell")
    harness = Harness(monkeypatch)
    attempts = []
    for step in (0, 0.5, 1, 1.5, 2.5, 3, 5, 7, 7.5):  # seconds since the first try
        harness.clock.now = T0 + step
        before = harness.prewarm.errors["access"]
        assert await harness.prewarm._client() is None
        if harness.prewarm.errors["access"] > before:
            attempts.append(step)
    assert attempts == [0, 1, 3, 7]  # after 1 s, then 2, then 4
    assert len(caplog.records) == 1  # the same problem, once


async def test_a_watch_task_that_ends_is_started_again_and_counted(monkeypatch):
    started: list[str] = []
    stay, restarted = asyncio.Event(), asyncio.Event()

    async def watch(access: object, selection: Any, on_change: Callable[..., None], **kw: Any):
        started.append(selection.resource.plural)
        if len(started) == 4:
            restarted.set()
        if started.count(selection.resource.plural) > 1:
            await stay.wait()
        # the first watch on each resource ends at once, as a dead task would

    monkeypatch.setattr(shell, "watch_objects", watch)
    harness = Harness(monkeypatch)
    harness.prewarm._start_watches()
    await asyncio.gather(*harness.prewarm._watches.values())
    harness.prewarm._start_watches()
    async with asyncio.timeout(10):
        await restarted.wait()
    assert sorted(started) == ["dataloads", "dataloads", "datasets", "datasets"]
    assert harness.prewarm.errors["watch"] == 2
    stay.set()
    for task in harness.prewarm._watches.values():
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- M8: a DataLoad's finish time from the future is not trusted -------------------------


@pytest.mark.parametrize(
    ("ahead", "seen_ago", "reloads"),
    [
        pytest.param(86_400 * 365 * 70, 3600, True,
                     id="a finish 70 years ahead is timed from its sight: the cache reloads"),
        pytest.param(86_400 * 365 * 70, 10, False,
                     id="a finish 70 years ahead seen 10 s ago waits for Fluid's figures"),
        pytest.param(CLOCK_SLACK_SECONDS + 60, 3600, True,
                     id="a finish dated past the clock slack ahead is timed from its sight"),
        pytest.param(-3600, 0, True, id="a finish an hour ago reloads the evicted cache"),
        pytest.param(-10, 0, False, id="a finish ten seconds ago still waits for Fluid's figures"),
    ],
)  # fmt: skip
def test_a_finish_time_from_the_future_never_holds_the_reload(ahead, seen_ago, reloads):
    own = load("dataload-complete.yaml", finished=NOW + ahead)
    seen = (meta(own, "uid"), NOW - seen_ago)
    track = Track(active=True, desired=2, warm_after=meta(own, "uid"), finished=seen)  # evicted
    made = plan(KEY, SPEC, track, active=True, desired=3, fluid=view(dataset("10.0%"), own),
                now=NOW)  # fmt: skip
    assert (made.delete is not None) == reloads, made.reason
    if ahead > CLOCK_SLACK_SECONDS and reloads:
        assert "ahead of this clock" in made.reason


# --- hostile pass 14: a cache flipping warm and cold, loads dated before they were made ---


def flipping(
    seconds: float, step: float, dated: float, same_uid: bool = False
) -> tuple[int, list[float]]:
    """Plan every ``step`` s for ``seconds`` against a Dataset flipping warm and cold.

    Each DataLoad created completes at once, its finish dated ``dated`` s from its
    creation (the API server's creationTimestamp is the plan's clock). Returns the
    writes planned and the times of the creates.
    """
    track, now, writes, made_at = Track(active=True, desired=2), NOW, 0, []
    loads: list[dict[str, Any]] = []
    while now < NOW + seconds:
        cached = "100.0%" if round((now - NOW) / step) % 2 else "0.0%"
        made = plan(KEY, SPEC, track, active=True, desired=2,
                    fluid=view(dataset(cached), *loads), now=now)  # fmt: skip
        track = made.track
        if made.delete is not None:
            writes, loads = writes + 1, []
        if made.create is not None:
            writes += 1
            made_at.append(now)
            done = load("dataload-complete.yaml", made.create["metadata"]["name"], now + dated)
            done["metadata"]["uid"] = "uid-again" if same_uid else f"uid-{len(made_at)}"
            done["metadata"]["creationTimestamp"] = format_time(now)
            loads = [done]
        now += step
    return writes, made_at


@pytest.mark.parametrize(
    ("dated", "step", "same_uid"),
    [
        pytest.param(-86_400.0, 0.3, False, id="loads done a day before made, flips 0.3 s apart"),
        pytest.param(0.0, 0.3, False, id="loads dated as made, flips 0.3 s apart"),
        pytest.param(-86_400.0, 5.0, False, id="loads done a day before made, flips 5 s apart"),
        pytest.param(0.0, 0.3, True, id="every load handed the same UID (pass 15)"),
    ],
)  # fmt: skip
def test_a_cache_flipping_warm_and_cold_costs_a_few_loads_an_hour(dated, step, same_uid):
    # Each flip to cold after a warm sight reads as an eviction. A load dated before its
    # creation once skipped the wait for Fluid's figures, and each reload went at once:
    # 198 writes a minute at 0.3 s flips. The wait is timed from the first sight of the
    # finish, and reloads in a row back off from 300 s, doubling to an hour.
    writes, made_at = flipping(3600.0, step, dated, same_uid)
    assert writes <= 10, made_at
    gaps = [b - a for a, b in itertools.pairwise(made_at)]
    assert all(gap >= STATUS_LAG_SECONDS for gap in gaps), gaps
    assert gaps[1:] == sorted(gaps[1:]), gaps  # the waits only grow while it flips


def test_a_load_dated_before_its_creation_waits_for_fluid_s_figures_from_its_sight():
    own = load("dataload-complete.yaml", finished=NOW - 86_400)
    own["metadata"]["creationTimestamp"] = format_time(NOW - 5)
    track = Track(active=True, desired=2, warm_after=meta(own, "uid"))  # evicted, seen warm after
    fluid = view(dataset("10.0%"), own)
    first = plan(KEY, SPEC, track, active=True, desired=2, fluid=fluid, now=NOW)
    assert first.delete is None and "waiting for Fluid's figures" in first.reason
    later = plan(KEY, SPEC, first.track, active=True, desired=2, fluid=fluid,
                 now=NOW + STATUS_LAG_SECONDS)  # fmt: skip
    assert later.delete is not None, later.reason
    assert "before its creation" in later.reason


def test_reloads_in_a_row_back_off_and_a_load_that_stood_resets_the_count():
    own = load("dataload-complete.yaml", finished=NOW - 3600)
    uid = meta(own, "uid")
    fluid = view(dataset("10.0%"), own)
    evicted = Track(active=True, desired=2, warm_after=uid, finished=(uid, NOW - 200), reloads=2)
    held = plan(KEY, SPEC, evicted, active=True, desired=2, fluid=fluid, now=NOW)
    # The third in a row waits 600 s after its predecessor finished (seen 200 s ago).
    assert held.delete is None and "reload 3 in a row waits 600 s" in held.reason
    went = plan(KEY, SPEC, held.track, active=True, desired=2, fluid=fluid, now=NOW + 400)
    assert went.delete is not None and went.track.reloads == 3
    again = plan(KEY, SPEC, went.track, active=True, desired=2, fluid=fluid, now=NOW + 401)
    assert again.delete is not None and again.track.reloads == 3  # one reload, counted once
    stood = replace(evicted, finished=(uid, NOW - RELOAD_RESET_SECONDS), reloads=6)
    reset = plan(KEY, SPEC, stood, active=True, desired=2, fluid=fluid, now=NOW)
    assert reset.delete is not None and reset.track.reloads == 1


class _Counted(dict):  # type: ignore[type-arg]
    """A DataLoad that counts how often its spec is read."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        if key == "spec":
            _Counted.reads += 1
        return super().get(key, default)


def deciding(many: int) -> shell.Prewarmer:
    """A prewarm over ``many`` ScaledObjects (``llama-N`` on Dataset ``weights-N``), each
    with a decision (KEDA asked once on its signals)."""
    clock = FakeClock(T0)
    store = SignalStore(clock)
    registry = ScaledObjectRegistry(store, 60.0, clock)
    prewarm = shell.Prewarmer(registry, KubeAccess(Path("/nonexistent/kubeconfig")), clock)
    for n in range(many):
        metadata = {**BASE, "deployment": f"llama-{n}", "fluidDataset": f"weights-{n}"}
        scaled = registry.resolve(f"llama-{n}", "serving", metadata)
        store.update(Snapshot(("serving", f"llama-{n}", ""), GatewaySignals(T0, None, 1, 0)))
        registry.current(scaled)
    return prewarm


def test_a_pass_over_every_scaled_object_reads_each_dataload_once(monkeypatch):
    # Hostile pass 14 (at scale): each plan looked at every DataLoad (and the view was a
    # new list of them for each plan): 3,000 ScaledObjects and loads took 6.7 s a pass on
    # the scaler's event loop, each tick and each watch event.
    many = 40
    prewarm = deciding(many)
    datasets = {f"serving/weights-{n}": fluid_dataset(f"weights-{n}") for n in range(many)}
    loads: dict[str, dict[str, Any]] = {
        f"serving/x{n}": _Counted(load_of(f"weights-{n}")) for n in range(many)
    }
    prewarm._on_change("datasets")(datasets)
    prewarm._on_change("dataloads")(loads)
    _Counted.reads = 0
    prewarm._replan()
    assert len(prewarm.statuses()) == many
    assert _Counted.reads <= many, _Counted.reads  # one look each, not one a plan
    _Counted.reads = 0
    prewarm._replan()  # nothing changed: the view and its index are kept
    assert _Counted.reads == 0


async def test_watch_events_in_a_stream_coalesce_into_passes_of_a_bounded_share(monkeypatch):
    # Hostile pass 14 (at scale): every watch event woke a pass over every ScaledObject;
    # a Dataset flipping every 50 ms kept the passes going without end. A pass of 20 ms
    # woken every millisecond for a second now runs at most once per 100 ms.
    harness = Harness(monkeypatch)
    passes = 0

    def slow_pass() -> None:
        nonlocal passes
        passes += 1
        until = time.monotonic() + 0.02
        while time.monotonic() < until:
            pass

    monkeypatch.setattr(harness.prewarm, "_replan", slow_pass)
    task = asyncio.create_task(harness.prewarm.run())
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        harness.prewarm._wake.set()
        await asyncio.sleep(0.001)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert 3 <= passes <= 12, passes


@pytest.mark.parametrize(
    "behind",
    [
        pytest.param(0.0, id="Fluid's clock as the scaler's"),
        pytest.param(150.0, id="Fluid's clock 150 s behind (pass 16)"),
        pytest.param(86_400.0, id="Fluid's clock a day behind (pass 16)"),
        pytest.param(None, id="a finish without a date (pass 16)"),
    ],
)
def test_one_eviction_of_a_dataset_shared_by_many_scaled_objects_is_loaded_once(behind):
    # Hostile pass 15: eight ScaledObjects warm one Dataset, each by a load of its own.
    # After one eviction the first reloads; Fluid's figures lag 100 s behind its finish,
    # and each of the others took them for an eviction (or for no load) and loaded the
    # same data again: 8 loads for one eviction. A load of the Dataset finished within
    # Fluid's status lag is waited for by every ScaledObject: from its own date, or from
    # when the watches first saw it finished (pass 16: a Fluid clock behind, or no date).
    first_done: dict[str, float] = {}  # as the shell keeps it
    keys = [("serving", f"llama-{n}") for n in range(8)]
    loads: dict[str, dict[str, Any]] = {}
    tracks = {}
    made_at = NOW - 7200

    def finish(obj: dict[str, Any], at: float) -> None:
        obj["status"] = copy.deepcopy(load("dataload-complete.yaml")["status"])
        for condition in obj["status"]["conditions"]:
            condition["lastTransitionTime"] = format_time(at)

    for n, key in enumerate(keys):  # warm for an hour: each one's own load, seen warm
        made = plan(key, SPEC, Track(active=True, desired=2), active=True, desired=2,
                    fluid=view(dataset("0.0%")), now=made_at)  # fmt: skip
        assert made.create is not None
        obj = copy.deepcopy(made.create)
        obj["metadata"].update(uid=f"u{n}", creationTimestamp=format_time(made_at))
        finish(obj, made_at + 60)
        loads[obj["metadata"]["name"]] = obj
        warm = view(dataset("100.0%"), *loads.values())
        seen = plan(key, SPEC, made.track, active=True, desired=2, fluid=warm, now=made_at + 400)
        tracks[key] = seen.track
    created, warm_at = 0, None
    done: dict[str, float] = {}
    for step in range(900):  # evicted at NOW; loads take 5 s; figures lag 100 s
        now = NOW + step
        for name, at in list(done.items()):
            if now >= at:
                finish(loads[name], now - (behind or 0.0))
                if behind is None:
                    loads[name]["status"]["conditions"] = []
                first_done[loads[name]["metadata"]["uid"]] = now
                warm_at = warm_at or now + 100
                del done[name]
        cached = "100.0%" if warm_at is not None and now >= warm_at else "0.0%"
        fluid = replace(view(dataset(cached), *loads.values()), first_done=first_done)
        for key in keys:
            made = plan(key, SPEC, tracks[key], active=True, desired=2, fluid=fluid, now=now)
            tracks[key] = made.track
            if made.delete is not None:
                loads.pop(made.delete.name)
                fluid = replace(view(dataset(cached), *loads.values()), first_done=first_done)
            if made.create is not None:
                created += 1
                obj = copy.deepcopy(made.create)
                obj["metadata"].update(uid=f"new-{created}", creationTimestamp=format_time(now))
                obj["status"] = {"phase": "Executing"}
                loads[obj["metadata"]["name"]] = obj
                done[obj["metadata"]["name"]] = now + 5
                fluid = replace(view(dataset(cached), *loads.values()), first_done=first_done)
    assert created == 1


def cleaned_up(ttl: float | None, same_uid: str = "") -> tuple[int, str]:
    """An hour of plans, one a second, our loads (5 s each) deleted ``ttl`` s after they
    finish by someone else (None: kept); the cache stays short of warm. Creates, state."""
    track, creates, live = Track(active=True, desired=2), 0, None
    before = frozenset({same_uid}) if same_uid else frozenset()
    state = ""
    for step in range(3600):
        now = NOW + step
        loads: list[dict[str, Any]] = []
        if live is not None:
            obj, made_at = live
            if now >= made_at + 5:
                if ttl is not None and now >= made_at + 5 + ttl:
                    live = None
                else:
                    obj["status"] = copy.deepcopy(load("dataload-complete.yaml")["status"])
                    for condition in obj["status"]["conditions"]:
                        condition["lastTransitionTime"] = format_time(made_at + 5)
            if live is not None:
                loads = [obj]
        fluid = FluidView(True, {"models/weights": dataset("50.0%")}, loads, before=before)
        made = plan(KEY, SPEC, track, active=True, desired=2, fluid=fluid, now=now)
        track, state = made.track, made.state
        if made.delete is not None:
            live = None
        if made.create is not None:
            creates += 1
            obj = copy.deepcopy(made.create)
            obj["metadata"].update(
                uid=same_uid or f"u{creates}", creationTimestamp=format_time(now)
            )
            obj["status"] = {"phase": "Executing"}
            live = (obj, now)
    return creates, state


@pytest.mark.parametrize(
    ("ttl", "same_uid", "most"),
    [
        pytest.param(0.0, "", 6, id="deleted as it finishes (never seen finished): backed off"),
        pytest.param(60.0, "", 6, id="deleted a minute after it finished: backed off"),
        pytest.param(None, "", 1, id="kept: loaded once"),
        pytest.param(None, "same", 1, id="kept, every load one UID of the first list: once"),
    ],
)
def test_our_load_cleaned_up_by_someone_else_is_reloaded_with_back_off(ttl, same_uid, most):
    # Hostile pass 16: a load of ours deleted once finished (a TTL clean-up) was created
    # again at once, a full load each time: 720 an hour with loads of 5 s. Loading again
    # is a reload, backed off; a load this scaler made is never one it did not see.
    creates, _ = cleaned_up(ttl, same_uid)
    assert creates <= most, creates


def test_a_dataload_of_our_name_loading_another_dataset_is_not_taken_for_ours():
    # Hostile pass 16: the create answered 409 (taken for ours) and was asked again at
    # every watch event: 3,600 POSTs an hour, nothing ever loaded.
    squatter = load("dataload-complete.yaml")
    squatter["spec"]["dataset"] = {"name": "other", "namespace": "models"}
    made = plan(KEY, SPEC, Track(active=True, desired=2), active=True, desired=2,
                fluid=view(dataset("0.0%"), squatter), now=NOW)  # fmt: skip
    assert made.create is None and made.delete is None
    assert made.state == "failed" and "is not a load of this Dataset" in made.reason


def test_the_watches_keep_when_each_load_was_first_seen_finished(monkeypatch):
    harness = Harness(monkeypatch)
    done = load_of("weights-a", status={"phase": "Complete"})
    done["metadata"]["uid"] = "u-done"
    running = load_of("weights-a", status={"phase": "Executing"})
    running["metadata"].update(name="y", uid="u-running")
    harness.feed({}, {"serving/x": done, "serving/y": running})
    first = harness.clock.now
    assert harness.prewarm._view().first_done == {"u-done": first}
    harness.clock.now += 30
    harness.feed({}, {"serving/x": done})  # seen again: the first sight stands
    assert harness.prewarm._view().first_done == {"u-done": first}
    harness.feed({}, {})  # gone: let go
    assert harness.prewarm._view().first_done == {}


async def test_a_write_pass_builds_the_view_once_not_once_a_write(monkeypatch):
    # Hostile pass 16: each write invalidated the view and the re-plan after it built it
    # again: 3,000 creates at once (a start on cold Datasets) took 8.3 s of the loop.
    many = 30
    prewarm = deciding(many)
    prewarm._on_change("datasets")(
        {f"serving/weights-{n}": fluid_dataset(f"weights-{n}") for n in range(many)}
    )
    prewarm._on_change("dataloads")({})
    prewarm._replan()

    async def create(api: Any, resource: Any, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "metadata": {**body["metadata"], "uid": f"u-{body['metadata']['name']}"}}

    built = 0
    real = FluidView

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        built += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(shell, "create", create)
    monkeypatch.setattr(shell, "FluidView", counted)
    await prewarm._write_all(object())  # type: ignore[arg-type]
    assert sum(s.created for s in prewarm.statuses()) == many
    assert built <= 1, built


def test_our_load_gone_before_seen_finished_and_not_made_here_is_loaded_again():
    # Hostile pass 17: a restarted scaler (it made none) saw our load Executing, then
    # gone before it finished (deleted): the reload was timed from each plan's now, so it
    # never came and the prewarm stopped for good. It is timed from the first miss.
    running = load("dataload-executing.yaml")
    track = plan(KEY, SPEC, Track(active=True, desired=2), active=True, desired=2,
                 fluid=view(dataset("0.0%"), running), now=NOW).track  # fmt: skip
    created = None
    for step in range(1, 600):
        made = plan(KEY, SPEC, track, active=True, desired=2, fluid=view(dataset("0.0%")),
                    now=NOW + step)  # fmt: skip
        track = made.track
        if made.create is not None:
            created = step
            break
        assert "is gone (not by us)" in made.reason
    assert created is not None and created <= STATUS_LAG_SECONDS + 1, created


@pytest.mark.parametrize(
    "back",
    [
        pytest.param(86_400.0, id="a clock stepped back a day reloads as it would have"),
        pytest.param(3_600.0, id="a clock stepped back an hour reloads as it would have"),
    ],
)
def test_a_wall_clock_stepped_back_never_stretches_the_reload_wait(back):
    # Hostile pass 18: our load was made on a clock ahead; NTP stepped it back, then a
    # TTL clean-up deleted the load. The reload waited until made_at + 121 s by the new
    # clock (a day). Times later than now are taken as now.
    track = plan(KEY, SPEC, Track(), active=True, desired=2, fluid=view(dataset("0.0%")),
                 now=NOW).track  # fmt: skip
    running = load("dataload-executing.yaml")
    track = plan(KEY, SPEC, track, active=True, desired=2,
                 fluid=view(dataset("10.0%"), running), now=NOW + 5).track  # fmt: skip
    assert track.ours
    created = None
    for after in range(1, 600):
        made = plan(KEY, SPEC, track, active=True, desired=2, fluid=view(dataset("10.0%")),
                    now=NOW + 5 - back + after)  # fmt: skip
        track = made.track
        if made.create is not None:
            created = after
            break
        assert "is gone (not by us)" in made.reason
    assert created is not None and STATUS_LAG_SECONDS <= created <= STATUS_LAG_SECONDS + 2
