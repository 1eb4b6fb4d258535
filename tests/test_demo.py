"""``unitscale demo``: its workload, its compressed world, and whole runs as processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from foundation.errors import ConfigError
from foundation.net import free_port
from foundation.replica_model import HOST_MEMORY_PRICE_PER_GB_HOUR, PROFILES, warm_tiers
from replay.keda import ScalingSpec, read_scaled_object
from replay.simulate import Result, simulate
from scaler.config import PolicyConfig
from scaler.core.decide import decide
from scaler.core.model import DecisionState, Observation
from scaler.core.tiers import StandbyPolicy
from scaler.metadata import parse_metadata
from unitscale import flags
from unitscale.demo.fleet import Fleet, Replica, held_seconds, sleeping_seconds
from unitscale.demo.load import Outcome
from unitscale.demo.processes import MARKER, Child, Supervisor
from unitscale.demo.report import LiveRun, live_metrics
from unitscale.demo.run import (
    Conductor,
    DemoOptions,
    _plan,
    capacity_priors,
    default_policy,
    load_trace,
    validate,
)
from unitscale.demo.workload import IDLE, WorkloadShape, generate, lead_in, rate_at
from unitscale.demo.world import (
    Plan,
    exporter_config,
    gateway_config,
    keda_spec,
    make_plan,
    prediction,
    scaler_config,
    trigger_metadata,
)

ROOT = Path(__file__).resolve().parent.parent
RECOMMENDED = ROOT / "deploy" / "scaledobjects" / "recommended.yaml"
SHAPE = WorkloadShape(length=1000.0, base_rate=2.0, burst_rate=5.0)


# --- the workload -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "rate"),
    [
        pytest.param(10.0, 0.6, id="the first requests trickle in at 0.3 x base"),
        pytest.param(150.0, 1.3, id="halfway up the ramp the rate is halfway to base"),
        pytest.param(280.0, 2.0, id="the steady phase runs at the base rate"),
        pytest.param(350.0, 5.0, id="the burst runs at the burst rate"),
        pytest.param(450.0, 1.0, id="halfway down the rate is half the base"),
        pytest.param(600.0, 0.0, id="the idle stretch has no arrivals"),
        pytest.param(800.0, 1.6, id="traffic returns at once at 0.8 x base"),
        pytest.param(1000.0, 0.0, id="nothing after the end"),
    ],
)
def test_workload_rate_follows_the_documented_shape(t: float, rate: float) -> None:
    assert rate_at(t, SHAPE) == pytest.approx(rate)


def test_workload_is_reproducible_for_a_seed_and_differs_across_seeds() -> None:
    a, b, c = generate(SHAPE, 3), generate(SHAPE, 3), generate(SHAPE, 4)
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt, b.prompt)
    assert not np.array_equal(a.arrival[:10], c.arrival[:10])


def test_workload_has_the_expected_volume_an_idle_stretch_and_bounded_lengths() -> None:
    trace = generate(WorkloadShape(), 0)
    shape = WorkloadShape()
    grid = np.linspace(0, shape.length, 20_001)
    expected = float(np.trapezoid([rate_at(t, shape) for t in grid], grid))
    assert abs(len(trace) - expected) < 5 * math.sqrt(expected)  # Poisson: 5 sigma
    idle = (trace.arrival >= IDLE[0] * shape.length) & (trace.arrival < IDLE[1] * shape.length)
    assert not idle.any()
    assert trace.prompt.min() >= 32 and trace.prompt.max() <= 8000
    assert trace.output.min() >= 16 and trace.output.max() <= 1500
    assert 1300 < np.median(trace.prompt) < 1700 and 200 < np.median(trace.output) < 300


def test_a_lead_in_is_one_request_of_the_first_ones_size_and_the_trace_later() -> None:
    trace = generate(SHAPE, 3)
    led = lead_in(trace, 300.0)
    assert len(led) == len(trace) + 1
    assert led.arrival[0] == 0.0 and np.allclose(led.arrival[1:], trace.arrival + 300.0)
    assert (led.prompt[0], led.output[0]) == (trace.prompt[0], trace.output[0])
    assert np.array_equal(led.prompt[1:], trace.prompt)


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(0.0, id="no lead-in is no lead-in"),
        pytest.param(-5.0, id="a negative lead-in is refused"),
        pytest.param(math.inf, id="an endless lead-in is refused"),
    ],
)
def test_a_lead_in_must_be_a_positive_finite_time(seconds: float) -> None:
    with pytest.raises(ValueError, match="lead-in"):
        lead_in(generate(SHAPE, 3), seconds)


def test_with_standby_the_lead_in_outlasts_a_start_the_idle_grace_and_the_cooldown() -> None:
    plan = _plan(DemoOptions(report=Path("unused")))
    spec = plan.scaled_object.spec
    waits = plan.policy.idle_grace + spec.cooldown + spec.scale_down_stabilization
    assert plan.lead_in > plan.cold_start + waits
    assert _plan(DemoOptions(report=Path("unused"), standby=False)).lead_in == 0.0


# --- ScaledObject manifests ----------------------------------------------------------------


def _scaled_object(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {
        "triggers": [{"type": "external-push", "metadata": {"scalerAddress": "s:9090"}}]
    }
    return {"kind": "ScaledObject", "metadata": {"name": "x"}, "spec": {**base, **spec}}


def test_the_recommended_scaled_object_reads_as_keda_and_the_hpa_would_act() -> None:
    doc = yaml.safe_load(RECOMMENDED.read_text())
    scaled = read_scaled_object(doc)
    assert scaled.push and scaled.metadata["deployment"] == "llama-chat"
    assert scaled.spec == ScalingSpec(
        min_replicas=0,
        max_replicas=64,
        polling_interval=15,
        cooldown=60,
        scale_down_stabilization=0,
        scale_up_pods=16,
        scale_up_percent=400,
        scale_down_percent=50,
        fallback_replicas=2,
        failure_threshold=3,
    )


def test_a_bare_scaled_object_gets_kedas_and_the_hpas_defaults() -> None:
    scaled = read_scaled_object(_scaled_object())
    assert scaled.spec == ScalingSpec()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"kind": "Deployment"}, "expected ScaledObject", id="another kind is refused"),
        pytest.param(
            _scaled_object(triggers=[{"type": "prometheus", "metadata": {}}]),
            "exactly one trigger",
            id="a trigger that is not external is refused",
        ),
        pytest.param(
            _scaled_object(
                advanced={
                    "horizontalPodAutoscalerConfig": {
                        "behavior": {"scaleUp": {"selectPolicy": "Min"}}
                    }
                }
            ),
            "only Max",
            id="selectPolicy Min is not modelled",
        ),
        pytest.param(
            _scaled_object(
                advanced={
                    "horizontalPodAutoscalerConfig": {
                        "behavior": {
                            "scaleDown": {
                                "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]
                            }
                        }
                    }
                }
            ),
            "periodSeconds 15",
            id="a policy period other than one HPA sync is refused",
        ),
        pytest.param(
            _scaled_object(maxReplicaCount="many"),
            "many",
            id="a count that is not a number is named",
        ),
    ],
)
def test_a_scaled_object_the_model_cannot_follow_is_refused(
    doc: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        read_scaled_object(doc)


# --- the compressed world ------------------------------------------------------------------

QWEN = PROFILES["qwen2.5-32b-h200"]
PLAN = make_plan(10.0, QWEN, RECOMMENDED, capacity_priors(QWEN), 8, 16.0, standby=False)
"""The priors-planned demo (``--scaler-config`` with no profile, so ``--no-standby``)."""
PROFILE_PLAN = make_plan(10.0, QWEN, RECOMMENDED, default_policy(QWEN), 8, 16.0)
"""The default demo: planned with the profile the replicas simulate."""


def test_every_clock_is_compressed_and_every_rate_sped_up_by_the_same_factor() -> None:
    scaler = scaler_config(PLAN, ["127.0.0.1:1"])
    policy = scaler["policy"]
    assert policy["idle-grace"] == pytest.approx(12.0)
    assert policy["slo-ttft"] == pytest.approx(0.2)
    assert policy["decode-tokens-per-second"] == pytest.approx(
        PLAN.policy.decode_tokens_per_second * 10
    )
    assert scaler["max-signal-age"] == pytest.approx(3.0)
    assert policy["profile"] is None and policy["profile-speedup"] == pytest.approx(10.0)
    exporter = exporter_config(PLAN, ["http://127.0.0.1:2"])
    assert exporter["interval"] == pytest.approx(0.5) and exporter["stable-window"] == 6.0
    assert exporter["timeout"] < exporter["interval"]
    assert exporter["deployments"][0]["accelerator"]["price-per-hour"] == pytest.approx(35.0)
    assert exporter["deployments"][0]["targets"] == ["http://127.0.0.1:2/metrics"]
    gateway = gateway_config(PLAN, [])
    assert gateway["buffer-timeout"] == pytest.approx(12.0)
    # The gateway judges requests by the scaler's SLO on the compressed clock.
    assert gateway["slo"] == {
        "ttft": pytest.approx(0.2),
        "itl": pytest.approx(0.01),
        "attainment": 0.99,
        "window": pytest.approx(6.0),  # the replay's stable window, as its judged rates
    }
    metadata = trigger_metadata(PLAN, "127.0.0.1:3")
    assert metadata["sloTtft"] == "0.2s" and metadata["sloItl"] == "0.01s"
    assert metadata["scalerAddress"] == "127.0.0.1:3" and metadata["targetConcurrency"] == "16"
    spec = keda_spec(PLAN)
    assert (spec.polling_interval, spec.cooldown, spec.hpa_sync) == (1.5, 6.0, 1.5)
    assert spec.scale_up_pods == 16  # counts are not clocks


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("profile", "qwen2.5-32b-h200", id="the scaler plans with the replicas'"),
        pytest.param("profile-speedup", 10.0, id="at the speed the replicas step"),
        pytest.param("backlog-drain", 2.0, id="so is the backlog's drain time"),
        pytest.param("demand-window", 6.0, id="and the window demand is averaged over"),
        pytest.param("forecast-horizon", 6.0, id="the headroom's horizon, as before"),
        pytest.param("profile-utilization", 1.0, id="a share is not a clock"),
        pytest.param("slo-attainment", 0.99, id="nor is the attainment target"),
        pytest.param("headroom-half-life", 30.0, id="the headroom's half-life is a clock"),
    ],
)  # fmt: skip
def test_the_default_demo_plans_with_the_profile_on_the_compressed_scale(
    key: str, value: object
) -> None:
    assert scaler_config(PROFILE_PLAN, [])["policy"][key] == pytest.approx(value)


@pytest.mark.parametrize(
    ("prompt", "output"),
    [
        pytest.param(1892.0, 318.0, id="the demo workload's mix"),
        pytest.param(12_000.0, 300.0, id="long prompts"),
        pytest.param(200.0, 1000.0, id="long outputs"),
    ],
)
def test_replicas_c_times_faster_carry_c_times_the_load_within_slos_c_times_tighter(
    prompt: float, output: float
) -> None:
    from scaler.core.capacity import Mix, replica_rates

    real = PROFILE_PLAN.policy.policy()
    fast = PolicyConfig.model_validate(scaler_config(PROFILE_PLAN, [])["policy"]).policy()
    slow_rates, fast_rates = (replica_rates(p, Mix(prompt, output)) for p in (real, fast))
    assert slow_rates.requests_per_second is not None and slow_rates.requests_per_second > 0
    assert fast_rates.requests_per_second == pytest.approx(10 * slow_rates.requests_per_second)
    assert fast_rates.prefill_tokens_per_second == pytest.approx(
        10 * slow_rates.prefill_tokens_per_second
    )
    assert fast_rates.decode_tokens_per_second == pytest.approx(
        10 * slow_rates.decode_tokens_per_second
    )


@pytest.mark.parametrize(
    "compression",
    [
        pytest.param(10.0, id="at the default compression"),
        pytest.param(1.0, id="in real time"),
        pytest.param(50.0, id="at the most the demo's flag takes"),
    ],
)
def test_the_configs_written_for_the_live_run_are_valid_for_each_process(
    compression: float,
) -> None:
    from exporter.config import parse_config as parse_exporter
    from scaler.config import parse_config as parse_scaler
    from serving.config import parse_config as parse_gateway

    plan = dataclasses.replace(PLAN, compression=compression)
    profile_plan = dataclasses.replace(PROFILE_PLAN, compression=compression)
    parse_scaler(yaml.safe_dump(scaler_config(plan, ["127.0.0.1:1"])))
    parse_scaler(yaml.safe_dump(scaler_config(profile_plan, ["127.0.0.1:1"])))
    parse_exporter(yaml.safe_dump(exporter_config(plan, ["http://127.0.0.1:2"])))
    parse_gateway(yaml.safe_dump(gateway_config(plan, ["http://127.0.0.1:2"])), "test")
    standby = gateway_config(profile_plan, ["http://127.0.0.1:2"], "127.0.0.1:3")
    assert parse_gateway(yaml.safe_dump(standby), "test").standby_scaler == "127.0.0.1:3"
    assert flags.DEMO_COMPRESSION("50") == 50.0


LOAD_SHAPE = (0.3, 0.5, 1, 1, 1.5, 2, 4, 4, 4, 3, 2, 1, 1, 0.5, 0.2, *[0] * 12, 0.8, 0.8, 1, 1)
"""Ten minutes of decisions every 15 s: the rates scaled by this, a burst, an idle stretch
long enough to scale to zero, and a return."""


@pytest.mark.parametrize(
    "plan", [pytest.param(PLAN, id="priors"), pytest.param(PROFILE_PLAN, id="profile")]
)
@pytest.mark.parametrize(
    "observation",
    [
        pytest.param(
            {"queue_depth": 40.0, "requests_running": 30.0, "gateway_buffered": 0},
            id="in-flight load with token rates unknown",
        ),
        pytest.param(
            {"prompt_token_rate": 20_000.0, "generation_token_rate": 3_000.0,
             "prompt_token_rate_panic": 60_000.0, "generation_token_rate_panic": 9_000.0,
             "queue_depth": 5.0, "requests_running": 40.0, "replicas_up": 3,
             "replicas_known": 3, "ttft_p95_seconds": 3.0},
            id="a burst with an SLO breach and known token rates",
        ),
        pytest.param(
            {"gateway_buffered": 12, "gateway_in_flight": 0, "gateway_arrival_rate": 1.5},
            id="requests buffered at zero replicas",
        ),
        pytest.param(
            {"gateway_arrival_rate": 3.0, "gateway_buffered": 0, "gateway_in_flight": 20,
             "mean_prompt_tokens": 1892.0, "mean_output_tokens": 318.0,
             "prompt_token_rate": 5_700.0, "generation_token_rate": 950.0,
             "prompt_token_rate_panic": 7_000.0, "generation_token_rate_panic": 1_100.0,
             "queue_depth": 30.0, "requests_running": 20.0, "replicas_up": 2,
             "replicas_known": 2, "ttft_p95_seconds": 1.2, "inter_token_p95_seconds": 0.06},
            id="demand from the gateway with a known mix and a backlog",
        ),
    ],
)  # fmt: skip
def test_the_decision_in_the_compressed_world_is_the_production_decision(
    plan: Plan, observation: dict[str, Any]
) -> None:
    """The demo's premise: compressing time (durations / C, rates x C) changes nothing."""
    c = plan.compression
    policy = plan.policy.policy(max_replicas=8)
    compressed_policy = PolicyConfig.model_validate(scaler_config(plan, [])["policy"]).policy(
        max_replicas=8
    )
    rates = {"prompt_token_rate", "generation_token_rate", "prompt_token_rate_panic",
             "generation_token_rate_panic", "gateway_arrival_rate"}  # fmt: skip
    durations = {"ttft_p95_seconds", "inter_token_p95_seconds"}
    slow_state = fast_state = DecisionState()
    for step, scale in enumerate(LOAD_SHAPE):
        real = {k: v * scale if k in rates else v for k, v in observation.items()}
        compressed = {
            k: v * c if k in rates else v / c if k in durations else v for k, v in real.items()
        }
        now = 1_000.0 + 15.0 * step
        slow = decide(Observation(now=now, signal_time=now, **real), policy, slow_state)
        fast = decide(
            Observation(now=now / c, signal_time=now / c, **compressed),
            compressed_policy,
            fast_state,
        )
        assert (fast.desired_replicas, fast.active) == (
            slow.desired_replicas,
            slow.active,
        ), f"at {now - 1000:g} s: {fast.reason} / {slow.reason}"
        slow_state, fast_state = slow.state, fast.state


