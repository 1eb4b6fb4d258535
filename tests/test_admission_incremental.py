"""Decisions on state kept from pass to pass (admission.incremental) equal those from scratch.

A property over random event sequences (gangs arriving, admitted, placed, finishing;
shares taken and freed; nodes cordoned or their handshake going stale; Datasets turning
ready; the inference forecast moving; time passing): after every event a pass on the
kept ``Memo`` decides and plans exactly what a pass from scratch over the same state
does. Then the rules that make the kept state worth keeping (a gang that does not fit is
not searched again until its pool changes) and the controller's resync, which counts any
difference it finds.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import annotations as names
from admission import decide as decide_module
from admission import fit, incremental, workload
from admission.cluster import Cluster, Pending, PoolDemand
from admission.decide import decide_all
from admission.manager import plan_pools
from admission.parameters import DataParameters, Headroom, Parameters, ReclaimParameters
from foundation.timestamps import format_time
from tests import test_admission_decide as decided
from tests.test_admission_controller import NO_API, Writing

NOW = decided.NOW
CHECKS = {
    "check-a": Parameters(
        pool_node_selector={"pool": "a"}, data=DataParameters(timeout_seconds=120)
    ),
    "check-b": Parameters(
        pool_node_selector={"pool": "b"},
        gpu_scheduler_policy="spread",
        node_scheduler_policy="spread",
    ),
    # Pool a again, judged by the forecast and the capacity manager's allowance.
    "check-a-inference": Parameters(
        pool_node_selector={"pool": "a"},
        inference_headroom=Headroom("scaler:9090", "a"),
        reclaim=ReclaimParameters(enabled=True, min_run_seconds=0),
    ),
}


@dataclass
class World:
    """The cluster as the watches would show it; every change a new object version."""

    now: float = NOW
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    demand: dict[str, PoolDemand] | None = None
    version: int = 1

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A new version of ``obj`` (a copy, as a watch delivers a new object)."""
        obj = copy.deepcopy(obj)
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def pending(self) -> list[Pending]:
        return [
            Pending(w, entry["name"], CHECKS[entry["name"]], NOW - 10)
            for w in self.workloads.values()
            for entry in w["status"]["admissionChecks"]
            if entry["state"] == "Pending"
        ]

    def cluster(self, memo: incremental.Memo | None) -> Cluster:
        return Cluster(
            nodes=list(self.nodes.values()),
            pods=list(self.pods.values()),
            workloads=list(self.workloads.values()),
            datasets=list(self.datasets.values()),
            dataloads=[],
            demand=self.demand,
            our_checks=frozenset(CHECKS),
            check_parameters=CHECKS,
            memo=memo,
        )

    def ready(self) -> list[str]:
        return sorted(
            k
            for k, w in self.workloads.items()
            if w["status"]["admissionChecks"][0]["state"] == "Ready"
            and not any(c["type"] == "Finished" for c in w["status"]["conditions"])
        )


def pool_of(check: str) -> str:
    return "b" if check == "check-b" else "a"


