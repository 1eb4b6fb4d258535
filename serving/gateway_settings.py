"""The gateway's runtime settings: the one source of its defaults.

``serving.config.GatewayConfig`` (the ConfigMap's keys and the flags) takes its defaults
from here, and ``deploy/gateway/configmap.yaml`` documents them; a test keeps all three equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.arrivals import ArrivalSettings
from serving.slo import SloTargets


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Buffering and health-check settings, with the gateway's defaults."""

    namespace: str = "default"
    deployment: str = "default"
    buffer_size: int = 1000
    buffer_bytes: int = 256 * 1024**2
    """Bytes of request bodies the buffer may hold: 16 requests of the largest size."""
    buffer_timeout: float = 120.0
    """Seconds a request may wait for a replica: above a cold start from local disk (~40 s)."""
    max_request_bytes: int = 16 * 1024**2
    """The largest request body: a 128k-token prompt as token ids is ~1 MB; images need more."""
    body_timeout: float = 60.0
    """Seconds a client may take to send its whole request body (then 408): 16 MiB at
    300 KiB/s. A body being read is held in memory before the buffer bounds it."""
    upstream_timeout: float = 300.0
    """Seconds a replica may stay silent once sent a request: before its response headers
    (which a non-streaming answer sends after its last token) and between two chunks of a
    body (a stream's first chunk waits for its queueing and prefill). Knative's default."""
    models: tuple[str, ...] = ()
    """Models (and LoRA adapters) the replicas serve, known before any replica is up."""
    health_interval: float = 1.0
    connect_retries: int = 2
    signal_interval: float = 1.0
    rate_window: float = 10.0
    """Seconds over which the arrival and upstream-error rates are measured (the SLO rates:
    ``slo.window_seconds``)."""
    dns: str | None = None
    """``host:port`` of a headless Service: every A record is a replica (re-resolved each check)."""
    wake_timeout: float = 60.0
    """Seconds a sleeping replica's ``POST /wake_up`` may take before another is tried: above
    a level-2 wake of a 32B model from local disk (~56 s; level 1 takes ~4 s)."""
    wake_at_outstanding: int | None = None
    """Wake sleepers when every ready replica holds this many requests outstanding (or
    twice the mean over ``slo.window``, whichever is larger: ``serving.routing.WakePressure``);
    None: only when none is ready (requests buffered meanwhile). With a standby plan,
    ``RECOMMENDED_WAKE_AT_OUTSTANDING``."""
    wake_retry_after: float = 30.0
    """Seconds a replica whose wake failed is passed over for the next wake, and one whose
    sleep failed for the next sleep: doubled per failure in a row, at most eight times
    (``serving.routing.Backoff``), so a replica that keeps refusing is asked every 4 minutes."""
    standby_scaler: str | None = None
    """``host:port`` of the scaler's gRPC port: the gateway asks it for the standby plan
    (``GetStandbyPlan``) and puts the plan's sleepers to sleep; None: it sleeps none."""
    standby_interval: float = 5.0
    """Seconds between two asks for the standby plan (the scaler plans every 5 s)."""
    sleep_after_idle: float = 10.0
    """Seconds without a request (or since it woke) before a surplus replica is slept."""
    slo: SloTargets = field(default_factory=SloTargets)
    """The targets every request is judged against (``serving.slo``): the scaler's defaults."""
    arrivals: ArrivalSettings = field(default_factory=ArrivalSettings)
    """Where the arrivals are recorded (``serving.arrivals``); off by default."""


RECOMMENDED_WAKE_AT_OUTSTANDING = 8
"""``wake-at-outstanding`` beside a standby plan with burst sleepers (docs/gateway.md):
``bench/replay_quality.py`` holds 99% on every trace with it."""
