"""The scaler's own configuration: a YAML file, mounted from a ConfigMap.

Keys are kebab-case, durations Go-style. ``ScalerConfig()`` is the documented default;
``deploy/scaler/configmap.yaml`` shows every key and ``docs/scaler.md`` explains them.
The ``policy`` section's defaults are the core's ``Policy`` defaults, taken from it, not
repeated here (``tests/test_defaults.py`` keeps the ConfigMap and the docs equal to
them). A bad file at startup is fatal (``ConfigError`` names the key); the running
scaler hot-reloads the file, and a bad update keeps the last good config
(``foundation.reload``).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator

from foundation.configfile import KEBAB_CASE, load_mapping, no_booleans_for_numbers, validate
from foundation.durations import Seconds
from foundation.errors import ConfigError
from foundation.files import MAX_CONFIG_BYTES, MAX_PEM_BYTES, read_text
from foundation.replica_model import MAX_PRICE_PER_HOUR, PROFILES
from foundation.replica_model import Profile as ReplicaProfile
from scaler.core.capacity import PRIORS, check_profile
from scaler.core.model import Policy
from scaler.metadata import (
    MAX_SEASONAL_SECONDS,
    MAX_SIGNAL_AGE_SECONDS,
    MAX_TOKENS_PER_SECOND,
    MIN_RATE,
    MIN_SIGNAL_AGE_SECONDS,
    MIN_TOKENS_PER_SECOND,
    SLO_ITL_RANGE,
    SLO_TTFT_RANGE,
)
from scaler.promql import (
    DEFAULT_QUERIES,
    DEFAULT_SELECTOR,
    QUERY_PARAMETERS,
    SELECTOR_PARAMETERS,
    SIGNALS,
    check_template,
)

MAX_WINDOW_SECONDS = 3600.0
"""The longest ``scale-down-window``, ``demand-window``, ``forecast-horizon`` and
``backlog-drain`` (and a Prometheus source's
``panic-window`` and ``stable-window``): an hour, the HPA's own bound
on a stabilization window. Every decision keeps a sample for the window and copies them
all; Go's largest duration (292 years) kept them all for good, 23 ms a decision after 6
hours and growing, until the event loop could not keep up."""
MAX_HEADROOM = 10.0
"""The attainment loop's headroom (``headroom-max``) and one rise of it (``headroom-step``),
as a share of the need: ten times the need is past any fleet an SLO asks for."""
MAX_PROFILE_SPEEDUP = 1_000_000.0
"""``profile-speedup``: the largest time compression a demo or replay runs its replicas at
(``replay.limits.MAX_TIME_COMPRESSION``); real replicas run at 1."""
MIN_SOURCE_SECONDS = 0.01
"""The shortest a source's round (``interval``, ``timeout``; a demo source's ``interval``
and ``period``): 1 ns was taken, and the demo source's loop spun a whole core (hostile
pass 51)."""
MIN_PROMQL_WINDOW = 1.0
"""The shortest ``$window`` of a Prometheus source: a range finer than a second holds no
two samples of any scrape (1 ns was taken)."""
MAX_SOURCE_SECONDS = 600.0
"""The longest wait a source's loop may be told to make (``reconnect-min``,
``reconnect-max``, a Prometheus ``interval`` or ``timeout``) and ``grace-period``: 10
minutes. Go's largest duration (292 years) was taken: a watch broken once waited hours,
then centuries, to retry; a Prometheus round came once in 292 years."""
MAX_SCALED_OBJECT_TTL = 7 * 86_400.0
"""The longest ``scaled-object-ttl``: a week."""
MIN_SCALED_OBJECT_TTL = 300.0
"""The shortest ``scaled-object-ttl``: five minutes, ten of KEDA's slowest polls. 1 ns
forgot every ScaledObject at each minute's eviction, with its scale-down window, headroom
and step fit: a fall held 6 minutes came after 75 s (hostile pass 52)."""


class SignalSourceConfig(BaseModel):
    """One process serving ``unitscale.v1.SignalsService`` (exporter or gateway)."""

    model_config = KEBAB_CASE

    address: Annotated[str, Field(min_length=1)]
    """``host:port`` to dial; a headless Service name reaches every pod behind it."""
    reconnect_min: Seconds = Field(0.5, ge=MIN_SOURCE_SECONDS, le=MAX_SOURCE_SECONDS)
    """First wait after a broken watch; doubles up to ``reconnect-max``."""
    reconnect_max: Seconds = Field(30.0, ge=MIN_SOURCE_SECONDS, le=MAX_SOURCE_SECONDS)
    """The longest wait between two attempts: 10 min at most (``MAX_SOURCE_SECONDS``);
    2562047h made a watch broken for an hour wait hours more, then centuries."""
    idle_timeout: Seconds = Field(60.0, ge=1, le=MAX_SIGNAL_AGE_SECONDS)
    """A stream with no message for this long is broken and reconnected: sources publish
    every second (gateway) or scrape (exporter), and a hung source, or a connection
    whose peer's node died, had held the watch for good while the signals went stale."""

    @model_validator(mode="after")
    def _backoff_in_order(self) -> SignalSourceConfig:
        if self.reconnect_min > self.reconnect_max:
            raise ValueError(
                f"reconnect-min ({self.reconnect_min:g}s) must not exceed reconnect-max"
                f" ({self.reconnect_max:g}s)"
            )
        return self