def apply_event(world: World, event: tuple[Any, ...]) -> None:
    """One watch event's worth of change (the kinds the module docstring lists)."""
    kind, *args = event
    if kind == "arrive":
        check, gpus, pods, share, priority, data = args
        name = f"w{world.version}"
        w = decided.workload(name, pods=pods, gpus=gpus, priority=priority)
        if share:
            w = decided.asking_a_share(w, share)
        if data:
            w["metadata"]["annotations"][names.DATASET] = data
        w["metadata"]["creationTimestamp"] = format_time(world.now)
        w["status"]["admissionChecks"][0]["name"] = check
        w["metadata"]["generation"] = 1  # status writes leave it; no event here changes spec
        world.workloads[name] = world.stamp(w)
    elif kind == "admit" and (pending := [p.workload for p in world.pending()]):
        w = world.stamp(pending[args[0] % len(pending)])
        w["status"]["admissionChecks"][0].update(
            state="Ready", lastTransitionTime=format_time(world.now)
        )
        if args[0] % 2:  # Kueue's Admitted in the same write, or later ("kueue")
            w["status"]["conditions"].append(
                {"type": "Admitted", "status": "True", "lastTransitionTime": format_time(world.now)}
            )
        world.workloads[w["metadata"]["name"]] = w
    elif kind == "place" and (ready := world.ready()):
        place(world, world.workloads[ready[args[0] % len(ready)]], args[1])
    elif kind == "place-one" and (pending := [p.workload for p in world.pending()]):
        # HAMi placed one pod before Kueue's admission reached the view.
        place(world, pending[args[0] % len(pending)], args[1], pods=1)
    elif kind == "kueue" and world.workloads:
        # Kueue's own status writes: Admitted once every check is Ready, then others
        # (PodsReady, requeue state) that change nothing we read.
        w = world.stamp(world.workloads[sorted(world.workloads)[args[0] % len(world.workloads)]])
        ready = w["status"]["admissionChecks"][0]["state"] == "Ready"
        admitted = {
            "type": "Admitted",
            "status": "True",
            "lastTransitionTime": format_time(world.now),
        }
        if (
            args[1]
            and ready
            and admitted["type"] not in [c["type"] for c in w["status"]["conditions"]]
        ):
            w["status"]["conditions"].append(admitted)
        else:
            w["status"]["conditions"].append({"type": "PodsReady", "status": "False"})
        world.workloads[w["metadata"]["name"]] = w
    elif kind == "share-uid" and len(world.workloads) >= 2:
        # Two Workloads under one uid (a broken watch cache): one gang was fitted twice
        # and the other dropped, and a gang admitted onto its cards (hostile pass 30).
        names_ = sorted(world.workloads)
        a, b = names_[args[0] % len(names_)], names_[args[1] % len(names_)]
        if a != b:
            w = world.stamp(world.workloads[b])
            w["metadata"]["uid"] = world.workloads[a]["metadata"]["uid"]
            world.workloads[b] = w
    elif kind == "pin" and (ready := world.ready()):
        # Our Ready entry's selector names a cache label (Fluid's), which nodes take later.
        w = world.stamp(world.workloads[ready[args[0] % len(ready)]])
        w["status"]["admissionChecks"][0]["podSetUpdates"] = [
            {"name": w["spec"]["podSets"][0]["name"], "nodeSelector": {CACHE_LABEL: "true"}}
        ]
        world.workloads[w["metadata"]["name"]] = w
    elif kind == "shadow" and f"{(on := sorted(world.nodes)[0])}-shadow" not in world.nodes:
        # A second Node under a pool node's name, in no pool (a broken watch cache): the
        # selectors read labels by name, from either (hostile pass 31).
        shadow = decided.node(on, 1, labels={"pool": "zz"})
        world.nodes[f"{on}-shadow"] = world.stamp(shadow)
    elif kind == "label":
        # Fluid moves its cache label: only the node's labels change.
        on = sorted(world.nodes)[args[0] % len(world.nodes)]
        node = world.stamp(world.nodes[on])
        labels = node["metadata"]["labels"]
        if labels.pop(CACHE_LABEL, None) is None:
            labels[CACHE_LABEL] = "true"
        world.nodes[on] = node
    elif kind == "unscheduled" and (ready := world.ready()):
        # The gang's pods, not yet scheduled (no node), their allocation annotation absent
        # or empty (a tenant's template carries it; Kueue copies it onto the pods).
        unscheduled(world, world.workloads[ready[args[0] % len(ready)]], *args[1:])
    elif kind == "fail-one" and (placed := sorted(p for p in world.pods if "-r" not in p)):
        # A placed pod fails (its node and allocation stay on it) and its Job makes a
        # replacement, not yet scheduled: the failed one holds no card.
        name = placed[args[0] % len(placed)]
        failed = world.stamp(world.pods[name])
        failed["status"]["phase"] = "Failed"
        world.pods[name] = failed
        again = copy.deepcopy(failed)
        again["metadata"].update(name=f"{name}-r", uid=f"uid-{name}-r", annotations={})
        again["spec"], again["status"] = {}, {"phase": "Pending"}
        world.pods[f"{name}-r"] = world.stamp(again)
    elif kind == "drain-one" and (placed := sorted(p for p in world.pods if "-r" not in p)):
        # A placed pod's node is drained (cordoned), or dies (its handshake goes stale),
        # and the pod is being deleted, still Running and allocated; its Job makes a
        # replacement, not yet scheduled.
        name = placed[args[0] % len(placed)]
        deleting = world.stamp(world.pods[name])
        on = deleting["spec"].get("nodeName")
        if on in world.nodes:
            node = world.stamp(world.nodes[on])
            if args[1]:
                node["spec"]["unschedulable"] = True
            else:
                asked = format_time(world.now - 3600).replace("T", " ").rstrip("Z")
                node["metadata"]["annotations"][names.HAMI_NODE_HANDSHAKE] = f"Requesting_{asked}"
            world.nodes[on] = node
        deleting["metadata"]["deletionTimestamp"] = format_time(world.now)
        world.pods[name] = deleting
        again = copy.deepcopy(deleting)
        del again["metadata"]["deletionTimestamp"]
        again["metadata"].update(name=f"{name}-r", uid=f"uid-{name}-r", annotations={})
        again["spec"], again["status"] = {}, {"phase": "Pending"}
        world.pods[f"{name}-r"] = world.stamp(again)
    elif kind == "finish" and (ready := world.ready()):
        w = world.stamp(world.workloads[ready[args[0] % len(ready)]])
        w["status"]["conditions"].append({"type": "Finished", "status": "True"})
        world.workloads[w["metadata"]["name"]] = w
        for name, pod in list(world.pods.items()) if len(args) < 2 or not args[1] else ():
            if pod["metadata"]["ownerReferences"][0]["uid"] == f"uid-job-{w['metadata']['name']}":
                del world.pods[name]
    else:
        apply_cluster_event(world, kind, args)


def apply_cluster_event(world: World, kind: str, args: list[Any]) -> None:
    nodes = sorted(world.nodes)
    if kind == "share":
        on, card, mib = nodes[args[0] % len(nodes)], args[1], args[2]
        cards = len(_register(world.nodes[on]))
        pod = decided.sharing(f"share-{world.version}", on, card % cards, mib, 0)
        world.pods[pod["metadata"]["name"]] = world.stamp(pod)
    elif kind == "free" and world.pods:
        del world.pods[sorted(world.pods)[args[0] % len(world.pods)]]
    elif kind == "cordon":  # by its key in the world: a shadow's name is another's
        on = nodes[args[0] % len(nodes)]
        node = world.stamp(world.nodes[on])
        node["spec"]["unschedulable"] = not node["spec"].get("unschedulable", False)
        world.nodes[on] = node
    elif kind == "handshake":
        on = nodes[args[0] % len(nodes)]
        node = world.stamp(world.nodes[on])
        asked = format_time(world.now).replace("T", " ").rstrip("Z")
        node["metadata"]["annotations"][names.HAMI_NODE_HANDSHAKE] = f"Requesting_{asked}"
        world.nodes[on] = node
    elif kind == "dataset":
        world.datasets[args[0]] = world.stamp(decided.dataset(args[0], cached=args[1]))
    elif kind == "forecast":
        held, needed = args
        world.demand = None if held is None else {"a": PoolDemand("a", held, needed)}
    elif kind == "tick":
        world.now += args[0]


def _register(node: dict[str, Any]) -> list[Any]:
    return json.loads(node["metadata"]["annotations"][names.HAMI_NODE_REGISTER])


def place(world: World, w: dict[str, Any], first_card: int, pods: int | None = None) -> None:
    """The gang's pods (or its first ``pods``), each on a node of its pool holding whole cards."""
    name = w["metadata"]["name"]
    pool = pool_of(w["status"]["admissionChecks"][0]["name"])
    nodes = sorted(n for n, obj in world.nodes.items() if obj["metadata"]["labels"]["pool"] == pool)
    pod_set = w["spec"]["podSets"][0]
    gpus = int(pod_set["template"]["spec"]["containers"][0]["resources"]["limits"][names.GPU])
    for i in range(pod_set["count"] if pods is None else pods):
        on = nodes[(first_card + i) % len(nodes)]
        cards = len(_register(world.nodes[on]))
        start = first_card % cards
        pod = decided.running(
            f"{name}-{i}", on, range(start, min(cards, start + gpus)), owner=f"job-{name}"
        )
        world.pods[pod["metadata"]["name"]] = world.stamp(pod)


