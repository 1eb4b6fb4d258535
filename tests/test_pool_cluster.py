"""replay.pool.cluster: the Alibaba GPU trace's node and pod lists as Node and Task values."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.limits import MAX_POD_LIST_SECONDS
from replay.pool.cluster import (
    MAX_NODE_GPUS,
    NODE_COLUMNS,
    TASK_COLUMNS,
    Node,
    Task,
    _Cell,
    read_nodes,
    read_tasks,
)
from tests.shared_data import shared

ALIBABA = ("traces", "alibaba-gpu-2023")
NODES_CSV = "openb_node_list_gpu_node.csv"
DEFAULT_CSV = "openb_pod_list_default.csv"
GPUSPEC_CSV = "openb_pod_list_gpuspec33.csv"


def alibaba(name: str) -> Path:
    """One of the Alibaba trace's files in ``../shared`` (skips without it)."""
    return shared(*ALIBABA, name)


GOOD_TASK = {
    "name": "pod-a",
    "cpu_milli": "4000",
    "memory_mib": "8192",
    "num_gpu": "1",
    "gpu_milli": "500",
    "gpu_spec": "",
    "qos": "LS",
    "pod_phase": "Running",
    "creation_time": "100",
    "deletion_time": "400",
    "scheduled_time": "150",
}
GOOD_NODE = {
    "sn": "node-a",
    "cpu_milli": "64000",
    "memory_mib": "262144",
    "gpu": "2",
    "model": "T4",
}


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> Path:
    lines = [",".join(columns)] + [",".join(row.get(c, "") for c in columns) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_real_node_list_is_1213_nodes_with_6212_gpus_of_seven_models():
    nodes = read_nodes(alibaba(NODES_CSV))
    assert len(nodes) == 1213
    assert sum(node.gpus for node in nodes) == 6212
    assert Counter(node.model for node in nodes) == {
        "G2": 549,
        "T4": 404,
        "P100": 134,
        "V100M16": 55,
        "G3": 39,
        "V100M32": 30,
        "A10": 2,
    }
    assert nodes[0] == Node("openb-node-0000", "P100", 2, 64000, 262144)


@pytest.mark.parametrize("name", [DEFAULT_CSV, GPUSPEC_CSV], ids=["default", "gpuspec33"])
def test_the_real_pod_lists_are_8152_tasks_sorted_from_zero(name):
    tasks = read_tasks(alibaba(name))
    assert len(tasks) == 8152
    assert tasks[0].arrival == 0
    assert [(t.arrival, t.name) for t in tasks] == sorted((t.arrival, t.name) for t in tasks)
    assert sum(t.gpus == 0 for t in tasks) == 1088  # CPU-only, kept
    assert sum(t.gpus == 1 and t.gpu_milli < 1000 for t in tasks) == 3078
    multi = [t for t in tasks if t.gpus > 1]
    assert len(multi) == 75 and all(t.gpu_milli == 1000 for t in multi)
    qos = {"LS": 4647, "BE": 3398, "Burstable": 100, "Guaranteed": 7}
    assert Counter(t.qos for t in tasks) == qos
    assert sum(t.phase == "Pending" for t in tasks) == 897
    assert round(sum(t.cards for t in tasks), 6) == 6086.8


def test_the_gpuspec33_list_carries_type_constraints_and_the_default_none():
    assert all(t.gpu_types == () for t in read_tasks(alibaba(DEFAULT_CSV)))
    constrained = [t for t in read_tasks(alibaba(GPUSPEC_CSV)) if t.gpu_types]
    assert len(constrained) == 8152 - 5764
    models = {m for t in constrained for m in t.gpu_types}
    assert models <= {"G2", "T4", "P100", "G3", "V100M16", "V100M32", "A10"}
    assert all(list(t.gpu_types) == sorted(set(t.gpu_types)) for t in constrained)


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5])
def test_a_node_fraction_keeps_each_model_and_size_with_its_share(fraction):
    full = Counter((n.model, n.gpus) for n in read_nodes(alibaba(NODES_CSV)))
    kept = Counter((n.model, n.gpus) for n in read_nodes(alibaba(NODES_CSV), fraction))
    assert set(kept) == set(full)  # every group keeps at least one node
    for group, size in full.items():
        assert kept[group] == max(1, int(fraction * size + 0.5)), group


