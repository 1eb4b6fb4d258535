"""Prometheus as a signal source: PromQL per signal, its answers as the exporter's signals.

The pure part (``scaler.promql``) by tables and properties, over golden answers a real
Prometheus gave; then the source itself against Debian's Prometheus scraping simulated
vLLM replicas under load beside our exporter (the same ``decide()`` input from both),
a replica whose metric family is missing, and Prometheus killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import re
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import grpc
import pytest
import trustme
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import ConfigError, StaleSignalError
from foundation.signals import EngineSignals, Snapshot, TargetKey, WindowSignals
from protos.externalscaler import externalscaler_pb2_grpc as keda_grpc
from scaler import server as server_module
from scaler.config import PrometheusSourceConfig, parse_config
from scaler.core import DecisionState, Policy, decide
from scaler.core.model import Observation
from scaler.promql import (
    INSTANT,
    LOAD_SIGNALS,
    PANIC,
    WINDOWED,
    AnswerError,
    answer_value,
    checked_answers,
    format_window,
    plan,
    selector,
    signals_from_answers,
)
from scaler.server import ScalerServer
from scaler.signals import SignalStore, TargetSignals, observe
from scaler.sources import prometheus_source
from tests.conftest import ref
from tests.fake_engines import FakeReplicaServer
from tests.prometheus_stack import (
    DEPLOYMENT,
    NAMESPACE,
    Prometheus,
    ServingStack,
    needs_prometheus,
)
from tests.vllm import server as vllm

GOLDEN = Path(__file__).parent / "golden" / "prometheus"
TARGET: TargetKey = ("team-a", "llama", "")


# --- queries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "template", "model_label", "expected"),
    [
        pytest.param(
            ("team-a", "llama", ""),
            'namespace="$namespace",pod=~"$deployment_regex-[a-z0-9]+-[a-z0-9]+"',
            "model_name",
            (
                'namespace="team-a",pod=~"llama-[a-z0-9]+-[a-z0-9]+"',
                'namespace="team-a",pod=~"llama-[a-z0-9]+-[a-z0-9]+"',
            ),
            id="a target without a model matches its namespace and its Deployment's pods",
        ),
        pytest.param(
            ("team-a", "llama.v2", 'meta/"Llama"\\3'),
            'namespace="$namespace",pod=~"$deployment_regex-.*"',
            "model_name",
            (
                r'namespace="team-a",pod=~"llama\\.v2-.*",model_name="meta/\"Llama\"\\3"',
                r'namespace="team-a",pod=~"llama\\.v2-.*"',
            ),
            id="a dot is escaped for the regex, quotes and backslashes for the string",
        ),
        pytest.param(
            ("team-a", "llama", "m"),
            'service="$deployment",tenant="$namespace"',
            None,
            ('service="llama",tenant="team-a"', 'service="llama",tenant="team-a"'),
            id="no model label configured: the model is not matched",
        ),
        pytest.param(
            ("team-a", "llama", "m"),
            'job="vllm",model="$model"',
            None,
            ('job="vllm",model="m"', 'job="vllm",model="m"'),
            id="the template may match the model itself",
        ),
    ],
)
def test_the_selector_names_the_targets_series(target, template, model_label, expected):
    assert selector(target, template, model_label) == expected


@settings(max_examples=200, deadline=None)
@given(
    model=st.text(min_size=1),
    deployment=st.from_regex(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", fullmatch=True),
)
def test_every_name_is_one_promql_string_that_reads_back_as_itself(model, deployment):
    with_model, _ = selector(("ns", deployment, model), 'pod=~"$deployment_regex"', "model_name")
    pod_matcher, model_matcher = with_model.split(",model_name=", 1)
    # A PromQL double-quoted string takes Go's escapes, which JSON's read the same here.
    assert json.loads(model_matcher, strict=False) == model
    pattern = json.loads(pod_matcher.removeprefix("pod=~"))
    assert re.fullmatch(pattern, deployment)
    assert not re.fullmatch(pattern, deployment + "x")


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        pytest.param(60.0, "60s", id="whole seconds are seconds"),
        pytest.param(1.5, "1500ms", id="a fraction is milliseconds"),
        pytest.param(0.0004, "0s", id="under half a millisecond rounds to nothing"),
    ],
)
def test_a_window_is_a_promql_range(seconds, expected):
    assert format_window(seconds) == expected


def test_every_default_query_is_planned_once_per_window_the_decision_reads():
    config = PrometheusSourceConfig(url="http://prometheus:9090")
    queries = plan(TARGET, config.effective_queries(), config.selector, "model_name", 60, 180)
    keys = [(q.signal, q.window) for q in queries]
    assert keys == [
        *((name, None) for name in INSTANT),
        *((name, "stable") for name in WINDOWED),
        *((name, "panic") for name in PANIC),
    ]
    assert all("$" not in q.promql for q in queries)
    assert all("[180s]" in q.promql for q in queries if q.window == "stable")
    assert all("[60s]" in q.promql for q in queries if q.window == "panic")


def test_a_signal_whose_query_is_null_is_not_asked_for():
    config = parse_config(
        "prometheus-source: {url: 'http://p:9090', queries: {kv-usage: null, ttft-p95: null}}"
    ).prometheus_source
    assert config is not None
    queries = plan(TARGET, config.effective_queries(), config.selector, None, 60, 180)
    assert {q.signal for q in queries} == set(INSTANT + WINDOWED) - {"kv-usage", "ttft-p95"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "{url: 'http://p:9090', queries: {latency: 'x'}}",
            "unknown signal 'latency'",
            id="an unknown signal is named with the known ones",
        ),
        pytest.param(
            "{url: 'http://p:9090', queries: {running: 'sum(x{$labels})'}}",
            "unknown parameter $labels",
            id="an unknown query parameter is named",
        ),
        pytest.param(
            "{url: 'http://p:9090', selector: 'pod=~\"$pod-.*\"'}",
            "prometheus-source.selector",
            id="the selector's parameters are checked too, and the key named",
        ),
        pytest.param(
            "{url: 'http://p:9090', queries: {running: 'x * $'}}",
            "write '$$' for a dollar",
            id="a lone dollar is refused",
        ),
        pytest.param(
            "{url: 'http://p:9090', panic-window: 5m, stable-window: 1m}",
            "stable-window must not be shorter",
            id="a stable window shorter than the panic window is refused",
        ),
        pytest.param(
            "{url: 'http://p:9090', queries: {replicas: null, replicas-up: null}}",
            "'replicas' and 'replicas-up' may not both be null",
            id="both replica counts left unmeasured are refused: they frame every sum",
        ),
        pytest.param(
            "{url: 'prometheus:9090'}",
            "prometheus-source.url",
            id="a url without its scheme is refused",
        ),
        pytest.param(
            '{url: "http://p:9090", headers: {X-Scope-OrgID: "team-a\\r\\nX-Evil: 1"}}',
            "header 'X-Scope-OrgID''s value holds a control character",
            id="a header value with a line break is refused, its value not quoted",
        ),
        pytest.param(
            '{url: "http://p:9090", headers: {"X Org": "a"}}',
            "header name 'X Org' is not an HTTP token",
            id="a header name that is no token is refused",
        ),
    ],
)
def test_a_bad_prometheus_source_config_names_its_problem(text, problem):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"prometheus-source: {text}")
    assert problem in str(caught.value)
    assert "X-Evil" not in str(caught.value)


def test_a_header_with_a_tab_in_its_value_is_kept() -> None:
    config = parse_config(
        'prometheus-source: {url: "http://p:9090", headers: {X-Scope-OrgID: "a\\tb"}}'
    )
    assert config.prometheus_source is not None
    assert config.prometheus_source.headers == {"X-Scope-OrgID": "a\tb"}


def test_a_dollar_written_twice_is_a_dollar():
    config = parse_config(
        "prometheus-source: {url: 'http://p:9090', queries: {running: 'sum(x{a=\"$$1\"})'}}"
    ).prometheus_source
    assert config is not None
    (running,) = [
        q for q in plan(TARGET, config.effective_queries(), "", None, 1, 1) if q.signal == "running"
    ]
    assert running.promql == 'sum(x{a="$1"})'


# --- answers ---------------------------------------------------------------------------


def golden(name: str) -> object:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(golden("sum"), 12.0, id="one series answers its value"),
        pytest.param(golden("absent"), None, id="no series is not measured, not zero"),
        pytest.param(golden("nan-quantile"), None, id="a quantile of no request is not measured"),
        pytest.param(golden("scalar"), 3.0, id="a scalar answers its value"),
        pytest.param(
            {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {}, "value": [1.0, "+Inf"]}]}},
            None,
            id="+Inf (a mean over no request) is not measured, never a number to plan by",
        ),
        pytest.param(
            {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {}, "value": [1.0, "-Inf"]}]}},
            None,
            id="-Inf is not measured",
        ),
    ],
)  # fmt: skip
def test_an_answer_is_one_value_or_none(body, expected):
    assert answer_value(body, "q") == expected


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param(golden("bad-query"), "parse error", id="a refused query says why"),
        pytest.param(golden("two-series"), "2 series", id="an unaggregated query is refused"),
        pytest.param(golden("matrix"), "'matrix'", id="a range vector is refused"),
        pytest.param({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1.0, "x"]}]}}, "malformed", id="a non-number is refused"),
        pytest.param(["not", "an", "object"], "failed", id="a body that is no answer is refused"),
    ],
)  # fmt: skip
def test_an_answer_that_is_not_one_number_names_the_query(body, problem):
    with pytest.raises(AnswerError, match="query 'q'") as caught:
        answer_value(body, "q")
    assert problem in str(caught.value)


def full_answers(value: float = 2.0) -> dict[tuple[str, str | None], float | None]:
    answers: dict[tuple[str, str | None], float | None] = {(name, None): value for name in INSTANT}
    answers[("signal-time", None)] = 1_800_000_000.0
    answers.update({(name, "stable"): value for name in WINDOWED})
    answers.update({(name, "panic"): value for name in PANIC})
    return answers


def with_answers(**changes: float | None) -> dict[tuple[str, str | None], float | None]:
    answers = full_answers()
    for key, value in changes.items():
        name, _, window = key.replace("_", "-").partition("--")
        answers[(name, window or None)] = value
    return answers


def idle_answers(**changes: float | None) -> dict[tuple[str, str | None], float | None]:
    """``with_answers`` where no replica served in the windows and none holds KV: no
    rate, quantile, mean or KV gauge has a series."""
    answers = with_answers(**changes)
    for name, window in list(answers):
        if name in LOAD_SIGNALS and (window is not None or name == "kv-usage"):
            answers[(name, window)] = None
    return answers


@pytest.mark.parametrize(
    ("answers", "check"),
    [
        pytest.param({}, lambda s: s is None, id="no answer at all is no signals"),
        pytest.param(
            dict.fromkeys(full_answers()),
            lambda s: s is None,
            id="every series absent is no signals, not zeros",
        ),
        pytest.param(
            with_answers(signal_time=None),
            lambda s: s is None,
            id="no sample to date them by is no signals",
        ),
        pytest.param(
            with_answers(kv_usage=None),
            lambda s: s.kv_usage is None and s.running == 2.0,
            id="an absent kv usage is missing while the rest is there",
        ),
        pytest.param(
            with_answers(ttft_p95__stable=None),
            lambda s: s.stable.ttft.p95 is None and s.panic.ttft.p95 == 2.0,
            id="a window's absent quantile is missing in that window only",
        ),
        pytest.param(
            idle_answers(replicas=0, replicas_up=0, running=None, queue_depth=None),
            lambda s: s.running == 0.0 and s.stable.request_rate == 0.0 and s.replicas == 0,
            id="zero replicas known is zero load, a fact, as from the exporter",
        ),
        pytest.param(
            with_answers(replicas=3, replicas_up=2),
            lambda s: s.partial and (s.replicas, s.replicas_up) == (3, 2),
            id="fewer replicas up than known is partial",
        ),
        pytest.param(
            with_answers(prompt_token_rate__stable=None),
            lambda s: s.partial and s.stable.prompt_token_rate is None,
            id="a token rate asked for and unanswered while replicas are up is partial",
        ),
        pytest.param(
            with_answers(replicas=None, replicas_up=2),
            lambda s: s.partial and (s.replicas, s.replicas_up) == (None, 2),
            id="replicas known unmeasured: unknown, those up known, and it is partial",
        ),
        pytest.param(
            with_answers(replicas_sleeping=None),
            lambda s: s.replicas_sleeping is None and s.replicas == 2,
            id="engines that do not say whether they sleep leave it unknown",
        ),
        pytest.param(
            with_answers(replicas_sleeping=1.0),
            lambda s: s.replicas_sleeping == 1,
            id="a sleeping engine is counted",
        ),
        pytest.param(
            idle_answers(
                replicas=0, replicas_up=0, replicas_sleeping=None, running=None, queue_depth=None
            ),
            lambda s: s.replicas_sleeping == 0,
            id="zero replicas known sleep none",
        ),
        pytest.param(
            with_answers(replicas=2, replicas_up=2),
            lambda s: not s.partial and s.cost_per_million_tokens is None,
            id="complete signals are not partial and carry no cost (no price here)",
        ),
    ],
)
def test_answers_become_the_exporters_signals(answers, check):
    assert check(signals_from_answers(answers, 60.0, 180.0))


@pytest.mark.parametrize(
    "counts",
    [
        pytest.param({"replicas": math.nan, "replicas_up": 0}, id="count(up) NaN beside none up"),
        pytest.param(
            {"replicas": 1e9, "replicas_up": 0}, id="count(up) of a billion beside none up"
        ),
        pytest.param({"replicas": -1, "replicas_up": 0}, id="count(up) negative beside none up"),
        pytest.param(
            {"replicas": None, "replicas_up": 0}, id="count(up) unanswered beside none up"
        ),
        pytest.param({"replicas": 0, "replicas_up": None}, id="count(up) 0 and sum(up) unanswered"),
        pytest.param({"replicas": 0, "replicas_up": 0}, id="both 0 while requests are served"),
    ],
)
def test_a_replica_count_that_is_no_count_never_scales_a_busy_deployment_to_zero(counts):
    """Requests served at 50/s (3.3 replicas' worth), no gauge of those running or queued:
    a count of 0 read from a refused ``count(up)``'s stand-in, or beside rates above 0,
    is no count, and the load the rates show holds the replicas (issue 27, hostile pass
    10: each was idle, and the deployment went to zero)."""
    answers = with_answers(**counts, running=None, queue_depth=None)
    for window in ("stable", "panic"):  # 50 requests of 1,000 prompt tokens a second
        answers[("request-rate", window)] = 50.0
        answers[("prompt-token-rate", window)] = 50_000.0
        answers[("generation-token-rate", window)] = 10_000.0
    answers[("signal-time", None)] = time.time()  # the store takes no snapshot from ahead
    signals = signals_from_answers(answers, 60.0, 180.0)
    assert signals is not None and signals.partial
    assert signals.stable.request_rate == 50.0
    now = signals.time
    target = ("team-a", "llama", "")
    store = SignalStore()
    store.update(Snapshot(target, signals))
    observation, _ = observe(target, store.get(target), now, 180)
    previous = DecisionState(decisions=50, desired=5, last_activity=now - 600)
    assert decide(observation, Policy(), previous).desired_replicas >= 5


@pytest.mark.parametrize(
    ("served", "named"),
    [
        pytest.param({("ttft-p95", "stable"): 5.0}, "ttft-p95 (stable)", id="a 5 s TTFT p95"),
        pytest.param(
            {("mean-output-tokens", "stable"): 300.0},
            "mean-output-tokens (stable)",
            id="300 output tokens a finished request",
        ),
        pytest.param({("kv-usage", None): 0.8}, "kv-usage", id="KV cache 80% used"),
    ],
)
def test_a_count_of_0_beside_what_only_served_replicas_give_is_no_count(served, named):
    """Hostile pass 12: a count of 0 beside a latency quantile, a request mix or KV in
    use, with no rate or gauge of requests, was taken as no replicas: idle, and to zero
    after the idle grace. Each exists only while a replica serves."""
    answers = {("signal-time", None): time.time(), ("replicas", None): 0.0, **served}
    clean, problems = checked_answers(answers)
    assert clean[("replicas", None)] is None
    assert problems == [f"replicas is 0 beside {named} above 0"]


def _window_value(signals: EngineSignals, window: str, name: str) -> float | None:
    values: WindowSignals = getattr(signals, window)
    if name.endswith("-p95"):
        return values.latency(name.removesuffix("-p95")).p95
    value: float | None = getattr(values, name.replace("-", "_"))
    return value


def _windowed(window: str, name: str) -> Callable[[EngineSignals], float | None]:
    return lambda signals: _window_value(signals, window, name)


ENGINE_FIELDS: dict[tuple[str, str | None], Callable[[EngineSignals], float | None]] = {
    ("queue-depth", None): lambda s: s.queue_depth,
    ("running", None): lambda s: s.running,
    ("kv-usage", None): lambda s: s.kv_usage,
    **{
        (name, window): _windowed(window, name)
        for window, names in (("stable", WINDOWED), ("panic", PANIC))
        for name in names
    },
}


@settings(max_examples=200, deadline=None)
@given(
    present=st.dictionaries(
        st.sampled_from(sorted(ENGINE_FIELDS, key=str)),
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
    ),
    replicas=st.integers(min_value=1, max_value=50),
)
def test_each_signal_is_missing_exactly_when_its_series_is(present, replicas):
    answers = dict.fromkeys(full_answers())
    answers.update(present)
    answers[("signal-time", None)] = 1_800_000_000.0
    answers[("replicas", None)] = answers[("replicas-up", None)] = float(replicas)
    signals = signals_from_answers(answers, 60.0, 180.0)
    assert signals is not None
    for key, read in ENGINE_FIELDS.items():
        assert read(signals) == present.get(key), key
    # And decide()'s input keeps it so: a missing signal is None there too, never 0.
    observation, _ = observe(TARGET, TargetSignals(1, signals), 1_800_000_001.0, 30.0)
    assert (observation.queue_depth is None) == (("queue-depth", None) not in present)
    assert (observation.ttft_p95_seconds is None) == (("ttft-p95", "stable") not in present)


# --- against a real Prometheus ---------------------------------------------------------


def pod_labels(
    addresses: Sequence[str],
    path: str = "/metrics",
    namespace: str = "team-a",
    deployment: str = "llama",
) -> dict[str, dict[str, str]]:
    """Each replica labelled as Kubernetes service discovery labels a Deployment's pod."""
    return {
        address: {
            "namespace": namespace,
            "pod": f"{deployment}-5d8f9c-r{index}",
            "__metrics_path__": path,
        }
        for index, address in enumerate(addresses)
    }


async def prometheus_over(
    directory: Path, replicas: Sequence[FakeReplicaServer], scrape_interval: str = "250ms"
) -> Prometheus:
    """A real Prometheus scraping fake vLLM replicas as one Deployment's pods."""
    addresses = [f"127.0.0.1:{r.port}" for r in replicas]
    return await Prometheus.start(
        directory,
        {"vllm": addresses},
        scrape_interval=scrape_interval,
        target_labels=pod_labels(addresses, "/r0/metrics"),
    )


def source_config(url: str, **overrides: object) -> dict[str, object]:
    """The scaler's ``prometheus-source`` for tests: fast rounds, windows of seconds."""
    return {
        "url": url,
        "interval": "250ms",
        "timeout": "2s",
        "panic-window": "2s",
        "stable-window": "4s",
        **overrides,
    }


async def drain(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def engine_of(store: SignalStore, target: TargetKey = TARGET) -> EngineSignals | None:
    signals = store.get(target)
    return signals.engine if signals is not None else None


async def engine_signals_until(
    store: SignalStore,
    done: Callable[[EngineSignals], bool],
    within: float = 30.0,
    target: TargetKey = TARGET,
) -> EngineSignals:
    """Poll the store until its engine signals satisfy ``done``; the last ones named."""
    deadline = time.monotonic() + within
    while True:
        engine = engine_of(store, target)
        if engine is not None and done(engine):
            return engine
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within:g}s; last signals: {engine}")
        await asyncio.sleep(0.05)


class WithoutFamily(FakeReplicaServer):
    """Fake replicas whose ``/metrics`` lack one metric family (an engine without it)."""

    def __init__(self, count: int, family: str) -> None:
        super().__init__(count)
        self.family = family

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        replica = self.replicas[int(request.match_info["index"])]
        lines = replica.body().splitlines(keepends=True)
        kept = "".join(line for line in lines if self.family not in line)
        return web.Response(text=kept, content_type="text/plain")


@needs_prometheus
async def test_a_family_an_engine_lacks_is_missing_and_idle_latency_unmeasured(tmp_path):
    replicas = [await WithoutFamily(1, "vllm:kv_cache_usage_perc").start() for _ in range(2)]
    replicas[0].replicas[0].set_load(running=3, waiting=1, kv=0.5)
    replicas[1].replicas[0].set_load(running=2, waiting=0, kv=0.5)
    prometheus = await prometheus_over(tmp_path, replicas)
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(source_config(prometheus.url))
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        # Two scrapes of each replica at least: rates need two samples in the window.
        engine = await engine_signals_until(store, lambda e: e.stable.request_rate is not None)
    finally:
        await drain(task)
        await prometheus.stop()
        for server in replicas:
            await server.stop()
    assert (engine.replicas, engine.replicas_up, engine.partial) == (2, 2, False)
    assert (engine.running, engine.queue_depth) == (5.0, 1.0)
    assert engine.kv_usage is None  # the family is not there: not measured, not 0
    # Nothing finished: the counters say 0 (a fact), the quantiles and means say nothing.
    assert engine.stable.request_rate == 0.0
    assert engine.stable.ttft.p95 is None and engine.stable.itl.p95 is None
    assert engine.stable.mean_prompt_tokens is None


# Fields of decide()'s input that only the exporter can fill: it knows the price.
EXPORTER_ONLY = {"cost_per_million_tokens"}
# (field, relative tolerance): the two sources measure the same replicas over windows
# that end up to a scrape apart; Prometheus's rate() also extrapolates to the window's
# ends. The panic window is 2 s of 500 ms scrapes: the noisiest. (Measured: 2-4% apart.)
CLOSE = [
    ("request_rate", 0.2),
    ("prompt_token_rate", 0.2),
    ("generation_token_rate", 0.2),
    ("prompt_token_rate_panic", 0.4),
    ("generation_token_rate_panic", 0.4),
    ("mean_prompt_tokens", 0.02),
    ("mean_output_tokens", 0.05),
    ("ttft_p95_seconds", 0.3),
    ("inter_token_p95_seconds", 0.3),
]


def measured(observation: Observation) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(observation)
        if getattr(observation, f.name) is not None and f.name not in ("now", "signal_time")
    }