class DemoSourceConfig(BaseModel):
    """A built-in synthetic signal source, for the demo and benchmarks."""

    model_config = KEBAB_CASE

    namespace: str = "demo"
    deployments: list[str] = Field(default_factory=lambda: ["llama-chat"], min_length=1)
    interval: Seconds = Field(1.0, ge=MIN_SOURCE_SECONDS, le=MAX_SOURCE_SECONDS)
    """How often each deployment publishes a new snapshot."""
    period: Seconds = Field(60.0, ge=MIN_SOURCE_SECONDS, le=MAX_SEASONAL_SECONDS)
    """Length of one demo load cycle (ramp, burst, idle, return)."""
    peak_concurrency: float = Field(64.0, gt=0)
    """Requests in flight at the top of the burst."""


def ca_context(path: Path) -> ssl.SSLContext:
    """A client TLS context verifying by the PEM bundle ``path``.

    The bundle is read as every file a user names is (``foundation.files``: a regular
    file, opened without blocking, at most ``MAX_PEM_BYTES``), and OpenSSL gets the text,
    never the path: a FIFO as ``ca-file`` blocked OpenSSL's ``open`` for good, which
    hung ``unitscale scaler`` at startup and every config reload after it.

    Raises:
        ConfigError: the file cannot be read so, or holds no certificate.
    """
    text = read_text(path, MAX_PEM_BYTES, "ca-file")
    try:
        return ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as err:
        raise ConfigError(f"cannot load the CA bundle {path}: {err}") from err


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
"""An HTTP header's name: a token (RFC 9110, 5.6.2), bounded."""


