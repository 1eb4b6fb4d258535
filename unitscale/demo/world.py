"""The demo's compressed world: every process's config, in wall time, from one plan.

The demo plays ``L`` seconds of trace in ``L / C`` seconds of wall time. For the
scaler to see what it would see in production, everything that has a clock is
compressed by the same ``C``: the sim replicas step ``C`` times faster, so token rates
are ``C`` times higher and latencies ``C`` times shorter; every interval, window,
delay and SLO of the exporter, gateway, scaler and KEDA is divided by ``C``; the
token-rate priors are multiplied by ``C``; the scaler plans with the profile the
replicas simulate at ``C`` times its speed (``profile-speedup``: its capacity at the
SLOs x ``C``, times ``C``); and an accelerator-hour costs ``C`` times more, so that cost
per 1M tokens comes out as in production. The decision code sees a world that only
differs from production by its unit of time.

With ``standby`` (the default) the trigger says ``standby: "true"``: the scaler's decisions
carry sleepers beside the running replicas, the gateway asks the scaler for that plan and
puts surplus idle replicas to sleep (vLLM sleep level 1), waking one when a request finds
none ready. A sleeper holds its weights in host memory, not an accelerator.

The replay's prediction runs the same plan uncompressed (``prediction``), its sleepers the
replay's warm tier (``SimConfig.standby``), not running replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from foundation.configfile import UniqueKeyLoader
from foundation.durations import parse_duration
from foundation.errors import ConfigError, MetadataError, quote
from foundation.files import MAX_CONFIG_BYTES, read_text, write_file
from foundation.replica_model import Profile
from replay.keda import ScaledObjectSpec, ScalingSpec, read_scaled_object
from replay.policies import KEY as REPLAY_KEY
from replay.policies import Policy, StaticPeak, Unitscale
from replay.simulate import SimConfig, cold_start_seconds
from scaler.config import PolicyConfig
from scaler.core.standby import standby_setup
from scaler.core.tiers import StandbyPolicy
from scaler.metadata import STANDBY_KEYS as TRIGGER_STANDBY_KEYS
from scaler.metadata import TriggerMetadata, parse_metadata
from serving.gateway_settings import RECOMMENDED_WAKE_AT_OUTSTANDING, GatewaySettings
from serving.routing import WakePressure

NAMESPACE = "demo"
DEPLOYMENT = "llama-chat"

# Trigger metadata keys that are durations (compressed) and token rates (sped up).
_DURATION_KEYS = ("sloTtft", "sloItl", "idleGrace", "maxSignalAge", "standbyReleaseAfter")
_RATE_KEYS = ("prefillTokensPerSecond", "decodeTokensPerSecond")
# PolicyConfig fields likewise: every duration it has (a new one is compressed without
# being listed here), and the rates, the profile's speed among them.
POLICY_DURATIONS = tuple(
    name
    for name, field in PolicyConfig.model_fields.items()
    if any(getattr(m, "func", None) is parse_duration for m in field.metadata)
)
POLICY_RATES = ("prefill_tokens_per_second", "decode_tokens_per_second", "profile_speedup")
STANDBY_KEYS = ("standby", *TRIGGER_STANDBY_KEYS)
"""The trigger's warm-tier keys (``scaler.metadata``)."""
STANDBY_RECOMMENDED = {"standbyBurstSleepers": "2", "standbyMaxSleeping": "16"}
"""The standby knobs docs/scaler.md recommends on shared cards (the file's own win)."""
STANDBY_RELEASE_AFTER = "1h"
REPLICA_CAP = 8
"""Simulated replicas at most unless ``--max-replicas`` says (each a process here)."""
DEFAULT_TARGET_CONCURRENCY = 16.0
"""The trigger's ``targetConcurrency`` where neither the flag nor the file gives one."""
"""Written into the demo's trigger, so that it is compressed as every clock is (the
scaler's own default is not): the demo's 30 minutes never reach it."""
_GATEWAY = GatewaySettings()