async def both_measure(
    stores: Sequence[SignalStore], target: TargetKey, since: float, within: float = 60.0
) -> list[EngineSignals]:
    """Poll until every store holds engine signals with finished requests in their stable
    window, measured at ``since`` or later."""
    deadline = time.monotonic() + within
    while True:
        engines = [engine_of(store, target) for store in stores]
        found = [e for e in engines if e is not None and e.stable.request_rate and e.time >= since]
        if len(found) == len(stores):
            return found
        assert time.monotonic() < deadline, f"no signals under load: {engines}"
        await asyncio.sleep(0.1)


@needs_prometheus
async def test_prometheus_and_the_exporter_give_decide_the_same_observation(tmp_path):
    stack = await ServingStack.start()
    jobs = stack.scrape_jobs()
    labels = pod_labels(jobs["vllm"], namespace=NAMESPACE, deployment=DEPLOYMENT)
    prometheus = await Prometheus.start(tmp_path, {"vllm": jobs["vllm"]}, target_labels=labels)
    await stack.serve()
    target: TargetKey = (NAMESPACE, DEPLOYMENT, "")
    store = SignalStore()
    windows = {"panic-window": "2s", "stable-window": "6s"}  # the stack's exporter's
    config = PrometheusSourceConfig.model_validate(source_config(prometheus.url, **windows))
    task = asyncio.create_task(prometheus_source(config, store, lambda: [target]))
    try:
        # Under load until both stable windows are full of it (the stack's clients run):
        # signals measured a stable window after both first saw finished requests.
        stores = [store, stack.scaler.store]
        loaded = max(e.time for e in await both_measure(stores, target, since=0.0))
        ours, theirs = await both_measure(stores, target, since=loaded + 6.0)
    finally:
        await drain(task)
        await prometheus.stop()
        await stack.stop()
    now = max(ours.time, theirs.time)
    from_prometheus, _ = observe(target, TargetSignals(1, ours), now, 30.0)
    from_exporter, _ = observe(target, TargetSignals(1, theirs), now, 30.0)
    assert measured(from_prometheus) == measured(from_exporter) - EXPORTER_ONLY
    assert (from_prometheus.replicas_known, from_prometheus.replicas_up) == (2, 2)
    assert (from_exporter.replicas_known, from_exporter.replicas_up) == (2, 2)
    assert ours.replicas_sleeping == theirs.replicas_sleeping == 0  # the sim's engines are awake
    for name, tolerance in CLOSE:
        mine, exported = getattr(from_prometheus, name), getattr(from_exporter, name)
        assert mine == pytest.approx(exported, rel=tolerance), (name, mine, exported)
    for name in ("queue_depth", "requests_running"):  # 4 clients: at most 4 in flight
        assert 0 <= getattr(from_prometheus, name) <= 4, name
    assert from_prometheus.kv_cache_usage == pytest.approx(from_exporter.kv_cache_usage, abs=0.01)
    # A gauge's mean over the window: the exporter averages its 12 scrapes, Prometheus
    # its own 12, taken at other instants, of a gauge that is mostly 0 or 1 here (requests
    # last milliseconds). Two independent samples of it need not be close (measured:
    # 1.08/1.58, 1.0/1.17, 1.33/0.33, 0.08/1.75), so both are checked to be known and in
    # the clients' range; the decision below is what must agree.
    mine, exported = from_prometheus.requests_running_mean, from_exporter.requests_running_mean
    assert mine is not None and exported is not None
    assert 0 <= mine <= 4 and 0 <= exported <= 4, (mine, exported)
    # And decide() makes the same decision of either.
    policy = Policy(target_concurrency=1.0)
    first = decide(from_prometheus, policy, DecisionState())
    second = decide(from_exporter, policy, DecisionState())
    assert first.desired_replicas == second.desired_replicas