def unscheduled(
    world: World,
    w: dict[str, Any],
    allocated: str | None,
    on: str | None = None,
    bound: str | None = None,
) -> None:
    """The gang's pods, not scheduled by HAMi, carrying ``allocated`` (None: no such key)
    and HAMi's node annotation ``on`` (None: none), as a tenant's template may; bound to
    ``bound`` by another scheduler (None: not bound)."""
    name = w["metadata"]["name"]
    for i in range(w["spec"]["podSets"][0]["count"]):
        annotations = {} if allocated is None else {names.HAMI_DEVICES_ALLOCATED: allocated}
        if on is not None:
            annotations[names.HAMI_VGPU_NODE] = on
        pod = {
            "metadata": {
                "name": f"{name}-{i}",
                "namespace": "train",
                "uid": f"uid-{name}-{i}",
                "ownerReferences": [{"uid": f"uid-job-{name}"}],
                "annotations": annotations,
            },
            "spec": {} if bound is None else {"nodeName": bound},
            "status": {"phase": "Pending"},
        }
        world.pods[f"{name}-{i}"] = world.stamp(pod)


ARRIVALS = st.tuples(
    st.just("arrive"),
    st.sampled_from(sorted(CHECKS)),
    st.sampled_from([1, 1, 2, 4, 8]),
    st.integers(1, 3),
    st.sampled_from([None, None, 20_000, 70_000]),
    st.integers(0, 2),
    st.sampled_from([None, None, None, "weights"]),
)
GANGS = st.one_of(  # gangs come and go more often than the rest changes
    ARRIVALS,
    ARRIVALS,
    st.tuples(st.just("admit"), st.integers(0, 20)),
    st.tuples(st.just("admit"), st.integers(0, 20)),
    st.tuples(st.just("place"), st.integers(0, 20), st.integers(0, 7)),
    st.tuples(st.just("place-one"), st.integers(0, 20), st.integers(0, 7)),
    st.tuples(
        st.just("unscheduled"),
        st.integers(0, 20),
        st.sampled_from([None, "", ";", "GPU-gpu-0-0,NVIDIA,80000,100:;", "garbage"]),
        st.sampled_from([None, "gpu-0", "ghost"]),
        st.sampled_from([None, None, "gpu-0", "gpu-1"]),
    ),
    st.tuples(st.just("drain-one"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("fail-one"), st.integers(0, 20)),
    st.tuples(st.just("finish"), st.integers(0, 20), st.booleans()),  # pods gone with it, or later
    st.tuples(st.just("kueue"), st.integers(0, 20), st.booleans()),
)
EVENTS = st.one_of(
    GANGS,
    GANGS,
    st.tuples(
        st.just("share"),
        st.integers(0, 7),
        st.integers(0, 7),
        st.sampled_from([10_000, 40_000, 100_000]),
    ),
    st.tuples(st.just("free"), st.integers(0, 20)),
    st.tuples(st.just("cordon"), st.integers(0, 7)),
    st.tuples(st.just("handshake"), st.integers(0, 7)),
    st.tuples(st.just("dataset"), st.just("weights"), st.sampled_from(["40.0%", "100.0%"])),
    st.tuples(
        st.just("forecast"),
        st.sampled_from([None, 0.0, 2.0]),
        st.sampled_from([0.0, 3.0, 9.0]),
    ).map(lambda e: e if e[1] is not None else ("forecast", None, None)),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 1.0, 30.0, 70.0, 200.0, 301.0])),
    st.tuples(st.just("share-uid"), st.integers(0, 20), st.integers(0, 20)),
    st.tuples(st.just("pin"), st.integers(0, 20)),
    st.tuples(st.just("label"), st.integers(0, 7)),
    st.tuples(st.just("shadow")),
)
CACHE_LABEL = "fluid.io/s-ns-data"


@st.composite
def worlds(draw: st.DrawFn) -> World:
    """Two pools of a few small nodes, some cards already held."""
    world = World()
    for i in range(draw(st.integers(2, 5))):
        name = f"gpu-{i}"
        pool = "ab"[i % 2] if i < 2 else draw(st.sampled_from("ab"))
        node = decided.node(name, draw(st.integers(1, 4)), labels={"pool": pool})
        node["metadata"]["uid"] = f"uid-{name}"
        world.nodes[name] = world.stamp(node)
    return world


def both(world: World, memo: incremental.Memo) -> tuple[Any, Any]:
    """(plans, decisions) on the kept memo, and from scratch."""
    answers = []
    for kept in (memo, None):
        cluster = world.cluster(kept)
        plans = plan_pools(cluster, world.now)
        decisions = decide_all(world.pending(), replace(cluster, plans=plans), world.now)
        answers.append((plans, decisions))
    return answers[0], answers[1]


@settings(max_examples=250, deadline=None)
@given(world=worlds(), events=st.lists(EVENTS, min_size=1, max_size=25))
def test_decisions_on_the_kept_state_equal_a_pass_from_scratch(world, events):
    memo = incremental.Memo()
    for event in events:
        apply_event(world, event)
        kept, fresh = both(world, memo)
        assert kept == fresh, event


@settings(max_examples=150, deadline=None)
@given(world=worlds(), events=st.lists(EVENTS, min_size=1, max_size=25))
def test_decisions_resumed_from_held_checkpoints_equal_a_pass_from_scratch(world, events):
    """As above, with a checkpoint every second gang held: a pass resumes from the one
    before its first change, and fits the gangs since again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(incremental, "HELD_CHECKPOINT", 2)
        memo = incremental.Memo()
        for event in events:
            apply_event(world, event)
            kept, fresh = both(world, memo)
            assert kept == fresh, event


@settings(max_examples=60, deadline=None)
@given(  # two Nodes of one name are built every pass (``pool_fingerprint``)
    world=worlds(),
    events=st.lists(EVENTS.filter(lambda e: e[0] != "shadow"), min_size=1, max_size=12),
)
def test_a_second_pass_over_an_unchanged_state_reuses_every_pool_and_decides_the_same(
    world, events
):
    memo = incremental.Memo()
    for event in events:
        apply_event(world, event)
    first, _ = both(world, memo)
    built = memo.built
    second, _ = both(world, memo)
    assert second == first
    assert memo.built == built, "nothing changed, yet a pool was built again"


# --- what the kept state saves ------------------------------------------------------------


@pytest.fixture
def searches(monkeypatch):
    """Every fit search a pass runs, by gang name."""
    calls: list[str] = []
    real = fit.fit_gang

    def counting(demand, *args, **kw):
        calls.append(demand[0].name if demand else "")
        return real(demand, *args, **kw)

    monkeypatch.setattr("admission.decide.fit_gang", counting)
    return calls


def small_world() -> World:
    world = World()
    for i in range(2):
        node = decided.node(f"gpu-{i}", 2, labels={"pool": "a"})
        world.nodes[node["metadata"]["name"]] = world.stamp(node)
    return world


def one_card_nodes(*pools: str) -> World:
    """A world of one-card nodes gpu-0, gpu-1, ... in these pools."""
    world = World()
    for i, pool in enumerate(pools):
        name = f"gpu-{i}"
        world.nodes[name] = world.stamp(decided.node(name, 1, labels={"pool": pool}))
    return world


def assert_kept_decides_as_scratch(world: World, events: tuple[tuple[Any, ...], ...]) -> None:
    """After each event, the memo's plans and decisions equal a pass from scratch."""
    memo = incremental.Memo()
    for event in events:
        apply_event(world, event)
        kept, fresh = both(world, memo)
        assert kept == fresh, event


