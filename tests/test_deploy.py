"""The shipped manifests say what the code accepts, as the real kustomize renders them.

``deploy/base`` and each overlay are rendered by the kustomize binary that
``tests/k8s/build-control-plane`` builds (``make k8s-bins``); without it these tests
skip, and under ``CI=true`` they fail. What is checked here needs no API server: every
Deployment runs a command the CLI accepts with the config it is given, unprivileged,
with requests and probes on ports it listens on; every ServiceAccount's rules are
exactly the requests its component sends (``USED``); the overlays differ from the base
as they say. The API server's verdict on the same rendering is
``tests/k8s/test_deploy_dry_run.py``; that the rules are enough (and each needed),
``tests/k8s/test_rbac_components.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from scaler.metadata import parse_metadata
from tests.k8s import versions
from unitscale.cli import build_parser

DEPLOY = Path(__file__).parent.parent / "deploy"
SCALED_OBJECTS = DEPLOY / "scaledobjects"
# Every kustomization a user builds, and what it is.
RENDERINGS = {
    "base": "every component, the base's own settings",
    "overlays/single-node": "one scaler, no PodDisruptionBudget",
    "overlays/ha": "three scalers and two exporters, spread",
    "overlays/production": "ha with mutual TLS (cert-manager) and monitoring (Prometheus Operator)",
}
COMPONENTS = ("scaler", "exporter", "gateway", "admission")

# (API group, resource, verb, resourceName or "") each component sends, from its code:
# foundation.reload.read_configmap (get) and watch_configmap (list + watch, field
# selector metadata.name) for --config-configmap; foundation.discovery.EndpointSliceWatch
# (list + watch, label selector) for `endpoint-slices`. The admission controller's are
# read from its source by tests/test_admission_deploy.py.
CONFIG = {"scaler": "unitscale-scaler", "exporter": "unitscale-exporter"}
CONFIG["gateway"] = "unitscale-gateway"
USED: dict[str, set[tuple[str, str, str, str]]] = {
    component: {("", "configmaps", verb, name) for verb in ("get", "list", "watch")}
    for component, name in CONFIG.items()
}
# scaler.scaled_objects: a watch of every namespace's ScaledObjects, against which a
# pool's inference demand checks KEDA's calls.
USED["scaler"] |= {("keda.sh", "scaledobjects", v, "") for v in ("list", "watch")}
for _component in ("exporter", "gateway"):
    USED[_component] |= {("discovery.k8s.io", "endpointslices", v, "") for v in ("list", "watch")}
# Fluid prewarm (scaler.prewarm.shell, with components/scaler-prewarm): watches of every
# namespace's Datasets and DataLoads; a DataLoad created, and deleted under a UID
# precondition when its cache was evicted.
PREWARM = {("data.fluid.io", "datasets", v, "") for v in ("list", "watch")} | {
    ("data.fluid.io", "dataloads", v, "") for v in ("list", "watch", "create", "delete")
}


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: the deploy/ rendering must run: {reason}", pytrace=False)
    pytest.skip(reason)


def kustomize() -> Path:
    binary = versions.kustomize_path()
    if not binary.exists():
        unavailable(f"no kustomize at {binary}: run `make k8s-bins`")
    return binary


@cache
def _build(directory: str) -> str:
    done = subprocess.run(
        [str(kustomize()), "build", str(DEPLOY / directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, f"kustomize build deploy/{directory}: {done.stderr}"
    return done.stdout


def render(directory: str) -> list[dict[str, Any]]:
    """``kustomize build deploy/<directory>``: the documents, as the binary wrote them."""
    return [doc for doc in yaml.safe_load_all(_build(directory)) if doc]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def every_deployment() -> list[Any]:
    return [
        pytest.param(directory, f"unitscale-{c}", id=f"{directory}-{c}")
        for directory in RENDERINGS
        for c in COMPONENTS
    ]


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


# --- the renderings --------------------------------------------------------------------


@pytest.mark.parametrize("directory", list(RENDERINGS))
def test_every_kustomization_renders_every_component_in_its_namespace(directory):
    docs = render(directory)
    for component in COMPONENTS:
        for kind in ("Deployment", "ServiceAccount", "ConfigMap"):
            assert named(docs, kind, f"unitscale-{component}")["metadata"]["namespace"] == (
                "unitscale"
            )
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "unitscale" for d in docs)
    assert (DEPLOY / directory / "kustomization.yaml").read_text().startswith("# ")


@pytest.mark.parametrize(
    ("directory", "scalers", "budget"),
    [
        pytest.param("base", 2, 1, id="the base runs two scalers, one may be evicted"),
        pytest.param("overlays/single-node", 1, None, id="one node: one scaler, no budget"),
        pytest.param("overlays/ha", 3, 2, id="ha: three scalers, two always up"),
        pytest.param("overlays/production", 3, 2, id="production keeps ha's counts"),
    ],
)
def test_the_scalers_replicas_and_disruption_budget(directory, scalers, budget):
    docs = render(directory)
    assert named(docs, "Deployment", "unitscale-scaler")["spec"]["replicas"] == scalers
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    scaler_budgets = [b for b in budgets if b["metadata"]["name"] == "unitscale-scaler"]
    if budget is None:
        assert budgets == []
        return
    (pdb,) = scaler_budgets
    assert pdb["spec"]["minAvailable"] == budget < scalers
    labels = named(docs, "Deployment", "unitscale-scaler")["spec"]["template"]["metadata"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels["labels"].items()


def test_ha_spreads_the_scalers_and_exporters_over_nodes():
    docs = render("overlays/ha")
    for name in ("unitscale-scaler", "unitscale-exporter"):
        spec = named(docs, "Deployment", name)["spec"]["template"]["spec"]
        keys = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
        assert keys["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
        assert "app.kubernetes.io/name" in keys["kubernetes.io/hostname"]["matchLabelKeys"]
    assert named(docs, "Deployment", "unitscale-exporter")["spec"]["replicas"] == 2
    # One gateway per target: the scaler keeps one gateway snapshot, it does not sum.
    assert named(docs, "Deployment", "unitscale-gateway")["spec"]["replicas"] == 1


# --- every Deployment --------------------------------------------------------------------


@pytest.mark.parametrize(("directory", "name"), every_deployment())
def test_the_container_runs_unprivileged_with_requests_and_probes(directory, name):
    deployment = named(render(directory), "Deployment", name)
    pod = deployment["spec"]["template"]["spec"]
    container = container_of(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        (how,) = {"grpc", "httpGet", "tcpSocket"} & set(container[probe])
        port = container[probe][how]["port"]
        assert port in ports or port in ports.values(), f"{probe} on a port not served"


def listen_ports(args: list[str]) -> set[int]:
    """The ports a subcommand's arguments make it listen on (flags and their defaults)."""
    parsed = vars(build_parser().parse_args(args))
    return {
        int(value.rpartition(":")[2])
        for key, value in parsed.items()
        if key.endswith("listen") and isinstance(value, str)
    }


