"""ServeGen's per-client traces drawn for replay (``replay.servegen``), and varied business days.

Small ServeGen-shaped directories written per test pin the rules (counts per window,
burstiness by family, lengths from the nearest block, the day range, the bounds, the
errors); the shared m-small data (``tests.shared_data.shared``) shows the drawn day
follows the recorded rates window by window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import servegen
from replay.servegen import (
    BLOCK_SECONDS,
    DAY_SECONDS,
    ServeGenOptions,
    _nearest_block,
    parse_source,
    read_servegen,
)
from replay.trace import TraceError
from replay.workloads import BusinessDay, DayToDay, business_days, load_trace
from tests.shared_data import shared

WINDOW = 600


def write_client(
    directory: Path,
    n: int,
    rows: list[tuple[float, float, str, float]],
    blocks: dict[int, tuple[str, str]] | None = None,
) -> None:
    """Client ``n``: (start, rate, pattern, shape) per window; its length blocks, if any."""
    lines = [
        f"{s:g},{r!r},1.0,{p},{k!r},0.5" if p else f"{s:g},{r!r},0,,0,0" for s, r, p, k in rows
    ]
    (directory / f"chunk-{n}-trace.csv").write_text("\n".join(lines) + "\n")
    if blocks is not None:
        data = {str(k): {"input_tokens": i, "output_tokens": o} for k, (i, o) in blocks.items()}
        (directory / f"chunk-{n}-dataset.json").write_text(json.dumps(data))


LENGTHS = {0: ("{100: 0.5, 300: 0.5}", "{10: 1.0}")}


def days_of(
    count: int, rate: float, pattern: str = "Gamma", shape: float = 1.0
) -> list[tuple[float, float, str, float]]:
    return [(w * 600.0, rate, pattern, shape) for w in range(count * DAY_SECONDS // WINDOW)]


@pytest.fixture
def two_days(tmp_path: Path) -> Path:
    write_client(tmp_path, 0, days_of(2, 2.0, "Gamma", 0.5), LENGTHS)
    write_client(tmp_path, 1, days_of(2, 1.0, "Weibull", 0.4))  # no lengths of its own
    return tmp_path


def per_window(arrival: np.ndarray, windows: int) -> np.ndarray:
    return np.bincount((arrival // WINDOW).astype(int), minlength=windows)


# --- counts and times ------------------------------------------------------------------


@settings(deadline=None, max_examples=40)
@given(
    st.lists(
        st.tuples(st.floats(0, 50), st.sampled_from(["Gamma", "Weibull", ""]), st.floats(0.2, 4)),
        min_size=1,
        max_size=12,
    ),
    st.floats(0.01, 3),
    st.integers(0, 2**32),
)
def test_each_window_holds_its_rate_times_scale_within_one_request(
    tmp_path_factory, windows, scale, seed
):
    """The count is the rate's, rounded down or up; every arrival inside its window."""
    directory = tmp_path_factory.mktemp("servegen")
    rows = [(i * 600.0, rate, pattern, shape) for i, (rate, pattern, shape) in enumerate(windows)]
    write_client(directory, 0, rows, LENGTHS)
    expected = np.array([rate * scale * WINDOW for rate, _, _ in windows])
    try:
        trace = read_servegen(directory, ServeGenOptions(scale, (0, 0)), seed)
    except TraceError as err:
        assert "drew no request" in str(err) and np.all(expected < 1)
        return
    counts = per_window(trace.arrival, len(windows))[: len(windows)]
    assert len(trace) == counts.sum()
    assert np.all(np.abs(counts - expected) < 1)
    assert np.all(np.diff(trace.arrival) >= 0) and trace.arrival[-1] < len(windows) * WINDOW


