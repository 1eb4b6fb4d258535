"""What the demo shows and reports: samples of the live system, and the scaler's reasons.

``Sampler`` asks the exporter and the gateway for their signals (``GetSignals``, the
API the scaler watches) every sample period; values are converted to trace time for
display (rates / C, latencies x C). ``ReasonTail`` follows the scaler's log for its
decisions (``desired replicas N (reason)``), which the scaler logs on every change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

from protos.unitscale.v1 import signals_pb2 as pb
from protos.unitscale.v1 import signals_pb2_grpc as pb_grpc


@dataclass(slots=True)
class Sample:
    """The system at one moment, in trace units (``t`` in trace seconds)."""

    t: float
    arrival_rate: float | None
    """Requests/s at the gateway."""
    buffered: int | None
    engine_queue: float | None
    running: float | None
    replicas: int
    """Starting or ready, awake (the replay's replicas)."""
    ready: int
    ttft_p95: float | None
    itl_p95: float | None
    cost_per_million: float | None
    arrivals: int
    """Requests sent since the previous sample."""
    sleeping: int = 0
    """Replicas asleep (the standby plan's), besides ``replicas``."""


@dataclass
class Sampler:
    """Reads both signal sources; ``compression`` converts to trace units."""

    exporter: pb_grpc.SignalsServiceStub
    gateway: pb_grpc.SignalsServiceStub
    compression: float
    samples: list[Sample] = field(default_factory=list)

    async def sample(
        self, wall: float, replicas: int, ready: int, arrivals: int, sleeping: int = 0
    ) -> Sample:
        c = self.compression
        engine = await _signals(self.exporter, "engine")
        gateway = await _signals(self.gateway, "gateway")
        sample = Sample(
            t=wall * c,
            arrival_rate=_scaled(gateway, "arrival_rate", 1 / c),
            buffered=gateway.buffered if gateway is not None else None,
            engine_queue=_scaled(engine, "queue_depth", 1.0),
            running=_scaled(engine, "requests_running", 1.0),
            replicas=replicas,
            ready=ready,
            ttft_p95=_quantile(engine, "ttft_seconds", c),
            itl_p95=_quantile(engine, "inter_token_seconds", c),
            cost_per_million=_scaled(engine, "cost_per_million_tokens", 1.0),
            arrivals=arrivals,
            sleeping=sleeping,
        )
        self.samples.append(sample)
        return sample


async def _signals(stub: pb_grpc.SignalsServiceStub, payload: str) -> Any:
    try:
        response = await stub.GetSignals(pb.GetSignalsRequest(), timeout=2.0)
    except grpc.aio.AioRpcError:
        return None
    for signals in response.signals:
        if signals.WhichOneof("payload") == payload:
            return getattr(signals, payload)
    return None


def _scaled(message: Any, name: str, factor: float) -> float | None:
    if message is None or not message.HasField(name):
        return None  # not measured is not zero
    return float(getattr(message, name)) * factor


def _quantile(engine: Any, name: str, factor: float) -> float | None:
    if engine is None:
        return None
    window = engine.stable
    quantiles = getattr(window, name)
    return float(quantiles.p95) * factor if quantiles.HasField("p95") else None


_DECISION = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*ScaledObject \S+:"
    # a change of the standby plan's sleepers, without its reason (the decision's own)
    r" (desired replicas \d+ \(.*\)|panic \w+ \(.*\)|\d+ sleeping beside \d+ running)"
    r"(?: \(.*\))?$"
)


class ReasonTail:
    """New decision lines of the scaler's log since the last call, with their times."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self._offset = 0

    def read(self) -> list[tuple[float, str]]:
        """``(seconds since the epoch, decision)`` for each new line (the log's clock)."""
        try:
            with self._log.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # only whole lines
        self._offset += end
        found = []
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            match = _DECISION.search(line)
            if match:
                # logging's asctime: local time, milliseconds after a comma
                at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((at, match.group(2)))
        return found