def expanded(args: list[str], namespace: str) -> list[str]:
    """The arguments as the kubelet passes them: ``$(POD_NAMESPACE)`` expanded."""
    return [a.replace("$(POD_NAMESPACE)", namespace) for a in args]


@pytest.mark.parametrize(("directory", "name"), every_deployment())
def test_the_command_parses_and_reads_a_configmap_that_is_there(directory, name):
    docs = render(directory)
    deployment = named(docs, "Deployment", name)
    container = container_of(deployment)
    namespace = deployment["metadata"]["namespace"]
    args = expanded(container["args"], namespace)
    parsed = build_parser().parse_args(args)
    assert parsed.command == name.removeprefix("unitscale-")
    env = {e["name"]: e for e in container.get("env", [])}
    if any("$(POD_NAMESPACE)" in a for a in container["args"]):
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    if parsed.command == "admission":
        return  # a mounted file read once: tests/test_admission_deploy.py
    ref_namespace, _, rest = parsed.config_configmap.partition("/")
    configmap_name, _, key = rest.partition(":")
    assert ref_namespace == namespace
    assert key in named(docs, "ConfigMap", configmap_name)["data"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports <= listen_ports(args), "a container port nothing listens on"


@pytest.mark.parametrize("name", [f"unitscale-{c}" for c in COMPONENTS])
def test_every_service_port_reaches_a_named_container_port(name):
    docs = render("base")
    container = container_of(named(docs, "Deployment", name))
    ports = {p["name"] for p in container["ports"]}
    service = named(docs, "Service", name)
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_the_scalers_signal_sources_are_the_services_grpc_ports():
    docs = render("base")
    text = named(docs, "ConfigMap", "unitscale-scaler")["data"]["config.yaml"]
    addresses = {s["address"] for s in yaml.safe_load(text)["signal-sources"]}
    expected = set()
    for name in ("unitscale-exporter", "unitscale-gateway"):
        service = named(docs, "Service", name)
        (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        expected.add(f"{name}.{service['metadata']['namespace']}.svc:{grpc['port']}")
        assert service["spec"]["clusterIP"] == "None", "headless: the scaler reaches each pod"
    assert addresses == expected


# --- RBAC --------------------------------------------------------------------------------


def granted_to(docs: list[dict[str, Any]], account: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, resourceName or "") the Roles bound to ``account`` allow."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    granted = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]
        ):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        for rule in roles[(ref["kind"], scope, ref["name"])]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            granted.add((group, resource, verb, name))
    return granted


@pytest.mark.parametrize("component", sorted(USED))
def test_each_role_grants_exactly_what_its_component_sends(component):
    assert granted_to(render("base"), f"unitscale-{component}") == USED[component]


def test_prewarm_adds_exactly_fluids_requests_to_the_scaler():
    granted = granted_to(render("overlays/production"), "unitscale-scaler")
    assert granted == USED["scaler"] | PREWARM


@pytest.mark.parametrize("rbac", [*sorted(USED), "components/scaler-prewarm"])
def test_each_rule_says_why(rbac):
    """Every rule of our Roles has a comment right above it."""
    lines = (DEPLOY / rbac / "rbac.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("  - apiGroups:")]
    assert rules
    assert all(lines[i - 1].lstrip().startswith("#") for i in rules)


def test_the_endpoint_slice_roles_are_in_the_namespace_the_configs_serve():
    docs = render("base")
    exporter = yaml.safe_load(
        named(docs, "ConfigMap", "unitscale-exporter")["data"]["exporter.yaml"]
    )
    gateway = yaml.safe_load(named(docs, "ConfigMap", "unitscale-gateway")["data"]["gateway.yaml"])
    served = {d["namespace"] for d in exporter["deployments"] if d.get("endpoint-slices")}
    assert served == {gateway["namespace"]}
    for name in ("unitscale-exporter-slices", "unitscale-gateway-slices"):
        assert named(docs, "Role", name)["metadata"]["namespace"] in served


# --- the scaler's NetworkPolicy component ------------------------------------------------


def test_the_scalers_network_policy_lets_in_exactly_its_callers():
    """gRPC from KEDA's namespace, the admission controller and the gateway; metrics open."""
    docs = render("overlays/production")
    policy = named(docs, "NetworkPolicy", "unitscale-scaler")
    pods = {
        name: named(docs, "Deployment", f"unitscale-{name}")["spec"]["template"]["metadata"]
        for name in COMPONENTS
    }
    assert policy["spec"]["podSelector"]["matchLabels"] == pods["scaler"]["labels"]
    ports = {
        p["name"] for p in container_of(named(docs, "Deployment", "unitscale-scaler"))["ports"]
    }
    grpc_rule, metrics_rule = policy["spec"]["ingress"]
    assert [p["port"] for p in grpc_rule["ports"]] == ["grpc"] and "grpc" in ports
    assert (
        metrics_rule == {"ports": [{"port": "metrics", "protocol": "TCP"}]} and "metrics" in ports
    )
    keda, ours = grpc_rule["from"]
    assert keda == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}
    (expression,) = ours["podSelector"]["matchExpressions"]
    let_in = {
        name
        for name, meta in pods.items()
        if meta["labels"].get(expression["key"]) in expression["values"]
    }
    assert let_in == {"admission", "gateway"}


# --- the TLS component ---------------------------------------------------------------------


def test_mtls_mounts_the_certificate_the_scalers_names_are_issued_for():
    docs = render("overlays/production")
    scaler = named(docs, "Deployment", "unitscale-scaler")
    pod = scaler["spec"]["template"]["spec"]
    args = container_of(scaler)["args"]
    parsed = build_parser().parse_args(expanded(args, "unitscale"))
    (mount,) = [m for m in container_of(scaler)["volumeMounts"] if m["name"] == "tls"]
    for path in (parsed.tls_cert, parsed.tls_key, parsed.tls_client_ca):
        assert str(path).startswith(mount["mountPath"] + "/")
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    server = named(docs, "Certificate", "unitscale-scaler")["spec"]
    assert volume["secret"]["secretName"] == server["secretName"]
    assert "unitscale-scaler.unitscale.svc" in server["dnsNames"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # The kubelet's gRPC probe speaks no TLS.
    assert "grpc" not in container_of(scaler)["readinessProbe"]
    client = named(docs, "Certificate", "unitscale-scaler-client")
    push = list(yaml.safe_load_all((SCALED_OBJECTS / "external-push.yaml").read_text()))
    auth = next(d for d in push if d["kind"] == "TriggerAuthentication")
    assert {r["name"] for r in auth["spec"]["secretTargetRef"]} == {client["spec"]["secretName"]}
    assert client["metadata"]["namespace"] == auth["metadata"]["namespace"]
    scaled = next(d for d in push if d["kind"] == "ScaledObject")
    address = scaled["spec"]["triggers"][0]["metadata"]["scalerAddress"]
    assert address.rpartition(":")[0] in server["dnsNames"]


# --- the monitoring component -------------------------------------------------------------


def test_each_component_is_scraped_on_a_port_its_service_names_as_the_rules_job():
    docs = render("overlays/production")
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {f"unitscale-{c}" for c in COMPONENTS}
    for name, monitor in monitors.items():
        service = named(docs, "Service", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            service["metadata"]["labels"].items()
        )
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    # The rules select jobs by the Service names (a ServiceMonitor's job label).
    rules = yaml.safe_dump(named(docs, "PrometheusRule", "unitscale")["spec"])
    jobs = set(re.findall(r'job="([^"]+)"', rules))
    assert jobs and jobs <= set(monitors)


OPERATOR_TARGET_LABELS = {"namespace", "service", "pod", "container", "endpoint", "instance", "job"}
"""The labels the Prometheus Operator puts on every target of a ServiceMonitor."""


def test_the_scrapes_keep_our_namespace_label_over_the_operators():
    from serving.gateway_metrics import GatewayMetrics

    # Our series name the workload's namespace (here a gateway's), a target label too.
    exposition = GatewayMetrics("serving", "llama").render().decode()
    assert 'namespace="serving"' in exposition and "namespace" in OPERATOR_TARGET_LABELS
    docs = render("overlays/production")
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            # Without it Prometheus renames ours exported_namespace: namespace="unitscale".
            assert endpoint.get("honorLabels") is True, monitor["metadata"]["name"]


def test_the_dashboards_configmap_holds_every_dashboard_as_committed():
    docs = render("overlays/production")
    configmap = named(docs, "ConfigMap", "unitscale-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted((DEPLOY / "dashboards").glob("*.json"))
    assert files
    assert configmap["data"] == {f.name: f.read_text() for f in files}
    assert named(docs, "PrometheusRule", "unitscale")["metadata"]["namespace"] == "unitscale"


# --- the ScaledObject examples ----------------------------------------------------------


def triggers():
    for path in sorted(SCALED_OBJECTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "ScaledObject":
                for trigger in doc["spec"]["triggers"]:
                    yield pytest.param(doc, trigger, id=f"{path.stem}-{trigger['type']}")


@pytest.mark.parametrize(("scaled_object", "trigger"), list(triggers()))
def test_example_triggers_parse_and_agree_with_the_scaled_object(scaled_object, trigger):
    assert trigger["type"] in {"external", "external-push"}
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), "KEDA wants strings"
    metadata = parse_metadata(trigger["metadata"])
    assert metadata.deployment == scaled_object["spec"]["scaleTargetRef"]["name"]
    assert metadata.max_replicas >= scaled_object["spec"]["maxReplicaCount"] or (
        "maxReplicas" not in trigger["metadata"]
    )
    # The scaler's headless Service of deploy/scaler (namespace unitscale).
    assert trigger["metadata"]["scalerAddress"] == "unitscale-scaler.unitscale.svc:9090"
    assert scaled_object["spec"]["fallback"]["replicas"] >= 1, "a fallback for UNAVAILABLE"


def test_the_scaler_docs_examples_are_the_shipped_ones():
    docs = (DEPLOY.parent / "docs" / "scaler.md").read_text()
    for path in sorted(SCALED_OBJECTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for trigger in doc["spec"].get("triggers", []):
                for key, value in trigger["metadata"].items():
                    assert f"{key}: {value}" in docs or f'{key}: "{value}"' in docs, (
                        f"{path.name}: {key}: {value} is not shown in docs/scaler.md"
                    )


def test_the_docs_deploy_commands_name_kustomizations_that_exist():
    text = (DEPLOY.parent / "docs" / "operations.md").read_text()
    built = [
        shlex.split(line)[2]
        for line in map(str.strip, text.splitlines())
        if line.startswith("kustomize build deploy/")
    ]
    assert built
    for path in built:
        assert path.removeprefix("deploy/").rstrip("/") in RENDERINGS, path


# --- the ConfigMaps ----------------------------------------------------------------------


def config_models() -> list[Any]:
    from exporter.config import AcceleratorConfig, DeploymentConfig, ExporterConfig
    from scaler.config import PolicyConfig, PrometheusSourceConfig, ScalerConfig
    from serving.config import ArrivalsConfig, GatewayConfig, SloConfig

    return [
        pytest.param("scaler", ScalerConfig, id="the scaler's keys"),
        pytest.param("scaler", PolicyConfig, id="the scaler's policy keys"),
        pytest.param("scaler", PrometheusSourceConfig, id="the scaler's prometheus-source keys"),
        pytest.param("exporter", ExporterConfig, id="the exporter's keys"),
        pytest.param("exporter", DeploymentConfig, id="the exporter's deployment keys"),
        pytest.param("exporter", AcceleratorConfig, id="the exporter's accelerator keys"),
        pytest.param("gateway", GatewayConfig, id="the gateway's keys"),
        pytest.param("gateway", SloConfig, id="the gateway's slo keys"),
        pytest.param("gateway", ArrivalsConfig, id="the gateway's arrivals keys"),
    ]


@pytest.mark.parametrize(("component", "model"), config_models())
def test_the_configmap_example_shows_and_comments_every_key(component, model):
    """``_example`` names each key (set, or commented out under its parent) with a comment."""
    configmap = yaml.safe_load((DEPLOY / component / "configmap.yaml").read_text())
    lines = configmap["data"]["_example"].splitlines()
    for name, field in model.model_fields.items():
        key = field.alias or name.replace("_", "-")
        pattern = re.compile(rf"^\s*(#\s*)?(-\s+)?{re.escape(key)}:")
        at = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        assert at is not None, f"deploy/{component}/configmap.yaml _example does not show {key}"
        commented = "#" in lines[at].split(":", 1)[1] or lines[at - 1].lstrip().startswith("#")
        assert commented, f"deploy/{component}/configmap.yaml _example: {key} has no comment"
