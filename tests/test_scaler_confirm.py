"""A pool's inference demand counts a ScaledObject only as the API server has it.

Anyone who reaches the scaler's port can call ``GetMetricSpec`` with a ScaledObjectRef of
their making; one such call with a pool and no signals made the pool's figures unknown
(every gang held under ``whenUnavailable: Hold``), and one with ``minReplicas`` 10000 x 8
accelerators claimed 80,002 of them (issue 27, hostile pass 23). The real scaler on
127.0.0.1 with its ScaledObject watch; the list it would get from the API server is given
to the watch as the API server would (``seen``), its Kubernetes access pointing nowhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.cluster import PoolDemand
from admission.demand import DemandResult, fetch_demand
from foundation.errors import MetadataError
from foundation.kube import KubeAccess
from scaler.config import ScalerConfig
from scaler.confirm import MAX_TRIGGERS, TRIGGER_TYPES, Standing, projected, standing
from scaler.registry import MAX_PER_TARGET, RegistryFullError, ScaledObjectRegistry
from scaler.scaled_objects import STALE_AFTER, ScaledObjectWatch
from scaler.server import ScalerServer
from scaler.signals import SignalStore
from scaler.sources import receive
from tests.conftest import FakeClock, engine_signals, eventually, ref

H200 = {"pool": "h200", "acceleratorsPerReplica": "1"}


def api_object(name: str, namespace: str = "team-a", kind: str = "external", **metadata: str):
    """The ScaledObject as the API server lists it: the trigger ``ref`` would send."""
    trigger = {"type": kind, "metadata": dict(ref(name, namespace, **metadata).scalerMetadata)}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"scaleTargetRef": {"name": name}, "triggers": [{"type": "cpu"}, trigger]},
    }


def listed(*objects: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects}


@pytest.fixture
async def scaler(clock: FakeClock, tmp_path: Path) -> AsyncIterator[ScalerServer]:
    server = ScalerServer(
        ScalerConfig(max_signal_age=30.0),
        "127.0.0.1:0",
        clock=clock,
        kube=KubeAccess(tmp_path / "no-kubeconfig"),
    )
    await server.start()
    yield server
    await server.stop(grace=0)


def watch_of(scaler: ScalerServer) -> ScaledObjectWatch:
    assert scaler.scaled_objects is not None
    return scaler.scaled_objects


async def demand(scaler: ScalerServer) -> DemandResult:
    return await fetch_demand(f"127.0.0.1:{scaler.port}", "h200", 600, timeout=5)


async def honest_llama(scaler: ScalerServer, stub) -> None:
    """KEDA's calls for team-a/llama (1 card a replica): one replica up, 32 in flight, 2."""
    await stub.GetMetricSpec(ref("llama", **H200))
    receive(scaler.store, engine_signals("llama", queue=0.0, running=32.0))


def aimed_at_llama(call):
    """The call, its trigger naming team-a's llama Deployment as the one it scales."""
    call.scalerMetadata.update(deployment="llama", namespace="team-a")
    return call


@dataclass
class Listed:
    """A list as the watch holds it (``scaler.confirm.Confirmer``)."""

    listed: dict[str, Any] | None
    problem: str = ""


HONEST = DemandResult({"h200": PoolDemand("h200", 1.0, 2.0)})  # 1 replica up, 2 needed


@pytest.mark.parametrize(
    ("caller", "api_has"),
    [
        pytest.param(
            ref("x", "evil", deployment="nothing-here", **H200),
            [],
            id="a caller the API server has no ScaledObject for, with no signals, is left out",
        ),
        pytest.param(
            aimed_at_llama(
                ref(
                    "y",
                    "evil",
                    minReplicas="10000",
                    maxReplicas="10000",
                    pool="h200",
                    acceleratorsPerReplica="8",
                )
            ),
            [],
            id="one claiming 10000 x 8 on the honest deployment under a name of its own is"
            " left out",
        ),
        pytest.param(
            ref("x", "evil", deployment="nothing-here", **H200),
            [api_object("x", "other", deployment="nothing-here", **H200)],
            id="the same name in another namespace does not vouch for it",
        ),
    ],
)
async def test_a_scaled_object_the_api_server_does_not_have_is_left_out(
    scaler, stub, caller, api_has
):
    """Told of before the list came (calls are believed until then), then left out."""
    await honest_llama(scaler, stub)
    await stub.GetMetricSpec(caller)
    watch_of(scaler).seen(listed(api_object("llama", **H200), *api_has))
    for _ in range(3):
        assert await demand(scaler) == HONEST
    assert scaler.registry.errors["unconfirmed"] == 1, "counted and logged once, not per ask"