@pytest.mark.parametrize(
    ("pattern", "shape", "cv"),
    [
        pytest.param("Gamma", 0.25, 2.0, id="gamma-shape-a-quarter-keeps-a-cv-of-2"),
        pytest.param("Gamma", 4.0, 0.5, id="gamma-shape-4-keeps-a-cv-of-a-half"),
        pytest.param("Weibull", 0.5, math.sqrt(5), id="weibull-shape-a-half-keeps-its-cv"),
        pytest.param("", 1.0, 1.0, id="a-rate-without-a-fit-is-poisson"),
    ],
)
def test_the_fitted_shape_keeps_the_window_s_burstiness(tmp_path, pattern, shape, cv):
    """Inter-arrival cv over 20 windows of 3,000 requests, at a 10x thinner scale too."""
    write_client(tmp_path, 0, [(w * WINDOW, 50.0, pattern, shape) for w in range(20)], LENGTHS)
    for scale in (1.0, 0.1):
        trace = read_servegen(tmp_path, ServeGenOptions(scale, (0, 0)), seed=3)
        window = (trace.arrival // WINDOW).astype(int)
        gaps = np.diff(trace.arrival)[window[1:] == window[:-1]]
        assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.15)


def test_a_day_at_a_scale_follows_the_shared_trace_s_rates_window_by_window():
    """m-small day 1 at 1%: each 10-minute window's requests within one per client of the
    recorded rates' sum; the day's total within 0.1% of it."""
    directory = shared("traces", "servegen-m-small")
    scale, clients, recorded = 0.01, 0, np.zeros(144)
    for path in directory.glob("chunk-*-trace.csv"):
        rows = np.loadtxt(path, delimiter=",", usecols=(0, 1))
        day = (rows[:, 0] >= DAY_SECONDS) & (rows[:, 0] < 2 * DAY_SECONDS)
        recorded += rows[day, 1] * scale * WINDOW
        clients += 1
    trace = load_trace(f"servegen:{directory}?scale={scale}&days=1", seed=0)
    counts = per_window(trace.arrival, 144)
    assert len(counts) == 144 and np.all(np.abs(counts - recorded) < clients)
    assert len(trace) == pytest.approx(recorded.sum(), rel=1e-3)
    assert 500_000 < len(trace) < 2_000_000  # about a million requests a day at 1%


def test_the_shared_trace_s_14_days_at_full_scale_are_refused_before_drawing():
    directory = shared("traces", "servegen-m-small")
    with pytest.raises(TraceError, match=r"days 0-13 at scale 1 .* at most 10,000,000"):
        load_trace(f"servegen:{directory}?scale=1")


# --- the day range, the scale and the seed ---------------------------------------------


def test_a_day_is_the_same_alone_or_in_a_range(two_days):
    both = read_servegen(two_days, ServeGenOptions(0.05, (0, 1)), seed=7)
    second = read_servegen(two_days, ServeGenOptions(0.05, (1, 1)), seed=7)
    later = both.arrival >= DAY_SECONDS
    assert np.array_equal(both.arrival[later] - DAY_SECONDS, second.arrival)
    assert np.array_equal(both.prompt[later], second.prompt)
    assert second.arrival[0] < 600 and second.arrival[-1] < DAY_SECONDS


def test_the_same_seed_draws_the_same_trace_and_another_another(two_days):
    options = ServeGenOptions(0.05, (0, 0))
    a, b = (read_servegen(two_days, options, seed=1) for _ in range(2))
    c = read_servegen(two_days, options, seed=2)
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.output, b.output)
    assert not np.array_equal(a.arrival[:100], c.arrival[:100])


def test_the_scale_multiplies_every_window(two_days):
    one = per_window(read_servegen(two_days, ServeGenOptions(0.01, (0, 0))).arrival, 144)
    ten = per_window(read_servegen(two_days, ServeGenOptions(0.1, (0, 0))).arrival, 144)
    assert np.all(np.abs(one - 3 * 0.01 * WINDOW) < 2)  # two clients: 2 + 1 requests/s
    assert np.all(np.abs(ten - 3 * 0.1 * WINDOW) < 2)


# --- token lengths ---------------------------------------------------------------------


