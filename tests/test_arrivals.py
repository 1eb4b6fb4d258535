"""The gateway records its arrivals in files ``unitscale replay --trace`` reads.

The pure part (``serving.arrivals``: a row, the rotation plan, which files go, a prompt's
estimate) has its tables and properties; then a real gateway on 127.0.0.1 in front of the
simulated replica and of small replicas that fail: what it records reads back through
``replay.trace.read_trace``, rotation keeps the files bounded, and a write that fails
fails no request.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from foundation.errors import ConfigError
from foundation.net import free_port
from replay.limits import MAX_TOKENS as READER_MAX_TOKENS
from replay.trace import read_trace
from serving.arrivals import (
    HEADER,
    MAX_ROW_BYTES,
    MAX_TOKENS,
    MIN_FILE_BYTES,
    ArrivalSettings,
    estimate_prompt_tokens,
    file_name,
    format_row,
    is_a_later_day,
    next_sequence,
    plan_writes,
    to_delete,
)
from serving.config import parse_config
from serving.sim_validation import prompt_length
from tests.conftest import eventually
from tests.test_gateway import completion, start_gateway, start_sim, wait_ready
from tests.test_gateway_slo import answer_500

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC).timestamp()

# --- a row -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "output", "row"),
    [
        pytest.param(1020, 129, "2025-03-04 05:06:07.890123+00:00,1020,129\n", id="a-request"),
        pytest.param(-3, 0, "2025-03-04 05:06:07.890123+00:00,0,0\n", id="a-negative-count-is-0"),
        pytest.param(
            10**12,
            5,
            f"2025-03-04 05:06:07.890123+00:00,{MAX_TOKENS},5\n",
            id="a-count-past-the-reader-s-bound-is-clamped-to-it",
        ),
    ],
)
def test_format_row(prompt, output, row):
    assert format_row(T0, prompt, output) == row
    assert len(row) <= MAX_ROW_BYTES


def test_the_clamp_is_the_reader_s_bound():
    assert MAX_TOKENS == READER_MAX_TOKENS


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 31 * 86_400, allow_nan=False),  # the reader's span
            st.integers(-5, 2 * MAX_TOKENS),
            st.integers(-5, 2 * MAX_TOKENS),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_any_rows_read_back_through_the_replay_s_reader(tmp_path_factory, rows):
    """Times to the microsecond, from the earliest; counts clamped (0 replays as 1)."""
    path = tmp_path_factory.mktemp("rows") / "arrivals.csv"
    path.write_text(HEADER + "".join(format_row(T0 + t, p, o) for t, p, o in rows))
    trace = read_trace(path)
    ordered = sorted(rows, key=lambda r: r[0])  # the reader's sort is stable
    times = [round(T0 + t, 6) for t, _, _ in ordered]
    assert [round(a, 6) for a in trace.arrival] == pytest.approx(
        [t - times[0] for t in times], abs=2e-6
    )
    bound = lambda n: max(1, min(n, MAX_TOKENS))  # noqa: E731
    assert sorted(trace.prompt.tolist()) == sorted(bound(p) for _, p, _ in rows)
    assert sorted(trace.output.tolist()) == sorted(bound(o) for _, _, o in rows)


# --- rotation --------------------------------------------------------------------------

ROW = "x" * 29 + "\n"  # 30 bytes; HEADER is 40


@pytest.mark.parametrize(
    ("rows", "size", "max_bytes", "writes"),
    [
        pytest.param([], 70, 100, [], id="no-rows-write-nothing"),
        pytest.param([], 0, 100, [], id="no-rows-open-no-file"),
        pytest.param([ROW], 0, 100, [(True, HEADER + ROW)], id="the-first-row-opens-a-file"),
        pytest.param([ROW], 40, 100, [(False, ROW)], id="a-row-that-fits-goes-to-the-file"),
        pytest.param(
            [ROW, ROW],
            80,
            100,
            [(True, HEADER + ROW + ROW)],
            id="a-full-file-rotates-before-the-first-row",
        ),
        pytest.param(
            [ROW, ROW, ROW],
            40,
            100,
            [(False, ROW + ROW), (True, HEADER + ROW)],
            id="the-row-that-would-pass-the-bound-starts-the-next-file",
        ),
        pytest.param(
            [ROW],
            0,
            50,
            [(True, HEADER + ROW)],
            id="a-file-of-its-header-alone-takes-any-row",
        ),
    ],
)
def test_plan_writes(rows, size, max_bytes, writes):
    assert plan_writes(rows, size, max_bytes) == writes


@settings(deadline=None)
@given(
    st.lists(st.integers(1, MAX_ROW_BYTES - 1), max_size=200),
    st.integers(MIN_FILE_BYTES, 4 * MIN_FILE_BYTES),
    st.integers(0, 4 * MIN_FILE_BYTES),
)
def test_every_row_lands_once_in_order_and_no_file_passes_its_bound(lengths, max_bytes, size):
    size = min(size, max_bytes) if size == 0 or size >= len(HEADER) else len(HEADER)
    rows = [f"{i:>{n}}"[-n:] + "\n" for i, n in enumerate(lengths)]
    writes = plan_writes(rows, size, max_bytes)
    files, current = [], size
    for rotate, text in writes:
        if rotate:
            assert text.startswith(HEADER)
            files.append(current)
            current = 0
        current += len(text)
        assert current <= max(max_bytes, size)
    body = "".join(text.removeprefix(HEADER) if rotate else text for rotate, text in writes)
    assert body == "".join(rows)


NAMES = [file_name(i, T0 + i) for i in range(5)]


@pytest.mark.parametrize(
    ("names", "max_files", "deleted"),
    [
        pytest.param(NAMES, 2, NAMES[:3], id="the-oldest-go-the-newest-stay"),
        pytest.param(NAMES[:2], 2, [], id="at-the-bound-nothing-goes"),
        pytest.param(
            ["notes.txt", "arrivals.csv", *NAMES[:2]],
            1,
            NAMES[:1],
            id="files-the-gateway-did-not-write-are-never-deleted",
        ),
        pytest.param(
            [file_name(10, T0), file_name(9, T0 + 999)],
            1,
            [file_name(9, T0 + 999)],
            id="the-sequence-orders-files-not-the-clock",
        ),
    ],
)
def test_to_delete(names, max_files, deleted):
    assert to_delete(names, max_files) == deleted


def test_a_restart_continues_the_sequence():
    assert next_sequence([]) == 0
    assert next_sequence(["notes.txt", *NAMES]) == 5
    assert file_name(5, T0) == "arrivals-00000005-20250304T050607Z.csv"


# --- a prompt's estimate ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        pytest.param({"prompt": "a" * 40}, 10, id="text-is-four-characters-a-token"),
        pytest.param({"prompt": "abc"}, 1, id="a-part-token-counts-whole"),
        pytest.param({"prompt": [5, 6, 7]}, 3, id="token-ids-count-one-each"),
        pytest.param({"prompt": [[1, 2], [3]]}, 3, id="lists-of-token-ids-count-each-id"),
        pytest.param({"prompt": ["a" * 8, "b" * 8]}, 4, id="a-list-of-texts-counts-them-all"),
        pytest.param(
            {"messages": [{"role": "user", "content": "a" * 8}]},
            6,
            id="a-chat-message-adds-its-framing",
        ),
        pytest.param(
            {"messages": [{"content": [{"type": "text", "text": "a" * 8}, {"type": "image"}]}]},
            6,
            id="a-message-s-text-parts-count",
        ),
        pytest.param(
            {"messages": ["hi", None, {"content": 5}], "prompt": {"x": 1}},
            12,
            id="odd-shapes-count-no-text",
        ),
        pytest.param({}, 0, id="no-prompt-is-0"),
        pytest.param({"prompt": "a" * (5 * MAX_TOKENS)}, MAX_TOKENS, id="clamped-to-the-bound"),
    ],
)
def test_estimate_prompt_tokens(body, tokens):
    assert estimate_prompt_tokens(body) == tokens


# --- the config ------------------------------------------------------------------------


def test_the_arrivals_block_sets_the_recorder_and_is_off_by_default():
    assert parse_config("{}", "c").settings().arrivals == ArrivalSettings()
    assert ArrivalSettings().directory is None
    text = "arrivals: {directory: /var/lib/arrivals, max-file-bytes: 1Mi, max-files: 3}"
    assert parse_config(text, "c").settings().arrivals == ArrivalSettings(
        "/var/lib/arrivals", 1024**2, 3
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("arrivals: {max-files: 0}", "arrivals.max-files", id="no-file-kept"),
        pytest.param(
            "arrivals: {max-file-bytes: 100}",
            "arrivals.max-file-bytes",
            id="a-file-too-small-for-a-row",
        ),
        pytest.param(
            "arrivals: {max-file-bytes: 2Ti}", "arrivals.max-file-bytes", id="a-file-past-1-tib"
        ),
        pytest.param('arrivals: {directory: ""}', "arrivals.directory", id="an-empty-directory"),
        pytest.param(
            'arrivals: {directory: "a\\0b"}', "arrivals.directory", id="a-nul-in-the-directory"
        ),
        pytest.param("arrivals: {dir: /x}", "arrivals.dir", id="an-unknown-key"),
    ],
)
def test_bad_arrivals_blocks_are_refused_naming_the_key(text, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        parse_config(text, "c")


# --- a real gateway --------------------------------------------------------------------


def counts(gateway) -> dict[str, float]:
    """The recorder's counters (recorded, dropped, write_errors), from /metrics."""
    text = gateway.gateway.metrics.render().decode()
    prefix = "unitscale_gateway_arrivals_"
    return {
        s.name.removeprefix(prefix).removesuffix("_total"): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith(prefix)
        for s in family.samples
        if s.name.endswith("_total")
    }