@pytest.mark.parametrize(
    ("caller", "why"),
    [
        pytest.param(
            ref("x", "evil", deployment="nothing-here", **H200),
            "has no ScaledObject of this namespace and name",
            id="a name the API server does not have is refused",
        ),
        pytest.param(
            ref("llama", **H200, targetUtilization="0.5"),
            "no trigger of the ScaledObject as the API server has it",
            id="other metadata under a real ScaledObject's name is refused",
        ),
    ],
)
async def test_once_listed_a_call_the_api_server_does_not_vouch_for_is_refused(
    scaler, stub, caller, why
):
    await honest_llama(scaler, stub)
    watch_of(scaler).seen(listed(api_object("llama", **H200)))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetMetricSpec(caller)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in str(refused.value.details())
    await stub.GetMetricSpec(ref("llama", **H200))  # KEDA's own call
    assert await demand(scaler) == HONEST
    assert scaler.registry.errors["unconfirmed-call"] == 1


async def test_forged_calls_never_get_kedas_own_metadata_refused_as_a_rival(scaler, stub):
    """Forged B, C, B then KEDA's A made A a "second trigger", refused for as long as the
    forger called every ten minutes (120 of 120 of KEDA's calls in an hour). Before the
    list that order still decides; once listed, A is the trigger and replaces B at once."""
    forged = [ref("llama", **H200, targetUtilization=u) for u in ("0.5", "0.6", "0.5")]
    await honest_llama(scaler, stub)
    for call in forged:
        await stub.GetMetricSpec(call)
    with pytest.raises(grpc.aio.AioRpcError):  # not listed yet: taken for a second trigger
        await stub.GetMetricSpec(ref("llama", **H200))
    watch_of(scaler).seen(listed(api_object("llama", **H200)))
    keda = ref("llama", **H200)
    await stub.GetMetricSpec(keda)
    for _ in range(5):
        for call in forged:
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetMetricSpec(call)
        await stub.GetMetricSpec(keda)
    (kept,) = scaler.registry.objects()
    assert kept.raw_metadata == dict(keda.scalerMetadata)
    assert (await demand(scaler)).demand is not None  # confirmed: the pool is known


async def test_a_scaled_object_with_two_unitscale_triggers_keeps_the_first(scaler, stub):
    """Both maps are the API server's: the second is refused at once, not after it took
    the first's place for a call (an edit lists only the new map)."""
    first, second = ref("llama", **H200), ref("llama", **H200, targetUtilization="0.5")
    both = api_object("llama", **H200)
    both["spec"]["triggers"].append({"type": "external", "metadata": dict(second.scalerMetadata)})
    await stub.GetMetricSpec(first)
    watch_of(scaler).seen(listed(both))
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetMetricSpec(second)
        assert "second unitscale trigger" in str(refused.value.details())
        await stub.GetMetricSpec(first)
    (kept,) = scaler.registry.objects()
    assert kept.raw_metadata == dict(first.scalerMetadata)


async def test_a_name_told_of_before_the_list_is_refused_once_listed(scaler, stub):
    made_up = ref("x", "evil", deployment="nothing-here", **H200)
    await stub.GetMetricSpec(made_up)  # believed: nothing listed yet
    watch_of(scaler).seen(listed(api_object("llama", **H200)))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetMetricSpec(made_up)  # the same call again
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_list_the_watch_cannot_renew_for_a_minute_is_no_longer_used(tmp_path):
    """Kept for good, a list refused every ScaledObject created after the watch broke."""
    clock = FakeClock(0.0)
    registry = ScaledObjectRegistry(SignalStore(), 30.0)
    watch = ScaledObjectWatch(
        KubeAccess(tmp_path / "no-kubeconfig"), registry, check_every=0.01, clock=clock
    )
    registry.confirm = watch
    registry.resolve("llama", "team-a", dict(ref("llama").scalerMetadata))
    running = asyncio.create_task(watch.run())
    try:
        await eventually(lambda: watch.problem, "the watch's first failure")
        watch.seen(listed(api_object("llama")))
        await eventually(lambda: watch.problem, "a failure after the list")  # kept: < 60 s
        with pytest.raises(MetadataError):
            registry.resolve("qwen", "team-a", dict(ref("qwen").scalerMetadata))
        clock.now += STALE_AFTER + 1
        assert watch.listed is None
        registry.resolve("qwen", "team-a", dict(ref("qwen").scalerMetadata))  # believed
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


@pytest.mark.parametrize(
    ("triggers", "confirmed"),
    [
        pytest.param(MAX_TRIGGERS, True, id="at the bound on triggers, one matches"),
        pytest.param(MAX_TRIGGERS + 1, False, id="past it, none does"),
    ],
)
def test_a_scaled_object_with_too_many_triggers_confirms_no_call(triggers, confirmed):
    obj = api_object("llama")
    obj["spec"]["triggers"] = [
        {"type": "external", "metadata": {"deployment": f"d{n}"}} for n in range(triggers)
    ]
    kept = projected(obj)
    assert set(kept) == {"metadata", *(set(kept) - {"metadata"})} and "spec" not in kept
    found = standing({"team-a/llama": kept}, ("team-a", "llama"), {"deployment": "d0"})
    assert (found is Standing.CONFIRMED) is confirmed