@settings(max_examples=8, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_a_larger_fraction_keeps_a_superset_of_the_same_rows(a, b):
    small, large = sorted((a, b))
    assert set(read_nodes(alibaba(NODES_CSV), small)) <= set(read_nodes(alibaba(NODES_CSV), large))
    assert read_nodes(alibaba(NODES_CSV), small) == read_nodes(alibaba(NODES_CSV), small)
    names_small = {t.name for t in read_tasks(alibaba(DEFAULT_CSV), small)}
    assert names_small <= {t.name for t in read_tasks(alibaba(DEFAULT_CSV), large)}


def test_a_task_fraction_is_stable_rebased_and_about_its_share():
    tasks = read_tasks(alibaba(DEFAULT_CSV), 0.25)
    assert tasks == read_tasks(alibaba(DEFAULT_CSV), 0.25)
    assert 0.22 * 8152 < len(tasks) < 0.28 * 8152
    assert tasks[0].arrival == 0
    # The same names in both pod lists, so both keep the same tasks.
    assert [t.name for t in tasks] == [t.name for t in read_tasks(alibaba(GPUSPEC_CSV), 0.25)]


@pytest.mark.parametrize(
    ("row", "duration", "types"),
    [
        pytest.param({}, 250.0, (), id="a scheduled task ran from scheduled_time to deletion_time"),
        pytest.param(
            {"scheduled_time": "", "pod_phase": "Pending"},
            300.0,
            (),
            id="a task never scheduled asked from creation_time to deletion_time",
        ),
        pytest.param(
            {"gpu_spec": "V100M32|V100M16|V100M32"},
            250.0,
            ("V100M16", "V100M32"),
            id="a gpu_spec becomes the sorted models, duplicates dropped",
        ),
    ],
)
def test_a_row_becomes_a_task(tmp_path, row, duration, types):
    path = write_csv(tmp_path / "pods.csv", TASK_COLUMNS, [GOOD_TASK | row])
    (task,) = read_tasks(path)
    assert task.duration == duration
    assert task.gpu_types == types
    assert task.arrival == 0  # rebased
    assert task.cards == 0.5


@pytest.mark.parametrize(
    ("row", "line", "message"),
    [
        pytest.param(
            {"cpu_milli": "4 cores"},
            2,
            "column cpu_milli: '4 cores' is not an integer",
            id="a CPU that is not an integer names the column",
        ),
        pytest.param(
            {"num_gpu": "2", "gpu_milli": "500"},
            2,
            "a multi-GPU task must take whole GPUs",
            id="a share of several GPUs is refused",
        ),
        pytest.param(
            {"gpu_milli": "1200"}, 2, "gpu_milli 1200 is outside 1..1000", id="over one GPU"
        ),
        pytest.param(
            {"num_gpu": "0", "gpu_milli": "300"},
            2,
            "gpu_milli 300 on a task with num_gpu 0",
            id="a share on a CPU-only task is refused",
        ),
        pytest.param(
            {"deletion_time": "120"},
            2,
            "deletion_time before it started",
            id="a task deleted before it was scheduled is refused",
        ),
        pytest.param(
            {"creation_time": "-5"},
            2,
            "column creation_time: '-5' is not a time from the trace start",
            id="a negative time is refused",
        ),
        pytest.param({"name": ""}, 2, "column name: is empty", id="a task without a name"),
        pytest.param(
            {"creation_time": "\u0661\u0660\u0660\u0660"},
            2,
            "column creation_time: '\u0661\u0660\u0660\u0660' is not a number of seconds",
            id="a time in Arabic-Indic digits is refused",
        ),
        pytest.param(
            {"deletion_time": "3_600"},
            2,
            "column deletion_time: '3_600' is not a number of seconds",
            id="a time with an underscore between digits is refused",
        ),
        pytest.param(
            {"scheduled_time": "nan"},
            2,
            "column scheduled_time: 'nan' is not a number",
            id="a time of nan is refused",
        ),
        pytest.param(
            {"creation_time": "1e999"},
            2,
            "column creation_time: '1e999' is not a time from the trace start",
            id="a time past a float is refused",
        ),
        pytest.param(
            {"creation_time": "1e308", "deletion_time": "1e308", "scheduled_time": "1e308"},
            2,
            "column creation_time: '1e308' is past 31,622,400 s (a year)",
            id="a time past a year compressed every other arrival to 0 and is refused",
        ),
        pytest.param(
            {"deletion_time": "31622401"},
            2,
            "column deletion_time: '31622401' is past 31,622,400 s",
            id="a deletion a second past a year is refused",
        ),
    ],
)
def test_a_bad_task_row_names_file_line_and_column(tmp_path, row, line, message):
    path = write_csv(tmp_path / "pods.csv", TASK_COLUMNS, [GOOD_TASK, GOOD_TASK | row])
    with pytest.raises(ValueError, match=r"pods\.csv:(\d+)") as error:
        read_tasks(path)
    assert f"pods.csv:{line + 1}" in str(error.value)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        pytest.param({"gpu": "two"}, "column gpu: 'two' is not an integer", id="a GPU count"),
        pytest.param({"model": ""}, "column model: is empty", id="a node without a model"),
        pytest.param({"cpu_milli": "-1"}, "cpu_milli is negative", id="negative CPU"),
        pytest.param(
            {"gpu": "10000000"},
            f"10000000 GPUs, more than the {MAX_NODE_GPUS} a node may hold",
            id="a node of ten million GPUs is refused naming the limit",
        ),
        pytest.param(
            {"gpu": str(MAX_NODE_GPUS + 1)},
            f"more than the {MAX_NODE_GPUS}",
            id="one GPU beyond the limit is refused",
        ),
    ],
)
def test_a_bad_node_row_names_file_line_and_column(tmp_path, row, message):
    path = write_csv(tmp_path / "nodes.csv", NODE_COLUMNS, [GOOD_NODE | row])
    with pytest.raises(ValueError, match=r"nodes\.csv:2: ") as error:
        read_nodes(path)
    assert message in str(error.value)


