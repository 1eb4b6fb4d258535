"""The real KEDA (operator + metrics server) and the real HPA controller act on a real
``unitscale scaler``'s answers: the Deployment's ``spec.replicas`` follows the decision.

One KEDA stack for the module (``keda`` fixture), a fresh namespace, signal source and
scaler per test. Everything is polled with deadlines; KEDA polls every second here and
the HPA syncs every second, so each wait is a few seconds when it works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from admission.cluster import PoolDemand
from admission.demand import DemandResult, fetch_demand
from protos.externalscaler import externalscaler_pb2 as keda_pb
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from tests.k8s.control_plane import ApiError, ControlPlane, Keda
from tests.k8s.keda import (
    Load,
    Scaler,
    ScalerTls,
    SignalSource,
    condition,
    create,
    deployment,
    eventually,
    get,
    replicas,
    scaled_object,
)

pytestmark = pytest.mark.k8s

NAME = "llama-chat"  # the Deployment the shipped ScaledObjects scale
HPA = f"keda-hpa-{NAME}"


def load(in_flight: float) -> Load:
    # No ready replicas reported (no pods run here): the scaler does not learn capacity
    # from them, so its decision is ceil(in flight / 16).
    return Load(running=in_flight)


@pytest.fixture
def source() -> Iterator[SignalSource]:
    started = SignalSource().start()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def scaler(source: SignalSource, tmp_path: Path) -> Iterator[Scaler]:
    running = Scaler(source, tmp_path).start()
    try:
        yield running
    finally:
        running.stop()


def follow(plane: ControlPlane, namespace: str, want: int, what: str, timeout: float = 30) -> None:
    """Wait until the Deployment has ``want`` replicas (the message says what it had)."""
    seen: list[int] = []

    def reached() -> bool:
        seen.append(replicas(plane, namespace, NAME))
        return seen[-1] == want

    try:
        eventually(reached, what, timeout)
    except AssertionError as err:
        metrics = ((hpa(plane, namespace) or {}).get("status") or {}).get("currentMetrics")
        changes = [n for i, n in enumerate(seen) if i == 0 or seen[i - 1] != n]
        raise AssertionError(f"{err}; replicas went {changes}; HPA metrics {metrics}") from None


def hpa(plane: ControlPlane, namespace: str) -> dict[str, Any] | None:
    path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{HPA}"
    try:
        found: dict[str, Any] = plane.request("GET", path)
    except ApiError as err:
        if err.code == 404:
            return None
        raise
    return found


def test_external_the_deployment_follows_the_decision_up_and_down(
    control_plane: ControlPlane, keda: Keda, namespace: str, source: SignalSource, scaler: Scaler
) -> None:
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(48))  # ceil(48 / 16) = 3
    for doc in scaled_object("external", namespace, scaler.address):
        create(control_plane, namespace, doc)

    created = eventually(lambda: hpa(control_plane, namespace), "KEDA creates the HPA")
    (metric,) = created["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == "s0-unitscale-desired-replicas"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert created["spec"]["minReplicas"] == 1 and created["spec"]["maxReplicas"] == 20

    follow(control_plane, namespace, 3, "activated and scaled to 3")
    source.set(namespace, NAME, load(96))
    follow(control_plane, namespace, 6, "up to 6")
    source.set(namespace, NAME, load(20))
    follow(control_plane, namespace, 2, "down to 2")
    source.set(namespace, NAME, load(160))
    follow(control_plane, namespace, 10, "up to 10")
    # 11 is within the HPA's 10% tolerance of the 10 the exporter sees: the scaler
    # reports 11.002 (core/hpa.py) and the HPA takes the least step past it, 12; a
    # plain 11 would leave it at 10, below the decision.
    source.set(namespace, NAME, Load(running=176, replicas_up=10))
    follow(control_plane, namespace, 12, "11 wanted within the tolerance: 12")
    # Down within the tolerance: 11 of 12 (0.917) would leave the HPA at 12; the scaler
    # reports 12 x 0.9 - 0.002 = 10.798 and the HPA lands on 11.
    source.set(namespace, NAME, Load(running=176, replicas_up=12))
    follow(control_plane, namespace, 11, "11 wanted at 12, within the tolerance: 11")

    status = eventually(
        lambda: (hpa(control_plane, namespace) or {}).get("status", {}).get("currentMetrics"),
        "the HPA reports the metric it read",
    )
    assert status[0]["external"]["metric"]["name"] == "s0-unitscale-desired-replicas"


def test_external_scales_to_zero_after_idle_and_back_on_load(
    control_plane: ControlPlane, keda: Keda, namespace: str, source: SignalSource, scaler: Scaler
) -> None:
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(32))
    for doc in scaled_object("external", namespace, scaler.address, cooldown=2):
        create(control_plane, namespace, doc)
    follow(control_plane, namespace, 2, "scaled to 2")

    source.set(namespace, NAME, load(0))
    follow(control_plane, namespace, 0, "idle for the cooldown: scaled to zero")
    so = get(control_plane, namespace, "ScaledObject", NAME)
    assert condition(so, "Active")["status"] == "False"

    source.set(namespace, NAME, load(16))
    follow(control_plane, namespace, 1, "load again: back from zero")
    so = eventually(
        lambda: (
            condition(get(control_plane, namespace, "ScaledObject", NAME), "Active").get("status")
            == "True"
        ),
        "the ScaledObject is Active again",
    )


def test_unavailable_applies_the_fallback_never_zero_and_recovers(
    control_plane: ControlPlane, keda: Keda, namespace: str, source: SignalSource, scaler: Scaler
) -> None:
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(64))  # 4 replicas
    for doc in scaled_object("external", namespace, scaler.address):
        create(control_plane, namespace, doc)
    follow(control_plane, namespace, 4, "scaled to 4")

    source.stop()  # the watch breaks; signals go stale after max-signal-age (3 s)
    seen: list[int] = []

    def at_fallback() -> bool:
        seen.append(replicas(control_plane, namespace, NAME))
        return seen[-1] == 2

    eventually(at_fallback, "the ScaledObject's fallback replicas (2)", timeout=60)
    so = eventually(
        lambda: (
            condition(get(control_plane, namespace, "ScaledObject", NAME), "Fallback").get("status")
            == "True"
            and get(control_plane, namespace, "ScaledObject", NAME)
        ),
        "the Fallback condition",
    )
    assert 0 not in seen
    health = so["status"]["health"]["s0-unitscale-desired-replicas"]
    assert health["status"] == "Failing" and health["numberOfFailures"] > 3

    source.start()
    follow(control_plane, namespace, 4, "the source is back: 4 again")
    eventually(
        lambda: (
            condition(get(control_plane, namespace, "ScaledObject", NAME), "Fallback").get("status")
            == "False"
        ),
        "the Fallback condition clears",
    )
    assert 0 not in seen


def test_unavailable_at_zero_counts_too_keda_activates_to_the_fallback(
    control_plane: ControlPlane, keda: Keda, namespace: str, source: SignalSource, scaler: Scaler
) -> None:
    """KEDA's polls count failures as the HPA's reads do, and a fallback counts as active:
    a ScaledObject at zero goes to the fallback replicas while the scaler fails."""
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(0))
    for doc in scaled_object("external", namespace, scaler.address):
        create(control_plane, namespace, doc)
    eventually(
        lambda: (
            condition(get(control_plane, namespace, "ScaledObject", NAME), "Active").get("status")
            == "False"
        ),
        "idle at zero",
    )
    assert replicas(control_plane, namespace, NAME) == 0
    source.stop()
    follow(control_plane, namespace, 2, "the fallback replicas from zero", timeout=60)
    source.start()
    follow(control_plane, namespace, 0, "the source is back, idle: zero again", timeout=60)


@pytest.fixture
def tls_scaler(source: SignalSource, tmp_path: Path) -> Iterator[tuple[Scaler, ScalerTls]]:
    tls = ScalerTls(tmp_path / "tls")
    running = Scaler(source, tmp_path, tls=tls).start()
    try:
        yield running, tls
    finally:
        running.stop()


def test_external_push_over_mutual_tls_activates_on_the_first_buffered_arrival(
    control_plane: ControlPlane,
    keda: Keda,
    namespace: str,
    source: SignalSource,
    tls_scaler: tuple[Scaler, ScalerTls],
) -> None:
    scaler, tls = tls_scaler
    create(control_plane, namespace, deployment(NAME))
    create(
        control_plane,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "unitscale-scaler-client"},
            "stringData": tls.secret_data(),
        },
    )
    source.set(namespace, NAME, Load(running=0, buffered=0))
    # A poll every 5 minutes: activation within seconds can only be the push.
    for doc in scaled_object("external-push", namespace, scaler.address, polling=300):
        create(control_plane, namespace, doc)
    eventually(
        lambda: (
            condition(get(control_plane, namespace, "ScaledObject", NAME), "Ready").get("status")
            == "True"
        ),
        "the ScaledObject is Ready (KEDA reached the scaler over mutual TLS)",
    )
    assert replicas(control_plane, namespace, NAME) == 0

    source.set(namespace, NAME, Load(running=0, buffered=1))
    follow(control_plane, namespace, 1, "the first buffered arrival activates 0 -> 1", 20)


def refused_by_keda(
    plane: ControlPlane, keda: Keda, namespace: str, logged: Callable[[str], bool]
) -> None:
    """Wait until KEDA reports the ScaledObject not Ready as it does when GetMetricSpec
    fails, and its operator logs a line about it that ``logged`` accepts (the scaler's
    reason is only there)."""
    ready = eventually(
        lambda: (
            (found := condition(get(plane, namespace, "ScaledObject", NAME), "Ready")).get("status")
            in ("True", "False")
            and found
        ),
        "KEDA sets the Ready condition",
    )
    assert (ready["status"], ready.get("reason")) == ("False", "ScaledObjectCheckFailed"), ready
    assert "no metric specs returned from scalers" in ready["message"]
    assert hpa(plane, namespace) is None
    assert replicas(plane, namespace, NAME) == 0
    eventually(
        lambda: [ln for ln in keda.log("keda-operator") if namespace in ln and logged(ln)],
        "the operator logs the scaler's error",
    )


CLIENT_AUTH = {"secretTargetRef": [{"parameter": "caCert", "name": "ca-only", "key": "ca.crt"}]}


@pytest.mark.parametrize(
    ("authentication", "reasons"),
    [
        pytest.param(
            None,
            ("error reading server preface",),
            id="no TriggerAuthentication: plain text is refused",
        ),
        pytest.param(
            CLIENT_AUTH,
            # TLS 1.3: the client has sent its Finished when the scaler refuses it, so
            # KEDA sees the alert, or the closed connection when it writes first.
            ("certificate required", "broken pipe", "connection reset by peer", "EOF"),
            id="a TriggerAuthentication with caCert but no client certificate is refused",
        ),
    ],
)
def test_a_scaled_object_without_the_client_certificate_is_refused(
    control_plane: ControlPlane,
    keda: Keda,
    namespace: str,
    source: SignalSource,
    tls_scaler: tuple[Scaler, ScalerTls],
    authentication: dict[str, Any] | None,
    reasons: tuple[str, ...],
) -> None:
    scaler, tls = tls_scaler
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(32))
    (so,) = [
        doc
        for doc in scaled_object("external", namespace, scaler.address)
        if doc["kind"] == "ScaledObject"
    ]
    if authentication is not None:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ca-only"}}
        secret["stringData"] = {"ca.crt": tls.secret_data()["ca.crt"]}
        create(control_plane, namespace, secret)
        auth: dict[str, Any] = {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication"}
        auth |= {"metadata": {"name": "ca-only"}, "spec": authentication}
        create(control_plane, namespace, auth)
        so["spec"]["triggers"][0]["authenticationRef"] = {"name": "ca-only"}
    create(control_plane, namespace, so)
    refused_by_keda(
        control_plane,
        keda,
        namespace,
        lambda line: "code = Unavailable" in line and any(r in line for r in reasons),
    )


@pytest.mark.parametrize(
    ("metadata", "fragment"),
    [
        pytest.param({"maxReplica": "3"}, "unknown key 'maxReplica'", id="an unknown key"),
        pytest.param(
            {"targetConcurrency": "-1"}, "'targetConcurrency'='-1'", id="a negative target"
        ),
    ],
)
def test_bad_trigger_metadata_leaves_the_scaled_object_not_ready(
    control_plane: ControlPlane,
    keda: Keda,
    namespace: str,
    source: SignalSource,
    scaler: Scaler,
    metadata: dict[str, str],
    fragment: str,
) -> None:
    """KEDA's status says only that no metric specs came back; the scaler's
    INVALID_ARGUMENT message, naming the key, is in the operator's log."""
    create(control_plane, namespace, deployment(NAME))
    source.set(namespace, NAME, load(32))
    for doc in scaled_object("external", namespace, scaler.address, metadata=metadata):
        create(control_plane, namespace, doc)
    refused_by_keda(
        control_plane, keda, namespace, lambda line: "InvalidArgument" in line and fragment in line
    )


