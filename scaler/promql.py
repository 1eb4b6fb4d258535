"""Prometheus as a signal source, the pure part: PromQL per signal, and answers to signals.

The scaler can read a deployment's engine signals from PromQL over vLLM's own metrics
instead of from our exporter. Each signal the decision reads has a query template:
``$selector`` is the target's label matchers (the config's ``selector``, a template over
``$namespace``, ``$deployment``, ``$deployment_regex`` and ``$model``, plus the model's
label when the target names one), ``$replica_selector`` the same without the model (for
``up``, which carries no model label), ``$window`` the panic or stable window (``60s``).
``scaler.sources.prometheus_source`` runs the queries and hands the answers to
``signals_from_answers``, which builds the ``EngineSignals`` the exporter publishes: an
absent series is a missing signal (None), never zero; no fresh sample at all is no
signals. An answer is checked where it comes in (``parse_answer``, ``checked_answers``):
a body that is not JSON of bounded size and depth, or not one sample, is an error naming
the query; a value that is not finite, negative, or a replica count of 0 beside running
requests is unmeasured with a reason, never a zero that lowers the replica count.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from string import Template
from typing import Any

from foundation.errors import quote
from foundation.signals import (
    MAX_REPLICAS,
    EngineSignals,
    Quantiles,
    TargetKey,
    WindowSignals,
)

INSTANT = (
    "signal-time",
    "replicas",
    "replicas-up",
    "replicas-sleeping",
    "queue-depth",
    "running",
    "kv-usage",
)
"""Signals of one instant (no ``$window``)."""

WINDOWED = (
    "request-rate",
    "prompt-token-rate",
    "generation-token-rate",
    "ttft-p95",
    "itl-p95",
    "mean-prompt-tokens",
    "mean-output-tokens",
    "running-mean",
)
"""Signals over a window: each is asked for the stable window."""

PANIC = ("prompt-token-rate", "generation-token-rate", "ttft-p95")
"""The windowed signals the decision also reads over the panic window."""

SIGNALS = INSTANT + WINDOWED

REPLICA_COUNTS = ("replicas", "replicas-up", "replicas-sleeping")
"""Signals that count replicas: at most ``MAX_REPLICAS`` each."""
LOAD_SIGNALS = frozenset(
    {
        "running",
        "queue-depth",
        "replicas-up",
        "kv-usage",
        "request-rate",
        "prompt-token-rate",
        "generation-token-rate",
        "running-mean",
        "ttft-p95",
        "itl-p95",
        "mean-prompt-tokens",
        "mean-output-tokens",
    }
)
"""Signals above 0 only where some replica serves: beside them a count of 0 is no count
(a rate, a latency quantile or a mean over the window exists only while a replica served
in it, and the idle grace outlasts the window before a scale to zero). Quantiles, means
and the KV gauge since hostile pass 12: a count of 0 beside a 5 s TTFT alone was idle."""


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{$selector}}[$window])))"


def _mean_per_request(histogram: str) -> str:
    return (
        f"sum(rate({histogram}_sum{{$selector}}[$window]))"
        f" / sum(rate({histogram}_count{{$selector}}[$window]))"
    )


DEFAULT_SELECTOR = 'namespace="$namespace",pod=~"$deployment_regex-[a-z0-9]+-[a-z0-9]+"'
"""A Deployment's pods (``<deployment>-<replicaset hash>-<pod hash>``) in its namespace,
as the Prometheus Operator's PodMonitor and the usual kubernetes_sd relabelling label them."""

DEFAULT_QUERIES: Mapping[str, str] = {
    # The oldest replica's newest sample: signals are as old as that.
    "signal-time": "min(timestamp(vllm:num_requests_running{$selector}))",
    "replicas": "count(up{$replica_selector})",
    "replicas-up": "sum(up{$replica_selector})",
    # Engines not awake (vLLM sleep mode); absent before vLLM ~0.11, so unknown there.
    "replicas-sleeping": 'sum(vllm:engine_sleep_state{$selector,sleep_state="awake"} == bool 0)',
    "queue-depth": "sum(vllm:num_requests_waiting{$selector})",
    "running": "sum(vllm:num_requests_running{$selector})",
    # vLLM before 0.9.2 names it gpu_cache_usage_perc (removed in 0.12).
    "kv-usage": (
        "avg(vllm:kv_cache_usage_perc{$selector}) or avg(vllm:gpu_cache_usage_perc{$selector})"
    ),
    "request-rate": "sum(rate(vllm:request_success_total{$selector}[$window]))",
    "prompt-token-rate": "sum(rate(vllm:prompt_tokens_total{$selector}[$window]))",
    "generation-token-rate": "sum(rate(vllm:generation_tokens_total{$selector}[$window]))",
    "ttft-p95": _quantile(0.95, "vllm:time_to_first_token_seconds"),
    # vLLM before 0.11 has only time_per_output_token_seconds (removed in ~0.15).
    "itl-p95": (
        f"{_quantile(0.95, 'vllm:inter_token_latency_seconds')}"
        f" or {_quantile(0.95, 'vllm:time_per_output_token_seconds')}"
    ),
    "mean-prompt-tokens": _mean_per_request("vllm:request_prompt_tokens"),
    "mean-output-tokens": _mean_per_request("vllm:request_generation_tokens"),
    # Each replica's mean over the window, summed: the exporter's gauge mean.
    "running-mean": "sum(avg_over_time(vllm:num_requests_running{$selector}[$window]))",
}