def test_the_prediction_runs_the_plan_uncompressed_under_the_replays_own_target() -> None:
    policy, config = prediction(PROFILE_PLAN)
    assert "namespace" not in policy.metadata and policy.metadata["deployment"] == "llm"
    assert policy.spec == PROFILE_PLAN.scaled_object.spec and policy.push
    assert config.slo_ttft == 2.0 and config.scrape_interval == 5.0
    assert config.max_replicas == 8
    # The replay's unitscale plans with the replicas' profile, on its own time scale.
    assert policy.defaults.profile == "qwen2.5-32b-h200"
    assert policy.defaults.profile_speedup == 1.0
    # Its fleet, and the live replicas, run the chunk budget the scaler's capacity assumes.
    assert config.profile == QWEN.for_itl_slo(0.1)
    assert config.profile.max_num_batched_tokens == 512  # 8,192 breaks the 100 ms ITL


# --- the warm tier: sleeping replicas (standby) ------------------------------------------

NO_STANDBY_PLAN = make_plan(10.0, QWEN, RECOMMENDED, default_policy(QWEN), 8, 16.0, standby=False)
"""``--no-standby``: every return from zero is a cold start."""


def _scaled_object_file(tmp_path: Path, **metadata: str) -> Path:
    """The recommended ScaledObject with ``metadata`` added to its trigger's."""
    doc = yaml.safe_load(RECOMMENDED.read_text())
    doc["spec"]["triggers"][0]["metadata"].update(metadata)
    path = tmp_path / "scaledobject.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_default_demo_holds_sleepers_and_compresses_every_standby_clock() -> None:
    # the knobs docs/scaler.md recommends on shared cards, no Fluid
    assert PROFILE_PLAN.standby == StandbyPolicy(cache=False, max_sleeping=16, burst_sleepers=2)
    metadata = trigger_metadata(PROFILE_PLAN, "127.0.0.1:3")
    assert metadata["standby"] == "true"
    # The scaler's default release (1 h) is no clock of the demo's: written, it is compressed.
    assert metadata["standbyReleaseAfter"] == "360s"
    served = parse_metadata(metadata).standby_policy()
    assert served is not None and served.release_after_seconds == pytest.approx(360.0)
    gateway = gateway_config(PROFILE_PLAN, [], "127.0.0.1:3")
    assert gateway["standby-scaler"] == "127.0.0.1:3"  # the scaler KEDA calls
    assert gateway["standby-interval"] == pytest.approx(0.5)
    assert gateway["sleep-after-idle"] == pytest.approx(1.0)
    assert gateway["wake-timeout"] == pytest.approx(6.0)
    assert gateway["wake-retry-after"] == pytest.approx(3.0)
    assert gateway["wake-at-outstanding"] == 8  # a count, not a clock: never compressed


