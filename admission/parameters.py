"""The check's parameters: a ``CapacityCheckParameters`` object (``unitscale.io/v1alpha1``).

An AdmissionCheck names one in ``spec.parameters`` (``apiGroup: unitscale.io``,
``kind: CapacityCheckParameters``); ``parse_parameters`` turns the object, as the API
server returns it, into a frozen ``Parameters``. The CRD (``deploy/admission/crd.yaml``)
carries the same defaults, enums and bounds, so the API server refuses most bad values
itself; this parser checks them again (a test object never met the API server) and adds
what a schema cannot say well: label syntax of the pool selector, a port in range.

Pure: a mapping in, a value or a ``ConfigError`` naming the field and value out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, cast

from foundation.errors import ConfigError, kind, quote

API_GROUP: Final = "unitscale.io"
VERSION: Final = "v1alpha1"
KIND: Final = "CapacityCheckParameters"
PLURAL: Final = "capacitycheckparameters"

GpuSchedulerPolicy = Literal["binpack", "spread", "topology-aware"]
NodeSchedulerPolicy = Literal["binpack", "spread"]
WhenUnavailable = Literal["Hold", "Ignore"]

GPU_SCHEDULER_POLICIES: Final[tuple[GpuSchedulerPolicy, ...]] = (
    "binpack",
    "spread",
    "topology-aware",
)
NODE_SCHEDULER_POLICIES: Final[tuple[NodeSchedulerPolicy, ...]] = ("binpack", "spread")
WHEN_UNAVAILABLE: Final[tuple[WhenUnavailable, ...]] = ("Hold", "Ignore")
MAX_TENANTS_PER_INSTANCE: Final = 8
"""More LoRA tenants than this on one base-model instance starve each other's adapters."""


@dataclass(frozen=True)
class DataParameters:
    """How long and how far a Fluid Dataset's cache must be warm before a job starts."""

    cached_percentage: float = 95.0
    """``status.cacheStates.cachedPercentage`` the Dataset must reach, 0-100."""
    timeout_seconds: int = 1800
    """Waiting for the cache longer than this (from the check's Pending) ends in Retry."""
    create_dataload: bool = True
    """Create a DataLoad (owned by the Workload) when the Dataset has none."""


@dataclass(frozen=True)
class Headroom:
    """Keep what inference on the same pool is forecast to need free of training."""

    scaler: str
    """``host:port`` of the scaler's gRPC service."""
    pool: str
    """The pool name the scaler's ScaledObjects declare."""
    horizon_seconds: int = 600
    """How far ahead the forecast looks."""
    when_unavailable: WhenUnavailable = "Hold"
    """Scaler unreachable: ``Hold`` (Retry, the safe default) or ``Ignore`` the check."""


@dataclass(frozen=True)
class LoraParameters:
    """How LoRA fine-tuning tenants share one base-model instance's nodes."""

    tenants_per_instance: int = 5
    """Tenants per instance, 1-8; the next one starts a new instance. With ``adaptive``,
    the ceiling the controller's per-model density moves under."""
    adaptive: bool = False
    """Raise or lower the per-model density from memory pressure and step time
    (``admission.lora.tenants_for``), at most one change a model per ``LORA_INTERVAL``."""
    step_time_slo_seconds: float | None = None
    """The tenants' step-time SLO; None: density follows memory pressure alone."""


@dataclass(frozen=True)
class ReclaimParameters:
    """Taking cards back from admitted training when inference needs them (``spec.reclaim``)."""

    enabled: bool = False
    """False: no plan for the check (no allowance enforced or exported), nothing reclaimed."""
    min_run_seconds: int = 600
    """A workload admitted less than this long ago is never reclaimed (no thrashing)."""
    max_priority: int = 0
    """Workloads with ``spec.priority`` at most this are preemptible."""
    headroom_fraction: float = 0.0
    """The allowance keeps this fraction of inference's forecast free beyond it (bursts)."""
    headroom_cards: int = 0
    """And this many whole cards more; neither is ever reclaimed for, only kept free."""