class PrometheusSourceConfig(BaseModel):
    """Engine signals from PromQL over vLLM's own metrics (Prometheus, Thanos, Mimir...).

    Every ScaledObject's target is queried each ``interval``; ``scaler.promql`` holds the
    default query of each signal and explains the templates.
    """

    model_config = KEBAB_CASE

    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$")]
    """Base URL of the Prometheus HTTP API (``/api/v1/query`` is added to it)."""
    interval: Seconds = Field(5.0, ge=MIN_SOURCE_SECONDS, le=MAX_SOURCE_SECONDS)
    """Time between query rounds for each target (10 min at most: past it every signal
    is stale long before the next round)."""
    timeout: Seconds = Field(3.0, ge=MIN_SOURCE_SECONDS, le=MAX_SOURCE_SECONDS)
    """Per-query limit; a round with a failed query publishes nothing."""
    panic_window: Seconds = Field(60.0, ge=MIN_PROMQL_WINDOW, le=MAX_WINDOW_SECONDS)
    """``$window`` of the panic signals: at least four scrape intervals."""
    stable_window: Seconds = Field(180.0, ge=MIN_PROMQL_WINDOW, le=MAX_WINDOW_SECONDS)
    """``$window`` of the stable rates and quantiles."""
    selector: str = Field(DEFAULT_SELECTOR, min_length=1)
    """``$selector``: the label matchers of one target's series."""
    model_label: str | None = Field("model_name", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    """Label matched to the ScaledObject's ``model``, when it names one; null: none."""
    queries: dict[str, str | None] = Field(default_factory=dict)
    """Per-signal PromQL replacing the default; null leaves the signal unmeasured."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every query, e.g. ``X-Scope-OrgID`` for a Mimir or Cortex tenant."""
    bearer_token_file: Path | None = None
    """Sent as ``Authorization: Bearer``, read every round (projected tokens rotate)."""
    ca_file: Path | None = None
    """PEM CA bundle to verify an https ``url`` by; unset: the system's."""
    max_concurrent_queries: int = Field(16, ge=1, le=1024)

    @field_validator("selector")
    @classmethod
    def _selector(cls, text: str) -> str:
        return check_template(text, SELECTOR_PARAMETERS, "selector")

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        # A name is an HTTP token, a value printable text: a CR or LF in either failed
        # every query round of the source, each with a WARNING (issue 27, pass 10). The
        # value is never quoted back: it may be a tenant's or a proxy's secret.
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name[:64]!r} is not an HTTP token")
            if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
                raise ValueError(f"header {name!r}'s value holds a control character")
        return headers

    @field_validator("queries")
    @classmethod
    def _queries(cls, queries: dict[str, str | None]) -> dict[str, str | None]:
        for name, text in queries.items():
            if name not in SIGNALS:
                raise ValueError(f"unknown signal {name!r} (signals: {', '.join(SIGNALS)})")
            if text is not None:
                check_template(text, QUERY_PARAMETERS, f"query {name!r}")
        if all(name in queries and queries[name] is None for name in ("replicas", "replicas-up")):
            # The counts frame every sum: without either, a replica that stops answering
            # only lowers the load, and the scaler never scales down or to zero.
            raise ValueError("queries 'replicas' and 'replicas-up' may not both be null")
        return queries

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                ca_context(path)
            except ConfigError as err:
                raise ValueError(str(err)) from err
        return path

    @model_validator(mode="after")
    def _windows(self) -> PrometheusSourceConfig:
        if self.stable_window < self.panic_window:
            raise ValueError("stable-window must not be shorter than panic-window")
        return self

    def effective_queries(self) -> dict[str, str | None]:
        """The default queries with this config's replacements."""
        return {**DEFAULT_QUERIES, **self.queries}


# The one source of the policy defaults: the decision core's own.
_CORE = Policy()
MIN_SEASONAL_DAY = 60.0
"""The shortest forecast day (a replay's compressed day); a slot is a 96th of it."""
MAX_PROFILES = 256
"""Replica profiles a config may define, ``profiles`` and its ``profiles-file`` together:
each decision and each reload looks a ScaledObject's profile up among them, and 65,000
(a valid 1 MB config) cost 6.7 ms a decision and held a reload's loop 5.4 s at 1,000
ScaledObjects (hostile pass 62)."""
MAX_SIGNAL_SOURCES = 256
"""Exporters and gateways one scaler watches: each is a gRPC channel and a task."""


_PANIC_REMOVED = (
    "no panic mode: demand rises with the short window at once, and the attainment loop"
    " holds the SLO; bench/ablation.py"
)
_RISK_REMOVED = (
    "no risk-sized standing headroom: +22-80% cost for at most +2 points of attainment"
    " where the attainment loop holds the SLO; bench/ablation.py"
)
_STEPS_REMOVED = (
    "the HPA paces each step (the ScaledObject's behavior): the scaler's own limits changed"
    " nothing on any bench trace; bench/ablation.py"
)
_COST_GUARD_REMOVED = (
    "no cost guard: the planner already plans the least capacity that holds the SLO, and a"
    " budget that trades the SLO for cost is not one the planner takes; docs/scaler.md"
)
_ALWAYS_ON = "always on: {what}; docs/scaler.md"
REMOVED_POLICY_KEYS = {
    "panic-threshold": _PANIC_REMOVED,
    "panic-hold": _PANIC_REMOVED,
    "forecast-lookback": (
        "no linear trend forecast: it cost more than it bought on every bench trace;"
        " bench/ablation.py"
    ),
    "risk-quantile": _RISK_REMOVED,
    "risk-lookback": _RISK_REMOVED,
    "scale-down-delay": (
        "no scale-down delay: the scale-down window holds the peak; the delay cost 2-6% on"
        " two bench traces and bought 0.8 point on one that missed anyway; bench/ablation.py"
    ),
    "max-scale-up-rate": _STEPS_REMOVED,
    "max-scale-down-rate": _STEPS_REMOVED,
    "cost-budget-per-million-tokens": _COST_GUARD_REMOVED,
    "cost-guard-utilization": _COST_GUARD_REMOVED,
    "profile-fit": _ALWAYS_ON.format(
        what="a fleet slower than its profile kept 100% with it, 90.4% without"
    ),
    "seasonal-floor": _ALWAYS_ON.format(what="it acts only on a confident seasonal forecast"),
}
"""Policy keys of mechanisms that measurements removed, and why."""