def test_a_cache_label_that_moves_moves_the_gang_held_on_it():
    """The memo's node key read no labels: a gang held on the nodes of a Fluid cache
    label stayed where the label had been, and another was admitted onto its cards
    (issue 27, hostile pass 30)."""
    assert_kept_decides_as_scratch(
        one_card_nodes("a", "a"),
        (
            ("arrive", "check-a", 1, 1, None, 5, None),
            ("admit", 0),
            ("pin", 0),
            ("arrive", "check-a", 1, 2, None, 0, None),  # two 1-card pods: both cards
            ("label", 0),
            ("label", 1),
            ("label", 0),  # moved from gpu-0 to gpu-1
            ("tick", 100.0),
        ),
    )


def test_two_workloads_under_one_uid_decide_as_a_pass_from_scratch():
    """Gangs held were read again by uid: of two Workloads sharing one (a broken watch
    cache), one was fitted twice and the other dropped (issue 27, hostile pass 30)."""
    assert_kept_decides_as_scratch(
        one_card_nodes("a", "b"),
        (
            ("arrive", "check-a", 1, 1, None, 0, None),
            ("arrive", "check-a", 1, 1, None, 0, None),
            ("share-uid", 0, 1),
            ("admit", 0),
        ),
    )


def test_a_node_named_twice_out_of_the_pool_moves_the_gang_held_on_its_label():
    """Two Nodes named gpu-0, the second in no pool: the gang's node selector read the
    second's labels, which the pool's fingerprint never read, so the kept pool held the
    gang where a pass from scratch no longer could (issue 27, hostile pass 31)."""
    assert_kept_decides_as_scratch(
        one_card_nodes("a", "a"),
        (
            ("arrive", "check-a", 1, 1, None, 0, None),
            ("admit", 0),
            ("pin", 0),
            ("shadow",),
            ("arrive", "check-a", 1, 2, None, 0, None),
            ("label", 1),  # sorted: gpu-0, gpu-0-shadow, gpu-1: the shadow takes the label
        ),
    )


CARD = "GPU-gpu-0-0,NVIDIA,80000,100:;"
"""An allocation of gpu-0's first card, as HAMi writes one."""


@pytest.mark.parametrize(
    ("allocated", "on", "bound"),
    [
        pytest.param(None, None, None, id="pods without the allocation annotation"),
        pytest.param("", None, None, id="pods with the annotation empty"),
        pytest.param(";", None, None, id="pods with an allocation naming no card"),
        pytest.param(CARD, "ghost", None, id="a template naming a node that does not exist"),
        pytest.param("garbage", "ghost", None, id="a template naming no node, unread"),
        pytest.param(CARD, "gpu-1", None, id="a template naming a pool node and another's card"),
        pytest.param(CARD, None, "gpu-1", id="bound by another scheduler, no node of HAMi's"),
        pytest.param(CARD, "ghost", "gpu-1", id="bound elsewhere than HAMi's node says"),
    ],
)
def test_a_ready_gang_whose_pods_are_not_scheduled_holds_its_cards(allocated, on, bound):
    """The annotations alone had read as placed: the gang held no card, and a third GPU's
    worth was admitted onto a pool of two (issue 27, hostile passes 35 to 37)."""
    world = one_card_nodes("a", "a")
    apply_event(world, ("arrive", "check-a", 1, 2, None, 0, None))
    apply_event(world, ("admit", 0))
    apply_event(world, ("unscheduled", 0, allocated, on, bound))
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    _, (_, decisions) = both(world, incremental.Memo())
    assert [d.state for d in decisions] == ["Retry"]


@pytest.mark.parametrize(
    "drained",
    [
        pytest.param(True, id="its node drained (cordoned)"),
        pytest.param(False, id="its node dead (its handshake stale)"),
    ],
)
def test_a_pod_being_deleted_holds_no_card_its_gang_counts_on(drained):
    """A pod being deleted stays Running, bound and allocated for its grace period (on
    a dead node, until the Node goes): counted as placed, its gang held nothing for the
    replacement, and a 1-GPU gang was admitted onto the only card left (issue 27,
    hostile pass 37)."""
    world = one_card_nodes("a", "a", "a")
    apply_event(world, ("arrive", "check-a", 1, 2, None, 0, None))
    apply_event(world, ("admit", 0))
    apply_event(world, ("place", 0, 0))  # gpu-0 and gpu-1
    apply_event(world, ("drain-one", 1, drained))
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    kept, (_, decisions) = both(world, incremental.Memo())
    assert [d.state for d in decisions] == ["Retry"]
    assert kept[1] == decisions


def test_a_pod_on_a_node_deleted_undrained_holds_no_card_its_gang_counts_on():
    """A Node deleted without a drain (a spot instance gone) leaves its pods bound and
    Running until PodGC's sweep: counted as placed, the gang held nothing and a 1-GPU
    gang took the only card left (issue 27, hostile pass 38)."""
    world = one_card_nodes("a", "a", "a")
    apply_event(world, ("arrive", "check-a", 1, 2, None, 0, None))
    apply_event(world, ("admit", 0))
    apply_event(world, ("place", 0, 0))  # gpu-0 and gpu-1
    del world.nodes["gpu-1"]
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    kept, (_, decisions) = both(world, incremental.Memo())
    assert [d.state for d in decisions] == ["Retry"]
    assert kept[1] == decisions


