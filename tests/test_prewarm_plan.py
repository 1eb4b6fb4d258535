"""The prewarm plan: when a ScaledObject's Fluid Dataset is warmed, and what is created.

Datasets and DataLoads are the golden files shaped as Fluid v1.0.8 writes them
(``tests/golden/fluid``), renamed to the Dataset and DataLoad the plan looks for.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.fluid import MAX_DATALOAD_NAME
from foundation.timestamps import format_time
from scaler.prewarm.plan import (
    STATES,
    FluidView,
    PrewarmSpec,
    Track,
    dataload_for,
    dataload_name,
    plan,
)

GOLDEN = Path(__file__).parent / "golden" / "fluid"
KEY = ("serving", "llama")
SPEC = PrewarmSpec("weights", "models", ("/llama-3-8b",), timeout_seconds=300.0)
NOW = 1_750_000_000.0
DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@functools.cache
def _read(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((GOLDEN / name).read_text())
    return loaded


def golden(name: str) -> dict[str, Any]:
    return copy.deepcopy(_read(name))


def dataset(cached: object = "0.0%", phase: str = "Bound") -> dict[str, Any]:
    obj = golden("dataset-bound.yaml")
    obj["metadata"].update(name="weights", namespace="models", uid="d5e7-uid")
    obj["status"]["phase"] = phase
    obj["status"].setdefault("cacheStates", {})["cachedPercentage"] = cached
    if cached is None:
        del obj["status"]["cacheStates"]["cachedPercentage"]
    return obj


OURS = dataload_name(KEY, SPEC, "d5e7-uid")


def load(golden_file: str, name: str = OURS, finished: float = NOW - 3600) -> dict[str, Any]:
    obj = golden(golden_file)
    obj["metadata"].update(name=name, namespace="models", uid=f"uid-{name}")
    obj["spec"]["dataset"] = {"name": "weights", "namespace": "models"}
    for condition in obj.get("status", {}).get("conditions") or []:
        condition["lastTransitionTime"] = format_time(finished)
    return obj


def view(ds: dict[str, Any] | None = None, *loads: dict[str, Any]) -> FluidView:
    datasets = {"models/weights": ds} if ds is not None else {}
    return FluidView(True, datasets, list(loads))


COLD_START = Track()  # never active: the next active decision is a scale-from-zero
RUNNING = Track(active=True, desired=2)
AT_ZERO = Track(idle_since=NOW - 60)  # scaled to zero a minute ago
LONG_AT_ZERO = Track(idle_since=NOW - 7200)


def deleting(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["deletionTimestamp"] = format_time(NOW - 5)
    return obj


CASES = [
    pytest.param(
        COLD_START,
        True,
        1,
        view(dataset("0.0%")),
        ("loading", "create"),
        "creating DataLoad",
        id="a scale-from-zero on a cold cache creates our DataLoad",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        view(dataset("100.0%")),
        ("warm", None),
        "is warm (100.0% cached)",
        id="a scale-from-zero on a warm cache creates none",
    ),
    pytest.param(
        RUNNING,
        True,
        4,
        view(dataset("100.0%")),
        ("warm", None),
        "is warm",
        id="a scale-out step on a warm cache creates none",
    ),
    pytest.param(
        RUNNING,
        True,
        4,
        view(dataset("40.0%")),
        ("loading", "create"),
        "40.0% of the 100% warm",
        id="a scale-out step on a cold cache creates our DataLoad",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        view(None),
        ("dataset-missing", None),
        "Fluid Dataset models/weights does not exist (trigger key fluidDataset)",
        id="a missing Dataset is reported, not crashed on",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        FluidView(False, problem="403 Forbidden on datasets.data.fluid.io"),
        ("unknown", None),
        "403 Forbidden",
        id="before the watches list, nothing is known and nothing created",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        view(dataset("0.0%", phase="NotBound")),
        ("not-bound", None),
        "is NotBound, not Bound",
        id="a Dataset whose runtime is not ready is waited for, not loaded",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        view(dataset("10.0%"), load("dataload-executing.yaml", "theirs")),
        ("loading", None),
        "DataLoad models/theirs is Executing",
        id="someone else's DataLoad under way is followed, not doubled",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset("10.0%"), load("dataload-executing.yaml")),
        ("loading", None),
        f"DataLoad models/{OURS} is Executing",
        id="our DataLoad under way is followed",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset("10.0%"), load("dataload-complete.yaml", finished=NOW - 10)),
        ("loading", None),
        "completed: waiting for Fluid's figures",
        id="a load completed within Fluid's status lag waits for the cache figures",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset("60.0%"), load("dataload-complete.yaml")),
        ("below-threshold", None),
        "not loading again (it would churn)",
        id="a completed load the cache never reached is not repeated",
    ),
    pytest.param(
        replace(RUNNING, warm_after=f"uid-{OURS}"),
        True,
        2,
        view(dataset("60.0%"), load("dataload-complete.yaml")),
        ("loading", "delete"),
        "down from warm: evicted; loading again",
        id="a cache evicted after our load was warm is loaded again",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset("0.0%"), load("dataload-failed.yaml")),
        ("failed", None),
        "retried at the next scale-up",
        id="a failed load is reported and not retried without a scale-up",
    ),
    pytest.param(
        RUNNING,
        True,
        3,
        view(dataset("0.0%"), load("dataload-failed.yaml")),
        ("loading", "delete"),
        "failed (",
        id="a failed load is loaded anew at the next scale-out step",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset(None), load("dataload-complete.yaml")),
        ("cache-unknown", None),
        "no cachedPercentage reported",
        id="a completed load with no cachedPercentage is unknown, not zero, and not repeated",
    ),
    pytest.param(
        COLD_START,
        True,
        1,
        view(dataset("garbled")),
        ("loading", "create"),
        "cachedPercentage 'garbled' is not a percentage",
        id="a garbled cachedPercentage is unknown, not zero: our load is created",
    ),
    pytest.param(
        RUNNING,
        True,
        2,
        view(dataset("0.0%"), deleting(load("dataload-complete.yaml"))),
        ("loading", None),
        "waiting for our old DataLoad",
        id="our old DataLoad being deleted is waited for before creating anew",
    ),
    pytest.param(
        AT_ZERO,
        False,
        0,
        view(dataset("0.0%")),
        ("loading", "create"),
        "creating DataLoad",
        id="within keepWarmAfterZero a cold cache is loaded, so a return finds it warm",
    ),
    pytest.param(
        LONG_AT_ZERO,
        False,
        0,
        view(dataset("0.0%")),
        ("idle", None),
        "no replicas wanted",
        id="at zero past keepWarmAfterZero a cold cache is left alone",
    ),
    pytest.param(
        RUNNING,
        False,
        0,
        view(dataset("0.0%")),
        ("loading", "create"),
        "creating",
        id="the scale to zero itself starts the keep-warm time",
    ),
    pytest.param(
        replace(RUNNING, wait_since=NOW - 301, wait_for="scale-out to 2"),
        True,
        2,
        view(dataset("10.0%"), load("dataload-executing.yaml")),
        ("timed-out", None),
        "gave up waiting after 300 s (prewarmTimeout) for the scale-out to 2, which "
        "proceeds with a cold cache",
        id="a warm-up past prewarmTimeout is given up and the decision proceeds cold",
    ),
]


@pytest.mark.parametrize(("track", "active", "desired", "fluid", "expected", "reason"), CASES)
def test_plan(track, active, desired, fluid, expected, reason):
    made = plan(KEY, SPEC, track, active=active, desired=desired, fluid=fluid, now=NOW)
    action = "create" if made.create else "delete" if made.delete else None
    assert (made.state, action) == expected, made.reason
    assert reason in made.reason
    assert made.state in STATES
    assert made.note.startswith(f"prewarm {made.state}: ") or made.state == "idle"


def test_the_created_dataload_loads_the_paths_once_owned_by_the_dataset():
    made = plan(KEY, SPEC, COLD_START, active=True, desired=1, fluid=view(dataset()), now=NOW)
    assert made.create == dataload_for(KEY, SPEC, dataset())
    body = made.create
    assert body["metadata"]["name"] == OURS == made.dataload
    assert body["metadata"]["namespace"] == "models"
    assert body["metadata"]["annotations"] == {"unitscale.io/scaled-object": "serving/llama"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "data.fluid.io/v1alpha1",
            "kind": "Dataset",
            "name": "weights",
            "uid": "d5e7-uid",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    assert body["spec"] == {
        "dataset": {"name": "weights", "namespace": "models"},
        "loadMetadata": True,
        "target": [{"path": "/llama-3-8b", "replicas": 1}],
        "policy": "Once",
    }


@pytest.mark.parametrize(
    ("track", "fluid"),
    [
        pytest.param(
            RUNNING, view(dataset("10.0%"), load("dataload-executing.yaml")), id="loading"
        ),
        pytest.param(
            replace(RUNNING, wait_since=NOW - 400, wait_for="scale-from-zero"),
            view(dataset("10.0%"), load("dataload-executing.yaml")),
            id="timed out",
        ),
        pytest.param(RUNNING, view(None), id="dataset missing"),
    ],
)
def test_time_alone_does_not_change_the_reason(track, fluid):
    # The shell logs each change of reason: one that counted seconds would log each tick.
    first = plan(KEY, SPEC, track, active=True, desired=2, fluid=fluid, now=NOW)
    later = plan(KEY, SPEC, first.track, active=True, desired=2, fluid=fluid, now=NOW + 90)
    assert (later.state, later.reason) == (first.state, first.reason)


def test_an_evicted_reload_deletes_ours_only_by_its_uid():
    track = replace(RUNNING, warm_after=f"uid-{OURS}")
    fluid = view(dataset("60.0%"), load("dataload-complete.yaml"))
    made = plan(KEY, SPEC, track, active=True, desired=2, fluid=fluid, now=NOW)
    assert made.delete is not None
    assert (made.delete.namespace, made.delete.name, made.delete.uid) == (
        "models",
        OURS,
        f"uid-{OURS}",
    )


MADE = NOW - 7200  # our load's creationTimestamp; it finished an hour ago


@pytest.mark.parametrize(
    ("before", "track", "made", "expected"),
    [
        pytest.param(
            frozenset({f"uid-{OURS}"}),
            RUNNING,
            MADE,
            ("loading", "delete"),
            id="a load the first list held (a restarted scaler did not see it) is loaded again",
        ),
        pytest.param(
            frozenset(),
            RUNNING,
            MADE,
            ("below-threshold", None),
            id="a load made while this scaler watched, never warm, is not repeated",
        ),
        pytest.param(
            frozenset(),
            RUNNING,
            NOW - 86_400 * 2,
            ("below-threshold", None),
            id="one dated long before, the API server's clock behind, is seen all the same",
        ),
        pytest.param(
            frozenset({f"uid-{OURS}"}),
            replace(RUNNING, warm_after="uid-an-older-load"),
            MADE,
            ("below-threshold", None),
            id="once this scaler has seen the cache warm, only an eviction it saw reloads",
        ),
    ],
)
def test_a_restarted_scaler_reloads_a_load_it_did_not_see(before, track, made, expected):
    # The cache is short of warm now. A scaler that was not watching when our load ran
    # cannot tell an eviction from a cache too small for the data.
    done = load("dataload-complete.yaml")
    done["metadata"]["creationTimestamp"] = format_time(made)
    fluid = replace(view(dataset("12.0%"), done), before=before)
    result = plan(KEY, SPEC, track, active=True, desired=2, fluid=fluid, now=NOW)
    action = "create" if result.create else "delete" if result.delete else None
    assert (result.state, action) == expected, result.reason
    if result.delete is not None:
        assert result.delete.uid == f"uid-{OURS}"
        assert "made before this scaler watched Fluid" in result.reason


def test_time_to_warm_is_from_the_trigger_to_the_warm_cache():
    first = plan(KEY, SPEC, COLD_START, active=True, desired=1, fluid=view(dataset()), now=NOW)
    assert first.track.wait_since == NOW and first.track.wait_for == "scale-from-zero"
    warm = view(dataset("100.0%"), load("dataload-complete.yaml", finished=NOW + 40))
    later = plan(KEY, SPEC, first.track, active=True, desired=1, fluid=warm, now=NOW + 42)
    assert later.state == "warm"
    assert later.track.time_to_warm == pytest.approx(42.0)
    assert "42 s after the scale-from-zero" in later.reason
    assert later.track.warm_after == f"uid-{OURS}"


def test_a_timeout_is_counted_once_and_lasts_until_the_cache_is_warm():
    track = plan(KEY, SPEC, COLD_START, active=True, desired=1, fluid=view(dataset()), now=NOW)
    cold = view(dataset("5.0%"), load("dataload-executing.yaml"))
    states = []
    for step in (100, 299, 300, 400, 500):
        track = plan(KEY, SPEC, track.track, active=True, desired=1, fluid=cold, now=NOW + step)
        states.append(track.state)
    assert states == ["loading", "loading", "timed-out", "timed-out", "timed-out"]
    assert track.track.timeouts == 1
    warm = view(dataset("100.0%"))
    track = plan(KEY, SPEC, track.track, active=True, desired=1, fluid=warm, now=NOW + 600)
    assert track.state == "warm" and track.track.timeouts == 1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param({"dataset": "Weights"}, "not a Kubernetes object name", id="a bad name"),
        pytest.param({"paths": ("models/x",)}, "must be absolute", id="a relative path"),
        pytest.param({"paths": ()}, "must be absolute", id="no paths"),
        pytest.param({"warm_percent": 0.0}, r"within \(0, 100\]", id="a zero threshold"),
    ],
)
def test_a_bad_spec_is_refused_with_a_clear_error(change, match):
    with pytest.raises(ValueError, match=match):
        replace(SPEC, **change)


# --- properties --------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,250}[a-z0-9])?", fullmatch=True)


@given(namespace=NAMES.filter(lambda n: len(n) <= 63), name=NAMES, uid=st.uuids())
def test_the_name_is_one_fluid_can_install_and_the_same_for_every_scaler(namespace, name, uid):
    made = dataload_name((namespace, name), SPEC, str(uid))
    assert len(made) <= MAX_DATALOAD_NAME and DNS.match(made)
    assert made == dataload_name((namespace, name), SPEC, str(uid))
    assert made != dataload_name((namespace, name), SPEC, f"{uid}-recreated")


DECISION = st.tuples(st.booleans(), st.integers(1, 8))
STEPS = st.lists(st.tuples(DECISION, st.floats(0.5, 400.0)), min_size=1, max_size=40)


def drive(steps, cache_for, *, keep_loads: bool = True):
    """Run the plan over ``steps``, doing its writes against an imaginary API server.

    A created DataLoad completes at once; ``cache_for(loads_created)`` is the cache the
    Dataset then reports. Returns the plans and the number of creates.
    """
    track, now, creates = Track(), NOW, 0
    loads: list[dict[str, Any]] = []
    plans = []
    for (active, desired), wait in steps:
        now += wait
        fluid = view(dataset(cache_for(creates)), *loads)
        made = plan(KEY, SPEC, track, active=active, desired=desired, fluid=fluid, now=now)
        plans.append(made)
        track = made.track
        if made.create is not None:
            creates += 1
            done = load("dataload-complete.yaml", made.create["metadata"]["name"], now)
            loads = [done] if keep_loads else []
        if made.delete is not None:
            loads = []
    return plans, creates


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_a_warm_cache_never_creates_a_dataload(steps):
    plans, creates = drive(steps, lambda created: "100.0%")
    assert creates == 0
    assert {p.state for p in plans} <= {"warm", "idle"}


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_a_cache_that_never_gets_warm_is_loaded_at_most_once(steps):
    # The load completes, the cache stays short of the threshold: no DataLoad churn,
    # whatever the scale-ups, the scale-downs to zero and the returns.
    _, creates = drive(steps, lambda created: "60.0%")
    assert creates <= 1


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_an_evicted_cache_is_loaded_again_once_per_eviction(steps):
    # Each load warms the cache, which is then evicted: one more load per eviction seen,
    # never two for one.
    evictions: list[float] = []

    def cache(created: int) -> str:
        return "100.0%" if len(evictions) < created else "0.0%"

    track, now, creates = Track(), NOW, 0
    loads: list[dict[str, Any]] = []
    for (active, desired), wait in steps:
        now += wait
        made = plan(
            KEY,
            SPEC,
            track,
            active=active,
            desired=desired,
            fluid=view(dataset(cache(creates)), *loads),
            now=now,
        )
        if made.state == "warm" and creates and len(evictions) < creates:
            evictions.append(now)  # seen warm: the next look finds it evicted
        assert not (made.create and made.delete)
        if made.delete is not None:
            assert creates == len(evictions)
            loads = []
        if made.create is not None:
            creates += 1
            loads = [load("dataload-complete.yaml", made.create["metadata"]["name"], now - 200)]
        track = made.track
    assert creates <= len(evictions) + 1


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_a_plan_is_a_function_of_its_inputs(steps):
    # Two scaler replicas fed the same decisions and objects plan the same writes.
    first, _ = drive(steps, lambda created: "0.0%")
    second, _ = drive(steps, lambda created: "0.0%")
    assert first == second


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_every_warm_up_that_stays_cold_is_given_up_after_the_timeout(steps):
    # The cache never warms and no load is ever seen: each trigger's wait ends in
    # timed-out once prewarmTimeout has passed, and every plan says why.
    track, now = Track(), NOW
    for (active, desired), wait in steps:
        now += wait
        made = plan(
            KEY,
            SPEC,
            track,
            active=active,
            desired=desired,
            fluid=view(dataset("0.0%"), load("dataload-executing.yaml", "theirs")),
            now=now,
        )
        assert made.reason
        since = made.track.wait_since
        if since is not None and now - since >= SPEC.timeout_seconds:
            assert made.state == "timed-out" and "cold cache" in made.reason
        track = made.track


# --- trigger metadata ----------------------------------------------------------------------

BASE = {"scalerAddress": "unitscale-scaler.keda:9090", "deployment": "llama"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({}, None, id="without fluidDataset there is no prewarm"),
        pytest.param(
            {"fluidDataset": "weights"},
            PrewarmSpec("weights", "serving", ("/",), 300.0, 900.0, 100.0),
            id="fluidDataset alone: the whole Dataset, in the ScaledObject's namespace",
        ),
        pytest.param(
            {"fluidDataset": "weights", "namespace": "team-a"},
            PrewarmSpec("weights", "team-a"),
            id="the Dataset's namespace defaults to the workload's",
        ),
        pytest.param(
            {
                "fluidDataset": "weights",
                "fluidDatasetNamespace": "models",
                "prewarmPaths": "/llama/config.json, /llama/model.safetensors,/llama/config.json",
                "prewarmTimeout": "2m",
                "keepWarmAfterZero": "0",
                "prewarmCachedPercentage": "95",
            },
            PrewarmSpec(
                "weights",
                "models",
                ("/llama/config.json", "/llama/model.safetensors"),
                120.0,
                0.0,
                95.0,
            ),
            id="every key, the paths trimmed and deduplicated, keepWarmAfterZero 0 kept",
        ),
    ],
)
def test_the_trigger_metadata_gives_the_prewarm_spec(given, expected):
    from scaler.metadata import parse_metadata

    assert parse_metadata({**BASE, **given}).prewarm("serving") == expected


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        pytest.param(
            {"prewarmPaths": "/llama", "keepWarmAfterZero": "5m"},
            "prewarmPaths, keepWarmAfterZero needs fluidDataset",
            id="a prewarm key without fluidDataset is refused, naming it",
        ),
        pytest.param(
            {"fluidDataset": "Weights"}, "key 'fluidDataset'='Weights'", id="a bad Dataset name"
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmPaths": "llama,/b"},
            "path 'llama' is not absolute",
            id="a relative path is refused",
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmPaths": "/a,,/b"},
            "comma-separated absolute paths",
            id="an empty path is refused",
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmPaths": ",".join(f"/{i}" for i in range(33))},
            "at most 32",
            id="too many paths are refused",
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmTimeout": "0s"},
            "key 'prewarmTimeout'='0s'",
            id="a zero prewarmTimeout is refused",
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmTimeout": "1ns"},
            "key 'prewarmTimeout'='1ns'",
            id="a prewarm that times out at once is refused",
        ),
        pytest.param(
            {"fluidDataset": "w", "prewarmCachedPercentage": "101"},
            "key 'prewarmCachedPercentage'='101'",
            id="a percentage above 100 is refused",
        ),
    ],
)
def test_bad_prewarm_metadata_is_refused_naming_the_key(given, fragment):
    from foundation.errors import MetadataError
    from scaler.metadata import parse_metadata

    with pytest.raises(MetadataError, match=re.escape(fragment)):
        parse_metadata({**BASE, **given})


# --- the shell's hook, without an API server -------------------------------------------


def test_a_failing_prewarm_never_costs_the_decision(monkeypatch, caplog):
    import time

    from foundation.kube import KubeAccess
    from foundation.signals import GatewaySignals, Snapshot
    from scaler.prewarm import shell
    from scaler.registry import ScaledObjectRegistry
    from scaler.signals import SignalStore

    store = SignalStore()
    registry = ScaledObjectRegistry(store, 60.0)
    shell.Prewarmer(registry, KubeAccess(Path("/nonexistent/kubeconfig")))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in planning")

    monkeypatch.setattr(shell, "plan", broken)
    scaled = registry.resolve("llama", "serving", {**BASE, "fluidDataset": "weights"})
    store.update(Snapshot(("serving", "llama", ""), GatewaySignals(time.time(), None, 1, 0)))
    decision = registry.current(scaled)
    assert (decision.active, decision.desired_replicas) == (True, 1)
    assert "prewarm" not in decision.reason
    assert "prewarm plan for serving/llama failed" in caplog.text


async def test_a_failing_watch_is_still_named_after_the_other_watch_lists_again(monkeypatch):
    import asyncio
    import time

    from kubernetes_asyncio import client

    from foundation.kube import KubeAccess
    from foundation.signals import GatewaySignals, Snapshot
    from scaler.prewarm import shell
    from scaler.registry import ScaledObjectRegistry
    from scaler.signals import SignalStore

    watches: dict[str, tuple[Any, Any]] = {}
    both = asyncio.Event()

    async def watch(access: object, selection: Any, on_change: Any, **kwargs: Any) -> None:
        # foundation.kube.watch_objects' callbacks, called below as its loop would.
        watches[selection.resource.plural] = (on_change, kwargs["on_error"])
        if len(watches) == 2:
            both.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(shell, "watch_objects", watch)
    store = SignalStore()
    registry = ScaledObjectRegistry(store, 60.0)
    prewarm = shell.Prewarmer(registry, KubeAccess(Path("/nonexistent/kubeconfig")), tick=0.01)
    scaled = registry.resolve("llama", "serving", {**BASE, "fluidDataset": "weights"})

    def reason() -> str:
        store.update(Snapshot(("serving", "llama", ""), GatewaySignals(time.time(), None, 1, 0)))
        return registry.current(scaled).reason

    task = asyncio.create_task(prewarm.run())
    try:
        async with asyncio.timeout(10):
            await both.wait()  # the watches start with the first prewarm ScaledObject
        watches["datasets"][0]({})
        watches["dataloads"][1](client.ApiException(status=403, reason="Forbidden"))
        refused = "forbidden to watch dataloads.data.fluid.io"
        assert refused in reason()
        watches["datasets"][0]({})  # a resync of the watch that works
        assert refused in reason()  # the other still fails: said, not "waiting"
        assert "ClusterRole of deploy/components/scaler-prewarm" in reason()
        watches["dataloads"][0]({})  # it lists at last
        assert "forbidden" not in reason()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_forecast_at_zero_warms_the_cache_before_the_first_request():
    cold = view(dataset("0.0%"))
    ahead = plan(
        KEY, SPEC, LONG_AT_ZERO, active=False, desired=0, fluid=cold, now=NOW, forecast=True
    )
    assert (ahead.state, ahead.create is not None) == ("loading", True)
    assert ahead.track.wait_for == "forecast return of traffic"
    # Without the forecast the same moment is idle: nothing is loaded.
    idle = plan(KEY, SPEC, LONG_AT_ZERO, active=False, desired=0, fluid=cold, now=NOW)
    assert (idle.state, idle.create) == ("idle", None)
    # The first request then finds the cache warm: no clock, nothing created.
    warm = view(dataset("100.0%"), load("dataload-complete.yaml", finished=NOW + 50))
    later = plan(KEY, SPEC, ahead.track, active=True, desired=1, fluid=warm, now=NOW + 60)
    assert (later.state, later.create) == ("warm", None)
    assert later.track.time_to_warm is None  # the scale-from-zero waited for nothing


def test_a_forecast_while_active_is_no_trigger():
    made = plan(
        KEY,
        SPEC,
        RUNNING,
        active=True,
        desired=2,
        fluid=view(dataset("100.0%")),
        now=NOW,
        forecast=True,
    )
    assert made.track.wait_since is None and not made.track.forecast