class PolicyConfig(BaseModel):
    """Defaults for every ScaledObject's decision policy (trigger metadata may override).

    Each key is a ``Policy`` field (durations without the ``_seconds`` suffix) with the
    core's default; only the bounds are the config's own.
    """

    model_config = KEBAB_CASE

    target_concurrency: float = Field(_CORE.target_concurrency, ge=MIN_RATE, le=100_000)
    """Requests in flight (running plus queued) one replica should hold."""
    prefill_tokens_per_second: float = Field(
        _CORE.prefill_tokens_per_second, ge=MIN_TOKENS_PER_SECOND, le=MAX_TOKENS_PER_SECOND
    )
    """Prior capacity: prompt tokens a replica prefills per second (8B on H200 ~36k)."""
    decode_tokens_per_second: float = Field(
        _CORE.decode_tokens_per_second, ge=MIN_TOKENS_PER_SECOND, le=MAX_TOKENS_PER_SECOND
    )
    """Prior capacity: output tokens a replica decodes per second within the ITL SLO."""
    target_utilization: float = Field(_CORE.target_utilization, ge=MIN_RATE, le=1)
    """Share of a replica's capacity to plan for; the rest absorbs bursts."""
    slo_ttft: Seconds = Field(_CORE.slo_ttft_seconds, ge=SLO_TTFT_RANGE[0], le=SLO_TTFT_RANGE[1])
    """Time-to-first-token p95 target: 10 ms to 10 min."""
    slo_itl: Seconds = Field(_CORE.slo_itl_seconds, ge=SLO_ITL_RANGE[0], le=SLO_ITL_RANGE[1])
    """Inter-token latency p95 target: 1 ms to 10 s."""
    slo_attainment: float = Field(_CORE.slo_attainment, gt=0, lt=1)
    """The share of requests to keep within both targets (the gateway judges them)."""
    headroom_step: float = Field(_CORE.headroom_step, ge=0, le=MAX_HEADROOM)
    """Headroom added per allowance of misses while attainment is below target."""
    headroom_max: float = Field(_CORE.headroom_max, ge=0, le=MAX_HEADROOM)
    """The attainment loop's headroom bound, a share of the need (0: the loop is off)."""
    headroom_half_life: Seconds = Field(
        _CORE.headroom_half_life_seconds, ge=1, le=MAX_SEASONAL_SECONDS
    )
    """While attainment has margin the headroom halves this often."""
    scale_down_window: Seconds = Field(_CORE.scale_down_window_seconds, ge=0, le=MAX_WINDOW_SECONDS)
    """Scale down only to the most replicas needed within this window."""
    forecast_horizon: Seconds = Field(_CORE.forecast_horizon_seconds, ge=0, le=MAX_WINDOW_SECONDS)
    """About one cold start: scale-up starts this far ahead of the load."""
    idle_grace: Seconds = Field(_CORE.idle_grace_seconds, ge=0, le=MAX_SEASONAL_SECONDS)
    """No request at all for this long before scaling to zero."""
    profile: str | None = Field(_CORE.profile, min_length=1)
    """A replica model (``llama3-8b-h200``, or one of ``profiles``): capacity from it and
    the observed mix (``ScalerConfig`` checks that it is known)."""
    profile_utilization: float = Field(_CORE.profile_utilization, ge=MIN_RATE, le=1)
    """With a profile: the share of a replica's SLO capacity to plan for."""
    backlog_drain: Seconds = Field(_CORE.backlog_drain_seconds, ge=0.1, le=MAX_WINDOW_SECONDS)
    """With a profile: drain a backlog within this long (more replicas if need be)."""
    seasonal_prewarm_lead: Seconds = Field(
        _CORE.seasonal_prewarm_lead_seconds, ge=0, le=MAX_SEASONAL_SECONDS
    )
    """At zero, prewarm the Fluid cache this long before a confident return (0: never)."""
    seasonal_utc_offset_hours: float = Field(_CORE.seasonal_utc_offset_hours, ge=-14, le=14)
    """The forecast's local time is UTC plus this many hours (fixed: no DST)."""
    seasonal_day: Seconds = Field(
        _CORE.seasonal_day_seconds, ge=MIN_SEASONAL_DAY, le=MAX_SEASONAL_SECONDS
    )
    """The forecast's day (shorter only in a replay of compressed days); 1 min to 7 days."""
    demand_window: Seconds = Field(_CORE.demand_window_seconds, ge=0.1, le=MAX_WINDOW_SECONDS)
    """With a profile: demand is averaged over this long (the exporter's stable window)."""
    profile_speedup: float = Field(_CORE.profile_speedup, gt=0, le=MAX_PROFILE_SPEEDUP)
    """With a profile: replicas step this many times faster than it says (1: real ones)."""

    @model_validator(mode="before")
    @classmethod
    def _no_removed_keys(cls, data: Any) -> Any:
        """A key of a removed mechanism says so, instead of pydantic's "extra input"."""
        no_booleans_for_numbers(cls, data)
        if isinstance(data, dict):
            removed = sorted(k for k in data if k in REMOVED_POLICY_KEYS)
            if removed:
                raise ValueError(
                    f"{', '.join(removed)}: removed ({REMOVED_POLICY_KEYS[removed[0]]});"
                    " delete the key"
                )
        return data

    def policy(
        self, min_replicas: int = _CORE.min_replicas, max_replicas: int = _CORE.max_replicas
    ) -> Policy:
        """The core's policy with these defaults (replica bounds come from each trigger)."""
        return Policy(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_concurrency=self.target_concurrency,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
            decode_tokens_per_second=self.decode_tokens_per_second,
            target_utilization=self.target_utilization,
            slo_ttft_seconds=self.slo_ttft,
            slo_itl_seconds=self.slo_itl,
            slo_attainment=self.slo_attainment,
            headroom_step=self.headroom_step,
            headroom_max=self.headroom_max,
            headroom_half_life_seconds=self.headroom_half_life,
            scale_down_window_seconds=self.scale_down_window,
            forecast_horizon_seconds=self.forecast_horizon,
            idle_grace_seconds=self.idle_grace,
            profile=self.profile,
            profile_utilization=self.profile_utilization,
            backlog_drain_seconds=self.backlog_drain,
            seasonal_prewarm_lead_seconds=self.seasonal_prewarm_lead,
            seasonal_utc_offset_hours=self.seasonal_utc_offset_hours,
            seasonal_day_seconds=self.seasonal_day,
            demand_window_seconds=self.demand_window,
            profile_speedup=self.profile_speedup,
        )