SELECTOR_PARAMETERS = ("namespace", "deployment", "deployment_regex", "model")
QUERY_PARAMETERS = ("selector", "replica_selector", "window")


class TemplateError(ValueError):
    """A query or selector template names a parameter that does not exist."""


def check_template(text: str, parameters: tuple[str, ...], what: str) -> str:
    """``text`` if it is a template over ``parameters`` only.

    Raises:
        TemplateError: an unknown ``$name`` or a lone ``$`` (``$$`` is a dollar).
    """
    template = Template(text)
    if not template.is_valid():
        raise TemplateError(f"{what}: a '$' that starts no parameter (write '$$' for a dollar)")
    unknown = sorted(set(template.get_identifiers()) - set(parameters))
    if unknown:
        known = ", ".join(f"${p}" for p in parameters)
        raise TemplateError(f"{what}: unknown parameter ${unknown[0]} (known: {known})")
    return text


def _string(value: str) -> str:
    """``value`` as the inside of a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(target: TargetKey, template: str, model_label: str | None) -> tuple[str, str]:
    """The label matchers of ``target``'s series, with and without its model matched.

    The model is matched on ``model_label`` when the target names one; the second
    selector leaves it out, for per-pod series such as ``up``.

    Values are quoted for PromQL strings; ``$deployment_regex`` is the name with regex
    metacharacters escaped too (a Deployment name may hold dots).
    """
    namespace, deployment, model = target
    matchers = Template(template).substitute(
        namespace=_string(namespace),
        deployment=_string(deployment),
        deployment_regex=_string(re.escape(deployment)),
        model=_string(model),
    )
    if model and model_label:
        return f'{matchers},{model_label}="{_string(model)}"', matchers
    return matchers, matchers


def format_window(seconds: float) -> str:
    """A PromQL range: whole milliseconds (``90s``, ``1500ms``)."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def render(template: str, matchers: tuple[str, str], window: float | None = None) -> str:
    """A query template with its selectors and (for windowed signals) window filled in."""
    values = {"selector": matchers[0], "replica_selector": matchers[1]}
    if window is not None:
        values["window"] = format_window(window)
    return Template(template).safe_substitute(values)


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query to run for one target: which signal, over which window."""

    signal: str
    window: str | None
    """``panic``, ``stable`` or None for an instant signal."""
    promql: str


def plan(
    target: TargetKey,
    queries: Mapping[str, str | None],
    selector_template: str,
    model_label: str | None,
    panic_seconds: float,
    stable_seconds: float,
) -> list[Query]:
    """Every query to run for ``target``; a signal whose query is None is not asked for."""
    matchers = selector(target, selector_template, model_label)
    planned = [
        Query(name, None, render(text, matchers))
        for name in INSTANT
        if (text := queries.get(name)) is not None
    ]
    for window, seconds, names in (
        ("stable", stable_seconds, WINDOWED),
        ("panic", panic_seconds, PANIC),
    ):
        for name in names:
            text = queries.get(name)
            if text is not None:
                planned.append(Query(name, window, render(text, matchers, seconds)))
    return planned


class AnswerError(ValueError):
    """A query's answer is not one number: the query is wrong for this use."""


MAX_ANSWER_BYTES = 1 << 16
"""An instant query aggregated to one series answers about 200 bytes; a body past 64 KiB
is not that answer (and is not read further): parsed on the source's event loop, 1 MiB
of unaggregated series took 28 ms a query (hostile pass 35)."""


def parse_answer(body: bytes, promql: str) -> float | None:
    """The one value of an instant query's raw answer (``answer_value`` of its JSON).

    Raises:
        AnswerError: the body is over ``MAX_ANSWER_BYTES``, not JSON (or nested too deep
            for the parser: a Prometheus answer is four levels deep), or not one value.
    """
    if len(body) > MAX_ANSWER_BYTES:
        raise AnswerError(f"query {promql!r} answered over {MAX_ANSWER_BYTES} bytes")
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise AnswerError(f"query {promql!r} answered no JSON: {type(err).__name__}") from err
    return answer_value(parsed, promql)