@dataclass(frozen=True)
class Parameters:
    """One AdmissionCheck's settings; ``Parameters()`` is what a check without any gets."""

    pool_node_selector: Mapping[str, str] = field(default_factory=dict)
    """Labels of the pool's nodes; empty: every node HAMi registered."""
    gpu_scheduler_policy: GpuSchedulerPolicy = "binpack"
    """Written as ``hami.io/gpu-scheduler-policy``."""
    node_scheduler_policy: NodeSchedulerPolicy | None = None
    """Written as ``hami.io/node-scheduler-policy`` when set."""
    retry_after_seconds: int = 60
    """``requeueAfterSeconds`` when the gang does not fit now."""
    handshake_timeout_seconds: int = 60
    """A node whose ``hami.io/node-handshake`` is older than this offers nothing."""
    data: DataParameters = field(default_factory=DataParameters)
    inference_headroom: Headroom | None = None
    """Absent: no headroom check."""
    lora: LoraParameters = field(default_factory=LoraParameters)
    reclaim: ReclaimParameters = field(default_factory=ReclaimParameters)
    """Enabled only with ``inference_headroom`` (the forecast it reclaims for)."""


# Kubernetes label syntax (apimachinery validation.IsQualifiedName / IsValidLabelValue).
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_HOST_PORT = re.compile(r"(?P<host>[^\s/:]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>[0-9]{1,5})")
_POOL = re.compile(r"[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?")

T = TypeVar("T")


def parse_parameters(obj: Mapping[str, Any]) -> Parameters:
    """The ``Parameters`` a ``CapacityCheckParameters`` object (the server's JSON) says.

    Unset fields take the defaults the CRD declares; unknown fields are refused (the API
    server prunes them, so one here comes from a hand-made object).

    Raises:
        ConfigError: every bad field, each named by its path and value, e.g.
            ``CapacityCheckParameters 'h200': spec.data.cachedPercentage=150: must be
            between 0 and 100``.
    """
    name = (obj.get("metadata") or {}).get("name", "?")
    problems: list[str] = []
    if obj.get("kind", KIND) != KIND or obj.get("apiVersion", f"{API_GROUP}/{VERSION}") != (
        f"{API_GROUP}/{VERSION}"
    ):
        problems.append(
            f"expected apiVersion {API_GROUP}/{VERSION} kind {KIND}, got "
            f"{quote(obj.get('apiVersion'))} {quote(obj.get('kind'))}"
        )
    spec = _section(obj, "spec", "spec", problems)
    reader = _Reader(problems)
    parameters = _parameters(spec, reader)
    if problems:
        raise ConfigError(f"{KIND} {quote(name)}: " + "; ".join(problems[:10]))
    return parameters


def _parameters(spec: Mapping[str, Any], read: _Reader) -> Parameters:
    read.only(
        spec,
        "spec",
        (
            "poolNodeSelector",
            "gpuSchedulerPolicy",
            "nodeSchedulerPolicy",
            "retryAfterSeconds",
            "handshakeTimeoutSeconds",
            "data",
            "inferenceHeadroom",
            "lora",
            "reclaim",
        ),
    )
    data = _section(spec, "data", "spec.data", read.problems)
    read.only(data, "spec.data", ("cachedPercentage", "timeoutSeconds", "createDataLoad"))
    lora = _section(spec, "lora", "spec.lora", read.problems)
    read.only(lora, "spec.lora", ("tenantsPerInstance", "adaptive", "stepTimeSloSeconds"))
    headroom = _headroom(spec, read)
    node_policy = spec.get("nodeSchedulerPolicy")
    return Parameters(
        pool_node_selector=_selector(spec.get("poolNodeSelector"), read),
        gpu_scheduler_policy=read.choice(
            spec, "gpuSchedulerPolicy", "spec", GPU_SCHEDULER_POLICIES, "binpack"
        ),
        node_scheduler_policy=None
        if node_policy is None
        else read.choice(spec, "nodeSchedulerPolicy", "spec", NODE_SCHEDULER_POLICIES, "binpack"),
        retry_after_seconds=read.integer(spec, "retryAfterSeconds", "spec", 60, 1, 86_400),
        handshake_timeout_seconds=read.integer(
            spec, "handshakeTimeoutSeconds", "spec", 60, 1, 3_600
        ),
        data=DataParameters(
            cached_percentage=read.number(data, "cachedPercentage", "spec.data", 95.0, 0, 100),
            timeout_seconds=read.integer(data, "timeoutSeconds", "spec.data", 1800, 1, 604_800),
            create_dataload=read.boolean(data, "createDataLoad", "spec.data", True),
        ),
        inference_headroom=headroom,
        lora=LoraParameters(
            tenants_per_instance=read.integer(
                lora, "tenantsPerInstance", "spec.lora", 5, 1, MAX_TENANTS_PER_INSTANCE
            ),
            adaptive=read.boolean(lora, "adaptive", "spec.lora", False),
            step_time_slo_seconds=None
            if lora.get("stepTimeSloSeconds") is None
            else read.number(lora, "stepTimeSloSeconds", "spec.lora", 1.0, 0.001, 86_400),
        ),
        reclaim=_reclaim(spec, read, headroom),
    )