@dataclass(frozen=True, slots=True)
class Plan:
    """The demo's settings in trace time (production units)."""

    compression: float
    profile: Profile
    scaled_object: ScaledObjectSpec
    """The ScaledObject KEDA would hold, with the demo's trigger metadata."""
    policy: PolicyConfig
    """The scaler ConfigMap's policy section."""
    cold_start_tier: str = "local-disk"
    max_signal_age: float = 30.0
    scrape_interval: float = 5.0
    scrape_timeout: float = 2.0
    panic_window: float = 10.0
    stable_window: float = 60.0
    buffer_size: int = 1000
    buffer_timeout: float = 120.0
    rate_window: float = 10.0
    health_interval: float = 1.0
    measured_cold_start: float | None = None
    """Replicas whose start is real (vLLM) take what they take: this estimate (trace
    seconds) replaces the tier's for the prediction, and the demo adds no wait."""
    standby: StandbyPolicy | None = None
    """The trigger's standby plan (``standby: "true"``): sleepers held beside the running
    replicas; None: every start is a cold one. No Fluid cache (the demo has none)."""
    wake_at_outstanding: int = RECOMMENDED_WAKE_AT_OUTSTANDING
    """The gateway's ``wake-at-outstanding`` beside the standby plan (docs/gateway.md)."""
    standby_interval: float = _GATEWAY.standby_interval
    """The gateway's asks for the standby plan (trace seconds), and the next three."""
    sleep_after_idle: float = _GATEWAY.sleep_after_idle
    wake_timeout: float = _GATEWAY.wake_timeout
    wake_retry_after: float = _GATEWAY.wake_retry_after

    @property
    def cold_start(self) -> float:
        """Seconds from a replica's start to ready (trace time)."""
        if self.measured_cold_start is not None:
            return self.measured_cold_start
        return cold_start_seconds(self.profile, self.cold_start_tier)

    @property
    def replica_profile(self) -> Profile:
        """The profile as the replicas run, launched for the ITL SLO.

        With the chunked-prefill budget whose steps keep the ITL SLO
        (``serving.vllm_profile.for_itl_slo``), as the scaler's capacity and the replay's
        fleet assume.
        """
        return self.profile.for_itl_slo(self.slo_itl)

    @property
    def lead_in(self) -> float:
        """Trace seconds before the workload with standby (0 without).

        A start, the idle grace, KEDA's cooldown, the HPA's scale-down stabilization and a
        minute: the workload begins at zero running with the sleepers held
        (``unitscale.demo.workload.lead_in``).
        """
        if self.standby is None:
            return 0.0
        spec = self.scaled_object.spec
        waits = self.policy.idle_grace + spec.cooldown + spec.scale_down_stabilization
        return self.cold_start + waits + 60.0

    def wall(self, seconds: float) -> float:
        """Trace seconds -> wall seconds."""
        return seconds / self.compression

    @property
    def slo_ttft(self) -> float:
        return self._metadata_seconds("sloTtft", self.policy.slo_ttft)

    @property
    def slo_itl(self) -> float:
        return self._metadata_seconds("sloItl", self.policy.slo_itl)

    def _metadata_seconds(self, key: str, default: float) -> float:
        text = self.scaled_object.metadata.get(key)
        return default if text is None else parse_duration(text)