def test_a_file_missing_a_column_says_which(tmp_path):
    path = write_csv(tmp_path / "pods.csv", TASK_COLUMNS[:-1], [GOOD_TASK])
    with pytest.raises(ValueError, match=r"pods\.csv:1: missing column\(s\) scheduled_time"):
        read_tasks(path)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="not within"):
        read_nodes(alibaba(NODES_CSV), fraction)
    with pytest.raises(ValueError, match="not within"):
        read_tasks(alibaba(DEFAULT_CSV), fraction)


def test_a_file_without_rows_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no nodes"):
        read_nodes(write_csv(tmp_path / "nodes.csv", NODE_COLUMNS, []))
    with pytest.raises(ValueError, match="no tasks kept"):
        read_tasks(write_csv(tmp_path / "pods.csv", TASK_COLUMNS, []))


def test_a_task_built_in_code_is_checked_as_a_row_is():
    with pytest.raises(ValueError, match="whole GPUs"):
        Task("t", 0.0, 1.0, 4, 250, (), "BE", 1000, 1024)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["\u0661\u0660\u0660\u0660", "3_600"])
    | st.text(max_size=20)
    | st.floats().map(str)
)
def test_a_time_is_read_from_ascii_decimal_digits_only(text):
    """'١٠٠٠' and '3_600' were taken as seconds (issue 27, hostile pass 4, L1)."""
    cell = _Cell(Path("pods.csv"), 2, {"creation_time": text})
    try:
        seconds = cell.seconds("creation_time")
    except ValueError:
        return
    value = text.strip()
    assert value.isascii() and "_" not in value and seconds == float(value) >= 0
    assert seconds <= MAX_POD_LIST_SECONDS