@pytest.mark.parametrize(
    ("plan", "scaler"),
    [
        pytest.param(NO_STANDBY_PLAN, "127.0.0.1:3", id="no-standby-asks-the-scaler-nothing"),
        pytest.param(PROFILE_PLAN, None, id="standby-with-no-scaler-to-ask-sleeps-nothing"),
    ],
)
def test_a_gateway_without_a_standby_plan_gets_no_standby_settings(
    plan: Plan, scaler: str | None
) -> None:
    gateway = gateway_config(plan, [], scaler)
    assert not {k for k in gateway if k.startswith(("standby", "sleep", "wake"))}


@pytest.mark.parametrize(
    ("metadata", "standby", "want"),
    [
        pytest.param({"standbyMaxSleeping": "2"}, True,
                     StandbyPolicy(cache=False, max_sleeping=2, burst_sleepers=2),
                     id="the-scaled-objects-own-knob-is-kept"),
        pytest.param({"standby": "true", "standbyMaxSleeping": "2"}, False, None,
                     id="no-standby-drops-every-standby-key"),
        pytest.param({"standby": "false"}, True,
                     StandbyPolicy(cache=False, max_sleeping=16, burst_sleepers=2),
                     id="standby-overrides-the-scaled-objects-false"),
    ],
)  # fmt: skip
def test_the_plans_standby_follows_the_flag_and_the_scaled_objects_knobs(
    tmp_path: Path, metadata: dict[str, str], standby: bool, want: StandbyPolicy | None
) -> None:
    path = _scaled_object_file(tmp_path, **metadata)
    plan = make_plan(10.0, QWEN, path, default_policy(QWEN), 8, 16.0, standby=standby)
    assert plan.standby == want
    keys = {k for k in trigger_metadata(plan, "127.0.0.1:3") if k.startswith("standby")}
    assert bool(keys) == standby
    parse_metadata(trigger_metadata(plan, "127.0.0.1:3"))  # the scaler takes it