def test_a_held_gangs_pod_on_a_node_outside_the_pool_deleted_decides_as_a_pass_from_scratch():
    """A gang's pod HAMi placed outside the gang's pool (nothing steers a Job without a
    selector into it) counts while its Node is there; that Node deleted undrained, the
    kept pool still counted the pod placed and admitted a gang onto the card the hold was
    for, until the resync (issue 27, hostile pass 39)."""
    world = one_card_nodes("a", "b")  # gpu-0 in pool a, gpu-1 in pool b
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    apply_event(world, ("admit", 0))
    name = world.workloads[world.ready()[0]]["metadata"]["name"]
    pod = decided.running(f"{name}-0", "gpu-1", range(1), owner=f"job-{name}")
    world.pods[pod["metadata"]["name"]] = world.stamp(pod)
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    memo = incremental.Memo()
    assert [d.state for d in both(world, memo)[0][1]] == ["Ready"]  # gpu-0 is free
    del world.nodes["gpu-1"]
    kept, fresh = both(world, memo)
    assert [d.state for d in fresh[1]] == ["Retry"]  # gpu-0 is the gang's again
    assert kept == fresh


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param("gpu-0", None, id="HAMi's node annotation taken off a bound pod"),
        pytest.param(None, "gpu-0", id="HAMi's node annotation put on a bound pod"),
    ],
)
def test_hamis_node_annotation_alone_changing_decides_as_a_pass_from_scratch(before, after):
    """The memo's pod key read HAMi's node or else the binding, so the annotation there
    or not, equal to the binding, keyed alike while the hold told them apart: the kept
    pool admitted a share onto the card a pass from scratch held (hostile pass 38)."""
    small = "GPU-gpu-0-0,NVIDIA,1000,1:;"
    assert_kept_decides_as_scratch(
        one_card_nodes("a"),
        (
            ("arrive", "check-a", 1, 1, None, 0, None),
            ("admit", 0),
            ("unscheduled", 0, small, before, "gpu-0"),
            ("arrive", "check-a", 1, 1, 20_000, 0, None),
            ("unscheduled", 0, small, after, "gpu-0"),
        ),
    )


def test_a_pod_that_failed_holds_no_card_and_its_replacement_is_held_for():
    """A failed pod keeps its node and allocation: counted as placed, the gang held
    nothing for its replacement, and a gang was admitted onto the card the failure
    freed (issue 27, hostile pass 36)."""
    world = one_card_nodes("a", "a")
    apply_event(world, ("arrive", "check-a", 1, 2, None, 0, None))
    apply_event(world, ("admit", 0))
    apply_event(world, ("place", 0, 0))
    apply_event(world, ("fail-one", 1))
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    _, (_, decisions) = both(world, incremental.Memo())
    assert [d.state for d in decisions] == ["Retry"]


def test_an_empty_allocation_and_none_decide_alike_on_the_kept_state():
    """The memo's pod key read an absent annotation and an empty one alike, while the
    hold told them apart: a pool kept from the empty one admitted a gang onto the held
    gang's cards once the annotation went (issue 27, hostile pass 35)."""
    assert_kept_decides_as_scratch(
        one_card_nodes("a", "a"),
        (
            ("arrive", "check-a", 1, 2, None, 0, None),
            ("admit", 0),
            ("arrive", "check-a", 3, 1, None, 0, None),  # never fits: the pool is read
            ("unscheduled", 0, ""),
            ("unscheduled", 0, None),
            ("arrive", "check-a", 1, 1, None, 0, None),
        ),
    )


def test_a_gang_that_does_not_fit_is_searched_again_only_when_its_pool_changes(searches):
    world = small_world()
    apply_event(world, ("arrive", "check-a", 8, 1, None, 0, None))  # 8 cards, the pool has 4
    apply_event(world, ("share", 0, 0, 10_000))
    memo = incremental.Memo()
    (_, [first]), _ = both(world, memo)
    assert first.state == "Rejected"  # never fits: no search at all
    apply_event(world, ("arrive", "check-a", 2, 2, None, 0, None))  # 2 x 2 cards: one card held
    searches.clear()
    (_, decisions), _ = both(world, memo)
    assert sorted(d.state for d in decisions) == ["Rejected", "Retry"]
    assert searches == ["workers", "workers"]  # kept pass, then the pass from scratch
    searches.clear()
    (_, again), _ = both(world, memo)
    assert again == decisions
    assert searches == ["workers"], "the pass from scratch searched; the kept one did not"
    apply_event(world, ("free", 0))  # the share on gpu-0 goes: capacity freed
    searches.clear()
    (_, freed), _ = both(world, memo)
    assert sorted(d.state for d in freed) == ["Ready", "Rejected"]
    assert searches == ["workers", "workers"]


def test_a_pass_reads_only_the_objects_that_changed_since_the_last(monkeypatch):
    """What a pool's fingerprint reads of a node, pod or held Workload is kept by object."""
    reads: list[str] = []
    for name in ("_node_keys", "_pod_key", "_held_key"):
        real = getattr(incremental, name)

        def counting(*args, _real=real, _name=name):
            reads.append(_name)
            return _real(*args)

        monkeypatch.setattr(incremental, name, counting)
    world = small_world()
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    apply_event(world, ("admit", 0))
    apply_event(world, ("place", 0, 0))
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    memo = incremental.Memo()

    def one_pass() -> list[str]:
        reads.clear()
        memo.begin()
        plans = plan_pools(world.cluster(memo), world.now)
        decide_all(world.pending(), replace(world.cluster(memo), plans=plans), world.now)
        return sorted(set(reads))

    assert one_pass() == ["_held_key", "_node_keys", "_pod_key"]
    assert one_pass() == []  # nothing changed: every key taken back
    apply_event(world, ("share", 1, 0, 10_000))  # one pod more
    assert one_pass() == ["_pod_key"]
    apply_event(world, ("kueue", 0, False))  # a status write: the held Workload is a new object
    assert one_pass() == ["_held_key"]
    apply_event(world, ("tick", 1.0))  # a node's handshake says until when it offers
    assert one_pass() == []
    apply_event(world, ("handshake", 0))  # HAMi rewrites it: that node alone is read again
    assert one_pass() == ["_node_keys"]
    assert len(memo.keys) <= len(world.nodes) + len(world.pods) + 3 * len(world.workloads)


HELD_KEYS = st.lists(
    st.tuples(st.sampled_from(["uid-a", "uid-b", "uid-c", "uid-d"]), st.integers(0, 2)), max_size=6
)