def make_plan(
    compression: float,
    profile: Profile,
    scaled_object_file: Path,
    scaler_config_policy: PolicyConfig,
    max_replicas: int | None,
    target_concurrency: float | None,
    standby: bool | None = None,
    *,
    replica_cap: int = REPLICA_CAP,
) -> Plan:
    """The demo's plan: the ScaledObject in ``scaled_object_file`` pointed at the demo.

    Each of ``max_replicas``, ``target_concurrency`` and ``standby`` is the flag's where
    given (not None), else the file's, else the demo's: at most ``replica_cap`` replicas
    (each a process here), ``DEFAULT_TARGET_CONCURRENCY``, standby on. A flag left out
    replaced the file's own key, so a ScaledObject tried in the demo ran another policy.
    With standby its trigger says ``standby: "true"`` (its own ``standbyMaxSleeping``
    kept); without, every ``standby*`` key is dropped.

    Raises:
        ConfigError: unreadable or unusable ScaledObject file, bad compression, standby
            without a profile to price the sleepers with.
    """
    if compression <= 0:
        raise ConfigError(f"--time-compression must be positive, got {compression:g}")
    text = read_text(scaled_object_file, MAX_CONFIG_BYTES, "ScaledObject")
    try:
        documents = list(yaml.load_all(text, Loader=UniqueKeyLoader))  # a SafeLoader
    except (yaml.YAMLError, ValueError) as err:
        raise ConfigError(f"{scaled_object_file}: not valid YAML: {quote(str(err), 200)}") from err
    except RecursionError as err:
        raise ConfigError(f"{scaled_object_file}: YAML nested too deeply") from err
    found = [d for d in documents if isinstance(d, dict) and d.get("kind") == "ScaledObject"]
    if len(found) != 1:
        raise ConfigError(f"{scaled_object_file}: expected one ScaledObject, found {len(found)}")
    scaled = read_scaled_object(found[0], str(scaled_object_file))
    own = {**scaled.metadata, "deployment": DEPLOYMENT, "namespace": NAMESPACE}
    if standby is None:
        standby = _trigger(own, False).standby if "standby" in own else True
    if max_replicas is None:
        max_replicas = min(scaled.spec.max_replicas, _trigger(own, False).max_replicas, replica_cap)
    concurrency = (
        f"{target_concurrency:g}"
        if target_concurrency is not None
        else own.get("targetConcurrency", f"{DEFAULT_TARGET_CONCURRENCY:g}")
    )
    metadata = {
        **{k: v for k, v in own.items() if standby or k not in STANDBY_KEYS},
        "maxReplicas": str(max_replicas),
        "targetConcurrency": concurrency,
    }
    if standby:
        metadata = {
            "standbyReleaseAfter": STANDBY_RELEASE_AFTER,
            **STANDBY_RECOMMENDED,
            **metadata,
            "standby": "true",
        }
    if scaled.spec.min_replicas > max_replicas:
        # The demo's KEDA keeps minReplicaCount whatever the maximum: 1e6 launched a
        # sim-replica process for each (hostile pass 6, H1).
        raise ConfigError(
            f"{scaled_object_file}: minReplicaCount {scaled.spec.min_replicas} is above"
            f" --max-replicas {max_replicas}"
        )
    spec = replace(scaled.spec, max_replicas=max_replicas)
    scaled = replace(scaled, name=DEPLOYMENT, namespace=NAMESPACE, spec=spec, metadata=metadata)
    # The trigger as the scaler reads it, with standby or not: a bad sloTtft without
    # standby passed here and raised a 55-line traceback once the processes ran (pass 6, M2).
    trigger = _trigger(metadata, standby)
    knobs = _standby_policy(trigger, scaler_config_policy) if standby else None
    return Plan(compression, profile, scaled, scaler_config_policy, standby=knobs)


MAX_LEAD_IN = 3600.0
"""Trace seconds the demo plays before its workload, at most (recommended.yaml: 395 s; a
ScaledObject without cooldown or stabilization, KEDA's and the HPA's 300 s each: ~900 s)."""


def check_lead_in(plan: Plan) -> None:
    """Refuse a plan whose lead-in is over ``MAX_LEAD_IN``, naming what makes it up.

    The lead-in waits out a start, the idle grace, KEDA's cooldown and the HPA's
    stabilization, each from a file: a cooldownPeriod of 1e6 made ``--duration 1`` play
    for 28 hours of wall time, and the prediction simulate the whole span (pass 6, M1).

    Raises:
        ConfigError: the lead-in and its parts, and how to shorten it.
    """
    if plan.lead_in <= MAX_LEAD_IN:
        return
    spec = plan.scaled_object.spec
    raise ConfigError(
        f"the lead-in before the workload would be {plan.lead_in:,.0f} s of trace time (a start"
        f" {plan.cold_start:,.0f} s + idle-grace {plan.policy.idle_grace:,.0f} s +"
        f" cooldownPeriod {spec.cooldown:,.0f} s + scaleDown stabilizationWindowSeconds"
        f" {spec.scale_down_stabilization:,.0f} s + 60 s), over the {MAX_LEAD_IN:,.0f} s the"
        " demo plays; lower them, or --no-standby runs the demo without a lead-in"
    )