@pytest.mark.parametrize(
    ("spec", "metadata", "flags", "want"),
    [
        pytest.param({}, {"targetConcurrency": "4"}, {}, ("4", 8, True),
                     id="the files target concurrency is kept without the flag"),
        pytest.param({}, {"targetConcurrency": "4"}, {"target_concurrency": 20.0},
                     ("20", 8, True), id="the flag's target concurrency wins over the file's"),
        pytest.param({}, {}, {}, ("16", 8, True),
                     id="neither gives a target concurrency: the demo's 16"),
        pytest.param({}, {"standby": "false"}, {}, ("16", 8, False),
                     id="the files standby false is kept without the flag"),
        pytest.param({}, {"standby": "true"}, {"standby": False}, ("16", 8, False),
                     id="no standby wins over the file's true"),
        pytest.param({"maxReplicaCount": 3}, {"maxReplicas": "3"}, {}, ("16", 3, True),
                     id="a files maximum below the demo's cap is kept"),
        pytest.param({"maxReplicaCount": 64}, {"maxReplicas": "64"}, {}, ("16", 8, True),
                     id="a files maximum above the demo's cap is capped"),
        pytest.param({"maxReplicaCount": 3}, {"maxReplicas": "3"}, {"max_replicas": 12},
                     ("16", 12, True), id="the flag's maximum wins over the file's"),
        pytest.param({}, {}, {"replica_cap": 2}, ("16", 2, True),
                     id="real vllm's cap of two replicas"),
    ],
)  # fmt: skip
def test_a_flag_left_out_keeps_the_scaled_objects_own_key(
    tmp_path: Path,
    spec: dict[str, object],
    metadata: dict[str, str],
    flags: dict[str, Any],
    want: tuple[str, int, bool],
) -> None:
    """The flags' defaults replaced the file's keys: a ScaledObject of targetConcurrency 4
    and standby false ran the demo at 16 with sleepers (issue 27, hostile pass 54)."""
    doc = yaml.safe_load(RECOMMENDED.read_text())
    doc["spec"].update(spec)
    doc["spec"]["triggers"][0]["metadata"].update(metadata)
    path = tmp_path / "scaledobject.yaml"
    path.write_text(yaml.safe_dump(doc))
    given = {"max_replicas": None, "target_concurrency": None, **flags}
    plan = make_plan(10.0, QWEN, path, default_policy(QWEN), **given)
    trigger = trigger_metadata(plan, "127.0.0.1:3")
    got = (trigger["targetConcurrency"], plan.scaled_object.spec.max_replicas, plan.standby)
    assert got[:2] == want[:2] and (got[2] is not None) == want[2]
    assert trigger["maxReplicas"] == str(want[1])