async def settled(gateway, recorded: float, dropped: float = 0.0) -> None:
    """Every request so far written (or dropped): flushed now, not at the next second."""
    recorder = gateway.gateway.arrivals

    def ended() -> bool:
        c = counts(gateway)
        return c["recorded"] + c["dropped"] + len(recorder._pending) >= recorded + dropped

    await eventually(ended, "every request ended")
    await recorder.flush()
    await eventually(
        lambda: (counts(gateway)["recorded"], counts(gateway)["dropped"]) == (recorded, dropped),
        "every row written",
    )


async def post(gateway, body, path="/v1/completions") -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"http://127.0.0.1:{gateway.port}{path}", json=body) as r,
    ):
        if body.get("stream"):
            await r.read()
            return {"status": r.status}
        return {"status": r.status} | await r.json()


async def test_what_the_gateway_records_reads_back_as_a_trace(tmp_path):
    """Prompt tokens from the replica's usage, estimated where it reports none; output
    tokens as generated; one row per request, whatever its kind."""
    sim = await start_sim()
    settings = ArrivalSettings(str(tmp_path / "arrivals"))
    gateway = await start_gateway([sim.url], arrivals=settings)
    try:
        await wait_ready(gateway, 1)
        expected = []
        for n in (3, 17, 40):
            answer = await post(gateway, completion(max_tokens=n, prompt="word " * n))
            expected.append((answer["usage"]["prompt_tokens"], n))
        chat = {
            "model": "sim-llama",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi there"}],
        }
        answer = await post(gateway, chat, "/v1/chat/completions")
        expected.append((answer["usage"]["prompt_tokens"], 5))
        # a stream without usage: its token ids are its prompt, its events its output
        await post(gateway, completion(stream=True, max_tokens=7, prompt=[1] * 25))
        expected.append((25, 7))
        usage = {"include_usage": True}
        await post(gateway, completion(stream=True, max_tokens=9, stream_options=usage))
        expected.append((prompt_length(completion()["prompt"]), 9))
        await settled(gateway, recorded=len(expected))
        (path,) = (tmp_path / "arrivals").iterdir()
        trace = read_trace(path)
        rows = zip(trace.prompt.tolist(), trace.output.tolist(), strict=True)
        assert sorted(rows) == sorted(expected)
        assert list(trace.arrival) == sorted(trace.arrival) and trace.arrival[0] == 0.0
    finally:
        await gateway.stop()
        await sim.stop()