def _trigger(metadata: dict[str, str], standby: bool) -> TriggerMetadata:
    """The trigger's metadata as the scaler parses it.

    Raises:
        ConfigError: the scaler would refuse it (the key named).
    """
    try:
        return parse_metadata({"scalerAddress": "demo", **metadata})
    except (MetadataError, ValueError) as err:
        hint = "; --no-standby runs the demo without sleeping replicas" if standby else ""
        raise ConfigError(f"{err}{hint}") from err


def _standby_policy(trigger: TriggerMetadata, policy: PolicyConfig) -> StandbyPolicy:
    """The standby plan's knobs as the scaler reads them from ``trigger``, without a cache.

    The demo has no Fluid cache: its starts are all the cold-start tier's.

    Raises:
        ConfigError: the scaler would refuse the trigger (no profile, a bad knob).
    """
    try:
        knobs = trigger.standby_policy() or StandbyPolicy()  # standby: "true" is there
        standby_setup(trigger.policy(policy.policy()), knobs, cache=False)
    except (MetadataError, ValueError) as err:
        raise ConfigError(f"{err}; --no-standby runs the demo without sleeping replicas") from err
    return replace(knobs, cache=False)


# --- the live (compressed) world --------------------------------------------------------


def scaler_config(plan: Plan, sources: list[str]) -> dict[str, Any]:
    """The scaler's config file, compressed."""
    c = plan.compression
    policy = plan.policy.model_dump(by_alias=False)
    for name in POLICY_DURATIONS:
        policy[name] = policy[name] / c
    for name in POLICY_RATES:
        policy[name] = policy[name] * c
    return {
        "signal-sources": [
            {"address": a, "reconnect-min": 0.05, "reconnect-max": 1.0} for a in sources
        ],
        "max-signal-age": plan.max_signal_age / c,
        "grace-period": 0.5,
        "policy": {k.replace("_", "-"): v for k, v in policy.items()},
    }


def exporter_config(plan: Plan, replicas: list[str]) -> dict[str, Any]:
    """The exporter's config file, compressed; ``replicas`` are base URLs."""
    c = plan.compression
    return {
        "interval": plan.scrape_interval / c,
        "timeout": min(plan.scrape_timeout / c, 0.8 * plan.scrape_interval / c),
        "panic-window": plan.panic_window / c,
        "stable-window": plan.stable_window / c,
        "deployments": [
            {
                "namespace": NAMESPACE,
                "deployment": DEPLOYMENT,
                "engine": "vllm",
                "targets": [f"{url}/metrics" for url in replicas],
                # An hour of wall time is C hours of trace time.
                "accelerator": {"price-per-hour": plan.profile.price_per_hour * c},
            }
        ],
    }


def gateway_config(
    plan: Plan, replicas: list[str], standby_scaler: str | None = None
) -> dict[str, Any]:
    """The gateway's config file, compressed.

    With the plan's standby and ``standby_scaler`` (the scaler's ``host:port``), the
    gateway asks that scaler for the standby plan and sleeps and wakes replicas by it.
    """
    c = plan.compression
    config: dict[str, Any] = {
        "namespace": NAMESPACE,
        "deployment": DEPLOYMENT,
        "replicas": replicas,
        "buffer-size": plan.buffer_size,
        "buffer-timeout": plan.buffer_timeout / c,
        "rate-window": plan.rate_window / c,
        # Failures are rare here and checks cost CPU: no faster than 4 per second.
        "health-interval": max(plan.health_interval / c, 0.25),
        # Judged as the scaler plans: its SLO, on the compressed clock.
        "slo": {
            "ttft": plan.slo_ttft / c,
            "itl": plan.slo_itl / c,
            "attainment": plan.policy.slo_attainment,
            # Its within/outside rates over the replay's window (its stable window).
            "window": plan.stable_window / c,
        },
    }
    if plan.standby is not None and standby_scaler is not None:
        config |= {
            "standby-scaler": standby_scaler,
            "standby-interval": plan.standby_interval / c,
            "sleep-after-idle": plan.sleep_after_idle / c,
            "wake-timeout": plan.wake_timeout / c,
            "wake-retry-after": plan.wake_retry_after / c,
            "wake-at-outstanding": plan.wake_at_outstanding,
        }
    return config


