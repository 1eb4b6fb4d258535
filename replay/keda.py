"""KEDA's and the HPA's arithmetic, as pure functions of time and the scaler's answers.

- KEDA polling (``pollingInterval``, default 30 s): active with 0 replicas -> 1 (or
  ``minReplicaCount``); inactive for more than ``cooldownPeriod`` (300 s) -> 0.
  ``external-push`` activates at once.
- A scaler error changes nothing without a ``fallback``. With one, every failed call
  (KEDA's polls and the HPA's metric reads alike) counts; past ``failureThreshold``
  consecutive failures KEDA answers the HPA ``fallback.replicas x target`` and counts
  the trigger active, so a ScaledObject at zero is activated and then held at the
  fallback replicas by the HPA. One success resets the count.
- HPA sync (15 s) while replicas >= 1, AverageValue: the value rounded to milli-units
  (KEDA's ``%.3f`` quantity), ``ceil(value / target)`` unless ``value / (target *
  replicas)`` is within the 10% tolerance of 1; scale-up limited to max(+4 pods, +100%)
  per 15 s; scale-down to the highest recommendation of the last 300 s
  (stabilization), then at most -100% per 15 s.
Sources: kubernetes pkg/controller/podautoscaler (replica_calculator.go, defaults.go);
kedacore/keda pkg/scaling/executor/scale_scaledobjects.go, pkg/fallback/fallback.go,
pkg/scaling/scale_handler.go (see keda-external-scaler.md); checked against the real
KEDA v2.21 and kube-controller-manager by tests/k8s/test_keda_e2e.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from foundation.errors import ConfigError, kind, quote
from scaler.core.hpa import within_tolerance


@dataclass(frozen=True, slots=True)
class ScalingSpec:
    """A ScaledObject's scaling settings and the HPA behaviour it gets."""

    min_replicas: int = 0
    max_replicas: int = 100
    polling_interval: float = 30.0
    cooldown: float = 300.0
    hpa_sync: float = 15.0
    tolerance: float = 0.1
    scale_down_stabilization: float = 300.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_down_percent: float = 100.0
    fallback_replicas: int | None = None
    """``fallback.replicas``; None: no fallback (errors change nothing)."""
    failure_threshold: int = 3
    """``fallback.failureThreshold``: failures tolerated before the fallback applies."""
    fallback_behavior: str = "static"
    """``fallback.behavior``: static, currentReplicas, currentReplicasIfHigher/IfLower."""


