"""The replay's gateway judges each request as it ends and publishes the rates steered by."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from foundation.replica_model import LLAMA3_8B_H200
from foundation.signals import GatewaySignals
from replay.controllers import Actuator
from replay.policies import GatewayView, Unitscale, View
from replay.simulate import SimConfig, simulate
from replay.trace import Trace

CONFIG = SimConfig(LLAMA3_8B_H200, max_replicas=4, tail=120.0, cold_start_override=5.0)


@dataclasses.dataclass
class _Recorder:
    """One replica started cold (5 s) at the start; records every view the gateway gives."""

    name: str = "recorder"
    views: list[View] = dataclasses.field(default_factory=list)

    def controller(self) -> _Recorder:
        return self

    def start(self, actuator: Actuator, initial_replicas: int) -> None:
        actuator.scale_to(1, "cold")

    def tick(self, view: View, actuator: Actuator) -> None:
        self.views.append(view)


def _trace() -> Trace:
    """Ten requests buffered through the cold start (late), then ten served at once."""
    arrival = np.r_[np.full(10, 0.0), np.full(10, 20.0)]
    return Trace("judged", arrival, np.full(20, 256), np.full(20, 16))


def test_the_gateway_publishes_the_requests_judged_within_and_outside_per_second():
    recorder = _Recorder()
    result = simulate(_trace(), recorder, CONFIG)
    assert result.metrics["slo_attainment"] == pytest.approx(0.5)
    last = recorder.views[-1].gateway
    # Both groups ended within the last stable window (60 s): 10 of each, per second.
    assert last.slo_within_rate == pytest.approx(10 / CONFIG.stable_window)
    assert last.slo_outside_rate == pytest.approx(10 / CONFIG.stable_window)
    # Before anything ended, nothing was judged: zero rates, not unknown ones.
    assert recorder.views[0].gateway.slo_within_rate == 0.0
    assert recorder.views[0].gateway.slo_outside_rate == 0.0


def test_a_judgement_leaves_the_window_after_the_stable_window():
    recorder = _Recorder()
    trace = _trace()
    later = Trace(
        "judged", np.r_[trace.arrival, 60.0], np.r_[trace.prompt, 256], np.r_[trace.output, 16]
    )
    simulate(later, recorder, dataclasses.replace(CONFIG, stable_window=10.0))
    # Everything before ended by about 21 s: from 32 s on, the 10 s window is empty.
    quiet = [v.gateway for v in recorder.views if 32.0 <= v.now < 60.0]
    assert quiet and all(g.slo_within_rate == g.slo_outside_rate == 0.0 for g in quiet)


def test_the_unitscale_policy_hands_the_rates_to_the_scaler_as_the_gateway_does():
    gateway = GatewayView(1.0, 0, 0, slo_within_rate=3.0, slo_outside_rate=0.5)
    snapshot = Unitscale.gateway_signals(View(0.0, None, gateway, 1, 1))
    assert isinstance(snapshot.signals, GatewaySignals)
    assert (snapshot.signals.slo_within_rate, snapshot.signals.slo_outside_rate) == (3.0, 0.5)