async def test_requests_that_fail_record_what_they_had(tmp_path):
    """An upstream 500 and a full buffer's 429: the prompt's estimate, no output."""
    from tests.test_gateway_faults import fakes

    (fake,) = await fakes(answer_500)
    failing = await start_gateway([fake.url], arrivals=ArrivalSettings(str(tmp_path / "a")))
    nowhere = f"http://127.0.0.1:{free_port()}"
    full = await start_gateway(
        [nowhere], buffer_size=0, arrivals=ArrivalSettings(str(tmp_path / "b"))
    )
    try:
        await wait_ready(failing, 1)
        assert (await post(failing, completion(prompt=[1] * 30)))["status"] == 500
        assert (await post(full, completion(prompt=[1] * 12)))["status"] == 429
        await settled(failing, recorded=1)
        await settled(full, recorded=1)
        rows = sorted(
            (int(p), int(o))
            for path in tmp_path.glob("*/*")
            for _, p, o in (line.split(",") for line in path.read_text().splitlines()[1:])
        )
        assert rows == [(12, 0), (30, 0)]
    finally:
        await failing.stop()
        await full.stop()
        await fake.stop()


async def test_rotation_keeps_at_most_max_files_of_at_most_max_file_bytes(tmp_path):
    """A restart's files count: the oldest go first, other files stay."""
    old = [tmp_path / file_name(i, T0) for i in range(3)]
    for path in old:
        path.write_text(HEADER)
    (tmp_path / "notes.txt").write_text("kept")
    sim = await start_sim()
    settings = ArrivalSettings(str(tmp_path), max_file_bytes=MIN_FILE_BYTES, max_files=2)
    gateway = await start_gateway([sim.url], arrivals=settings)
    recorder = gateway.gateway.arrivals
    try:
        await wait_ready(gateway, 1)
        total = 0
        for _ in range(4):  # batches of 30 rows (~45 bytes): several files each
            for _ in range(30):
                assert (await post(gateway, completion(max_tokens=2)))["status"] == 200
            total += 30
            await settled(gateway, recorded=total)
            names = sorted(p.name for p in tmp_path.iterdir())
            recorded = [n for n in names if n.startswith("arrivals-")]
            assert len(recorded) == 2 and "notes.txt" in names
            assert not set(recorded) & {p.name for p in old}
            assert next_sequence(recorded) > 3
            for name in recorded:
                assert (tmp_path / name).stat().st_size <= MIN_FILE_BYTES
                assert len(read_trace(tmp_path / name)) > 0
        assert recorder._files.size <= MIN_FILE_BYTES
    finally:
        await gateway.stop()
        await sim.stop()


