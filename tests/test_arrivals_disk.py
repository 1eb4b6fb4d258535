"""The arrivals writer when the disk fails under it (issue 27's eighteenth hostile pass).

A full disk, a write that lands half its bytes, the directory or the file removed or
moved while the gateway runs: the record keeps what it held, takes rows again once the
disk does, and never counts rows written to a file nobody can read. The writer
(``serving.arrival_recorder._Files``) is called directly, as its thread does.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.trace import busiest_window, read_recording, read_trace
from serving.arrival_recorder import Row, _Files
from serving.arrivals import ArrivalSettings
from tests.conftest import T0


class Disk:
    """Files opened through ``Path.open`` whose writes fail while ``full``.

    ``landing`` is the share of a failing write's bytes that reach the file first (a
    disk that fills mid-write).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, landing: float = 0.0) -> None:
        self.full = False
        self.landing = landing
        real_open = Path.open

        def opened(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = real_open(path, mode, *args, **kwargs)
            return _Failing(handle, self) if "b" in mode else handle

        monkeypatch.setattr(Path, "open", opened)

    def fail(self, files: _Files, settings: ArrivalSettings, batch: list[Row], now: float) -> None:
        """One batch written while the disk is full: it fails, and the disk frees after."""
        self.full = True
        with pytest.raises(OSError):
            files.write(settings, batch, now)
        self.full = False


class _Failing:
    def __init__(self, handle: IO[bytes], disk: Disk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data: bytes) -> int:
        if self._disk.full:
            self._handle.write(data[: int(len(data) * self._disk.landing)])
            self._handle.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _Failing:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


def rows(start: int, count: int) -> list[tuple[float, int, int]]:
    """``count`` rows whose prompt tokens number them from ``start`` + 1."""
    return [(T0 + start + i, 1 + start + i, 1) for i in range(count)]


def recorded(directory: Path) -> dict[str, list[int]]:
    """Each recorded file's rows (by their prompt tokens), read back by the replay's reader."""
    return {
        path.name: read_trace(path).prompt.tolist() for path in sorted(directory.glob("arrivals-*"))
    }


def test_a_full_disk_deletes_no_history_and_opens_no_file_after_file(tmp_path, monkeypatch):
    """16 failing batches, each of which would have rotated: the two files of history stay
    whole and at most one more file is tried for all of them; the first batch after the
    disk frees lands whole and only then displaces the oldest rows."""
    disk = Disk(monkeypatch)
    files, settings = _Files(), ArrivalSettings(str(tmp_path), 1024, 2)
    for batch in range(4):  # 40 rows of about 30 bytes: past a file a batch
        files.write(settings, rows(100 * batch, 40), T0 + batch)
    history = recorded(tmp_path)
    assert len(history) == 2
    disk.full = True
    for batch in range(4, 20):
        with pytest.raises(OSError, match="No space"):
            files.write(settings, rows(100 * batch, 40), T0 + batch)
    after = recorded(tmp_path)
    assert {name: after[name] for name in history} == history
    assert len(after) <= 3
    disk.full = False
    files.write(settings, rows(2000, 20), T0 + 20)  # less than a file
    files.reset()
    now = [row for prompts in recorded(tmp_path).values() for row in prompts]
    kept = [row for prompts in history.values() for row in prompts]
    assert now[-20:] == list(range(2001, 2021))
    assert now[:-20] == kept[len(kept) - len(now) + 20 :]  # the newest of the history


@pytest.mark.parametrize(
    "landing",
    [
        pytest.param(0.0, id="a failing write that lands nothing is resumed where it began"),
        pytest.param(0.5, id="half a failing write's bytes are cut before the next batch"),
    ],
)
def test_a_failed_batch_leaves_no_row_and_no_part_row_in_the_file(tmp_path, monkeypatch, landing):
    disk = Disk(monkeypatch, landing)
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    disk.fail(files, settings, rows(100, 10), T0 + 1)
    files.write(settings, rows(200, 10), T0 + 2)
    files.reset()
    assert list(recorded(tmp_path).values()) == [[*range(1, 11), *range(201, 211)]]


def remove_directory(directory: Path, path: Path) -> None:
    shutil.rmtree(directory)


def delete_file(directory: Path, path: Path) -> None:
    path.unlink()


def move_file(directory: Path, path: Path) -> None:
    path.rename(directory.parent / "moved.csv")


@pytest.mark.parametrize(
    "remove",
    [
        pytest.param(remove_directory, id="the directory removed is made again"),
        pytest.param(delete_file, id="the file deleted is followed by a new file"),
        pytest.param(move_file, id="the file moved away is followed by a new file"),
    ],
)
def test_rows_after_the_file_goes_land_in_a_file_of_the_directory(tmp_path, remove):
    """Writes to the open descriptor would succeed and read back nowhere."""
    directory = tmp_path / "arrivals"
    files, settings = _Files(), ArrivalSettings(str(directory), 1024, 4)
    files.write(settings, rows(0, 5), T0)
    assert files.path is not None
    remove(directory, files.path)
    files.write(settings, rows(100, 5), T0 + 1)
    files.write(settings, rows(200, 40), T0 + 2)  # past 1 KiB: a rotation scans the directory
    files.reset()
    found = [row for prompts in recorded(directory).values() for row in prompts]
    assert found == [*range(101, 106), *range(201, 241)]


MIDNIGHT = T0 - T0 % 86_400 + 86_400


def left_for_the_next_day(files: _Files, settings: ArrivalSettings, disk: Disk) -> None:
    files.write(settings, rows(0, 10), MIDNIGHT - 5)
    disk.fail(files, settings, rows(100, 10), MIDNIGHT - 4)
    files.write(settings, rows(200, 10), MIDNIGHT + 5)
    files.reset()


def left_at_shutdown(files: _Files, settings: ArrivalSettings, disk: Disk) -> None:
    files.write(settings, rows(0, 10), MIDNIGHT - 5)
    disk.fail(files, settings, rows(100, 10), MIDNIGHT - 4)
    files.reset()  # the gateway restarted to free the volume


def first_batch_failed(files: _Files, settings: ArrivalSettings, disk: Disk) -> None:
    files.write(settings, rows(0, 10), MIDNIGHT - 5)
    files.reset()
    disk.fail(files, settings, rows(100, 10), MIDNIGHT - 4)
    files.reset()


@pytest.mark.parametrize(
    ("scenario", "found"),
    [
        pytest.param(
            left_for_the_next_day,
            [*range(1, 11), *range(201, 211)],
            id="a file left for the next day is cut back",
        ),
        pytest.param(
            left_at_shutdown, list(range(1, 11)), id="a file left at shutdown is cut back"
        ),
        pytest.param(
            first_batch_failed, list(range(1, 11)), id="a file whose first batch failed is deleted"
        ),
    ],
)
def test_a_file_left_after_a_failed_batch_holds_no_part_row(tmp_path, monkeypatch, scenario, found):
    """Half of each failing write lands: left as it was, the replay refuses the recording."""
    disk = Disk(monkeypatch, landing=0.47)
    scenario(_Files(), ArrivalSettings(str(tmp_path)), disk)
    assert read_recording(tmp_path).prompt.tolist() == found


def test_a_clock_stepping_back_and_forth_over_midnight_keeps_the_history(tmp_path):
    """Each step back opened a file; the bound on files then deleted the oldest."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path), 1 << 20, 2)
    for batch in range(20):
        now = MIDNIGHT + (5 if batch % 2 else -5)
        files.write(settings, [(now, batch + 1, 1)], now)
    files.reset()
    assert sorted(row for rows_ in recorded(tmp_path).values() for row in rows_) == list(
        range(1, 21)
    )


def test_a_file_replaced_while_its_failed_batch_waits_is_not_ours_to_cut(tmp_path, monkeypatch):
    """Resuming it would cut another writer's file, or zero-fill it up to our offset."""
    disk = Disk(monkeypatch, landing=0.5)
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    disk.fail(files, settings, rows(100, 10), T0 + 1)
    assert files.path is not None
    files.path.unlink()
    files.path.write_bytes(b"someone else's\n")
    replaced = files.path
    files.write(settings, rows(200, 10), T0 + 2)
    files.reset()
    assert replaced.read_bytes() == b"someone else's\n"
    assert files.path is None and len(list(tmp_path.iterdir())) == 2


def test_a_file_cut_short_in_place_is_left_and_the_recording_reads(tmp_path):
    """A ``copytruncate`` rotation: writing on at our offset left a hole of zeros."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    assert files.path is not None
    os.truncate(files.path, 0)
    files.write(settings, rows(100, 10), T0 + 1)
    files.reset()
    assert all(b"\0" not in path.read_bytes() for path in tmp_path.iterdir())
    assert read_recording(tmp_path).prompt.tolist() == list(
        range(101, 111)
    )  # the empty file adds nothing


@pytest.mark.parametrize(
    "leave",
    [
        pytest.param(lambda files, settings: None, id="at shutdown"),
        pytest.param(
            lambda files, settings: files.write(settings, rows(86_400, 3), T0 + 86_400),
            id="for the next day",
        ),
    ],
)
def test_a_failed_file_cut_short_in_place_is_not_cut_back_up_to_our_length(
    tmp_path, monkeypatch, leave
):
    """Truncating "back" to what we had flushed zero-filled it: the replay refused it all."""
    disk = Disk(monkeypatch)
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    disk.fail(files, settings, rows(100, 10), T0 + 1)
    assert files.path is not None
    os.truncate(files.path, 0)  # a copytruncate rotation
    leave(files, settings)
    files.reset()
    assert [b"\0" in path.read_bytes() for path in sorted(tmp_path.iterdir())] == [False] * len(
        list(tmp_path.iterdir())
    )


def test_a_file_opened_on_a_clock_a_year_ahead_ends_when_the_clock_comes_back(tmp_path):
    """It would never see a later day: its rows would pass the replay's 31-day span."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 5), T0 + 365 * 86_400)  # one flush on a clock a year ahead
    for day in range(40):
        now = T0 + day * 86_400
        files.write(settings, [(now, day + 1, 1)], now)
    files.reset()
    assert read_recording(tmp_path).prompt.tolist() == list(range(25, 41))  # a file a day, 16 kept


def test_a_burst_over_small_files_keeps_the_bound_while_it_rotates(tmp_path, monkeypatch):
    """The files a rotation displaced were deleted only at the batch's end: one burst over
    1 KiB files left 5,370 of a bound of 16 (22 MB), and each rotation listed them all,
    so the batch grew quadratic (issue 27, hostile pass 29)."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path), 1024, 16)
    seen: list[int] = []
    opened = _Files._open_next

    def counting(self: _Files, directory: Path, max_files: int, now: float) -> None:
        opened(self, directory, max_files, now)
        seen.append(len(list(directory.iterdir())))

    monkeypatch.setattr(_Files, "_open_next", counting)
    files.write(settings, rows(0, 5_000), T0)
    files.reset()
    assert len(seen) > 100  # it rotated all along the batch
    assert max(seen) <= 17  # the bound, and the file just opened
    assert read_recording(tmp_path).prompt.tolist()[-1] == 5_000


def test_a_row_cut_short_by_a_kill_is_left_out_and_the_rest_replays(tmp_path, caplog):
    """A write cut off by a full disk, then a kill, left a part row: the replay refused the
    whole recording (issue 27, hostile pass 29)."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    files.close()  # as a kill leaves it: no _leave to cut the part row back
    (path,) = tmp_path.glob("arrivals-*")
    with path.open("ab") as handle:
        handle.write(b"2026-1")
    trace = read_recording(tmp_path)
    assert trace.prompt.tolist() == list(range(1, 11))
    assert f"{path}:12: a row cut short" in caplog.text


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        pytest.param(
            (T0, 1), (T0 + 40 * 86_400, 5), [2, 3, 4, 5, 6],
            id="a run left from 40 days before is left out",
        ),
        pytest.param(
            (T0 + 40 * 86_400, 1), (T0, 5), [2, 3, 4, 5, 6],
            id="one flush on a clock 40 days ahead is left out",
        ),
    ],
)  # fmt: skip
def test_a_recording_over_31_days_replays_its_busiest_31(tmp_path, caplog, first, second, kept):
    """Refused whole until the far file rotated out, which at low traffic could be never
    (issue 27, hostile pass 29)."""
    for at, count in (first, second):
        start = 0 if count == 1 else 1
        batch = [(at + i, 1 + start + i, 1) for i in range(count)]
        files = _Files()
        files.write(ArrivalSettings(str(tmp_path / "d")), batch, at)
        files.reset()  # a gateway stopped, then another started
    assert read_recording(tmp_path / "d").prompt.tolist() == kept
    assert "1 of 6 requests lie outside the 31 days" in caplog.text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1000), min_size=1, max_size=40), st.floats(0, 300))
def test_the_busiest_window_holds_the_most_times_within_the_span(times, span):
    ordered = np.sort(np.array(times))
    start, end = busiest_window(ordered, span)
    assert ordered[end - 1] - ordered[start] <= span
    best = max(int(np.sum((ordered >= t) & (ordered <= t + span))) for t in ordered)
    assert end - start == best


def test_a_file_whose_header_was_cut_short_is_left_out(tmp_path, caplog):
    """A new file's first write cut after 14 bytes (a full disk, then a kill) left
    'TIMESTAMP,Cont': the replay refused every other file's rows (issue 27, hostile
    pass 30)."""
    files, settings = _Files(), ArrivalSettings(str(tmp_path))
    files.write(settings, rows(0, 10), T0)
    files.reset()
    cut = tmp_path / "arrivals-00000001-20240102T000000Z.csv"
    cut.write_bytes(b"TIMESTAMP,Cont")
    assert read_recording(tmp_path).prompt.tolist() == list(range(1, 11))
    assert f"{cut}: a header cut short" in caplog.text