def test_lengths_come_from_the_client_s_distribution_and_others_borrow_them(two_days):
    trace = read_servegen(two_days, ServeGenOptions(0.05, (0, 0)), seed=0)
    assert set(trace.prompt.tolist()) == {100, 300} and set(trace.output.tolist()) == {10}
    assert np.mean(trace.prompt == 100) == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize(
    ("keys", "start", "block"),
    [
        pytest.param([0, 21_600], 25_000, 1, id="a-window-in-a-block-takes-it"),
        pytest.param([0, 43_200], 25_000, 0, id="in-an-empty-block-the-nearer-span"),
        pytest.param([0, 43_200], 40_000, 1, id="in-an-empty-block-the-next-when-nearer"),
        pytest.param([21_600], 0, 0, id="before-the-first-block-the-first"),
        pytest.param([0], 10 * BLOCK_SECONDS, 0, id="after-the-last-block-the-last"),
        pytest.param([0, 32_400], 27_000, 0, id="a-tie-takes-the-earlier"),
    ],
)
def test_the_nearest_block(keys, start, block):
    assert _nearest_block(np.array(keys, dtype=float), np.array([float(start)])).tolist() == [block]


def test_a_client_s_empty_first_block_draws_from_its_nearest(tmp_path):
    blocks = {21_600: ("{7: 1.0}", "{3: 1.0}")}
    write_client(tmp_path, 0, days_of(1, 1.0), blocks)
    (tmp_path / "chunk-0-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": "{}", "output_tokens": "{}"}})[:-1]
        + ', "21600": {"input_tokens": "{7: 1.0}", "output_tokens": "{3: 1.0}"}}'
    )
    trace = read_servegen(tmp_path, ServeGenOptions(0.01, (0, 0)))
    assert set(trace.prompt.tolist()) == {7} and set(trace.output.tolist()) == {3}


# --- errors ----------------------------------------------------------------------------

GOOD = "0,1.0,1.0,Gamma,1.0,0.5\n"


@pytest.mark.parametrize(
    ("trace_csv", "dataset", "fragment"),
    [
        pytest.param(GOOD + "600,fast,1,Gamma,1,1\n", None, r"chunk-0-trace.csv:2: column rate",
                     id="a-rate-that-is-not-a-number"),
        pytest.param(GOOD + "600,-1,1,Gamma,1,1\n", None, r":2: column rate",
                     id="a-negative-rate"),
        pytest.param(GOOD + "600,nan,1,Gamma,1,1\n", None, r":2: column rate", id="a-nan-rate"),
        pytest.param(GOOD + "600,1,1,Lognormal,1,1\n", None, r":2: column pattern",
                     id="an-unknown-family"),
        pytest.param(GOOD + "600,1,1,Weibull,0,1\n", None, r":2: column shape",
                     id="a-shape-of-0"),
        pytest.param(GOOD + "600,1,1,Gamma,1\n", None, r":2: 5 columns, not 6",
                     id="a-short-row"),
        pytest.param(GOOD + "0,1,1,Gamma,1,1\n", None, r":2: column start_s: 0 is not after",
                     id="a-window-out-of-order"),
        pytest.param(GOOD + "1e12,1,1,Gamma,1,1\n", None, r":2: column start_s",
                     id="a-window-past-31-days"),
        pytest.param(GOOD + "600,1,1,Weibull,0.001,1\n", None, r":2: column shape",
                     id="a-weibull-shape-whose-gaps-overflow"),
        pytest.param(b"0,1,1,Gamma,1,\xff\n", None, r":1: not UTF-8", id="not-utf-8"),
        pytest.param("", None, r"no windows", id="an-empty-chunk"),
        pytest.param(GOOD, "{", r"chunk-0-dataset.json: not JSON", id="a-dataset-not-json"),
        pytest.param(GOOD, "[" * 100_000, r"dataset.json: not JSON", id="a-deeply-nested-dataset"),
        pytest.param(GOOD, '{"x": {}}', r"block 'x'", id="a-block-that-is-not-a-second"),
        pytest.param(
            GOOD, '{"0": {"input_tokens": "{1: x}", "output_tokens": "{1: 1}"}}',
            r"block 0, input_tokens: token counts", id="a-probability-that-is-not-a-number",
        ),
        pytest.param(
            GOOD, '{"0": {"input_tokens": "{1: 1}", "output_tokens": "__import__(1)"}}',
            r"block 0, output_tokens: not a \{tokens: probability", id="code-is-not-a-dict",
        ),
        pytest.param(
            GOOD, '{"0": {"input_tokens": "{99999999999: 1}", "output_tokens": "{1: 1}"}}',
            r"token counts must be 0 to 10,000,000", id="a-length-past-the-bound",
        ),
        pytest.param(
            GOOD, '{"0": {"input_tokens": "{1: 0}", "output_tokens": "{1: 1}"}}',
            r"not all 0", id="a-distribution-of-nothing",
        ),
        pytest.param(
            GOOD, '{"0": {"input_tokens": "{1: 1}", "output_tokens": "{1: 1}"},'
                  ' "00": {"input_tokens": "{9: 1}", "output_tokens": "{9: 1}"}}',
            r"block '00' starts where another block does", id="two-blocks-at-one-second",
        ),
    ],
)  # fmt: skip
def test_a_malformed_chunk_is_a_trace_error_naming_the_file_and_column(
    tmp_path, trace_csv, dataset, fragment
):
    path = tmp_path / "chunk-0-trace.csv"
    path.write_bytes(trace_csv if isinstance(trace_csv, bytes) else trace_csv.encode())
    if dataset is not None:
        (tmp_path / "chunk-0-dataset.json").write_text(dataset)
    with pytest.raises(TraceError, match=fragment):
        read_servegen(tmp_path, ServeGenOptions(1.0, (0, 0)))