@given(before=HELD_KEYS, after=HELD_KEYS, copied=st.booleans())
def test_the_held_gangs_gone_and_added_are_those_a_set_difference_finds(before, after, copied):
    """By uid and identity, as by hashing whole keys; equal keys as copies, uids twice."""
    if copied:  # equal keys that are not the same tuple, as from a Workload written again
        after = [(h[0], h[1]) for h in after]
    old, new = set(before), set(after)
    expected = ({h[0] for h in old - new}, {h[0] for h in new - old})
    assert incremental.held_changes(before, after) == expected


def test_a_miss_after_a_ready_of_the_same_pass_is_not_kept_for_the_next():
    """Y missed only for the cards X took in that pass; next pass X waits, Y fits."""
    world = small_world()  # 2 nodes x 2 cards
    apply_event(world, ("forecast", 0.0, 0.0))
    apply_event(world, ("arrive", "check-a-inference", 2, 1, None, 2, None))  # X, first
    apply_event(world, ("arrive", "check-a", 2, 2, None, 0, None))  # Y: both nodes
    memo = incremental.Memo()
    (_, decisions), _ = both(world, memo)
    assert [d.state for d in decisions] == ["Ready", "Retry"]
    apply_event(world, ("forecast", 0.0, 9.0))  # inference needs every card: X waits
    (_, kept), (_, fresh) = both(world, memo)
    assert kept == fresh
    assert [d.state for d in kept] == ["Retry", "Ready"]


def test_a_miss_kept_from_an_earlier_pass_is_not_taken_after_a_ready_of_this_pass():
    """A gang that missed the pool as the last pass began says what the pool had then; in
    a pass where a Ready took a card first, it is searched again, as a build would."""
    world = World()
    for i, pool in enumerate("abaa"):  # 3 cards in pool a
        node = decided.node(f"gpu-{i}", 1, labels={"pool": pool})
        world.nodes[f"gpu-{i}"] = world.stamp(node)
    memo = incremental.Memo()
    for event in [
        ("arrive", "check-a", 1, 1, None, 0, None),
        ("arrive", "check-a", 1, 1, None, 0, None),
        ("admit", 0),
        ("arrive", "check-a", 1, 2, None, 0, None),  # misses with 1 card free
        ("admit", 0),
        ("arrive", "check-a", 1, 1, None, 0, None),  # decided first, takes that card
    ]:
        apply_event(world, event)
        kept, fresh = both(world, memo)
        assert kept == fresh, event
    _, decisions = kept
    assert [d.message.split(";")[0] for d in decisions if d.state == "Retry"] == [
        "does not fit now: podSet workers: 0 of 2 pods fit"
    ]


def one_node(cards: int) -> World:
    world = World()
    node = decided.node("gpu-0", cards, labels={"pool": "a"})
    world.nodes["gpu-0"] = world.stamp(node)
    return world


@pytest.mark.parametrize(
    ("cards", "events", "state"),
    [
        pytest.param(
            2,
            [
                ("arrive", "check-a", 2, 1, None, 0, None),
                ("admit", 0),
                ("arrive", "check-a", 1, 1, None, 2, None),
                ("admit", 0),  # the priority-2 gang: held back before the first one
                ("arrive", "check-a", 1, 1, None, 0, None),
            ],
            "Ready",
            id="a-gang-admitted-ahead-of-those-held-is-held-back-before-them",
        ),
        pytest.param(
            3,
            [
                ("arrive", "check-a", 1, 2, None, 0, None),
                ("place-one", 0, 0),  # one pod placed while the gang is still pending
                ("admit", 0),  # then Ready: its placed pod is in the gang, not beside it
                ("arrive", "check-a", 1, 1, None, 0, None),
            ],
            "Ready",
            id="a-gang-admitted-with-a-pod-placed-counts-that-pod-once",
        ),
        pytest.param(
            2,
            [
                ("arrive", "check-a", 1, 1, None, 0, None),
                ("place-one", 0, 0),  # its one pod placed while it is still pending
                ("admit", 0),  # then Ready: placed, so nothing is held back for it
                ("arrive", "check-a", 1, 1, None, 0, None),
            ],
            "Ready",
            id="a-gang-admitted-with-every-pod-placed-holds-nothing-more",
        ),
        pytest.param(
            2,
            [
                ("arrive", "check-a", 2, 1, None, 0, None),
                ("admit", 0),
                ("arrive", "check-a", 1, 1, None, 0, None),
                ("finish", 0),  # no pod ever placed: only the Workload changes
            ],
            "Ready",
            id="a-held-gang-that-finishes-frees-its-cards",
        ),
        pytest.param(
            4,
            [
                ("forecast", 0.0, 0.0),  # the allowance: all 4 cards
                ("arrive", "check-a", 1, 2, None, 0, None),
                ("place-one", 0, 0),
                ("admit", 0),  # Ready, not yet Admitted: its placed card is promised too
                ("arrive", "check-a-inference", 2, 1, None, 0, None),
                ("kueue", 0, True),  # Admitted: that card now counts as placed, once
            ],
            "Ready",
            id="a-held-gang-admitted-by-kueue-counts-its-placed-cards-once-in-the-allowance",
        ),
        pytest.param(
            2,
            [
                ("arrive", "check-a", 1, 2, None, 0, None),
                ("place-one", 0, 0),
                ("admit", 0),  # held: its pod on card 0 is part of it
                ("arrive", "check-a", 2, 1, None, 0, None),
                ("finish", 0, True),  # finished, its pod still running: it holds card 0
            ],
            "Retry",
            id="a-held-gang-that-finishes-with-a-pod-left-leaves-that-pod-counted",
        ),
        pytest.param(
            2,
            [
                ("arrive", "check-a", 1, 1, None, 0, None),
                ("admit", 0),
                ("arrive", "check-a", 1, 1, None, 0, None),
                ("admit", 0),  # after the first: fitted on the kept pool
                ("arrive", "check-a", 1, 1, None, 0, None),
            ],
            "Retry",
            id="gangs-admitted-one-after-another-are-each-held-back",
        ),
    ],
)
def test_gangs_admitted_since_the_last_pass_are_held_back_as_a_build_would(cards, events, state):
    world = one_node(cards)
    memo = incremental.Memo()
    for event in events:
        apply_event(world, event)
        kept, fresh = both(world, memo)
        assert kept == fresh, event
    _, decisions = kept
    assert [d.state for d in decisions] == [state]