def _reclaim(
    spec: Mapping[str, Any], read: _Reader, headroom: Headroom | None
) -> ReclaimParameters:
    where = "spec.reclaim"
    section = _section(spec, "reclaim", where, read.problems)
    read.only(
        section,
        where,
        ("enabled", "minRunSeconds", "maxPriority", "headroomFraction", "headroomCards"),
    )
    enabled = read.boolean(section, "enabled", where, False)
    if enabled and headroom is None:
        read.problems.append(
            f"{where}.enabled=true needs spec.inferenceHeadroom: reclaim gives cards back to "
            "the inference the scaler forecasts, and without the forecast it has none"
        )
    return ReclaimParameters(
        enabled=enabled,
        min_run_seconds=read.integer(section, "minRunSeconds", where, 600, 0, 86_400),
        max_priority=read.integer(section, "maxPriority", where, 0, -(2**31), 2**31 - 1),
        headroom_fraction=read.number(section, "headroomFraction", where, 0.0, 0.0, 10.0),
        headroom_cards=read.integer(section, "headroomCards", where, 0, 0, 100_000),
    )


def _headroom(spec: Mapping[str, Any], read: _Reader) -> Headroom | None:
    if spec.get("inferenceHeadroom") is None:
        return None
    where = "spec.inferenceHeadroom"
    section = _section(spec, "inferenceHeadroom", where, read.problems)
    read.only(section, where, ("scaler", "pool", "horizonSeconds", "whenUnavailable"))
    scaler = read.string(section, "scaler", where)
    if scaler and not _valid_host_port(scaler):
        read.problems.append(f"{where}.scaler={quote(scaler)}: expected host:port (port 1-65535)")
    pool = read.string(section, "pool", where)
    if pool and not _POOL.fullmatch(pool):
        read.problems.append(
            f"{where}.pool={quote(pool)}: expected a lowercase name (a-z, 0-9, '-', '.', '_')"
        )
    return Headroom(
        scaler=scaler,
        pool=pool,
        horizon_seconds=read.integer(section, "horizonSeconds", where, 600, 1, 86_400),
        when_unavailable=read.choice(section, "whenUnavailable", where, WHEN_UNAVAILABLE, "Hold"),
    )


def _selector(value: object, read: _Reader) -> dict[str, str]:
    where = "spec.poolNodeSelector"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        read.problems.append(f"{where}: expected a mapping of labels, got {kind(value)}")
        return {}
    selector: dict[str, str] = {}
    for key, label in value.items():
        if not isinstance(key, str) or not _valid_label_key(key):
            read.problems.append(f"{where}: {quote(key)} is not a valid label key")
        elif not isinstance(label, str) or not _LABEL_VALUE.fullmatch(label):
            read.problems.append(f"{where}.{key}={quote(label)}: not a valid label value")
        else:
            selector[key] = label
    return selector


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_LABEL_NAME.fullmatch(name))


def _valid_host_port(value: str) -> bool:
    # Printable ASCII: gRPC encodes the target, and a lone surrogate raised
    # UnicodeEncodeError inside the pass (hostile pass 4, H5).
    if not (value.isascii() and value.isprintable()):
        return False
    match = _HOST_PORT.fullmatch(value)
    return match is not None and 1 <= int(match["port"]) <= 65535


def _section(
    parent: Mapping[str, Any], key: str, where: str, problems: list[str]
) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{where}: expected a mapping, got {kind(value)}")
        return {}
    return value