FALLBACK_BEHAVIORS = (
    "static",
    "currentReplicas",
    "currentReplicasIfHigher",
    "currentReplicasIfLower",
)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the scaler answered: the metric and target (HPA), activity (KEDA).

    ``value`` or ``active`` None means the call failed (UNAVAILABLE): KEDA and the HPA
    keep the current replicas.
    """

    value: float | None
    target: float
    active: bool | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LoopState:
    """What KEDA and the HPA remember between evaluations."""

    last_active: float = -math.inf
    recommendations: tuple[tuple[float, int], ...] = ()
    failures: int = 0
    """Consecutive failed calls to the scaler (KEDA's fallback counter)."""

    def activated(self, now: float) -> LoopState:
        """The state after a push activation: active now, the failure count kept.

        A push does not touch KEDA's fallback health.
        """
        return replace(self, last_active=now)


def with_fallback(
    replicas: int, answer: Answer, state: LoopState, spec: ScalingSpec
) -> tuple[Answer, LoopState]:
    """The answer KEDA acts on: the scaler's, or past the threshold the fallback's.

    KEDA counts each failed call and answers ``fallback.replicas x target`` (active)
    once the count exceeds ``failureThreshold``; a successful call resets it.
    """
    if answer.value is not None:
        return answer, replace(state, failures=0) if state.failures else state
    if spec.fallback_replicas is None:
        return answer, state
    state = replace(state, failures=state.failures + 1)
    if state.failures <= spec.failure_threshold:
        return answer, state
    fallback = spec.fallback_replicas
    if spec.fallback_behavior == "currentReplicas":
        fallback = replicas
    elif spec.fallback_behavior == "currentReplicasIfHigher":
        fallback = max(replicas, fallback)
    elif spec.fallback_behavior == "currentReplicasIfLower":
        fallback = min(replicas, fallback)
    reason = f"fallback {fallback} after {state.failures} failures ({answer.reason})"
    return Answer(float(fallback) * answer.target, answer.target, True, reason), state


def milli(value: float) -> float:
    """The value as the HPA reads it: KEDA formats it with ``%.3f`` into a quantity."""
    return float(f"{value:.3f}")


def keda_poll(
    replicas: int, answer: Answer, state: LoopState, now: float, spec: ScalingSpec
) -> tuple[int, LoopState]:
    """One KEDA operator poll: 0 -> 1 on activity, N -> 0 after the cooldown."""
    answer, state = with_fallback(replicas, answer, state, spec)
    if replicas < spec.min_replicas:
        return spec.min_replicas, state  # KEDA keeps minReplicaCount whatever the scaler says
    if answer.active is None:
        return replicas, state  # a scaler error never scales to zero
    if answer.active:
        state = replace(state, last_active=now)
        if replicas == 0:
            return max(spec.min_replicas, 1), state
        return replicas, state
    # Strictly after: KEDA scales in when lastActiveTime + cooldownPeriod is before now.
    if replicas > 0 and spec.min_replicas == 0 and now - state.last_active > spec.cooldown:
        return 0, replace(state, recommendations=())
    return replicas, state


def hpa_sync(
    replicas: int, answer: Answer, state: LoopState, now: float, spec: ScalingSpec
) -> tuple[int, LoopState]:
    """One HPA evaluation of an AverageValue external metric."""
    if replicas == 0:
        return replicas, state  # the HPA is disabled at zero: no metric read, no count
    answer, state = with_fallback(replicas, answer, state, spec)
    if answer.value is None:
        return replicas, state
    # The HPA divides integer milli-values (Quantity.MilliValue): 11700 / 13000 is 0.9
    # exactly, where 11.7 / 13 is just below it. KEDA clamps negatives (v2.20.2).
    usage = round(milli(max(0.0, answer.value)) * 1000)
    target = round(answer.target * 1000)
    ratio = usage / (target * replicas)
    wanted = replicas if within_tolerance(ratio, spec.tolerance) else math.ceil(usage / target)
    wanted = min(max(wanted, max(spec.min_replicas, 1)), spec.max_replicas)
    window = tuple(
        (t, r) for t, r in state.recommendations if now - t < spec.scale_down_stabilization
    )
    window += ((now, wanted),)
    stabilized = wanted if wanted > replicas else min(replicas, max(r for _, r in window))
    up_limit = max(
        replicas + spec.scale_up_pods, math.ceil(replicas * (1 + spec.scale_up_percent / 100))
    )
    down_limit = math.floor(replicas * (1 - spec.scale_down_percent / 100))
    desired = min(
        max(stabilized, down_limit, max(spec.min_replicas, 1)), up_limit, spec.max_replicas
    )
    return desired, replace(state, recommendations=window)


@dataclass(frozen=True, slots=True)
class ScaledObjectSpec:
    """What a ScaledObject manifest says about scaling one workload."""

    name: str
    namespace: str
    spec: ScalingSpec
    metadata: dict[str, str]
    """The unitscale trigger's ``metadata`` (what KEDA sends as ``scalerMetadata``)."""
    push: bool
    """``external-push``: StreamIsActive activates at once."""


def read_scaled_object(doc: Mapping[str, Any], origin: str = "ScaledObject") -> ScaledObjectSpec:
    """A ScaledObject manifest (parsed YAML) as KEDA and the HPA would act on it.

    KEDA's defaults fill what the manifest leaves out (polling 30 s, cooldown 300 s,
    min 0, max 100); HPA behaviour policies must use 15 s periods (one HPA sync), the
    only ones this model has. Anything else this model cannot follow is refused.

    Raises:
        ConfigError: not a ScaledObject with one external(-push) trigger, or a setting
            the model does not follow (named in the message).
    """
    doc = _mapping(doc, "the document", origin)
    if doc.get("kind") != "ScaledObject":
        raise ConfigError(f"{origin}: kind is {quote(doc.get('kind'))}, expected ScaledObject")
    meta = _mapping(doc.get("metadata"), "metadata", origin)
    spec = _mapping(doc.get("spec"), "spec", origin)
    all_triggers = [
        _mapping(t, f"spec.triggers.{i}", origin)
        for i, t in enumerate(_sequence(spec.get("triggers"), "spec.triggers", origin))
    ]
    triggers = [t for t in all_triggers if t.get("type") in EXTERNAL_TRIGGERS]
    if len(triggers) != 1 or len(all_triggers) != 1:
        raise ConfigError(
            f"{origin}: expected exactly one trigger, of type external or external-push"
        )
    trigger = triggers[0]
    hpa = "spec.advanced.horizontalPodAutoscalerConfig"
    advanced = _mapping(spec.get("advanced"), "spec.advanced", origin)
    behavior = _mapping(
        _mapping(advanced.get("horizontalPodAutoscalerConfig"), hpa, origin).get("behavior"),
        f"{hpa}.behavior",
        origin,
    )
    scale_up = _mapping(behavior.get("scaleUp"), "behavior.scaleUp", origin)
    scale_down = _mapping(behavior.get("scaleDown"), "behavior.scaleDown", origin)
    up = _policies(scale_up, f"{origin}: behavior.scaleUp")
    down = _policies(scale_down, f"{origin}: behavior.scaleDown")
    if scale_up.get("stabilizationWindowSeconds", 0) not in (0, None):
        raise ConfigError(f"{origin}: scaleUp.stabilizationWindowSeconds must be 0 here")
    if "Pods" in down:
        raise ConfigError(f"{origin}: scaleDown Pods policies are not modelled; use Percent")
    defaults = ScalingSpec()
    try:
        scaling = ScalingSpec(
            min_replicas=int(_number(spec, "minReplicaCount", defaults.min_replicas)),
            max_replicas=int(_number(spec, "maxReplicaCount", defaults.max_replicas)),
            # At least a second (KEDA's unit): 0 polled the scaler in a loop, 234,000
            # calls a second in the demo (issue 27, hostile pass 5, M6)
            polling_interval=_number(spec, "pollingInterval", defaults.polling_interval, 1.0),
            cooldown=_number(spec, "cooldownPeriod", defaults.cooldown),
            scale_down_stabilization=_number(
                scale_down, "stabilizationWindowSeconds", defaults.scale_down_stabilization
            ),
            scale_up_pods=int(up.get("Pods", defaults.scale_up_pods)),
            scale_up_percent=float(up.get("Percent", defaults.scale_up_percent)),
            scale_down_percent=float(down.get("Percent", defaults.scale_down_percent)),
            **_fallback(spec.get("fallback"), f"{origin}: fallback"),
        )
    except (TypeError, ValueError, ArithmeticError) as err:
        raise ConfigError(f"{origin}: {err}") from err
    if scaling.min_replicas > scaling.max_replicas:
        # KEDA's webhook refuses it; KEDA's loop keeps the minimum whatever the maximum
        # (``keda_poll``), and the demo launched a process per replica (hostile pass 6, H1).
        raise ConfigError(
            f"{origin}: minReplicaCount {scaling.min_replicas} is above maxReplicaCount"
            f" {scaling.max_replicas}"
        )
    metadata = _mapping(trigger.get("metadata"), "the trigger's metadata", origin)
    return ScaledObjectSpec(
        _text(meta.get("name", ""), "metadata.name", origin),
        _text(meta.get("namespace", "default"), "metadata.namespace", origin),
        scaling,
        {str(k): _text(v, f"metadata.{k}", origin) for k, v in metadata.items()},
        trigger.get("type") == "external-push",
    )


MAX_SETTING = 1_000_000.0
"""The largest count, second or percent a ScaledObject setting may hold here (KEDA's
own bounds are int32; nothing real comes near a million)."""


def _mapping(value: object, key: str, origin: str) -> Mapping[str, Any]:
    """``value`` when it is a mapping (missing or null: empty).

    Raises:
        ConfigError: anything else, naming ``key`` (``metadata: []`` was an
            AttributeError in ``.get``).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{origin}: {key}: expected a mapping, got {kind(value)}")
    return value


def _sequence(value: object, key: str, origin: str) -> list[Any]:
    """``value`` when it is a list (missing or null: empty); else a ConfigError."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{origin}: {key}: expected a list, got {kind(value)}")
    return value