# An SRE profile's optional keys default to the built-in profiles' defaults.
_PROFILE_DEFAULT: dict[str, Any] = {f.name: f.default for f in fields(ReplicaProfile)}
_PROFILE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
STEP_FLOOR_MS = 0.05
"""A decode step's fixed cost (``decode-ms[0]``), ms, at least: a hundredth of the
calibrated 8B on H200's (5.7 ms). Coefficients of 1e-9 ms were taken and every replica
carried any load: 100,000 requests queued asked for 1 (hostile pass 52). Seconds given
for milliseconds fall below it too."""
PER_TOKEN_FLOOR_MS = 0.0001
"""A decode step's cost per sequence and a prefill's per token (``decode-ms[1]``,
``prefill-ms[1]``), ms, at least: a hundredth of the 8B on H200's (0.017, 0.020)."""


MAX_NUM_SEQS = 16_384
"""A profile's ``max-num-seqs``: vLLM runs hundreds (256 by default), a few thousand at
the most. The wait for a seat sums over every seat (Erlang C): one ConfigMap line of
10**12 held a core for days on each decision of its targets (hostile pass 28)."""
MAX_NUM_BATCHED_TOKENS = 10_000_000
"""A profile's ``max-num-batched-tokens``: the longest context served today."""


class ProfileConfig(BaseModel):
    """One model on one accelerator: ``foundation.replica_model.Profile``'s numbers.

    ``docs/capacity.md`` says how to fit them ("Making a profile for your model and
    accelerator"). Every coefficient the step times divide by must be positive.
    """

    model_config = KEBAB_CASE

    model: Annotated[str, Field(min_length=1)]
    """What it serves, in words (shown in reasons and reports)."""
    decode_ms: tuple[
        Annotated[float, Field(ge=STEP_FLOOR_MS)],
        Annotated[float, Field(ge=PER_TOKEN_FLOOR_MS)],
        NonNegative,
    ]
    """(a, b, c) of one decode step's ``a + b*batch + c*context_tokens`` ms."""
    prefill_ms: tuple[NonNegative, Annotated[float, Field(ge=PER_TOKEN_FLOOR_MS)], NonNegative]
    """(p0, p1, p2) of a T-token prefill's ``p0 + p1*T + p2*T**2`` ms."""
    weights_gb: float = Field(gt=0)
    kv_bytes_per_token: int = Field(gt=0)
    accelerator_memory_gb: float | None = Field(None, gt=0)
    """The accelerator's memory in GB (1e9 bytes); or ``accelerator-memory-bytes``."""
    accelerator_memory_bytes: int | None = Field(None, gt=0)
    price_per_hour: float = Field(gt=0, le=MAX_PRICE_PER_HOUR)
    """US$ per accelerator-hour."""
    gpu_memory_utilization: float = Field(_PROFILE_DEFAULT["gpu_memory_utilization"], gt=0, le=1)
    activation_reserve_bytes: int = Field(_PROFILE_DEFAULT["activation_reserve_bytes"], ge=0)
    overhead: float = Field(_PROFILE_DEFAULT["overhead"], ge=1)
    """The engine's scheduling and sampling on top of the fitted step times."""
    max_num_seqs: int = Field(_PROFILE_DEFAULT["max_num_seqs"], ge=1, le=MAX_NUM_SEQS)
    max_num_batched_tokens: int = Field(
        _PROFILE_DEFAULT["max_num_batched_tokens"], ge=1, le=MAX_NUM_BATCHED_TOKENS
    )
    engine_init: Seconds = Field(_PROFILE_DEFAULT["engine_init_seconds"], ge=0, le=3600)
    """An engine's start past its weights' load: an hour at most (an 8B's is 25 s)."""

    @model_validator(mode="after")
    def _memory(self) -> ProfileConfig:
        given = [self.accelerator_memory_gb, self.accelerator_memory_bytes]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give one of accelerator-memory-gb and accelerator-memory-bytes")
        if self.profile("check").kv_capacity_tokens <= 0:
            raise ValueError(
                "weights-gb and activation-reserve-bytes leave no KV cache in the"
                " accelerator's memory at gpu-memory-utilization"
            )
        return self

    def profile(self, name: str) -> ReplicaProfile:
        """The replica model these numbers make, named ``name``."""
        memory = self.accelerator_memory_bytes or int((self.accelerator_memory_gb or 0) * 1e9)
        return ReplicaProfile(
            name=name,
            model=self.model,
            decode_ms=self.decode_ms,
            prefill_ms=self.prefill_ms,
            weights_gb=self.weights_gb,
            kv_bytes_per_token=self.kv_bytes_per_token,
            accelerator_memory_bytes=memory,
            price_per_hour=self.price_per_hour,
            gpu_memory_utilization=self.gpu_memory_utilization,
            activation_reserve_bytes=self.activation_reserve_bytes,
            overhead=self.overhead,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            engine_init_seconds=self.engine_init,
        )