async def test_a_write_that_fails_fails_no_request_and_is_logged_once(tmp_path, caplog):
    """The directory is a file: every batch fails, counted; requests are answered."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    sim = await start_sim()
    gateway = await start_gateway([sim.url], arrivals=ArrivalSettings(str(blocked / "arrivals")))
    try:
        await wait_ready(gateway, 1)
        with caplog.at_level(logging.WARNING, logger="serving.arrival_recorder"):
            for dropped in (3, 6):
                for _ in range(3):
                    assert (await post(gateway, completion()))["status"] == 200
                await settled(gateway, recorded=0, dropped=dropped)
        assert counts(gateway)["write_errors"] >= 2
        warnings = [r for r in caplog.records if r.name == "serving.arrival_recorder"]
        assert len(warnings) == 1 and "not-a-directory" in warnings[0].getMessage()
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://127.0.0.1:{gateway.port}/health") as r,
        ):
            assert r.status == 200  # the recording loop goes on
    finally:
        await gateway.stop()
        await sim.stop()


async def test_a_reload_turns_recording_on_and_off(tmp_path):
    from serving.gateway_settings import GatewaySettings

    sim = await start_sim()
    gateway = await start_gateway([sim.url])
    g = gateway.gateway
    try:
        await wait_ready(gateway, 1)
        assert (await post(gateway, completion()))["status"] == 200
        on = GatewaySettings(health_interval=0.05, arrivals=ArrivalSettings(str(tmp_path)))
        g.reconfigure([sim.url], on)
        assert (await post(gateway, completion()))["status"] == 200
        await settled(gateway, recorded=1)
        g.reconfigure([sim.url], GatewaySettings(health_interval=0.05))
        assert (await post(gateway, completion()))["status"] == 200
        await g.arrivals.flush()
        (path,) = tmp_path.iterdir()
        assert len(read_trace(path)) == 1 and counts(gateway)["recorded"] == 1
    finally:
        await gateway.stop()
        await sim.stop()


def test_a_file_holds_one_utc_day_at_most(tmp_path):
    """The writer (on its thread, called here directly) opens a new file at midnight UTC."""
    from serving.arrival_recorder import _Files

    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    midnight = datetime(2025, 3, 5, tzinfo=UTC).timestamp()
    files.write(settings, [(midnight - 2, 10, 1)], midnight - 1)
    files.write(settings, [(midnight - 1, 20, 2)], midnight - 0.5)
    files.write(settings, [(midnight - 0.2, 30, 3)], midnight + 1)
    files.reset()
    paths = sorted(tmp_path.iterdir())
    assert [p.name[18:26] for p in paths] == ["20250304", "20250305"]
    assert [read_trace(p).prompt.tolist() for p in paths] == [[10, 20], [30]]
    assert is_a_later_day(midnight - 1, midnight) and not is_a_later_day(midnight, midnight + 1)
    assert not is_a_later_day(midnight, midnight - 1)  # a clock stepped back opens no file