def test_standby_without_a_profile_is_refused_naming_no_standby() -> None:
    with pytest.raises(ConfigError, match=r"standby needs a profile.*--no-standby"):
        make_plan(10.0, QWEN, RECOMMENDED, capacity_priors(QWEN), 8, 16.0)


def test_the_prediction_models_the_sleepers_as_the_replays_warm_tier_not_as_running() -> None:
    """Through the replay's KEDA, ``standby: "true"`` would ask for every sleeper running."""
    policy, config = prediction(PROFILE_PLAN)
    assert not {k for k in policy.metadata if k.startswith("standby")}
    assert config.standby == PROFILE_PLAN.standby  # uncompressed: 1 h, 16 sleepers, no cache
    assert config.standby is not None and config.standby.release_after_seconds == 3600.0
    assert prediction(NO_STANDBY_PLAN)[1].standby is None
    assert policy.metadata == prediction(NO_STANDBY_PLAN)[0].metadata


@pytest.fixture(scope="module")
def predicted() -> dict[str, Result]:
    """The prediction with and without standby on the demo's workload, shorter."""
    trace = generate(WorkloadShape(length=1200.0), 0)  # its idle stretch still reaches zero
    plans = {"standby": PROFILE_PLAN, "no-standby": NO_STANDBY_PLAN}
    return {name: simulate(trace, *prediction(plan)) for name, plan in plans.items()}


