"""The exposition parser agrees with prometheus_client on every golden file and on
generated input, and names the line of any malformed wanted sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from exporter.engines import WANTED_ANY
from exporter.parse import ExpositionError, TooManySeriesError, parse_samples

# The engines' expositions (other golden directories hold HAMi annotations, Fluid objects).
GOLDEN = sorted(
    path
    for engine in ("vllm", "sglang")
    for path in (Path(__file__).parent / "golden" / engine).rglob("*.txt")
)


def reference(text, openmetrics=False):
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    out = []
    for family in parse(text):
        for s in family.samples:
            timestamp = s.timestamp
            if timestamp is not None and not isinstance(timestamp, float):
                timestamp = float(timestamp.sec) + timestamp.nsec / 1e9
            out.append((s.name, s.labels, s.value, timestamp))
    return out


def ours(text, wanted=None, openmetrics=None):
    return [
        (s.name, s.labels, s.value, s.timestamp) for s in parse_samples(text, wanted, openmetrics)
    ]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x[:2] == y[:2]
        assert x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])), (x, y)
        assert x[3] == y[3]


@pytest.mark.parametrize("path", GOLDEN, ids=[f"{p.parent.name}-{p.stem}" for p in GOLDEN])
def test_every_sample_matches_prometheus_client(path):
    text = path.read_text()
    same(ours(text), reference(text))


@pytest.mark.parametrize("path", GOLDEN, ids=[f"{p.parent.name}-{p.stem}" for p in GOLDEN])
def test_wanted_samples_match_prometheus_client_filtered(path):
    text = path.read_text()
    expected = [s for s in reference(text) if s[0] in WANTED_ANY]
    assert expected, "the golden file holds none of the engine metrics"
    same(ours(text, WANTED_ANY), expected)


OPENMETRICS = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0 1700000000.25 # {trace_id="a"} 1.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09 1700000000.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} +Inf
# EOF
"""


def test_openmetrics_with_exemplars_and_timestamps_in_seconds():
    same(ours(OPENMETRICS), reference(OPENMETRICS, openmetrics=True))


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        pytest.param('vllm:num_requests_running{engine="0" 1', "line 2", id="unclosed-braces"),
        pytest.param("vllm:num_requests_running", "no value", id="no-value"),
        pytest.param("vllm:num_requests_running abc", "bad number", id="not-a-number"),
        pytest.param(
            "vllm:num_requests_running 1_000",
            "bad number",
            id="digit separators are no number to Prometheus",
        ),
        pytest.param(
            "vllm:num_requests_running 1 1_700_000_000", "bad number", id="nor in a timestamp"
        ),
        pytest.param("vllm:num_requests_running{engine=0} 1", "bad label", id="unquoted-label"),
        pytest.param("vllm:num_requests_running 1 2 3", "value [timestamp]", id="extra-fields"),
    ],
)
def test_malformed_wanted_lines_name_the_line(line, fragment):
    with pytest.raises(ExpositionError, match="line 2") as caught:
        parse_samples("# HELP x\n" + line + "\n", {"vllm:num_requests_running"})
    assert fragment in str(caught.value)


def test_malformed_lines_of_unwanted_families_are_not_examined():
    text = "garbage{{{ here\nvllm:num_requests_running 3\n"
    assert ours(text, {"vllm:num_requests_running"}) == [
        ("vllm:num_requests_running", {}, 3.0, None)
    ]


names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(
    # le and quantile have meanings; names starting "__" are reserved by Prometheus
    lambda n: n not in ("le", "quantile") and not n.startswith("__")
)
# Any UTF-8 a label may hold, line separators other than "\n" included (prometheus_client
# escapes only backslash, quote and newline).
label_values = st.text(st.characters(codec="utf-8"), max_size=12)
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, width=64),
    st.integers(min_value=-(10**12), max_value=10**12).map(float),
)


def render_value(value):
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(names, st.dictionaries(label_names, label_values, max_size=4), values),
        min_size=1,
        max_size=8,
    )
)
def test_generated_exposition_parses_like_prometheus_client(samples):
    lines = []
    for name, labels, value in samples:
        rendered = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        lines.append(
            f"{name}{{{rendered}}} {render_value(value)}"
            if labels
            else f"{name} {render_value(value)}"
        )
    text = "\n".join(lines) + "\n"
    same(ours(text), reference(text))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "n", "x", "\\\\", "\\n", '\\"', "\\x"]), max_size=12))
def test_any_run_of_escapes_in_a_label_value_reads_as_prometheus_client_reads_it(pieces):
    """Known escapes, unknown ones (kept as written) and runs of backslashes before a quote."""
    text = f'vllm:num_requests_running{{a="{"".join(pieces)}",b="z"}} 1\n'
    same(ours(text), reference(text))


@pytest.mark.parametrize(
    "separator",
    ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"],
    ids=[
        "carriage return",
        "vertical tab",
        "form feed",
        "file separator",
        "next line",
        "line separator",
        "paragraph separator",
    ],
)
def test_a_sample_hidden_behind_a_line_separator_in_a_label_value_stays_in_the_value(separator):
    """A LoRA adapter named so once added 5,000 waiting requests to an honest replica."""
    adapter = f"tenant-a{separator}vllm:num_requests_waiting 5000{separator}#"
    text = (
        f'vllm:lora_requests_info{{running_lora_adapters="{adapter}"}} 1\n'
        "vllm:num_requests_waiting 2\n"
    )
    assert ours(text) == reference(text)
    waiting = ours(text, {"vllm:num_requests_waiting"})
    assert waiting == [("vllm:num_requests_waiting", {}, 2.0, None)]


def test_a_body_written_with_crlf_line_ends_reads_as_with_lf():
    text = "vllm:num_requests_running 3\r\nvllm:num_requests_waiting 1\r\n"
    assert ours(text) == ours(text.replace("\r\n", "\n"))
    assert len(ours(text)) == 2


def test_a_sample_of_more_than_64_labels_is_refused_at_the_65th_read():
    labels = ",".join(f'l{i}=""' for i in range(500_000))
    with pytest.raises(ExpositionError, match="more than 64 labels"):
        parse_samples(f"vllm:num_requests_running{{{labels}}} 1\n", {"vllm:num_requests_running"})
    repeated = ",".join(['a="\\\\"'] * 500_000)  # one name: counted each time it is read
    with pytest.raises(ExpositionError, match="more than 64 labels"):
        parse_samples(f"vllm:num_requests_running{{{repeated}}} 1\n", {"vllm:num_requests_running"})
    sixty_four = ",".join(f'l{i}="v"' for i in range(64))
    (sample,) = parse_samples(f"m{{{sixty_four}}} 1\n")
    assert len(sample.labels) == 64


def test_an_error_quotes_at_most_200_characters_of_a_long_line():
    line = "vllm:num_requests_running{" + "x" * 5_000_000
    with pytest.raises(ExpositionError) as caught:
        parse_samples(line + "\n", {"vllm:num_requests_running"})
    message = str(caught.value)
    assert len(message) < 300
    assert "line 1" in message and f"{len(line):,} characters" in message
    assert "vllm:num_requests_running{xxx" in message


def test_more_wanted_samples_than_the_cap_stop_the_parse():
    text = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(10))
    text += "process_cpu_seconds_total 1\n" * 100  # unwanted lines never count
    assert len(parse_samples(text, {"vllm:num_requests_running"}, max_samples=10)) == 10
    with pytest.raises(TooManySeriesError, match="line 10"):
        parse_samples(text, {"vllm:num_requests_running"}, max_samples=9)