@pytest.mark.parametrize("source", ["servegen:", "servegen:?scale=1", "servegen: ?days=1"])
def test_a_source_naming_no_directory_is_refused_not_read_as_the_working_one(source):
    with pytest.raises(TraceError, match="needs a directory before"):
        parse_source(source)


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        pytest.param("?scale=0", "scale='0' must be above 0", id="a-scale-of-0"),
        pytest.param("?scale=nan", "scale='nan'", id="a-nan-scale"),
        pytest.param("?scale=1e9", "at most 1,000", id="a-scale-past-the-multiplier-s-bound"),
        pytest.param("?days=3-1", "days='3-1' must be A or A-B", id="days-backwards"),
        pytest.param("?days=one", "days='one'", id="days-not-numbers"),
        pytest.param("?speed=2", "unknown option 'speed'", id="an-unknown-option"),
        pytest.param("?scale=0.1&scale=0.01", "'scale' given twice", id="a-scale-given-twice"),
        pytest.param("?days=0&days=1", "'days' given twice", id="days-given-twice"),
        pytest.param("?days=2", "the data holds days 0-1", id="a-day-past-the-data"),
    ],
)
def test_bad_options_are_refused_naming_them(two_days, query, fragment):
    with pytest.raises(TraceError, match=fragment):
        load_trace(f"servegen:{two_days}{query}")


def test_no_chunks_is_refused(tmp_path):
    with pytest.raises(TraceError, match=r"no chunk-N-trace\.csv"):
        load_trace(f"servegen:{tmp_path}")


def test_the_request_bound_is_checked_before_drawing(two_days, monkeypatch):
    monkeypatch.setattr(servegen, "MAX_TRACE_REQUESTS", 1000)
    with pytest.raises(TraceError, match=r"days 0-1 at scale 0.01 is up to 5,184 requests"):
        load_trace(f"servegen:{two_days}?scale=0.01")


def test_the_source_forms(two_days):
    assert parse_source(f"servegen:{two_days}?scale=0.5&days=1") == (
        two_days, ServeGenOptions(0.5, (1, 1))
    )  # fmt: skip
    assert parse_source(str(two_days)) == (two_days, ServeGenOptions())
    bare = load_trace(f"{two_days}?days=0-1&scale=0.01", seed=0)
    assert np.array_equal(bare.arrival, load_trace(f"servegen:{two_days}?scale=0.01").arrival)
    assert bare.name == f"servegen-{two_days.name}-days-0-1-x0.01"


# --- business days with day-to-day variation -------------------------------------------