@pytest.mark.parametrize(
    ("events", "placing", "state"),
    [
        pytest.param(
            [("arrive", "check-a", 1, 2, None, 0, None), ("admit", 0)],
            ("place", 0, 0),  # held until now; its two pods' cards count instead
            "Ready",
            id="a-held-gang-whose-pods-are-placed-counts-them-instead-of-its-hold",
        ),
        pytest.param(
            [("arrive", "check-a", 2, 1, None, 0, None), ("admit", 0)],
            ("share", 0, 2, 100_000),  # an inference pod of no gang on the free card
            "Retry",
            id="a-pod-of-no-gang-takes-its-card-off-the-kept-pool",
        ),
        pytest.param(
            [("arrive", "check-a", 1, 2, None, 0, None), ("admit", 0)],
            ("place-one", 0, 2),  # the pending gang's first pod, before its admission
            "Retry",
            id="a-pod-placed-for-a-pending-gang-counts-as-placed",
        ),
    ],
)
def test_pods_placed_since_the_last_pass_are_taken_off_the_kept_pool_as_a_build_would(
    events, placing, state
):
    """Pods only added: the kept pool is extended, not built, and answers as a build."""
    world = one_node(3)
    memo = incremental.Memo()
    for event in events:
        apply_event(world, event)
        both(world, memo)
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))  # decided after the pods
    both(world, memo)
    apply_event(world, placing)
    built = memo.built
    kept, fresh = both(world, memo)
    assert kept == fresh
    assert memo.built == built  # every pool extended or taken back
    _, decisions = kept
    assert [d.state for d in decisions][-1] == state


def test_the_pools_kept_after_held_gangs_are_checkpoints_with_their_nodes_only():
    """What a fit works out of an inventory (columns, orders: ~6x its nodes) is let go
    for every pool kept after a held gang but the last; 5,000 held gangs kept them all.
    Between checkpoints the pool itself is let go (70 MB at 10,000 cards)."""
    world = one_node(8)
    for _ in range(3):
        apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
        apply_event(world, ("admit", 0))
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    memo = incremental.Memo()
    both(world, memo)
    (entry,) = [e for k, e in memo.pools.items() if isinstance(k, tuple) and k[0] == "held"]
    assert len(entry.held) == 3
    derived = {"columns", "fullest_first", "emptiest_first"}
    assert [h.pool is None for h in entry.held] == [True, True, False]
    assert derived & entry.held[-1].pool.__dict__.keys()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(incremental, "HELD_CHECKPOINT", 2)
        memo = incremental.Memo()
        both(world, memo)  # built: the pool after the second gang is a checkpoint
    (entry,) = [e for k, e in memo.pools.items() if isinstance(k, tuple) and k[0] == "held"]
    pools = [h.pool for h in entry.held]
    assert [p is None for p in pools] == [True, False, False]
    assert pools[1] is not None and not derived & pools[1].__dict__.keys()


def test_a_gang_held_without_pods_lets_go_at_its_deadline_with_no_event():
    world = small_world()
    apply_event(world, ("arrive", "check-a", 2, 2, None, 0, None))
    apply_event(world, ("admit", 0))  # Ready, no pod matched: holds all 4 cards for 5 min
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    memo = incremental.Memo()
    (_, [waiting]), _ = both(world, memo)
    assert waiting.state == "Retry"
    world.now += decide_module.HOLD_SECONDS  # no event: only time passes
    (_, [now_ready]), (_, [fresh]) = both(world, memo)
    assert now_ready == fresh
    assert now_ready.state == "Ready", now_ready.message


def test_a_node_whose_handshake_goes_stale_offers_nothing_with_no_event():
    world = small_world()
    for name in sorted(world.nodes):
        apply_event(world, ("handshake", int(name[-1])))  # asked now, answered by nobody
    apply_event(world, ("arrive", "check-a", 1, 1, None, 0, None))
    memo = incremental.Memo()
    (_, [before]), _ = both(world, memo)
    assert before.state == "Ready"
    world.now += 61  # past the 60 s handshake limit
    (_, [after]), (_, [fresh]) = both(world, memo)
    assert after == fresh
    assert after.state == "Retry", after.message


@pytest.mark.parametrize(
    ("compared", "found"),
    [
        pytest.param({}, {}, id="nothing-to-compare-is-no-difference"),
        pytest.param(
            {"decision": ({"a": 1, "b": 2}, {"a": 1, "b": 3})},
            {"decision": 1},
            id="a-decision-that-differs-counts-once",
        ),
        pytest.param(
            {"plan": ({"a": 1}, {"a": 1, "b": 2})},
            {"plan": 1},
            id="a-plan-only-one-side-made-counts",
        ),
        pytest.param(
            {"inventory": ({"a": 1, "old": 5}, {"a": 1, "new": 2})},
            {},
            id="a-kept-pool-no-check-read-this-pass-is-not-compared",
        ),
    ],
)
def test_differences_count_what_the_kept_state_answered_otherwise(compared, found):
    assert incremental.differences(compared) == found


# --- the controller's resync --------------------------------------------------------------


class Resyncing(Writing):
    """A controller whose clock the test moves, and whose decide errs on kept state."""

    def __init__(self) -> None:
        self.t = NOW

        def wrong_when_kept(pending, cluster, now):
            answers = decide_all(pending, cluster, now)
            if cluster.memo is not None and cluster.memo.built + cluster.memo.reused > 1:
                # A bug stand-in: the kept state's second pass turns every Ready to Retry.
                return [replace(d, state="Retry") if d.state == "Ready" else d for d in answers]
            return answers

        super().__init__(decide=wrong_when_kept)
        self._clock = lambda: self.t


def watching(controller: Writing, *workloads: dict[str, Any]) -> None:
    """The watches list one check of ours, two nodes of 8 cards, and ``workloads``."""
    check = {"metadata": {"name": decided.CHECK}, "spec": {"controllerName": controller.name}}
    controller._changed("admissionchecks", {decided.CHECK: check})
    controller._changed("workloads", {f"train/{w['metadata']['name']}": w for w in workloads})
    controller._changed("nodes", {n: decided.node(n) for n in ("gpu-1", "gpu-2")})
    for name in ("pods", "datasets", "dataloads", "parameters"):
        controller._changed(name, {})