def _text(value: object, key: str, origin: str) -> str:
    """A scalar setting as the text KEDA would send; a list or mapping is refused."""
    if isinstance(value, Mapping | list):
        raise ConfigError(f"{origin}: {key}: expected a value, got {kind(value)}")
    return str(value)


def _number(fields: Mapping[str, Any], key: str, default: float, low: float = 0.0) -> float:
    """``fields[key]`` as a number from ``low`` to ``MAX_SETTING`` (``default`` when absent).

    Raises:
        ValueError: anything else (a boolean, NaN, ``.inf``, 10**5000), naming ``key``.
    """
    value = fields.get(key, default)
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not low <= number <= MAX_SETTING:
        raise ValueError(f"{key} {quote(value)} is not a number from {low:g} to {MAX_SETTING:,.0f}")
    return number


EXTERNAL_TRIGGERS = ("external", "external-push")


def _fallback(fallback: object, origin: str) -> dict[str, Any]:
    """``ScalingSpec`` fields for a ScaledObject's ``fallback`` (none: no fields)."""
    fallback = _mapping(fallback, "fallback", origin)
    if not fallback:
        return {}
    behavior = fallback.get("behavior", "static")
    if behavior not in FALLBACK_BEHAVIORS:
        shown = quote(behavior)
        raise ConfigError(f"{origin}.behavior {shown}: one of {', '.join(FALLBACK_BEHAVIORS)}")
    if "replicas" not in fallback or "failureThreshold" not in fallback:
        raise ConfigError(f"{origin}: needs replicas and failureThreshold (as KEDA's CRD)")
    return {
        "fallback_replicas": int(_number(fallback, "replicas", 0)),
        "failure_threshold": int(_number(fallback, "failureThreshold", 0)),
        "fallback_behavior": behavior,
    }


def _policies(rules: Mapping[str, Any], origin: str) -> dict[str, float]:
    """``{type: value}`` of 15 s policies whose ``selectPolicy`` is Max (the default)."""
    if rules.get("selectPolicy", "Max") != "Max":
        raise ConfigError(f"{origin}.selectPolicy: only Max is modelled")
    found: dict[str, float] = {}
    for i, item in enumerate(_sequence(rules.get("policies"), "policies", origin)):
        policy = _mapping(item, f"policies.{i}", origin)
        if policy.get("periodSeconds") != 15:
            raise ConfigError(f"{origin}: policies need periodSeconds 15 (one HPA sync)")
        if policy.get("type") not in ("Pods", "Percent"):
            raise ConfigError(f"{origin}: unknown policy type {quote(policy.get('type'))}")
        try:
            found[policy["type"]] = _number(policy, "value", math.nan)
        except ValueError as err:
            raise ConfigError(f"{origin}: policies.{i}: {err}") from err
    return found