def test_business_days_vary_in_volume_and_burst_timing_and_rest_at_the_weekend():
    day = BusinessDay(length=2400.0, base_rate=20.0, lunch_seconds=30.0, spike_seconds=5.0)
    week = business_days(day, 7, seed=0, variation=DayToDay())
    volume = np.bincount((week.arrival // day.length).astype(int), minlength=7)
    weekdays, weekend = volume[:5], volume[5:]
    assert weekdays.std() / weekdays.mean() > 0.03  # the days differ
    assert np.all(weekend < 0.5 * weekdays.min())  # Saturday and Sunday are quiet
    lunches = {DayToDay().vary(day, d, 0).lunch_hour for d in range(5)}
    assert len(lunches) == 5 and all(11 <= h <= 13 for h in lunches)
    assert {DayToDay().vary(day, d, 0).lunch_multiple for d in (5, 6)} == {1.0}


def test_varied_days_are_drawn_per_day():
    day = BusinessDay(length=1200.0, base_rate=5.0, lunch_seconds=30.0, spike_seconds=5.0)
    three = business_days(day, 3, seed=4, variation=DayToDay())
    two = business_days(day, 2, seed=4, variation=DayToDay())
    assert np.array_equal(three.arrival[: len(two)], two.arrival)
    assert not np.array_equal(
        business_days(day, 2, seed=4).arrival[:50], two.arrival[:50]
    )  # without variation every day is the same shape


@pytest.mark.parametrize(
    ("name", "days"),
    [
        pytest.param("business-days", 3, id="three-varied-weekdays"),
        pytest.param("business-week", 7, id="a-varied-week-with-its-weekend"),
    ],
)
def test_the_multi_day_builtins(name, days):
    trace = load_trace(f"builtin:{name}", seed=0)
    assert trace.name == f"business-days-{days}"
    assert trace.arrival[-1] < days * BusinessDay().length


# --- hostile texts (issue 27, hostile pass 3: H1, L5) -----------------------------------


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        pytest.param("{100: 0.5, 300: 0.5}", [(100, 0.5), (300, 0.5)], id="the data's own form"),
        pytest.param("{ 7 : 1e-05 , }", [(7, 1e-05)], id="spaces and one trailing comma"),
        pytest.param("{0: .5}", [(1, 0.5)], id="a count of 0 is drawn as 1 token"),
    ],
)
def test_a_distribution_text_is_read_as_its_pairs(text, pairs):
    tokens, cdf = servegen._pdf(text, "here")
    weights = np.diff(cdf, prepend=0.0) * sum(p for _, p in pairs)
    assert tokens.tolist() == [t for t, _ in pairs]
    assert np.allclose(weights, [p for _, p in pairs])


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{1: 1" + " " * 6000 + "x", id="no closing brace after many spaces"),
        pytest.param("{1: 1" + " " * 3000 + "}x", id="text after the closing brace"),
        pytest.param("{1: 1, 2: {3: 1}}", id="a nested dict"),
        pytest.param("{1: 1,, 2: 1}", id="an empty pair"),
        pytest.param("{1: 1: 2}", id="two colons in a pair"),
        pytest.param("{: 1}", id="a pair with no token count"),
        pytest.param("{" + "1: 1," * 1_000_001 + "}", id="more pairs than the bound"),
    ],
)
@pytest.mark.timeout(30)  # a hang guard: the old whole-dict pattern took minutes on the first
def test_a_text_that_is_not_a_dict_is_refused_in_one_pass(text):
    with pytest.raises(TraceError, match=r"here: not a \{tokens: probability"):
        servegen._pdf(text, "here")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{١٢: 1}", id="a token count in Arabic-Indic digits"),
        pytest.param("{1_0: 1}", id="a token count with an underscore"),
        pytest.param("{12: ١}", id="a probability in Arabic-Indic digits"),
        pytest.param("{12: 1_0}", id="a probability with an underscore"),
        pytest.param("{12: nan}", id="a nan probability"),
        pytest.param("{12: -1}", id="a negative probability"),
    ],
)
def test_a_distribution_reads_ascii_digits_only(text):
    with pytest.raises(TraceError, match="token counts must be 0 to"):
        servegen._pdf(text, "here")