def answer_value(body: Any, promql: str) -> float | None:
    """The one value of an instant query's JSON answer; None when no series answers.

    NaN (``histogram_quantile`` or a mean over a window with no request finished) and
    ±Inf (a mean over no request: x / 0) are None too: not measured, and never a number
    ``decide`` computes with (``ceil(inf)`` raises).

    Raises:
        AnswerError: an error answer, another result type, or more than one series
            (the query must aggregate, e.g. ``sum(...)``), with the query named.
    """
    if not isinstance(body, dict) or body.get("status") != "success":
        problem = body.get("error", body) if isinstance(body, dict) else body
        raise AnswerError(f"query {promql!r} failed: {quote(problem, 200)}")
    data = body.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    samples: list[Any]
    if kind == "scalar" and isinstance(result, list):
        samples = [result]
    elif kind == "vector" and isinstance(result, list):
        samples = [r.get("value") if isinstance(r, dict) else None for r in result]
    else:
        raise AnswerError(f"query {promql!r} answered {kind!r}, not an instant vector")
    if not samples:
        return None
    if len(samples) > 1:
        raise AnswerError(
            f"query {promql!r} answered {len(samples)} series; aggregate it to one"
            " (sum, avg, max, min)"
        )
    sample = samples[0]
    # [time, "value"]; Prometheus writes the value as a string ("+Inf", "NaN", "1.5").
    text = sample[1] if isinstance(sample, list) and len(sample) == 2 else None
    try:
        if not isinstance(text, str | int | float) or isinstance(text, bool):
            raise TypeError(type(text).__name__)
        value = float(text)
    except (TypeError, ValueError, OverflowError) as err:  # OverflowError: a 400-digit int
        raise AnswerError(
            f"query {promql!r} answered a malformed sample {quote(sample, 200)}"
        ) from err
    return value if math.isfinite(value) else None


Answers = Mapping[tuple[str, str | None], float | None]
"""Each query's value by (signal, window); a signal not asked for is simply absent."""


def checked_answers(answers: Answers) -> tuple[Answers, list[str]]:
    """The answers with every impossible value unmeasured (None), and why each was.

    Every signal here is a time, count, rate, latency or share: finite and not negative.
    A replica count above ``MAX_REPLICAS`` is none (``count(up)`` of 5e9 pins the
    deployment at its maximum and overflows the capacity RPC), and so are sleepers above
    the replicas up. A replica count of 0 beside requests running or queued, replicas
    up, or any rate served above 0 (``LOAD_SIGNALS``) contradicts them, and so does one
    read from the replicas up where ``replicas`` was asked and is unreadable; read as a
    fact it would zero the load (``signals_from_answers``'s rule for no replicas) and
    scale the deployment to zero, so the counts are unmeasured instead and the load
    stands. Checking twice changes nothing.
    """
    clean: dict[tuple[str, str | None], float | None] = dict(answers)
    problems: list[str] = []  # what, not how much: the same problem reads the same each round
    for (name, window), value in answers.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            where = f"{name} ({window})" if window else name
            problems.append(f"{where} is {'negative' if value < 0 else 'not finite'}")
            clean[(name, window)] = None
        elif value is not None and name in REPLICA_COUNTS and value > MAX_REPLICAS:
            problems.append(f"{name} is above {MAX_REPLICAS:,}, no deployment's count")
            clean[(name, window)] = None
    replicas, up = clean.get(("replicas", None)), clean.get(("replicas-up", None))
    if ("replicas", None) in answers and replicas is None and up is not None and round(up) == 0:
        # ``replicas`` asked and unreadable: the replicas up, 0 here, are no stand-in for
        # it. Read as the count they zeroed the load and scaled a busy deployment to zero
        # (issue 27, hostile pass 10); unknown, the load stands and the count holds.
        problems.append("replicas-up is 0 with replicas unmeasured: no count")
        clean[("replicas-up", None)] = None
        up = None
    known = replicas if replicas is not None else up
    load = sorted(
        {
            f"{name} ({window})" if window else name
            for (name, window), value in clean.items()
            if name in LOAD_SIGNALS and value is not None and value > 0
        }
    )
    if known is not None and round(known) == 0 and load:
        problems.append(f"replicas is 0 beside {' and '.join(load)} above 0")
        clean[("replicas", None)] = None
        if up is not None and round(up) == 0:
            clean[("replicas-up", None)] = None
    _check_sleepers(clean, problems)  # last: against the counts as they stand
    return clean, problems