class FakePrometheus:
    """An HTTP API on 127.0.0.1 that answers every query as its ``mode`` says."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.queries = 0
        self.enough = 0
        self.authorization: str | None = None
        """The Authorization header every query must carry (None: none)."""
        self.authorized = 0
        self.delay = 0.0
        """Seconds each query takes before its answer."""
        self.asked_enough = asyncio.Event()
        """Set once ``enough`` queries have come."""
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, tls: ssl.SSLContext | None = None) -> FakePrometheus:
        app = web.Application()
        app.router.add_get("/prefix/api/v1/query", self._query)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=tls).start()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://localhost:{self.runner.addresses[0][1]}/prefix/"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _query(self, request: web.Request) -> web.StreamResponse:
        self.queries += 1
        if self.queries >= self.enough:
            self.asked_enough.set()
        if self.mode == "401" or request.headers.get("Authorization") != self.authorization:
            return web.Response(status=401, text="Unauthorized\n")
        self.authorized += 1
        await asyncio.sleep(self.delay)
        if self.mode == "503":
            return web.Response(status=503, text="Service Unavailable: querier overloaded")
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "html":
            return web.Response(text="<html>a login page</html>", content_type="text/html")
        if self.mode == "two-series":
            return web.json_response(golden("two-series"))
        if self.mode == "bad-query":
            return web.json_response(golden("bad-query"), status=400)
        if self.mode == "later":  # every signal, its time too, now: newer than 12
            now = str(int(time.time()))
            later = {"metric": {}, "value": [float(now), now]}
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": [later]}}
            )
        if "engine_sleep_state" in request.query["query"]:  # none asleep beside 12 running
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": []}}
            )
        return web.json_response(golden("sum"))


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        pytest.param("503", "answered 503: Service Unavailable", id="a 5xx publishes nothing"),
        pytest.param("hang", "TimeoutError", id="a query past the timeout publishes nothing"),
        pytest.param("html", "200 text/html, not JSON", id="an answer not JSON publishes nothing"),
        pytest.param("401", "answered 401: Unauthorized", id="a refusal publishes nothing"),
        pytest.param("two-series", "aggregate it", id="an unaggregated query publishes nothing"),
        pytest.param("bad-query", "parse error", id="a query Prometheus refuses publishes nothing"),
    ],
)
async def test_a_failing_round_publishes_nothing_and_is_logged_once(mode, logged, caplog):
    caplog.set_level(logging.INFO, logger="scaler.sources")
    server = await FakePrometheus().start()
    server.mode, server.enough = mode, 3 * len(INSTANT)  # three rounds at least
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(
        # A short timeout for the query that hangs only: a loaded machine is slow.
        source_config(server.url, interval="20ms", timeout="300ms" if mode == "hang" else "10s")
    )
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        async with asyncio.timeout(30):
            await server.asked_enough.wait()
        assert store.get(TARGET) is None  # its signals age: KEDA gets UNAVAILABLE
        server.mode = "ok"
        engine = await engine_signals_until(store, lambda e: True)
    finally:
        await drain(task)
        await server.stop()
    assert engine.running == 12.0
    messages = [r.getMessage() for r in caplog.records if r.name == "scaler.sources"]
    warnings = [m for m in messages if m.startswith("no signals")]
    assert len(warnings) == 1 and logged in warnings[0], messages
    assert any(m.startswith("querying signals for team-a/llama") for m in messages)


@needs_prometheus
async def test_names_prometheus_must_quote_select_only_their_own_pods(tmp_path):
    replicas = [await FakeReplicaServer(1).start() for _ in range(3)]
    addresses = [f"127.0.0.1:{r.port}" for r in replicas]
    pods = ["llama.v2-5d8f9c-r0", "llamaxv2-5d8f9c-r1", "llama.v2-extra-5d8f9c-r2"]
    labels = {
        address: {"namespace": "team-a", "pod": pod, "__metrics_path__": "/r0/metrics"}
        for address, pod in zip(addresses, pods, strict=True)
    }
    prometheus = await Prometheus.start(
        tmp_path, {"vllm": addresses}, scrape_interval="250ms", target_labels=labels
    )
    config = PrometheusSourceConfig.model_validate(source_config(prometheus.url))
    dotted: TargetKey = ("team-a", "llama.v2", "")
    quoted: TargetKey = ("team-a", "llama.v2", 'tiny-llama"}) or vector(1) # \\\n')
    modelled: TargetKey = ("team-a", "llama.v2", "tiny-llama")
    store = SignalStore()
    targets = [dotted, quoted, modelled]
    task = asyncio.create_task(prometheus_source(config, store, lambda: targets))
    try:
        await prometheus.wait_for('count(up{namespace="team-a"}) == 3')
        dotted_engine = await engine_signals_until(store, lambda e: True, target=dotted)
        modelled_engine = await engine_signals_until(store, lambda e: True, target=modelled)
        # The model's quotes stay inside its string: a query, not an injection, and no
        # series carries that model.
        first = plan(quoted, config.effective_queries(), config.selector, "model_name", 2, 4)[0]
        answers = await prometheus.query(first.promql)
    finally:
        await drain(task)
        await prometheus.stop()
        for server in replicas:
            await server.stop()
    # The dot is a dot, not any character; the pod hash pattern keeps llama.v2-extra out.
    assert (dotted_engine.replicas, dotted_engine.replicas_up) == (1, 1)
    assert modelled_engine.replicas == 1 and modelled_engine.running == 0.0
    assert answers == []
    assert store.get(quoted) is None


async def test_a_reloaded_prometheus_source_queries_as_the_new_config_says():
    first, second = await FakePrometheus().start(), await FakePrometheus().start()
    second.mode = "later"
    text = "prometheus-source: {{url: '{}', interval: 20ms, timeout: 10s}}\n"
    server = ScalerServer(parse_config(text.format(first.url)))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            with contextlib.suppress(grpc.aio.AioRpcError):  # KEDA names the target
                await stub.IsActive(ref())
        await engine_signals_until(server.store, lambda e: e.running == 12.0)
        assert server.configs.update(text.format(second.url), "reloaded")
        # The second answers times as values: a running count that large is unmeasured
        # (foundation.signals.MAX_REQUESTS), an unbounded gauge tells it apart.
        await engine_signals_until(server.store, lambda e: (e.kv_usage or 0) > 1e9)
        asked_before = first.queries
        second.enough, second.asked_enough = second.queries + 3 * len(INSTANT), asyncio.Event()
        async with asyncio.timeout(30):
            await second.asked_enough.wait()
        assert first.queries == asked_before  # the old rounds stopped
        assert server.configs.update("{}\n", "removed")
        assert server.config.prometheus_source is None
    finally:
        await server.stop(grace=0)
        await first.stop()
        await second.stop()


async def test_a_source_reloaded_faster_than_its_queries_answer_still_publishes():
    """Each reload cancelled the queries under way: a header flapping faster than
    Prometheus answered left no signals at all, KEDA UNAVAILABLE (hostile pass 62)."""
    prometheus = await FakePrometheus().start()
    prometheus.delay = 0.3
    text = "prometheus-source: {{url: '{}', interval: 20ms, timeout: 10s, headers: {{X: '{}'}}}}\n"
    server = ScalerServer(parse_config(text.format(prometheus.url, 0)))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            with contextlib.suppress(grpc.aio.AioRpcError):  # KEDA names the target
                await stub.IsActive(ref())

        async def flap() -> None:
            for i in range(1, 100_000):
                assert server.configs.update(text.format(prometheus.url, i), "flapping")
                await asyncio.sleep(0.1)

        flapping = asyncio.create_task(flap())
        try:
            await engine_signals_until(server.store, lambda e: e.running == 12.0)
        finally:
            flapping.cancel()
            await asyncio.gather(flapping, return_exceptions=True)
        assert server.problem() is None  # a drained source is no loop that stopped
    finally:
        await server.stop(grace=0)
        await prometheus.stop()


async def test_a_source_replaced_is_replaced_again_only_after_the_gap(monkeypatch):
    """Replaced at every reload, rounds longer than the reloads never ended (no signals),
    and queries left to finish beside the new ones piled up (hostile pass 63)."""
    monkeypatch.setattr(server_module, "PROMETHEUS_RESTART_GAP", 1.0)
    first, second, third = [await FakePrometheus().start() for _ in range(3)]
    text = "prometheus-source: {{url: '{}', interval: 20ms, timeout: 10s}}\n"
    server = ScalerServer(parse_config(text.format(first.url)))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = keda_grpc.ExternalScalerStub(channel)
            with contextlib.suppress(grpc.aio.AioRpcError):  # KEDA names the target
                await stub.IsActive(ref())
        assert server.configs.update(text.format(second.url), "first change")
        assert server._prometheus is not None and server._prometheus[0].url == second.url
        assert server.configs.update(text.format(third.url), "second change")
        # In force, but the source replaced a moment ago runs on until the gap passes.
        assert server._prometheus[0].url == second.url
        await until(lambda: third.queries > 0, "the newest config queried after the gap")
        asked = second.queries
        await until(lambda: third.queries > 3 * len(INSTANT), "rounds of the newest")
        assert second.queries <= asked + len(INSTANT)  # at most a round under way
    finally:
        await server.stop(grace=0)
        for prometheus in (first, second, third):
            await prometheus.stop()


async def test_a_source_removed_and_added_back_within_the_gap_runs_on():
    """Removed at once and added back, it restarted at every reload: rounds longer than
    the reloads never ended, no signals (hostile pass 64)."""
    prometheus = await FakePrometheus().start()
    text = f"prometheus-source: {{url: '{prometheus.url}', interval: 20ms, timeout: 10s}}\n"
    server = ScalerServer(parse_config(text))
    await server.start()
    try:
        assert server._prometheus is not None
        running = server._prometheus[1]
        for _ in range(5):
            assert server.configs.update("{}\n", "removed")
            assert server.configs.update(text, "added back")
        assert server._prometheus[1] is running and not running.done()
    finally:
        await server.stop(grace=0)
        await prometheus.stop()


async def until(predicate: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {within:g}s"
        await asyncio.sleep(0.02)


async def test_the_bearer_token_is_read_every_round_and_never_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="scaler.sources")
    token = tmp_path / "token"
    token.write_text("s3cret-one\n")
    server = await FakePrometheus().start()
    server.authorization = "Bearer s3cret-one"
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(
        source_config(server.url, interval="20ms", **{"bearer-token-file": str(token)})
    )
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        await engine_signals_until(store, lambda e: True)
        server.authorization = "Bearer s3cret-two"  # the token rotated: the file follows
        token.write_text("s3cret-two")
        seen = server.authorized
        await until(lambda: server.authorized > seen + len(INSTANT), "queries on the new token")
        token.unlink()
        await until(
            lambda: any("cannot read bearer-token-file" in r.getMessage() for r in caplog.records),
            "the missing token logged",
        )
    finally:
        await drain(task)
        await server.stop()
    assert not any("s3cret" in r.getMessage() for r in caplog.records)


async def test_an_https_url_is_verified_by_the_configured_ca(tmp_path, caplog):
    authority = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(tls)
    (tmp_path / "ca.pem").write_bytes(authority.cert_pem.bytes())
    server = await FakePrometheus().start(tls)
    trusting, untrusting = SignalStore(), SignalStore()
    fast = {"interval": "20ms"}
    trusted = source_config(server.url, **fast, **{"ca-file": str(tmp_path / "ca.pem")})
    tasks = [
        asyncio.create_task(prometheus_source(PrometheusSourceConfig.model_validate(c), s, t))
        for c, s, t in (
            (trusted, trusting, lambda: [TARGET]),
            (source_config(server.url, **fast), untrusting, lambda: [TARGET]),
        )
    ]
    try:
        await engine_signals_until(trusting, lambda e: True)
        await until(
            lambda: any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records),
            "the system's CAs refusing our test CA",
        )
    finally:
        for task in tasks:
            await drain(task)
        await server.stop()
    assert untrusting.get(TARGET) is None


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(None, id="a CA file that is not there is a config error"),
        pytest.param(b"not a certificate", id="a CA file that holds no PEM is a config error"),
    ],
)
def test_a_bad_ca_file_is_a_config_error_naming_it(tmp_path, content):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        parse_config(f"prometheus-source: {{url: 'https://p:9090', ca-file: '{path}'}}")
    assert "prometheus-source.ca-file" in str(caught.value) and str(path) in str(caught.value)


@needs_prometheus
async def test_the_signals_are_as_old_as_the_scrape_not_as_the_query(tmp_path):
    replicas = [await FakeReplicaServer(1).start()]
    replicas[0].replicas[0].set_load(running=4, waiting=0, kv=0.1)
    prometheus = await prometheus_over(tmp_path, replicas, scrape_interval="3s")
    store = SignalStore()
    seen: list[tuple[float, float]] = []  # (signal time, wall time when published)

    def published(target: TargetKey) -> None:
        engine = engine_of(store, target)
        assert engine is not None
        seen.append((engine.time, time.time()))

    store.add_listener(published)
    config = PrometheusSourceConfig.model_validate(source_config(prometheus.url, interval="50ms"))
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        await until(lambda: len({t for t, _ in seen}) >= 3, "three scrapes", within=60)
    finally:
        await drain(task)
        await prometheus.stop()
        await replicas[0].stop()
    times = sorted({t for t, _ in seen})
    # Many rounds, one time per scrape: the sample's time, not the evaluation's.
    assert len(seen) > 2 * len(times)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(2.5 < gap < 3.5 for gap in gaps), gaps
    oldest_age = max(wall - signal for signal, wall in seen)
    assert oldest_age > 2.0  # just before the next scrape the signals are ~3 s old
    # And observe() calls them what they are past a max-signal-age shorter than that.
    signal, wall = max(seen, key=lambda pair: pair[1] - pair[0])
    engine = signals_from_answers(full_answers(), 60, 180)
    assert engine is not None
    stale = dataclasses.replace(engine, time=signal)
    with pytest.raises(StaleSignalError):
        observe(TARGET, TargetSignals(1, stale), wall, 1.0)


async def test_a_ca_file_gone_after_validation_stops_the_source_with_an_error(tmp_path, caplog):
    path = tmp_path / "ca.pem"
    path.write_bytes(trustme.CA().cert_pem.bytes())
    config = PrometheusSourceConfig.model_validate(
        source_config("https://localhost:1/", **{"ca-file": str(path)})
    )
    path.unlink()
    store = SignalStore()
    async with asyncio.timeout(10):
        await prometheus_source(config, store, lambda: [TARGET])  # returns: nothing to run
    assert store.get(TARGET) is None
    assert any("cannot load ca-file" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def real_vllm(tmp_path_factory):
    python = vllm.require_vllm()
    work = tmp_path_factory.mktemp("vllm")
    model = vllm.build_model(python, work / "model")
    server = vllm.start(python, model, work / "vllm.log")
    yield server
    server.stop()


@needs_prometheus
@pytest.mark.vllm
@pytest.mark.timeout(600)  # vLLM's start on two busy cores (the fixture's), then seconds
async def test_the_prometheus_source_reads_a_real_vllm(real_vllm, tmp_path):
    address = real_vllm.url.removeprefix("http://")
    labels = pod_labels([address], namespace="test", deployment="tiny")
    prometheus = await Prometheus.start(
        tmp_path, {"vllm": [address]}, scrape_interval="1s", target_labels=labels
    )
    target: TargetKey = ("test", "tiny", "")
    store = SignalStore()
    windows = {"panic-window": "30s", "stable-window": "2m", "timeout": "20s"}
    config = PrometheusSourceConfig.model_validate(source_config(prometheus.url, **windows))
    task = asyncio.create_task(prometheus_source(config, store, lambda: [target]))
    body = {"model": vllm.MODEL_NAME, "prompt": "hello world", "max_tokens": 8}
    body |= {"ignore_eos": True, "temperature": 0}
    try:
        # Prometheus has seen the idle engine before the first request. A round of
        # queries can straddle its first scrape (some series there, others not yet: a
        # partial reading, as a CI run on busy cores met): wait for a whole one.
        idle = await engine_signals_until(store, lambda e: not e.partial, within=60, target=target)
        async with aiohttp.ClientSession() as session:
            usages = []
            for _ in range(4):
                async with session.post(f"{real_vllm.url}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    usages.append((await r.json())["usage"])
        busy = await engine_signals_until(
            store, lambda e: e.stable.mean_output_tokens is not None, within=90, target=target
        )
    finally:
        await drain(task)
        await prometheus.stop()
    assert (idle.replicas, idle.replicas_up, idle.partial) == (1, 1, False)
    assert idle.stable.ttft.p95 is None  # nothing finished yet: unmeasured, not 0
    assert busy.running is not None and busy.queue_depth is not None
    assert busy.kv_usage is not None  # vllm:kv_cache_usage_perc (0.32)
    assert busy.replicas_sleeping == 0  # awake
    assert busy.stable.request_rate is not None and busy.stable.request_rate > 0
    assert busy.stable.mean_output_tokens == pytest.approx(8.0)
    assert busy.stable.mean_prompt_tokens == pytest.approx(usages[0]["prompt_tokens"])
    assert busy.stable.ttft.p95 is not None and busy.stable.itl.p95 is not None