def test_the_predicted_return_from_zero_wakes_a_sleeper_billed_as_host_memory(
    predicted: dict[str, Result],
) -> None:
    sleeping, cold = predicted["standby"].metrics, predicted["no-standby"].metrics
    assert sleeping["wakes"] >= 1 and cold["wakes"] == 0
    first = QWEN.wake_seconds(1) + 1.0  # the wake, and a request's prefill and routing
    assert sleeping["after_idle_ttft_max_seconds"] <= first < cold["after_idle_ttft_max_seconds"]
    assert sleeping["slo_attainment"] > cold["slo_attainment"]
    # A sleeper's hour is its weights in host memory, a small share of an accelerator's.
    per_hour = float(sleeping["standby_cost"]) / float(sleeping["sleeping_hours"])
    assert per_hour == pytest.approx(QWEN.weights_gb * HOST_MEMORY_PRICE_PER_GB_HOUR)
    assert per_hour < 0.1 * QWEN.price_per_hour
    assert sleeping["cost"] == pytest.approx(
        float(sleeping["gpu_hours"]) * QWEN.price_per_hour + float(sleeping["standby_cost"])
    )


def _replica(port: int, ready_at: float | None = 0.0) -> Replica:
    """A replica of the fleet's bookkeeping (its process is not needed here)."""
    return Replica(port, Child("replica", cast(Any, None), Path("replica.log")), 0.0, ready_at)


async def test_the_fleet_bills_a_replica_asleep_while_its_is_sleeping_says_so(
    tmp_path: Path,
) -> None:
    """As the kubelet reads a probe: a fake replica's ``/is_sleeping``, a fake clock."""
    asleep = {"now": False}
    answers: asyncio.Queue[bool] = asyncio.Queue()

    async def is_sleeping(request: web.Request) -> web.Response:
        await answers.put(asleep["now"])
        return web.json_response({"is_sleeping": asleep["now"]})

    app = web.Application()
    app.router.add_get("/is_sleeping", is_sleeping)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    now = [0.0]
    files = {name: tmp_path / f"{name}.yaml" for name in ("gateway", "exporter")}
    fleet = Fleet(Supervisor(tmp_path / "logs"), PROFILE_PLAN, lambda _: [], files["gateway"],
                  files["exporter"], 0.05, lambda: now[0], 1.0,
                  standby_scaler="127.0.0.1:3")  # fmt: skip
    replica = _replica(port)
    fleet.replicas.append(replica)
    watch = asyncio.create_task(fleet.watch_sleep(0.01))

    async def say(value: bool, at: float) -> None:
        """Answer ``value`` from ``at`` on, until a round after the first such answer asks.

        Rounds follow one another: the next one asks only once this one's answers count.
        """
        now[0], asleep["now"] = at, value
        async with asyncio.timeout(10):
            told = 0
            while told < 2:
                told = told + 1 if await answers.get() == value else 0

    try:
        await say(True, 10.0)
        assert replica.state == "sleeping"
        assert (fleet.desired, fleet.awake) == (1, 0)  # still a pod; no accelerator
        await say(False, 40.0)
        assert replica.state == "ready"
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await runner.cleanup()
    assert replica.naps == [(10.0, 40.0)] and (fleet.desired, fleet.awake) == (1, 1)
    assert held_seconds([replica], 100.0) == pytest.approx(70.0)
    assert sleeping_seconds([replica], 100.0) == pytest.approx(30.0)
    assert yaml.safe_load(files["gateway"].read_text())["standby-scaler"] == "127.0.0.1:3"


@pytest.mark.parametrize(
    ("naps", "asleep_since", "stopped_at", "until", "want"),
    [
        pytest.param([(10.0, 40.0)], None, None, 100.0, 30.0, id="a-nap-that-ended"),
        pytest.param([], 60.0, None, 100.0, 40.0, id="asleep-now-counts-until-now"),
        pytest.param([], 60.0, 80.0, 100.0, 20.0, id="stopped-asleep-counts-until-its-exit"),
        pytest.param([(10.0, 40.0)], None, None, 20.0, 10.0, id="cut-at-until"),
        pytest.param([(10.0, 40.0)], 70.0, 90.0, 100.0, 50.0, id="naps-and-a-last-sleep"),
    ],
)
def test_a_replicas_sleep_is_counted_up_to_its_exit_and_until(
    naps: list[tuple[float, float]],
    asleep_since: float | None,
    stopped_at: float | None,
    until: float,
    want: float,
) -> None:
    replica = _replica(1)
    replica.naps, replica.asleep_since, replica.stopped_at = naps, asleep_since, stopped_at
    assert replica.asleep_seconds(until) == pytest.approx(want)
    held = min(stopped_at or until, until)
    assert held_seconds([replica], until) == pytest.approx(held - want)


