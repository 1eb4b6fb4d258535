"""Fuzzing the exposition parser and the engine reader: nothing a replica sends crashes them.

The only outcomes allowed are ``EngineStats`` that hold only plausible numbers, or the
documented errors. Every crash the fuzzers found is a file under ``tests/golden/hostile/``
read back by ``test_hostile_golden_bodies``, so it stays fixed.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exporter.engines import (
    REJECTIONS,
    SGLANG,
    VLLM,
    WANTED_ANY,
    EngineStats,
    NoEngineMetricsError,
    read_exposition,
)
from exporter.parse import (
    ExpositionError,
    Limits,
    TooLargeError,
    TooManySeriesError,
    parse_samples,
)

GOLDEN = Path(__file__).parent / "golden"
HOSTILE = GOLDEN / "hostile"
DOCUMENTED = (ExpositionError, NoEngineMetricsError, TooLargeError, TooManySeriesError)
SMALL = Limits(max_bytes=16_384, max_series=400)
FUZZ = settings(
    max_examples=150,
    deadline=timedelta(seconds=2),  # generous on a busy machine; catches a pathological case
    suppress_health_check=[HealthCheck.too_slow],
)


def plausible(stats: EngineStats) -> None:
    """What every ``EngineStats`` must hold, whatever the body was."""
    for value in (*stats.gauges.values(), *stats.counters.values()):
        assert math.isfinite(value) and value >= 0, stats
    for histogram in stats.histograms.values():
        assert list(histogram.bounds) == sorted(set(histogram.bounds)), histogram
        assert len(histogram.bounds) == len(histogram.counts) > 0, histogram
        assert all(math.isfinite(c) and c >= 0 for c in histogram.counts), histogram
    present = {*stats.gauges, *stats.counters, *stats.histograms}
    assert not present & set(stats.missing), stats
    assert set(stats.rejected) <= set(stats.missing), stats
    assert set(stats.rejected.values()) <= set(REJECTIONS), stats


def read(body: str | bytes, limits: Limits = SMALL) -> EngineStats | None:
    """``read_exposition`` with the allowed outcomes checked: stats, or a documented error."""
    try:
        stats = read_exposition(body, limits=limits)
    except DOCUMENTED:
        return None
    plausible(stats)
    return stats


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_give_stats_or_a_documented_error(body):
    read(body)


@FUZZ
@given(st.text(max_size=4096))
def test_arbitrary_text_gives_samples_or_a_documented_error(text):
    for wanted in (None, WANTED_ANY):
        try:
            samples = parse_samples(text, wanted, max_samples=SMALL.max_series)
        except (ExpositionError, TooManySeriesError):
            continue
        assert wanted is None or all(s.name in wanted for s in samples)
    read(text)


NAMES = sorted(VLLM.wanted() | SGLANG.wanted())
LABEL_NAMES = ["engine", "model_name", "pid", "le", "dp_rank", "tp_rank", "finished_reason", "x"]
TOKENS = st.one_of(
    st.sampled_from(["0", "1", "2.5", "-3", "NaN", "+Inf", "-Inf", "1e308", "1e309", "-0"]),
    st.sampled_from(["", "fast", "0x10", "1_0", " 1", "∞", "1e", "--1", '"', "\\", "\n"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
)


@st.composite
def sample_lines(draw):
    name = draw(st.sampled_from(NAMES))
    labels = draw(st.dictionaries(st.sampled_from(LABEL_NAMES), TOKENS, max_size=4))
    value = draw(TOKENS)
    timestamp = draw(st.one_of(st.none(), st.sampled_from(["1700000000000", "x", "-1"])))
    rendered = ",".join(f'{k}="{v}"' for k, v in labels.items())
    line = f"{name}{{{rendered}}} {value}" if labels else f"{name} {value}"
    return line if timestamp is None else f"{line} {timestamp}"


LINES = st.one_of(
    sample_lines(),
    st.sampled_from(["", "# EOF", "# HELP vllm:x help", "# TYPE vllm:x gauge", "#"]),
    st.text(max_size=30).map(lambda t: "# " + t),
)


@st.composite
def near_valid(draw):
    """An exposition of engine families, then one byte-level mutation (or none)."""
    body = ("\n".join(draw(st.lists(LINES, max_size=30))) + "\n").encode()
    mutation = draw(st.sampled_from(["none", "truncate", "delete", "insert", "duplicate"]))
    if body and mutation != "none":
        at = draw(st.integers(0, len(body) - 1))
        if mutation == "truncate":
            body = body[:at]
        elif mutation == "delete":
            body = body[:at] + body[at + 1 :]
        elif mutation == "insert":
            body = body[:at] + draw(st.binary(min_size=1, max_size=4)) + body[at:]
        else:
            body = body + body[at:]
    return body


@FUZZ
@given(near_valid())
@example(b"vllm:num_preemptions_created NaN\n")  # a rejected _created is missing too
def test_near_valid_engine_expositions_give_plausible_stats_or_a_documented_error(body):
    read(body)


CAPTURE = (GOLDEN / "vllm" / "0.32.0-cpu" / "after.txt").read_text().splitlines()


@st.composite
def mutated_capture(draw):
    """A real vLLM 0.32 capture with a few sample lines changed, dropped or repeated."""
    lines = list(CAPTURE)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["value", "drop", "repeat", "label"]))
        line = lines[at]
        if action == "value" and not line.startswith("#"):
            lines[at] = line.rpartition(" ")[0] + " " + draw(TOKENS)
        elif action == "drop":
            del lines[at]
        elif action == "repeat":
            lines.insert(at, draw(sample_lines()))
        elif action == "label" and "{" in line:
            lines[at] = line.replace("{", "{" + f'le="{draw(TOKENS)}",', 1)
    return "\n".join(lines) + "\n"


@FUZZ
@given(mutated_capture())
def test_a_mutated_real_capture_gives_plausible_stats_or_a_documented_error(text):
    read(text, Limits())


def outcome(path: Path) -> str:
    try:
        stats = read_exposition(path.read_bytes())
    except DOCUMENTED as err:
        return type(err).__name__
    plausible(stats)
    return "ok: missing " + ",".join(stats.missing) if stats.missing else "ok"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("bad-bucket-bound", "ExpositionError", id="le-not-a-number-was-a-ValueError"),
        pytest.param(
            "bucket-without-le",
            "ok: missing preemptions,ttft,itl,e2e,queue_time",
            id="a-lone-bucket-without-le-was-an-IndexError",
        ),
        pytest.param(
            "only-nan-bounds",
            "ok: missing preemptions,ttft,itl,e2e,queue_time",
            id="buckets-with-only-nan-bounds-were-an-IndexError",
        ),
        pytest.param(
            "non-utf8-comment",
            "ok: missing preemptions,ttft,itl,e2e,queue_time",
            id="latin1-in-a-comment-was-a-UnicodeDecodeError",
        ),
        pytest.param(
            "non-utf8-label",
            "ExpositionError",
            id="latin1-in-a-wanted-label-was-a-UnicodeDecodeError",
        ),
        pytest.param(
            "negative-gauges",
            "ok: missing running,waiting,preemptions,ttft,itl,e2e,queue_time",
            id="negative-gauges-were-taken-as-data",
        ),
        pytest.param(
            "duplicate-series",
            "ok: missing running,preemptions,ttft,itl,e2e,queue_time",
            id="a-duplicate-series-was-resolved-by-taking-the-larger",
        ),
    ],
)
def test_hostile_golden_bodies(name, expected):
    assert outcome(HOSTILE / f"{name}.prom") == expected


def test_every_hostile_golden_body_has_a_test():
    tested = {
        "bad-bucket-bound",
        "bucket-without-le",
        "only-nan-bounds",
        "non-utf8-comment",
        "non-utf8-label",
        "negative-gauges",
        "duplicate-series",
    }
    assert {p.stem for p in HOSTILE.glob("*.prom")} == tested
