"""Prometheus as a signal source: PromQL per signal, its answers as the exporter's signals.

The pure part (``scaler.promql``) by tables and properties, over golden answers a real
Prometheus gave; then the source itself against Debian's Prometheus scraping simulated
vLLM replicas under load beside our exporter (the same ``decide()`` input from both),
a replica whose metric family is missing, and Prometheus killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import ConfigError
from foundation.signals import EngineSignals, TargetKey, WindowSignals
from scaler.config import PrometheusSourceConfig, parse_config
from scaler.promql import (
    INSTANT,
    PANIC,
    WINDOWED,
    AnswerError,
    answer_value,
    format_window,
    plan,
    selector,
    signals_from_answers,
)
from scaler.signals import SignalStore, TargetSignals, observe

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
            "{url: 'prometheus:9090'}",
            "prometheus-source.url",
            id="a url without its scheme is refused",
        ),
    ],
)
def test_a_bad_prometheus_source_config_names_its_problem(text, problem):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"prometheus-source: {text}")
    assert problem in str(caught.value)


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
            math.inf,
            id="+Inf is kept (a cost of nothing served)",
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
            with_answers(replicas=0, replicas_up=0, running=None, request_rate__stable=None),
            lambda s: s.running == 0.0 and s.stable.request_rate == 0.0 and s.replicas == 0,
            id="zero replicas known is zero load, a fact, as from the exporter",
        ),
        pytest.param(
            with_answers(replicas=3, replicas_up=2),
            lambda s: s.partial and (s.replicas, s.replicas_up) == (3, 2),
            id="fewer replicas up than known is partial",
        ),
        pytest.param(
            with_answers(replicas=None, replicas_up=2),
            lambda s: s.partial and (s.replicas, s.replicas_up) == (2, 2),
            id="replicas known unmeasured: those up are known, and it is partial",
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


async def drain(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def engine_of(store: SignalStore, target: TargetKey = TARGET) -> EngineSignals | None:
    signals = store.get(target)
    return signals.engine if signals is not None else None