def test_weights_each_finite_whose_sum_overflows_keep_their_shares():
    """1e308 three times summed to inf, the shares to NaN, and every draw to one count
    (hostile pass 56)."""
    tokens, shares = servegen._pdf("{100: 1e308, 200: 1e308, 300: 1e308}", "here")
    assert tokens.tolist() == [100, 200, 300]
    assert shares == pytest.approx([1 / 3, 2 / 3, 1])


@pytest.mark.timeout(30)  # a hang guard, not a measurement: 2,000 spaces took 27 s before
@settings(deadline=None, max_examples=60)
@given(st.text(alphabet="{}:, 0123456789.x\t", max_size=60), st.integers(0, 2000))
def test_any_text_is_read_or_refused_in_time_linear_in_its_length(text, spaces):
    """Each text is read or refused; never backtracked (a 3 KB text once took 98 s)."""
    try:
        servegen._pdf(text + " " * spaces + text, "here")
    except TraceError:
        pass


@pytest.mark.parametrize(
    ("field", "accepted"),
    [
        pytest.param("12.5", True, id="a plain decimal is read"),
        pytest.param("1e3", True, id="an exponent is read"),
        pytest.param("١٠", False, id="Arabic-Indic digits are refused"),
        pytest.param("1_0", False, id="an underscore between digits is refused"),
        pytest.param("inf", False, id="infinity is refused"),
    ],
)
def test_a_window_s_number_reads_ascii_digits_only(field, accepted):
    if accepted:
        assert servegen._number(field, "rate", 0.0, 1e6) == float(field)
    else:
        with pytest.raises(ValueError, match="column rate"):
            servegen._number(field, "rate", 0.0, 1e6)


def test_a_chunk_named_in_other_digits_is_not_a_chunk(tmp_path):
    write_client(tmp_path, 0, days_of(1, 1.0))
    (tmp_path / "chunk-0-trace.csv").rename(tmp_path / "chunk-١-trace.csv")
    with pytest.raises(TraceError, match=r"no chunk-N-trace\.csv"):
        read_servegen(tmp_path, ServeGenOptions(0.01, (0, 0)))


@pytest.mark.parametrize(
    ("bound", "value", "fragment"),
    [
        pytest.param(
            "MAX_CHUNKS", 2, r"3 chunk-N-trace\.csv files; a replay reads at most 2 clients",
            id="more clients than the bound are refused before any is read",
        ),
        pytest.param(
            "MAX_WINDOWS", 250, r"chunk-1-trace\.csv:107: .* more than 250 windows in all",
            id="more windows in all than the bound are refused at the row that passes it",
        ),
        pytest.param(
            "MAX_DATASETS_BYTES", 150,
            r"chunk-1-dataset\.json: .*dataset\.json files are over [0-9.e-]+ GiB in all",
            id="distributions files over the bound in all are refused before the one past it"
            " is parsed",
        ),
    ],
)  # fmt: skip
def test_a_directory_is_bounded_in_clients_windows_and_distribution_bytes(
    tmp_path, monkeypatch, bound, value, fragment
):
    # Hostile pass 4, H3 and L2: each file was bounded, their number was not; 100
    # chunks of 60 MB ended in MemoryError.
    for n in range(3):  # 3 clients of 144 windows and a ~60-byte distributions file each
        write_client(tmp_path, n, days_of(1, 1.0), LENGTHS)
    read_servegen(tmp_path, ServeGenOptions(0.01, (0, 0)))  # within the real bounds
    monkeypatch.setattr(servegen, bound, value)
    parsed: list[object] = []
    loads = json.loads

    def counted(raw: str | bytes, *args: object, **kwargs: object) -> object:
        parsed.append(raw)
        return loads(raw, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(json, "loads", counted)
    with pytest.raises(TraceError, match=fragment):
        read_servegen(tmp_path, ServeGenOptions(0.01, (0, 0)))
    assert len(parsed) <= 1, "the file past the bound was parsed"