@dataclass
class _Reader:
    """Typed field reads that collect problems instead of stopping at the first."""

    problems: list[str]

    def only(self, section: Mapping[str, Any], where: str, known: tuple[str, ...]) -> None:
        for key in section:
            if key not in known:
                self.problems.append(f"{where}: unknown field {quote(key)}")

    def integer(
        self, section: Mapping[str, Any], key: str, where: str, default: int, low: int, high: int
    ) -> int:
        value = section.get(key, default)
        if type(value) is not int:
            self.problems.append(
                f"{where}.{key}={quote(value)}: expected an integer, got {kind(value)}"
            )
            return default
        if not low <= value <= high:
            self.problems.append(f"{where}.{key}={quote(value)}: must be between {low} and {high}")
            return default
        return value

    def number(
        self,
        section: Mapping[str, Any],
        key: str,
        where: str,
        default: float,
        low: float,
        high: float,
    ) -> float:
        value = section.get(key, default)
        if type(value) not in (int, float) or value != value:  # value != value: NaN
            self.problems.append(
                f"{where}.{key}={quote(value)}: expected a number, got {kind(value)}"
            )
            return default
        if not low <= value <= high:
            self.problems.append(
                f"{where}.{key}={quote(value)}: must be between {low:g} and {high:g}"
            )
            return default
        return float(value)

    def boolean(self, section: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = section.get(key, default)
        if type(value) is not bool:
            self.problems.append(f"{where}.{key}={quote(value)}: expected true or false")
            return default
        return value

    def string(self, section: Mapping[str, Any], key: str, where: str) -> str:
        value = section.get(key)
        if value is None:
            self.problems.append(f"{where}.{key}: required")
            return ""
        if not isinstance(value, str) or not value:
            self.problems.append(f"{where}.{key}={quote(value)}: expected a non-empty string")
            return ""
        return value

    def choice(
        self,
        section: Mapping[str, Any],
        key: str,
        where: str,
        choices: tuple[T, ...],
        default: T,
    ) -> T:
        value = section.get(key, default)
        if value not in choices:
            self.problems.append(
                f"{where}.{key}={quote(value)}: one of {', '.join(map(str, choices))}"
            )
            return default
        return cast("T", value)


# --- an AdmissionCheck, its parameters and its Active condition ---------------------------

ACTIVE: Final = "Active"
ACTIVE_MESSAGE: Final = "The admission check is active"
BAD_PARAMETERS_REF: Final = "BadParametersRef"
KUEUE_API_VERSION: Final = "kueue.x-k8s.io/v1beta2"


def check_parameters(
    check: Mapping[str, Any], parameters_objects: Mapping[str, Mapping[str, Any]]
) -> Parameters:
    """The parameters an AdmissionCheck refers to, by name among ``parameters_objects``.

    A check without ``spec.parameters`` runs on the defaults (``Parameters()``).

    Raises:
        ConfigError: the reference names another kind, or an object that does not exist
            or is invalid; the message says which, for the check's Active condition.
    """
    ref = (check.get("spec") or {}).get("parameters")
    if ref is None:
        return Parameters()
    group, ref_kind, name = ref.get("apiGroup"), ref.get("kind"), ref.get("name")
    if group != API_GROUP or ref_kind != KIND:
        raise ConfigError(
            f"spec.parameters: expected apiGroup {API_GROUP} kind {KIND}, got "
            f"{quote(group)} {quote(ref_kind)}"
        )
    obj = parameters_objects.get(name) if isinstance(name, str) else None
    if obj is None:
        raise ConfigError(f"{KIND} {quote(name)} not found")
    return parse_parameters(obj)


def active_condition(
    check: Mapping[str, Any], problem: str | None, now: str
) -> dict[str, Any] | None:
    """The ``Active`` condition the check should carry, or None when it carries it.

    ``problem`` None: ``Active=True`` (reason Active); else ``Active=False`` with reason
    BadParametersRef and ``problem`` as the message. ``now`` (RFC 3339) becomes the
    transition time only when the status changes.
    """
    current = next(
        (
            c
            for c in (check.get("status") or {}).get("conditions") or []
            if isinstance(c, dict) and c.get("type") == ACTIVE
        ),
        None,
    )
    wanted: dict[str, Any] = {
        "type": ACTIVE,
        "status": "True" if problem is None else "False",
        "reason": ACTIVE if problem is None else BAD_PARAMETERS_REF,
        "message": ACTIVE_MESSAGE if problem is None else problem[:32768],
        "observedGeneration": (check.get("metadata") or {}).get("generation", 0),
        "lastTransitionTime": now,
    }
    if current is not None and current.get("status") == wanted["status"]:
        wanted["lastTransitionTime"] = current.get("lastTransitionTime", now)
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return None
    return wanted


def active_body(check: Mapping[str, Any], condition: Mapping[str, Any]) -> dict[str, Any]:
    """The server-side-apply body setting ``condition`` on the AdmissionCheck's status."""
    meta = check.get("metadata") or {}
    identity = {k: meta[k] for k in ("name", "uid") if k in meta}
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": identity,
        "status": {"conditions": [dict(condition)]},
    }