def _profile_names(profiles: dict[str, ProfileConfig]) -> dict[str, ProfileConfig]:
    for name in profiles:
        if name in PROFILES or name == PRIORS:
            raise ValueError(f"profile {name!r} is built in: name yours differently")
        if len(name) > 63 or not _PROFILE_NAME.fullmatch(name):
            raise ValueError(
                f"profile name {name!r}: lowercase letters, digits, '-' and '.', at most 63"
                " characters (such as 'mistral-7b-l40s')"
            )
    return profiles


class ProfileFile(BaseModel):
    """A ``profiles-file``: the same ``profiles`` mapping as the config's own."""

    model_config = KEBAB_CASE

    profiles: dict[str, ProfileConfig] = Field(default_factory=dict, max_length=MAX_PROFILES)

    _names = field_validator("profiles")(_profile_names)


def _read_profile_file(path: Path) -> dict[str, ProfileConfig]:
    try:
        text = read_text(path, MAX_CONFIG_BYTES, "profiles-file")
    except ConfigError as err:
        raise ValueError(str(err)) from err
    try:
        return validate(ProfileFile, load_mapping(text, str(path)), str(path)).profiles
    except ConfigError as err:
        raise ValueError(f"profiles-file {err}") from err


class ScalerConfig(BaseModel):
    """Everything the scaler reads from its ConfigMap."""

    model_config = KEBAB_CASE

    signal_sources: list[SignalSourceConfig] = Field(
        default_factory=list, max_length=MAX_SIGNAL_SOURCES
    )
    """Exporters and gateways to watch. Empty is allowed only with ``demo-source``."""
    max_signal_age: Seconds = Field(30.0, ge=MIN_SIGNAL_AGE_SECONDS, le=MAX_SIGNAL_AGE_SECONDS)
    """Signals older than this make KEDA RPCs answer UNAVAILABLE (KEDA's fallback
    applies) instead of acting on old data. 30 s is two exporter scrapes at the
    default 15 s Prometheus interval; 100 ms to an hour (``MIN_SIGNAL_AGE_SECONDS``,
    ``MAX_SIGNAL_AGE_SECONDS``). Keep it several of the sources' periods."""
    demo_source: DemoSourceConfig | None = None
    prometheus_source: PrometheusSourceConfig | None = None
    """Take engine signals from PromQL instead of (or beside) an exporter; read at start."""
    """Publish synthetic signals in-process instead of (or beside) real sources."""
    grace_period: Seconds = Field(5.0, ge=0, le=MAX_SOURCE_SECONDS)
    """On SIGTERM, how long open RPCs may finish before the server stops (10 min at most)."""
    scaled_object_ttl: Seconds = Field(3600.0, ge=MIN_SCALED_OBJECT_TTL, le=MAX_SCALED_OBJECT_TTL)
    """Forget a ScaledObject KEDA has not asked about for this long (KEDA never says one
    was deleted; its polls come every 15-30 s). A week at most: kept for good, deleted
    ScaledObjects filled the registry's bound and every new one was refused."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """Decision defaults for every ScaledObject."""
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict, max_length=MAX_PROFILES)
    """The SRE's own replica profiles by name, which ``policy.profile`` and a trigger's
    ``profile`` may name beside the built-in ones."""
    profiles_file: Path | None = None
    """A YAML file holding more of them (``profiles:`` as here), read with the config."""

    _names = field_validator("profiles")(_profile_names)
    _replica_profiles: tuple[ReplicaProfile, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _own_profiles(self) -> ScalerConfig:
        # The file is read once, with the config: a reload reads it again.
        mine = dict(self.profiles)
        if self.profiles_file is not None:
            for name, own in _read_profile_file(self.profiles_file).items():
                if name in mine:
                    raise ValueError(f"profile {name!r} is in both profiles and profiles-file")
                mine[name] = own
                if len(mine) > MAX_PROFILES:
                    break
        if len(mine) > MAX_PROFILES:
            raise ValueError(
                f"over {MAX_PROFILES} profiles (profiles and profiles-file together),"
                " the most a config defines"
            )
        self._replica_profiles = tuple(own.profile(name) for name, own in sorted(mine.items()))
        if self.policy.profile is not None:
            try:
                check_profile(self.policy.profile, sorted(mine))
            except ValueError as err:
                raise ValueError(f"policy.profile {self.policy.profile!r}: {err}") from err
        return self

    @property
    def replica_profiles(self) -> tuple[ReplicaProfile, ...]:
        """The SRE's own profiles: ``profiles`` and the ``profiles-file``'s, by name."""
        return self._replica_profiles

    def policy_defaults(self) -> Policy:
        """The core's policy with ``policy``'s defaults and the SRE's own profiles."""
        return replace(self.policy.policy(), profiles=self._replica_profiles)


def load_config(path: Path | None) -> ScalerConfig:
    """Read and validate the config file; ``None`` gives the defaults.

    Raises:
        ConfigError: unreadable file, bad YAML, or a bad key (named in the message).
    """
    if path is None:
        return ScalerConfig()
    text = read_text(path, MAX_CONFIG_BYTES, "config file")
    return parse_config(text, origin=str(path))


def parse_config(text: str, origin: str = "<config>") -> ScalerConfig:
    """Validate config text (YAML); see ``load_config``."""
    return validate(ScalerConfig, load_mapping(text, origin), origin)