def test_live_cost_bills_sleep_as_host_memory_as_the_replay_does() -> None:
    replica = _replica(1)
    replica.naps, replica.stopped_at = [(10.0, 40.0)], 100.0
    outcome = Outcome(0.0, 100, 10, False, sent=0.0, finished=100.0, status=200)
    live = live_metrics(LiveRun([outcome], [replica], [], []), PROFILE_PLAN)
    c = PROFILE_PLAN.compression
    assert live["gpu_hours"] == pytest.approx(70.0 * c / 3600)
    assert live["sleeping_hours"] == pytest.approx(30.0 * c / 3600) and live["wakes"] == 1
    tiers = warm_tiers(PROFILE_PLAN.replica_profile, PROFILE_PLAN.cold_start)
    assert live["standby_cost"] == pytest.approx(30.0 * c / 3600 * tiers.sleeping_per_hour)
    assert live["cost"] == pytest.approx(
        70.0 * c / 3600 * QWEN.price_per_hour + float(live["standby_cost"])
    )


def _get(url: str) -> str | None:
    """The body of ``url``, None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


def test_the_demos_replicas_prefill_in_the_chunks_the_scaler_assumes(tmp_path: Path) -> None:
    """A 2,000-token prompt on an idle replica takes four 512-token steps, not one."""
    port = free_port()
    speedup = 20.0
    conductor = Conductor(DemoOptions(report=tmp_path), PROFILE_PLAN, load_trace(
        DemoOptions(report=tmp_path), 10.0))  # fmt: skip
    argv = [*conductor._sim_replica(port)]
    argv[argv.index("--speedup") + 1] = f"{speedup:g}"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "512"
    replica = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _get(f"{url}/health") is not None, "the replica serves")
        body = {"model": QWEN.name, "prompt": list(range(2000)), "max_tokens": 1}
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        metrics = _get(f"{url}/metrics") or ""
    finally:
        replica.terminate()
        replica.wait(timeout=30)
    (ttft,) = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "vllm:time_to_first_token_seconds"
        for sample in family.samples
        if sample.name.endswith("_sum")
    ]
    chunks = sum(QWEN.prefill_seconds(c) for c in (512, 512, 512, 464))
    assert ttft == pytest.approx(chunks / speedup, rel=1e-6)
    assert ttft > 1.1 * QWEN.prefill_seconds(2000) / speedup  # one 2,000-token step: 20% less


def test_a_chunk_budget_below_the_batch_cap_is_refused_as_vllm_refuses_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unitscale.cli", "sim-replica", "--max-num-batched-tokens", "100"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--max-num-batched-tokens 100: at least max_num_seqs (256)" in done.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"duration": 0}, "--duration", id="a zero duration is refused"),
        pytest.param({"time_compression": -1}, "--time-compression", id="negative compression"),
        pytest.param({"profile": "gpt-9"}, "--profile", id="an unknown profile is named"),
        pytest.param({"cold_start": "warm"}, "--cold-start", id="an unknown cold-start tier"),
        pytest.param(
            {"rate_multiplier": 2.0}, "--trace", id="a rate multiplier needs a trace to multiply"
        ),
        pytest.param({"max_replicas": 0}, "--max-replicas", id="no room for a replica"),
    ],
)
def test_bad_demo_options_are_refused_before_anything_starts(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(dataclasses.replace(DemoOptions(report=tmp_path), **change))  # type: ignore[arg-type]


def test_a_given_trace_is_multiplied_and_cut_to_the_demos_length(tmp_path: Path) -> None:
    csv = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:{m:02d}:00.0000000,100,10" for m in range(10)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    options = DemoOptions(report=tmp_path, trace=csv, rate_multiplier=2.0)
    trace = load_trace(options, length=5 * 60 + 1)  # minutes 0..5 of 10
    assert len(trace) == 12 and trace.arrival.max() <= 301
    with pytest.raises(ConfigError, match="no request"):
        load_trace(dataclasses.replace(options, rate_multiplier=1.0), length=-1)


# --- whole runs, as a user runs them -----------------------------------------------------


def _demo(report: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "unitscale.cli", "demo", "--report", str(report), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


def _ours(report: Path) -> list[int]:
    """Live processes started by the demo that wrote to ``report``."""
    mark = f"{MARKER}={report.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if mark in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def test_a_short_demo_runs_end_to_end_reports_and_leaves_no_process(tmp_path: Path) -> None:
    report = tmp_path / "report"
    demo = _demo(report, "--duration", "10", "--time-compression", "20", "--plain")
    output, _ = demo.communicate(timeout=240)
    assert demo.returncode == 0, output
    assert _ours(report) == []
    text = (report / "report.md").read_text()
    assert "| cost per 1M tokens (US$) |" in text and "**Headline:**" in text
    assert "always on: 8 replicas" in text and "Fluid prewarm" in text
    assert "## What the replay predicts from each warm tier" in text
    results = json.loads((report / "results.json").read_text())
    assert list(results["tiers"]) == ["cold", "cache-warm", "sleeping", "always-on-1"]
    live, predicted = results["live"], results["predicted"]
    assert live["requests"] == predicted["requests"] > 0
    assert live["served"] > 0 and live["gpu_hours"] > 0 and live["cold_starts"] >= 1
    assert predicted["gpu_hours"] > 0
    for plot in ("replicas.png", "latency.png", "cost.png"):
        assert (report / plot).read_bytes().startswith(b"\x89PNG")
    assert "push: 0 -> 1 replicas" in output  # activation from zero through StreamIsActive
    assert "trace t" in output  # plain log lines when stdout is not a terminal
    for name in ("scaler", "exporter", "gateway", "replica-0"):
        assert (report / "logs" / f"{name}.log").exists()
    # By default the gateway sleeps and wakes replicas by the standby plan of the demo's scaler.
    assert 'warm tier: sleeping replicas (`standby: "true"`' in text
    gateway = yaml.safe_load((report / "config" / "gateway.yaml").read_text())
    scaler = yaml.safe_load((report / "config" / "scaler.yaml").read_text())
    assert gateway["standby-scaler"] and gateway["standby-interval"] == pytest.approx(0.25)
    assert scaler["policy"]["profile"] == "qwen2.5-32b-h200"  # standby prices sleepers by it
    assert live["sleeping_hours"] >= 0 and predicted["sleeping_hours"] >= 0


def _azure_csv(path: Path, seconds: list[int]) -> Path:
    """An Azure LLM trace: one 500-token prompt, 100 tokens out, at each of ``seconds``."""
    rows = [f"2023-11-16 18:{t // 60:02d}:{t % 60:02d}.0000000,500,100" for t in seconds]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_return_from_zero_wakes_the_replica_the_standby_plan_put_to_sleep(
    tmp_path: Path,
) -> None:
    """Two minutes of load, five idle (zero running), one more: the sleeper serves it."""
    trace = _azure_csv(tmp_path / "gap.csv", [*range(120), *range(420, 480)])
    report = tmp_path / "report"
    demo = _demo(report, "--trace", str(trace), "--duration", "25", "--time-compression", "20",
                 "--plain")  # fmt: skip
    output, _ = demo.communicate(timeout=240)
    assert demo.returncode == 0, output
    # two per running replica for bursts (one counted at zero): the plan holds them idle
    assert "scaler: 2 sleeping beside 1 running" in output
    live = json.loads((report / "results.json").read_text())["live"]
    assert live["wakes"] >= 1 and live["sleeping_hours"] > 0
    assert live["failed"] == 0


def _wait_for(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: still false after {limit:.0f}s"
        time.sleep(0.1)


def test_ctrl_c_stops_everything_and_still_reports_what_ran(tmp_path: Path) -> None:
    report = tmp_path / "report"
    demo = _demo(report, "--duration", "60", "--time-compression", "20", "--plain")
    _wait_for(lambda: (report / "logs" / "replica-0.log").exists(), "a replica started")
    demo.send_signal(signal.SIGINT)
    output, _ = demo.communicate(timeout=120)
    assert demo.returncode == 130, output
    assert _ours(report) == []
    assert "**Interrupted:**" in (report / "report.md").read_text()


def test_a_component_that_dies_stops_the_demo_with_its_name_and_log(tmp_path: Path) -> None:
    report = tmp_path / "report"
    demo = _demo(report, "--duration", "60", "--time-compression", "20", "--plain")
    _wait_for(lambda: (report / "logs" / "replica-0.log").exists(), "a replica started")
    exporter = [
        pid for pid in _ours(report) if b"exporter" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(exporter) == 1
    os.kill(exporter[0], signal.SIGKILL)
    output, _ = demo.communicate(timeout=120)
    assert demo.returncode == 1, output
    assert f"exporter (pid {exporter[0]}) exited with status -9" in output
    assert _ours(report) == []


def test_bad_flags_exit_2_with_the_flag_named(tmp_path: Path) -> None:
    demo = _demo(tmp_path / "r", "--profile", "gpt-9")
    output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 2 and "--profile 'gpt-9'" in output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("prompt", "output", "clipped"),
    [
        pytest.param(100, 50, (100, 50), id="a request that fits is sent as it is"),
        pytest.param(1000, 50, (384, 50), id="a long prompt is cut to the prompt limit"),
        pytest.param(300, 400, (300, 200), id="the output is cut to what the context leaves"),
        pytest.param(5000, 400, (384, 116), id="both cut, the prompt first"),
    ],
)
def test_real_vllm_requests_are_clipped_to_the_tiny_models_context(
    prompt: int, output: int, clipped: tuple[int, int]
) -> None:
    from replay.trace import Trace
    from unitscale.demo.load import clip

    trace = Trace("t", np.array([0.0]), np.array([prompt]), np.array([output]))
    out = clip(trace, max_prompt=384, max_total=500)
    assert (int(out.prompt[0]), int(out.output[0])) == clipped


def test_the_replays_unitscale_policy_scales_as_the_recommended_scaled_object() -> None:
    from replay.policies import RECOMMENDED_SPEC

    assert read_scaled_object(yaml.safe_load(RECOMMENDED.read_text())).spec == RECOMMENDED_SPEC