def trigger_metadata(plan: Plan, scaler_address: str) -> dict[str, str]:
    """``scalerMetadata`` as KEDA would send it, compressed."""
    c = plan.compression
    metadata = dict(plan.scaled_object.metadata, scalerAddress=scaler_address)
    for key in _DURATION_KEYS:
        if key in metadata:
            metadata[key] = f"{parse_duration(metadata[key]) / c:g}s"
    for key in _RATE_KEYS:
        if key in metadata:
            metadata[key] = f"{float(metadata[key]) * c:g}"
    return metadata


def keda_spec(plan: Plan) -> ScalingSpec:
    """KEDA's and the HPA's clocks, compressed."""
    s = plan.scaled_object.spec
    c = plan.compression
    return replace(
        s,
        polling_interval=s.polling_interval / c,
        cooldown=s.cooldown / c,
        hpa_sync=s.hpa_sync / c,
        scale_down_stabilization=s.scale_down_stabilization / c,
    )


def write_yaml(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically (a reader never sees half a file)."""
    write_file(path, yaml.safe_dump(data, sort_keys=False))


# --- the prediction (trace time) ---------------------------------------------------------


def prediction(plan: Plan) -> tuple[Unitscale, SimConfig]:
    """The replay's unitscale policy and fleet for the same plan, uncompressed.

    The standby plan is the replay's warm tier (``SimConfig.standby``: the same
    ``plan_standby``, sleepers off the accelerators, each wake the tier's wake time),
    not the trigger's ``standby`` key: through the replay's KEDA that key would ask for
    running + sleeping replicas, every one of them running.
    """
    scaled = plan.scaled_object
    dropped = {"namespace", *STANDBY_KEYS}
    policy = Unitscale(
        # The replay names its one target by its own key (namespace of the ScaledObject).
        metadata={
            **{k: v for k, v in scaled.metadata.items() if k not in dropped},
            "scalerAddress": "replay:9090",
            "deployment": REPLAY_KEY[1],
        },
        defaults=plan.policy.policy(),
        push=scaled.push,
        spec=scaled.spec,
    )
    config = SimConfig(
        plan.replica_profile,
        slo_ttft=plan.slo_ttft,
        slo_itl=plan.slo_itl,
        scrape_interval=plan.scrape_interval,
        panic_window=plan.panic_window,
        stable_window=plan.stable_window,
        cold_start_tier=plan.cold_start_tier,
        cold_start_override=plan.measured_cold_start,
        gateway_buffer=plan.buffer_size,
        gateway_timeout=plan.buffer_timeout,
        max_replicas=scaled.spec.max_replicas,
        standby=plan.standby,
        # the gateway's setting, whatever holds sleepers (without any it wakes none)
        wake_pressure=WakePressure(plan.wake_at_outstanding),
        served_before=False,  # the live Deployment starts never having served
    )
    return policy, config


def alternatives(plan: Plan) -> dict[str, tuple[Policy, SimConfig]]:
    """What-ifs the replay can answer for the same trace: Fluid prewarm, a fixed fleet."""
    policy, config = prediction(plan)
    found: dict[str, tuple[Policy, SimConfig]] = {}
    if plan.measured_cold_start is None and plan.cold_start_tier != "cached":
        cached = cold_start_seconds(plan.profile, "cached")
        found[f"unitscale with Fluid prewarm (cold start {cached:.0f} s)"] = (
            policy,
            replace(config, prewarm=True),
        )
    peak = plan.scaled_object.spec.max_replicas
    found[f"always on: {peak} replicas, no autoscaling"] = (
        StaticPeak(peak, name="always-on"),
        config,
    )
    return found