async def test_the_resync_counts_each_difference_and_the_kept_state_starts_again(caplog):
    controller = Resyncing()
    watching(controller, decided.workload("a", gpus=1))
    differences = "unitscale_admission_resync_differences_total"
    sample = controller.metrics.registry.get_sample_value

    async def passes(count: int, step: float) -> None:
        for _ in range(count):
            await controller.reconcile(api=NO_API)
            controller.t += step

    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await passes(2, 1.0)  # within the resync period: the kept answers stand
        assert controller.written["train/a"]["state"] == "Retry"
        assert controller.resync is None
        controller.t += incremental.RESYNC_SECONDS
        await passes(1, 1.0)  # the kept answer is written; from scratch beside the loop
        assert controller.written["train/a"]["state"] == "Retry"
        assert controller.resync is not None
        await controller.resync
        assert sample(differences, {"kind": "decision"}) == 1.0
        await passes(1, 1.0)  # on a kept state started again: a pool built, as from scratch
    assert controller.written["train/a"]["state"] == "Ready"
    warned = [r for r in caplog.records if "resync" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]


class Clocked(Writing):
    """A controller whose clock the test moves."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.t = NOW
        self._clock = lambda: self.t


async def test_the_resync_runs_beside_the_loop_one_at_a_time():
    release = threading.Event()

    def decide(pending, cluster, now):
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(10), "the test never let the resync go on"
        return decide_all(pending, cluster, now)

    controller = Clocked(decide=decide)
    watching(controller, decided.workload("a", gpus=1))
    await controller.reconcile(api=NO_API)
    kept = controller._memo
    controller.t += incremental.RESYNC_SECONDS
    await controller.reconcile(api=NO_API)  # due: the resync starts, and waits
    resync = controller.resync
    assert resync is not None
    for _ in range(2):  # passes go on meanwhile, with no second resync
        controller.t += incremental.RESYNC_SECONDS
        await controller.reconcile(api=NO_API)
        assert controller.resync is resync and not resync.done()
    release.set()
    await resync
    sample = controller.metrics.registry.get_sample_value
    assert sample("unitscale_admission_resync_differences_total", {"kind": "decision"}) is None
    assert controller._memo is kept, "no difference: the kept state stays"


async def test_a_resync_that_raises_fails_its_own_round_and_the_passes_go_on(caplog):
    def decide(pending, cluster, now):
        if threading.current_thread() is not threading.main_thread():
            raise RecursionError("a bug in the pass from scratch")
        return decide_all(pending, cluster, now)

    controller = Clocked(decide=decide)
    watching(controller, decided.workload("a", gpus=1))
    await controller.reconcile(api=NO_API)
    controller.t += incremental.RESYNC_SECONDS
    with caplog.at_level(logging.WARNING, logger="admission.controller"):
        await controller.reconcile(api=NO_API)
        assert controller.resync is not None
        await controller.resync
    sample = controller.metrics.registry.get_sample_value
    assert sample("unitscale_admission_unit_failures_total", {"unit": "resync"}) == 1.0
    assert any("RecursionError" in r.getMessage() for r in caplog.records)
    await controller.reconcile(api=NO_API)
    assert controller.written["train/a"]["state"] == "Ready"


async def test_a_pass_with_nothing_to_decide_keeps_the_pools_current():
    controller = Clocked()
    held = decided.admitted("b", pods=1)  # Ready, its pods not placed: it holds 8 cards
    held["metadata"]["resourceVersion"] = "1"  # a version: what the pool read is kept
    watching(controller, decided.workload("a", gpus=1), held)
    await controller.reconcile(api=NO_API)
    memo = controller._memo
    assert (memo.built, memo.reused, memo.extended) == (1, 0, 0)
    # a is gone; a pod of another owner is placed: nothing to decide, the pool extended
    watching(controller, held)
    controller._changed("pods", {"serve/p": decided.running("p", "gpu-2", range(2))})
    controller.t += 1
    await controller.reconcile(api=NO_API)
    assert (memo.built, memo.reused, memo.extended) == (1, 0, 1)
    # c arrives: its pass takes the pool back as it is, nothing left to catch up on
    controller._changed("workloads", {"train/b": held, "train/c": decided.workload("c", gpus=1)})
    controller.t += 1
    await controller.reconcile(api=NO_API)
    assert (memo.built, memo.reused, memo.extended) == (1, 1, 1)
    assert controller.written["train/c"]["state"] == "Ready"


async def test_a_pass_reads_the_pending_checks_of_the_workloads_its_view_changed_only():
    controller = Writing()
    read: list[str] = []
    real = controller._actionable

    def counting(object_key, w, ours):
        read.append(object_key)
        return real(object_key, w, ours)

    controller._actionable = counting  # type: ignore[method-assign]
    workloads = {f"train/w{i}": decided.workload(f"w{i}", gpus=1) for i in range(3)}
    for i, w in enumerate(workloads.values()):
        w["metadata"]["resourceVersion"] = str(i + 1)
    watching(controller, *workloads.values())
    await controller.reconcile(api=NO_API)
    assert sorted(read) == sorted(workloads)
    read.clear()
    newer = copy.deepcopy(workloads["train/w1"])
    newer["metadata"]["resourceVersion"] = "9"
    controller._heard("workloads", "train/w1", newer)  # one watch event
    await controller.reconcile(api=NO_API)
    assert read == ["train/w1"]


async def test_a_workloads_pending_checks_are_read_once_per_version(monkeypatch):
    read: list[str] = []
    real = workload.actionable

    def counting(w, ours):
        read.append(w["metadata"]["resourceVersion"])
        return real(w, ours)

    monkeypatch.setattr("admission.controller.actionable", counting)
    controller = Writing()
    check = {"metadata": {"name": decided.CHECK}, "spec": {"controllerName": controller.name}}
    waiting = decided.workload("a", gpus=1)
    waiting["metadata"]["resourceVersion"] = "1"
    controller._changed("admissionchecks", {decided.CHECK: check})
    controller._changed("workloads", {"train/a": waiting})
    controller._changed("nodes", {"gpu-1": decided.node("gpu-1")})
    for name in ("pods", "datasets", "dataloads", "parameters"):
        controller._changed(name, {})
    await controller.reconcile(api=NO_API)
    await controller.reconcile(api=NO_API)
    assert read == ["1"]
    newer = copy.deepcopy(waiting)
    newer["metadata"]["resourceVersion"] = "2"
    controller._changed("workloads", {"train/a": newer})
    await controller.reconcile(api=NO_API)
    assert read == ["1", "2"]
    assert controller.written["train/a"]["state"] == "Ready"
