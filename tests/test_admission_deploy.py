"""The admission controller's manifests (``deploy/admission/``) say what the code does.

The ConfigMap's example is the config's defaults and documents every key; the
Deployment runs the command with the mounted file and probes its ``/healthz``; the
ClusterRole grants exactly what the controller reads and writes; the AdmissionCheck, its
parameters and the queues name each other. The API server's own verdict on the same
files is ``tests/k8s/test_deploy_dry_run.py``; that the role is enough for a running
controller, ``tests/k8s/test_admission_rbac.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from admission import annotations as names
from admission import controller
from admission.config import DEFAULT_CONTROLLER_NAME, AdmissionConfig, parse_config
from admission.parameters import parse_parameters
from unitscale.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "admission"


def objects(file: str) -> dict[str, dict[str, Any]]:
    """The documents of ``deploy/admission/<file>`` by kind (one of each kind)."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / file).read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), f"{file}: two objects of one kind"
    return by_kind


def configmap() -> dict[str, Any]:
    return objects("configmap.yaml")["ConfigMap"]


def keys_of(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every config key as dotted kebab-case paths, nested models walked."""
    found = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        found.append(key)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += keys_of(annotation, key + ".")
    return found


# --- the ConfigMap ------------------------------------------------------------------------


def test_the_configmap_example_is_exactly_the_defaults():
    assert parse_config(configmap()["data"]["_example"], "_example") == AdmissionConfig()


def test_the_configmap_example_comments_every_key():
    lines = configmap()["data"]["_example"].splitlines()
    for key in keys_of(AdmissionConfig):
        leaf = key.rsplit(".", 1)[-1]
        at = next((i for i, line in enumerate(lines) if re.match(rf"\s*{leaf}:", line)), None)
        assert at is not None, f"_example does not show the key {key}"
        commented = "#" in lines[at] or (at > 0 and lines[at - 1].lstrip().startswith("#"))
        assert commented, f"_example: the key {key} has no comment"


def test_the_shipped_config_parses():
    config = parse_config(configmap()["data"]["admission.yaml"], "admission.yaml")
    assert config.controller_name == DEFAULT_CONTROLLER_NAME


# --- the Deployment -----------------------------------------------------------------------


def container() -> dict[str, Any]:
    deployment = objects("controller.yaml")["Deployment"]
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def test_the_deployment_runs_the_command_with_the_mounted_config():
    spec = objects("controller.yaml")["Deployment"]["spec"]["template"]["spec"]
    args = container()["args"]
    assert args == ["admission", "--config", "/etc/unitscale/admission.yaml"]
    assert build_parser().parse_args(args).config == Path("/etc/unitscale/admission.yaml")
    (mount,) = [m for m in container()["volumeMounts"] if m["mountPath"] == "/etc/unitscale"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    # A directory mount (no subPath): the file is the ConfigMap's key, updated in place.
    assert "subPath" not in mount
    assert volume["configMap"]["name"] == configmap()["metadata"]["name"]
    assert "admission.yaml" in configmap()["data"]
    sa = objects("rbac.yaml")["ServiceAccount"]["metadata"]
    assert spec["serviceAccountName"] == sa["name"]
    assert objects("controller.yaml")["Deployment"]["metadata"]["namespace"] == sa["namespace"]


def test_the_probes_ask_healthz_on_the_metrics_port():
    config = parse_config(configmap()["data"]["admission.yaml"])
    port = int(config.metrics_listen.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container()[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert ports[get["port"]] == port


def test_the_container_runs_unprivileged():
    pod = objects("controller.yaml")["Deployment"]["spec"]["template"]["spec"]
    security = container()["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container()["resources"]["requests"] and container()["resources"]["limits"]


# --- RBAC -----------------------------------------------------------------------------------


def used_by_the_controller() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the controller's code sends, read from its source.

    Watches: ``WATCHES`` (``foundation.kube.watch_objects`` lists, then watches). Writes:
    every ``self._apply(api, RESOURCE, ...)`` (server-side apply of the status
    subresource, a PATCH) and ``create(api, RESOURCE, ...)`` call in
    ``admission/controller.py``; ``create(api, resource, ...)`` with a variable creates
    what ``CREATABLE`` lists.
    """
    used = set()
    for selection in controller.WATCHES.values():
        for verb in ("list", "watch"):
            used.add((selection.kind.group, selection.kind.plural, verb))
    source = ast.parse(Path(controller.__file__).read_text())
    for call in ast.walk(source):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("_apply", "create", "apply"):
            continue
        target = call.args[1]
        assert isinstance(target, ast.Name), f"line {call.lineno}: teach this test that call"
        if name == "_apply":
            resource = getattr(controller, target.id)
            used.add((resource.group, f"{resource.plural}/status", "patch"))
        elif name == "create" and target.id.isupper():
            resource = getattr(controller, target.id)
            used.add((resource.group, resource.plural, "create"))
        elif name == "create":
            used |= {(r.group, r.plural, "create") for r in controller.CREATABLE.values()}
    return used


def test_the_cluster_role_grants_exactly_what_the_controller_uses():
    role = objects("rbac.yaml")["ClusterRole"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == used_by_the_controller()
    assert all("resourceNames" not in rule for rule in role["rules"])


def test_the_binding_gives_the_role_to_the_service_account():
    rbac = objects("rbac.yaml")
    binding, sa = rbac["ClusterRoleBinding"], rbac["ServiceAccount"]["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": rbac["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


# --- the check, its parameters, the queues -----------------------------------------------


def crd_fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Every field path of the parameters' spec schema."""
    found = []
    for name, sub in (schema.get("properties") or {}).items():
        found.append(prefix + name)
        found += crd_fields(sub, f"{prefix}{name}.")
    return found


def test_the_parameters_example_sets_and_comments_every_field():
    crd = yaml.safe_load((DEPLOY / "crd.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    example = objects("check.yaml")["CapacityCheckParameters"]
    lines = (DEPLOY / "check.yaml").read_text().splitlines()
    for path in crd_fields(schema):
        value: Any = example["spec"]
        for part in path.split("."):
            assert part in value, f"the example does not set spec.{path}"
            value = value[part]
        leaf = path.rsplit(".", 1)[-1]
        (line,) = [line for line in lines if re.match(rf"\s*{leaf}:", line)]
        assert "#" in line, f"check.yaml: spec.{path} has no comment"
    parse_parameters(example)  # raises, naming the field, when the example is wrong


def test_the_admission_check_names_our_controller_and_the_parameters():
    check_objects = objects("check.yaml")
    check = check_objects["AdmissionCheck"]
    assert check["spec"]["controllerName"] == DEFAULT_CONTROLLER_NAME
    assert check["spec"]["parameters"] == {
        "apiGroup": "unitscale.io",
        "kind": "CapacityCheckParameters",
        "name": check_objects["CapacityCheckParameters"]["metadata"]["name"],
    }


def test_the_queues_are_guarded_by_the_check_on_the_pool_it_judges():
    queues = objects("queues.yaml")
    check = objects("check.yaml")
    cluster_queue, flavor = queues["ClusterQueue"]["spec"], queues["ResourceFlavor"]
    assert cluster_queue["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": check["AdmissionCheck"]["metadata"]["name"]}
    ]
    (group,) = cluster_queue["resourceGroups"]
    assert {names.GPU, names.GPU_MEMORY, names.GPU_CORES} <= set(group["coveredResources"])
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    for listed in group["flavors"]:
        assert [r["name"] for r in listed["resources"]] == group["coveredResources"]
    pool = check["CapacityCheckParameters"]["spec"]["poolNodeSelector"]
    assert flavor["spec"]["nodeLabels"] == pool
    local = queues["LocalQueue"]
    assert local["spec"]["clusterQueue"] == queues["ClusterQueue"]["metadata"]["name"]


@pytest.mark.parametrize(
    "file", ["rbac.yaml", "configmap.yaml", "controller.yaml", "check.yaml", "queues.yaml"]
)
def test_every_file_opens_with_a_comment_saying_what_it_is(file):
    assert (DEPLOY / file).read_text().startswith("# ")