def test_a_pool_counts_kedas_scaled_object_and_leaves_out_a_forged_call(
    control_plane: ControlPlane, keda: Keda, namespace: str, source: SignalSource, tmp_path: Path
) -> None:
    """The metadata real KEDA sends is the API server's trigger, exactly: its
    ScaledObject counts in the pool; a GetMetricSpec of another caller claiming 100 x 8
    cards on the same Deployment, under a name the API server does not have, is refused
    and counts nothing."""
    scaler = Scaler(source, tmp_path, kubeconfig=control_plane.kubeconfig).start()
    try:
        create(control_plane, namespace, deployment(NAME))
        source.set(namespace, NAME, load(48))  # ceil(48 / 16) = 3
        pool = {"pool": "h200", "acceleratorsPerReplica": "1"}
        for doc in scaled_object("external", namespace, scaler.address, metadata=pool):
            create(control_plane, namespace, doc)
        follow(control_plane, namespace, 3, "activated and scaled to 3")

        def asked() -> DemandResult:
            return asyncio.run(fetch_demand(scaler.address, "h200", 600, timeout=5))

        counted = eventually(lambda: asked().demand, "the pool's demand, KEDA's call confirmed")
        assert counted == {"h200": PoolDemand("h200", 0.0, 3.0)}, asked()

        forged = {"scalerAddress": scaler.address, "deployment": NAME, "namespace": namespace}
        forged.update(pool, acceleratorsPerReplica="8", minReplicas="100", maxReplicas="100")
        with (
            grpc.insecure_channel(scaler.address) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            keda_grpc.ExternalScalerStub(channel).GetMetricSpec(
                keda_pb.ScaledObjectRef(name="forged", namespace=namespace, scalerMetadata=forged),
                timeout=5,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert asked() == DemandResult(counted)
    finally:
        scaler.stop()