def test_a_full_registry_forgets_the_names_the_api_server_does_not_have():
    """Names made up before the list came no longer hold the registry full against KEDA."""
    registry = ScaledObjectRegistry(SignalStore(), 30.0, max_objects=5)
    for n in range(5):
        registry.resolve(f"made-up-{n}", "evil", dict(ref(f"made-up-{n}").scalerMetadata))
    with pytest.raises(RegistryFullError):
        registry.resolve("llama", "team-a", dict(ref("llama").scalerMetadata))
    registry.confirm = Listed(listed(api_object("llama"), api_object("made-up-0", "evil")))
    registry.resolve("llama", "team-a", dict(ref("llama").scalerMetadata))
    assert sorted(s.key for s in registry.objects()) == [
        ("evil", "made-up-0"),
        ("team-a", "llama"),
    ]


def test_a_full_target_forgets_the_names_the_api_server_does_not_have():
    """Eight made up before the list came held the target's share for their whole TTL,
    and the API server's own ScaledObject was refused (issue 27, hostile pass 59)."""
    registry = ScaledObjectRegistry(SignalStore(), 30.0)
    metadata = dict(ref("llama").scalerMetadata)
    for n in range(MAX_PER_TARGET):
        registry.resolve(f"made-up-{n}", "team-a", metadata)
    with pytest.raises(RegistryFullError):
        registry.resolve("llama", "team-a", metadata)
    registry.confirm = Listed(listed(api_object("llama"), api_object("made-up-0")))
    registry.resolve("llama", "team-a", metadata)
    assert sorted(s.key[1] for s in registry.objects()) == ["llama", "made-up-0"]


@pytest.mark.parametrize(
    ("api_has", "why"),
    [
        pytest.param(
            api_object("llama", acceleratorsPerReplica="8", pool="h200"),
            "not the API server's",
            id="its metadata differs from the API server's (an edit, or a call under its name)",
        ),
        pytest.param(
            api_object("llama", kind="cpu", **H200),
            "not the API server's",
            id="a trigger of a type that calls no external scaler does not vouch for it",
        ),
    ],
)
async def test_a_scaled_object_the_api_server_has_otherwise_leaves_the_pool_unknown(
    scaler, stub, api_has, why
):
    await honest_llama(scaler, stub)
    watch_of(scaler).seen(listed(api_has))
    result = await demand(scaler)
    assert result.demand is None
    assert "team-a/llama" in result.error and why in result.error


async def test_the_pool_is_unknown_until_the_api_servers_scaled_objects_are_listed(scaler, stub):
    await honest_llama(scaler, stub)
    # The watch starts with the first pool and fails on the kubeconfig that is not there.
    await eventually(lambda: watch_of(scaler).problem, "the watch's first failure")
    result = await demand(scaler)
    assert result.demand is None
    assert "not listed" in result.error and "no-kubeconfig" in result.error
    assert scaler.registry.errors["scaled-object-watch"] >= 1
    watch_of(scaler).seen(listed(api_object("llama", **H200)))
    assert await demand(scaler) == HONEST


async def test_the_watch_starts_only_once_keda_asks_about_a_scaled_object(tmp_path):
    store = SignalStore()
    registry = ScaledObjectRegistry(store, 30.0)
    watch = ScaledObjectWatch(KubeAccess(tmp_path / "no-kubeconfig"), registry, check_every=0.01)
    running = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.2)  # twenty looks: none may start a watch
        assert registry.errors["scaled-object-watch"] == 0 and watch.problem == ""
        registry.resolve("plain", "team-a", dict(ref("plain").scalerMetadata))
        await eventually(lambda: watch.problem, "the watch tried, once KEDA asked")
        assert "no-kubeconfig" in watch.problem and watch.listed is None
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_TRIGGER = st.fixed_dictionaries(
    {"type": st.sampled_from([*sorted(TRIGGER_TYPES), "cpu", 3, None])},
    optional={
        "metadata": st.dictionaries(st.sampled_from(["pool", "a"]), st.text(max_size=3)) | _JSON
    },
)
_SPEC = (
    st.fixed_dictionaries({}, optional={"triggers": st.lists(_TRIGGER | _JSON, max_size=4) | _JSON})
    | _JSON
)


@settings(max_examples=300, deadline=None)
@given(spec=_SPEC, metadata=st.dictionaries(st.sampled_from(["pool", "a"]), st.text(max_size=3)))
def test_any_shape_of_spec_is_read_and_confirms_only_an_exactly_equal_external_trigger(
    spec, metadata
):
    obj = {"metadata": {"namespace": "n", "name": "s"}, "spec": spec}
    found = standing({"n/s": obj}, ("n", "s"), metadata)
    triggers = spec.get("triggers") if isinstance(spec, dict) else None
    equal = isinstance(triggers, list) and any(
        isinstance(t, dict)
        and t.get("type") in TRIGGER_TYPES
        and t.get("metadata") == metadata
        and isinstance(t.get("metadata"), dict)
        for t in triggers
    )
    assert found is (Standing.CONFIRMED if equal else Standing.DIFFERS)