def _check_sleepers(clean: dict[tuple[str, str | None], float | None], problems: list[str]) -> None:
    """Sleepers beyond the replicas up (or known), or all asleep while requests run.

    A sleeper is a replica answering that runs nothing; more of them than replicas, or
    every replica asleep beside running requests, is no count (read as one it takes the
    load's replicas away), so the sleepers are unmeasured.
    """
    sleeping = clean.get(("replicas-sleeping", None))
    if sleeping is None:
        return
    up = clean.get(("replicas-up", None))
    known = up if up is not None else clean.get(("replicas", None))
    running = clean.get(("running", None)) or 0.0
    if known is None:
        problem = "replicas-sleeping is known without a replica count to hold them"
    elif round(sleeping) > round(known) or (0 < round(sleeping) == round(known) and running > 0):
        problem = "replicas-sleeping is above the replicas awake to run requests"
    else:
        return
    problems.append(problem)
    clean[("replicas-sleeping", None)] = None


def signals_from_answers(
    answers: Answers, panic_seconds: float, stable_seconds: float
) -> EngineSignals | None:
    """The exporter's ``EngineSignals`` shape from the query answers, or None.

    None when no series answered at all, or ``signal-time`` did not (no sample to date
    the signals by). Zero replicas known is the exporter's rule: no load, rates zero
    (facts, not guesses), unless the answers contradict it (``checked_answers``, which
    runs first). A count asked for and unreadable is None, never 0 nor the other count,
    and the load stands as answered. ``partial`` when fewer replicas are up than known,
    either is unknown, or a token rate asked for is while replicas are up.
    """
    answers, _ = checked_answers(answers)
    present = {key: value for key, value in answers.items() if value is not None}
    time = present.get(("signal-time", None))
    if not present or time is None:
        return None
    replicas = _count(present.get(("replicas", None)))
    up = _count(present.get(("replicas-up", None)))
    sleeping = _count(present.get(("replicas-sleeping", None)))
    # The other count stands in for one whose query is null; one asked for and not
    # readable is unknown: the other in its place read two pods failing their scrapes
    # as no pods at all, and the hold on a replica missing never came (hostile pass 32).
    known = up if ("replicas", None) not in answers else replicas
    answering = known if ("replicas-up", None) not in answers else up
    queue: float | None
    running: float | None
    if known == 0:
        queue, running, sleeping = 0.0, 0.0, 0
        panic, stable = _idle(panic_seconds), _idle(stable_seconds)
    else:
        queue, running = present.get(("queue-depth", None)), present.get(("running", None))
        panic = _window(present, "panic", panic_seconds)
        stable = _window(present, "stable", stable_seconds)
    return EngineSignals(
        time=time,
        replicas=known,
        replicas_up=answering,
        queue_depth=queue,
        running=running,
        kv_usage=present.get(("kv-usage", None)),
        panic=panic,
        stable=stable,
        cost_per_million_tokens=None,  # no price here: the exporter's alone
        cost_per_million_output_tokens=None,
        price_is_default=False,
        partial=(
            replicas is None
            or up is None
            or up < replicas
            or (bool(answering) and _rates_unanswered(answers, stable))
        ),
        replicas_sleeping=sleeping,
    )


def _rates_unanswered(answers: Answers, stable: WindowSignals) -> bool:
    """Whether a token rate asked for came back with no value while replicas answer.

    One replica's counter NaN makes the sum's NaN: the deployment's rate is partly
    unknown, and what is in flight no measure of its load (ten busy replicas were taken
    to one, hostile pass 66), as the exporter marks it.
    """
    asked = [
        rate
        for name, rate in (
            ("prompt-token-rate", stable.prompt_token_rate),
            ("generation-token-rate", stable.generation_token_rate),
        )
        if (name, "stable") in answers
    ]
    return None in asked


def _count(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else max(0, round(value))


def _idle(seconds: float) -> WindowSignals:
    """No replica at all: nothing served, a fact (the exporter's rule too)."""
    return WindowSignals(seconds, 0.0, 0.0, 0.0, 0.0, queue_depth_mean=0.0, running_mean=0.0)


def _window(present: Answers, window: str, seconds: float) -> WindowSignals:
    def value(name: str) -> float | None:
        return present.get((name, window))

    return WindowSignals(
        seconds,
        request_rate=value("request-rate"),
        prompt_token_rate=value("prompt-token-rate"),
        generation_token_rate=value("generation-token-rate"),
        ttft=Quantiles(p95=value("ttft-p95")),
        itl=Quantiles(p95=value("itl-p95")),
        mean_prompt_tokens=value("mean-prompt-tokens"),
        mean_output_tokens=value("mean-output-tokens"),
        running_mean=value("running-mean"),
    )
