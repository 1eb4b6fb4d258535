"""Fluid prewarm against the real API server with Fluid v1.0.8's CRDs installed.

No Fluid runtime runs: the test writes the Dataset's and the DataLoad's status the way
Fluid's controllers would (``status`` subresource), and the scaler's registry is fed
gateway signals (one buffered request: a scale-from-zero), as its signal watches would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from foundation.errors import NoDataError
from foundation.signals import GatewaySignals, Snapshot
from foundation.timestamps import format_time
from scaler.prewarm import plan as plan_module
from scaler.prewarm.shell import Prewarmer
from scaler.registry import ScaledObjectRegistry
from scaler.signals import SignalStore
from scaler.telemetry import prewarm_families
from tests.k8s.control_plane import ControlPlane
from tests.shared_data import shared

pytestmark = pytest.mark.k8s

FLUID = "/apis/data.fluid.io/v1alpha1"


@pytest.fixture(scope="module")
def fluid_crds(control_plane):
    control_plane.apply_crds(
        [
            shared("crds", "fluid", f"data.fluid.io_{kind}.yaml")
            for kind in ("datasets", "dataloads")
        ]
    )


merge_patch = ControlPlane.merge_patch


async def eventually(what: str, get: Callable[[], Any], limit: float = 30.0) -> Any:
    """Poll ``get()`` until it returns something truthy (a deadline, not a sleep)."""
    deadline = time.monotonic() + limit
    while True:
        value = get()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {limit:.0f} s"
        await asyncio.sleep(0.05)


class Cluster:
    """A namespace's Dataset and DataLoads, written and read as Fluid would."""

    def __init__(self, plane: Any, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace

    def create_dataset(self, cached: str | None, phase: str = "Bound") -> None:
        path = f"{FLUID}/namespaces/{self.namespace}/datasets"
        self.plane.request(
            "POST",
            path,
            {
                "apiVersion": "data.fluid.io/v1alpha1",
                "kind": "Dataset",
                "metadata": {"name": "weights"},
            },
        )
        ready = {"type": "Ready", "status": "True", "reason": "DatasetReady"}
        status: dict[str, Any] = {"phase": phase, "conditions": [ready]}
        if cached is not None:
            status["cacheStates"] = {"cachedPercentage": cached}
        merge_patch(self.plane, f"{path}/weights/status", {"status": status})

    def set_cached(self, cached: str) -> None:
        path = f"{FLUID}/namespaces/{self.namespace}/datasets/weights/status"
        merge_patch(self.plane, path, {"status": {"cacheStates": {"cachedPercentage": cached}}})

    def dataloads(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.plane.request(
            "GET", f"{FLUID}/namespaces/{self.namespace}/dataloads"
        )["items"]
        return items

    def complete(self, name: str) -> None:
        """Fluid's DataLoad controller finishing the load (a Complete condition)."""
        stamp = format_time(time.time())
        merge_patch(
            self.plane,
            f"{FLUID}/namespaces/{self.namespace}/dataloads/{name}/status",
            {
                "status": {
                    "phase": "Complete",
                    "conditions": [
                        {
                            "type": "Complete",
                            "status": "True",
                            "lastProbeTime": stamp,
                            "lastTransitionTime": stamp,
                        }
                    ],
                    "duration": "12s",
                }
            },
        )


class Scaler:
    """One scaler replica: a registry fed gateway signals, and its running Prewarmer."""

    def __init__(self, access: Any, namespace: str, **metadata: str) -> None:
        self.store = SignalStore()
        self.registry = ScaledObjectRegistry(self.store, 60.0)
        self.prewarm = Prewarmer(self.registry, access, tick=0.1, resync=30.0)
        self.namespace = namespace
        keys = {"scalerAddress": "scaler:9090", "deployment": "llama", "fluidDataset": "weights"}
        self.scaled = self.registry.resolve("llama", namespace, {**keys, **metadata})
        self.task: asyncio.Task[None] | None = None

    def arrive(self, buffered: int = 1) -> None:
        # as a gateway publishes: its arrival rate is measured (0 while none arrives);
        # then KEDA's poll, which decides (the prewarm plans on each decision)
        signals = GatewaySignals(time.time(), 0.0, buffered, 0)
        self.store.update(Snapshot((self.namespace, "llama", ""), signals))
        with contextlib.suppress(NoDataError):
            self.registry.current(self.scaled)

    def state(self) -> str:
        statuses = self.prewarm.statuses()
        return statuses[0].plan.state if statuses else ""

    def listed(self) -> bool:
        return self.prewarm.listed

    def following(self) -> bool:
        """Loading, with nothing left to create: the DataLoad exists for it."""
        return self.state() == "loading" and self.status().plan.create is None

    def status(self) -> Any:
        (status,) = self.prewarm.statuses()
        return status

    def samples(self) -> dict[str, float]:
        out = {}
        for family in prewarm_families(self.prewarm):
            for sample in family.samples:
                state = sample.labels.get("state")
                out[sample.name + (f"{{{state}}}" if state else "")] = sample.value
        return out


@contextlib.asynccontextmanager
async def running(*scalers: Scaler) -> AsyncIterator[None]:
    for scaler in scalers:
        scaler.task = asyncio.create_task(scaler.prewarm.run())
    try:
        yield
        for scaler in scalers:
            assert scaler.task is not None and not scaler.task.done(), "the prewarm task ended"
    finally:
        for scaler in scalers:
            assert scaler.task is not None
            scaler.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scaler.task


def short_status_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fluid's figures are waited for 1 s after a load finishes, not 120 s: a load's
    finish dated before its creation (a shortcut once taken here) is no time."""
    monkeypatch.setattr(plan_module, "STATUS_LAG_SECONDS", 1.0)


@pytest.fixture(autouse=True)
def _short_status_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    short_status_lag(monkeypatch)


async def test_a_scale_from_zero_creates_one_dataload_and_proceeds_when_it_completes(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    scaler = Scaler(kube_access, namespace, prewarmPaths="/llama-3-8b")
    async with running(scaler):
        await eventually("Fluid's objects listed", lambda: scaler.prewarm.listed)
        scaler.arrive()
        # The decision is made at once, whatever the cache: one replica, active.
        decision = scaler.registry.current(scaler.scaled)
        assert (decision.active, decision.desired_replicas) == (True, 1)
        assert "prewarm loading" in decision.reason and "creating DataLoad" in decision.reason
        (load,) = await eventually("one DataLoad", cluster.dataloads)
        dataset = control_plane.request("GET", f"{FLUID}/namespaces/{namespace}/datasets/weights")
        assert load["spec"] == {
            "dataset": {"name": "weights", "namespace": namespace},
            "loadMetadata": True,
            "target": [{"path": "/llama-3-8b", "replicas": 1}],
            "policy": "Once",
        }
        (owner,) = load["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Dataset",
            "weights",
            dataset["metadata"]["uid"],
        )
        assert len(load["metadata"]["name"]) <= 46
        await eventually("loading, following our DataLoad", lambda: scaler.state() == "loading")
        cluster.complete(load["metadata"]["name"])
        cluster.set_cached("100.0%")
        await eventually("warm", lambda: scaler.state() == "warm")
        scaler.arrive()
        assert "prewarm warm" in scaler.registry.current(scaler.scaled).reason
        samples = scaler.samples()
    assert samples["unitscale_scaler_prewarm_state{warm}"] == 1.0
    assert samples["unitscale_scaler_prewarm_state{loading}"] == 0.0
    assert samples["unitscale_scaler_prewarm_cached_percent"] == 100.0
    assert samples["unitscale_scaler_prewarm_dataloads_created_total"] == 1.0
    assert 0 < samples["unitscale_scaler_prewarm_time_to_warm_seconds"] < 30
    assert len(cluster.dataloads()) == 1


async def test_a_warm_up_that_does_not_finish_times_out_and_the_decision_proceeds(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    scaler = Scaler(kube_access, namespace, prewarmTimeout="1s")
    async with running(scaler):
        await eventually("Fluid's objects listed", lambda: scaler.prewarm.listed)
        scaler.arrive()
        assert scaler.registry.current(scaler.scaled).active
        await eventually("one DataLoad", cluster.dataloads)
        # Nothing loads it (no Fluid runtime): the warm-up is given up after 1 s.
        await eventually("timed out", lambda: scaler.state() == "timed-out")
        scaler.arrive()  # the same one replica: no new trigger
        decision = scaler.registry.current(scaler.scaled)
        samples = scaler.samples()
    assert decision.active and decision.desired_replicas >= 1
    assert (
        "prewarm timed-out: gave up waiting after 1 s (prewarmTimeout) for the scale-from-zero,"
        " which proceeds with a cold cache" in decision.reason
    )
    assert samples["unitscale_scaler_prewarm_timeouts_total"] == 1.0
    assert "unitscale_scaler_prewarm_time_to_warm_seconds" not in samples
    assert len(cluster.dataloads()) == 1


async def test_a_warm_cache_creates_no_dataload(control_plane, fluid_crds, kube_access, namespace):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("100.0%")
    scaler = Scaler(kube_access, namespace)
    async with running(scaler):
        await eventually("Fluid's objects listed", lambda: scaler.prewarm.listed)
        scaler.arrive()
        await eventually("warm", lambda: scaler.state() == "warm")
        scaler.arrive(buffered=40)  # and a scale-out step
        decision = scaler.registry.current(scaler.scaled)
        assert decision.desired_replicas > 1
        await eventually("warm after the scale-out", lambda: scaler.state() == "warm")
        status = scaler.status()
    assert "prewarm warm: Dataset" in decision.reason
    assert (status.created, status.write_errors) == (0, 0)
    assert cluster.dataloads() == []


async def test_two_scalers_create_one_dataload_between_them(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    first, second = Scaler(kube_access, namespace), Scaler(kube_access, namespace)
    async with running(first, second):
        for scaler in (first, second):
            await eventually("Fluid's objects listed", scaler.listed)
        first.arrive()
        second.arrive()  # the same arrival, seen by both before either wrote
        names = {first.status().plan.dataload, second.status().plan.dataload}
        assert len(names) == 1
        for scaler in (first, second):
            await eventually("the DataLoad followed", scaler.following)
        loads = cluster.dataloads()
        statuses = (first.status(), second.status())
    assert [d["metadata"]["name"] for d in loads] == list(names)
    assert sum(s.created for s in statuses) == 1  # the other's create answered 409
    assert sum(s.write_errors for s in statuses) == 0


async def test_a_missing_dataset_gives_a_clear_error_and_no_crash(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    scaler = Scaler(kube_access, namespace)
    async with running(scaler):
        await eventually("Fluid's objects listed", lambda: scaler.prewarm.listed)
        scaler.arrive()
        decision = scaler.registry.current(scaler.scaled)
        assert decision.active
        assert (
            f"prewarm dataset-missing: Fluid Dataset {namespace}/weights does not exist "
            "(trigger key fluidDataset)" in decision.reason
        )
        await eventually("missing, still", lambda: scaler.state() == "dataset-missing")
        assert cluster.dataloads() == []
        # Created later, it is warmed then: the prewarm carried on.
        cluster.create_dataset("0.0%")
        await eventually("a DataLoad once the Dataset exists", cluster.dataloads)
        status = scaler.status()
    assert status.write_errors == 0


async def test_an_evicted_cache_is_loaded_again_by_a_new_dataload_of_the_same_name(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    scaler = Scaler(kube_access, namespace)
    async with running(scaler):
        await eventually("Fluid's objects listed", scaler.listed)
        scaler.arrive()
        (first,) = await eventually("one DataLoad", cluster.dataloads)
        # Loaded over a (shortened) status lag ago, so Fluid's figures are current, and seen warm.
        cluster.complete(first["metadata"]["name"])
        cluster.set_cached("100.0%")
        await eventually("warm", lambda: scaler.state() == "warm")
        cluster.set_cached("12.0%")  # evicted under pressure
        uid = first["metadata"]["uid"]

        def reloaded() -> list[dict[str, Any]]:
            loads = cluster.dataloads()
            return [d for d in loads if d["metadata"]["uid"] != uid]

        (second,) = await eventually("a new DataLoad", reloaded)
        await eventually("following the new load", scaler.following)
        status = scaler.status()
    assert second["metadata"]["name"] == first["metadata"]["name"]
    assert len(cluster.dataloads()) == 1
    assert (status.created, status.write_errors) == (2, 0)


async def test_a_restarted_scaler_loads_again_a_cache_evicted_while_it_was_away(
    control_plane, fluid_crds, kube_access, namespace
):
    # A load the new scaler's first list held is one it did not see (known by its UID).
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    before = Scaler(kube_access, namespace)
    async with running(before):
        await eventually("Fluid's objects listed", before.listed)
        before.arrive()
        (first,) = await eventually("one DataLoad", cluster.dataloads)
        cluster.complete(first["metadata"]["name"])
        cluster.set_cached("100.0%")
        await eventually("warm", lambda: before.state() == "warm")
    cluster.set_cached("12.0%")  # evicted while no scaler ran (a rollout)
    after = Scaler(kube_access, namespace)
    uid = first["metadata"]["uid"]
    async with running(after):
        await eventually("Fluid's objects listed", after.listed)
        after.arrive()

        def reloaded() -> list[dict[str, Any]]:
            return [d for d in cluster.dataloads() if d["metadata"]["uid"] != uid]

        (second,) = await eventually("a new DataLoad", reloaded)
        await eventually("following the new load", after.following)
        cluster.complete(second["metadata"]["name"])  # and the cache stays short
        await eventually("below-threshold", lambda: after.state() == "below-threshold")
        status = after.status()
    assert second["metadata"]["name"] == first["metadata"]["name"]
    assert [d["metadata"]["uid"] for d in cluster.dataloads()] == [second["metadata"]["uid"]]
    assert (status.created, status.write_errors) == (1, 0)  # once, not again and again


async def test_past_keep_warm_after_zero_an_eviction_loads_nothing_until_the_next_scale_up(
    control_plane, fluid_crds, kube_access, namespace
):
    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("0.0%")
    scaler = Scaler(kube_access, namespace, idleGrace="0s", keepWarmAfterZero="0s")
    async with running(scaler):
        await eventually("Fluid's objects listed", scaler.listed)
        scaler.arrive()
        (first,) = await eventually("one DataLoad", cluster.dataloads)
        cluster.complete(first["metadata"]["name"])
        cluster.set_cached("100.0%")
        await eventually("warm", lambda: scaler.state() == "warm")
        scaler.arrive(buffered=0)  # nothing left: scale to zero
        assert not scaler.registry.current(scaler.scaled).active
        cluster.set_cached("12.0%")  # evicted while at zero, past keepWarmAfterZero
        await eventually("idle", lambda: scaler.state() == "idle")
        assert [d["metadata"]["uid"] for d in cluster.dataloads()] == [first["metadata"]["uid"]]
        scaler.arrive()  # the next scale-from-zero loads it again
        assert scaler.registry.current(scaler.scaled).active
        await eventually(
            "a new DataLoad",
            lambda: [
                d for d in cluster.dataloads() if d["metadata"]["uid"] != first["metadata"]["uid"]
            ],
        )
        # The API server lists the new load before the scaler's create call returns and
        # counts it: the count is read once the scaler follows it.
        await eventually("following the new load", scaler.following)
        status = scaler.status()
    assert (status.created, status.write_errors) == (2, 0)


async def test_the_scaler_server_runs_the_prewarm_and_serves_its_metrics(
    control_plane, fluid_crds, kube_access, namespace
):
    import aiohttp

    from scaler.config import ScalerConfig
    from scaler.server import ScalerServer

    cluster = Cluster(control_plane, namespace)
    cluster.create_dataset("25.0%")
    server = ScalerServer(
        ScalerConfig(), "127.0.0.1:0", metrics_listen="127.0.0.1:0", kube=kube_access
    )
    await server.start()
    try:
        keys = {"scalerAddress": "scaler:9090", "deployment": "llama", "fluidDataset": "weights"}
        scaled = server.registry.resolve("llama", namespace, keys)
        assert server.prewarm is not None
        await eventually("Fluid's objects listed", lambda: server.prewarm and server.prewarm.listed)
        server.store.update(
            Snapshot((namespace, "llama", ""), GatewaySignals(time.time(), None, 1, 0))
        )
        assert server.registry.current(scaled).active  # KEDA's poll decides
        await eventually("one DataLoad", cluster.dataloads)
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            async with session.get(url) as response:
                text = await response.text()
    finally:
        await server.stop(grace=0)
    labels = f'namespace="{namespace}",scaled_object="llama"'
    assert f'unitscale_scaler_prewarm_state{{{labels},state="loading"}} 1.0' in text
    assert f'unitscale_scaler_prewarm_state{{{labels},state="warm"}} 0.0' in text
    assert f"unitscale_scaler_prewarm_cached_percent{{{labels}}} 25.0" in text
    assert f"unitscale_scaler_prewarm_dataloads_created_total{{{labels}}} 1.0" in text
    assert "unitscale_scaler_prewarm_time_to_warm_seconds{" not in text  # none warmed yet
