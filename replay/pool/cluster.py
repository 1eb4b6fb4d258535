"""The Alibaba GPU cluster trace (cluster-trace-gpu-v2023, "openb"): its nodes and tasks.

Pure parsing with the ``csv`` module (reading the path given is the only I/O). The files
and their columns (see ``shared/traces/README.md``):

- ``openb_node_list_gpu_node.csv``: ``sn,cpu_milli,memory_mib,gpu,model``, one row per
  node (1,213 nodes, 6,212 GPUs, models G2/T4/P100/G3/V100M16/V100M32/A10);
- ``openb_pod_list_*.csv``: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
  pod_phase,creation_time,deletion_time,scheduled_time``, one row per task (8,152).

What is kept and how:

- **CPU-only tasks are kept** (``gpus == 0``, ``gpu_milli == 0``; 1,088 of the 8,152):
  they take CPU and memory on the GPU nodes, which is one way GPUs are stranded (FGD's
  "lack CPU" fragments), so dropping them would flatter every placement policy.
- ``gpu_milli`` is per GPU; below 1000 it is a share of ONE GPU (HAMi-style sharing).
  A task with ``num_gpu > 1`` must ask for whole GPUs (1000 each); every row of the
  trace does, and one that does not is refused (the pool could not place it honestly).
- ``gpu_spec`` (``T4``, ``V100M16|V100M32``, empty = any) becomes the sorted tuple of
  allowed models, duplicates dropped (the gpuspec33 file has ``V100M16|V100M32|V100M32``).
- ``arrival`` is ``creation_time``, rebased so the first kept task arrives at 0.
  ``duration`` is the time the task ran: ``deletion_time - scheduled_time``; a task the
  real cluster never scheduled (``pod_phase`` Pending, empty ``scheduled_time``; 897) has
  ``deletion_time - creation_time``, how long it asked before it was withdrawn.

``fraction`` subsamples deterministically by a stable hash of the name (``zlib.crc32``),
so a fraction keeps the same rows on every run and a larger one keeps a superset. Nodes
are stratified: each (model, gpus) group keeps ``round(fraction * size)`` of its nodes,
at least one, so a small pool stays as heterogeneous as the full one.
"""

from __future__ import annotations

import csv
import math
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from foundation.errors import quote
from replay.limits import MAX_POD_LIST_SECONDS

MILLI = 1000
"""``gpu_milli`` of one whole GPU."""
MAX_NODE_GPUS = 64
"""GPUs one node may hold. The openb nodes hold 1 to 8 and the largest real boards 16;
the pool keeps a name and a slot per GPU, so a row of 10**7 GPUs stalled ``--pool``
instead of failing. Matches ``admission.hami.MAX_DEVICES_PER_NODE``."""

MAX_CPU_MILLI = 10**7
"""``cpu_milli`` of a node or task: 10,000 cores (the openb nodes hold 96 to 128)."""
MAX_MEMORY_MIB = 10**9
"""``memory_mib``: about 1 PiB (the openb nodes hold 0.4 to 2 TiB)."""
MAX_ROWS = 1_000_000
"""Rows of a node or pod list: the openb files hold 1,213 and 8,152."""
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
"""ASCII decimal: no ``_``, other digits, ``inf`` or ``nan`` (``float()`` takes them)."""
_COUNT = 10**9
"""Where a node's GPU count stops being parsed; ``Node`` names its own limit below it."""

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


@dataclass(frozen=True, slots=True)
class Node:
    """One node of the pool: its GPU model, GPU count, CPU (milli-cores) and memory (MiB)."""

    name: str
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError(f"node {self.name!r}: empty GPU model")
        for field_name in ("gpus", "cpu_milli", "memory_mib"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"node {self.name!r}: {field_name} is negative")
        if self.gpus > MAX_NODE_GPUS:
            raise ValueError(
                f"node {self.name!r}: {self.gpus} GPUs, more than the {MAX_NODE_GPUS} a node "
                "may hold"
            )


@dataclass(frozen=True, slots=True)
class Task:
    """One training or batch task of the trace (times in seconds).

    ``gpus`` whole GPUs when above 1; with ``gpus == 1``, ``gpu_milli`` (1..1000) of one
    GPU; ``gpus == 0`` is a CPU-only task (``gpu_milli`` 0). ``gpu_types`` are the models
    allowed, ``()`` for any. ``phase`` is the trace's ``pod_phase`` (Running, Succeeded,
    Failed, Pending), kept for reports.
    """

    name: str
    arrival: float
    duration: float
    gpus: int
    gpu_milli: int
    gpu_types: tuple[str, ...]
    qos: str
    cpu_milli: int
    memory_mib: int
    phase: str = ""

    def __post_init__(self) -> None:
        problem = _task_problem(self)
        if problem:
            raise ValueError(f"task {self.name!r}: {problem}")

    @property
    def cards(self) -> float:
        """GPUs' worth the task holds: ``gpus * gpu_milli / 1000``."""
        return self.gpus * self.gpu_milli / MILLI


def _task_problem(task: Task) -> str:
    """What makes a task impossible to place honestly, or "" (column names in the text)."""
    if task.gpus < 0:
        return "num_gpu is negative"
    if task.gpus == 0 and task.gpu_milli != 0:
        return f"gpu_milli {task.gpu_milli} on a task with num_gpu 0"
    if task.gpus >= 1 and not 1 <= task.gpu_milli <= MILLI:
        return f"gpu_milli {task.gpu_milli} is outside 1..{MILLI}"
    if task.gpus > 1 and task.gpu_milli != MILLI:
        return (
            f"num_gpu {task.gpus} with gpu_milli {task.gpu_milli}: a multi-GPU task must"
            f" take whole GPUs (gpu_milli {MILLI})"
        )
    if task.cpu_milli < 0 or task.memory_mib < 0:
        return "cpu_milli or memory_mib is negative"
    if not task.duration >= 0:
        return f"duration {task.duration} is negative (deletion_time before it started)"
    return ""


def read_nodes(path: Path, fraction: float = 1.0) -> tuple[Node, ...]:
    """Read the node list; ``fraction`` keeps that share of each (model, gpus) group.

    Raises:
        ValueError: a bad fraction, a missing column, or a bad row (file, line, column).
    """
    _check_fraction(fraction)
    nodes: list[Node] = []
    for line, row in _rows(path, NODE_COLUMNS):
        at = _Cell(path, line, row)
        name, model = at.text("sn"), at.text("model")
        gpus, cpu = at.integer("gpu", _COUNT), at.integer("cpu_milli", MAX_CPU_MILLI)
        memory = at.integer("memory_mib", MAX_MEMORY_MIB)
        try:
            node = Node(name, model, gpus, cpu, memory)
        except ValueError as err:
            raise at.error(str(err)) from err
        nodes.append(node)
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    return _stratified(nodes, fraction)


def read_tasks(path: Path, fraction: float = 1.0) -> tuple[Task, ...]:
    """Read a pod list, sorted by (arrival, name), the first kept arrival at 0.

    ``fraction`` keeps a task when its name's crc32 falls below ``fraction`` of 2**32.

    Raises:
        ValueError: a bad fraction, a missing column, a bad row (file, line, column), or
            no task kept.
    """
    _check_fraction(fraction)
    kept: list[Task] = []
    for line, row in _rows(path, TASK_COLUMNS):
        task = _task(_Cell(path, line, row))
        if _hash_share(task.name) < fraction:
            kept.append(task)
    if not kept:
        raise ValueError(f"{path}: no tasks kept at fraction {fraction}")
    start = min(task.arrival for task in kept)
    rebased = (_rebased(task, start) for task in kept)
    return tuple(sorted(rebased, key=lambda task: (task.arrival, task.name)))


def _task(at: _Cell) -> Task:
    gpus, gpu_milli = at.integer("num_gpu", MAX_NODE_GPUS), at.integer("gpu_milli", MAX_CPU_MILLI)
    created, deleted = at.seconds("creation_time"), at.seconds("deletion_time")
    scheduled = at.seconds("scheduled_time") if at.text("scheduled_time", empty=True) else None
    started = created if scheduled is None else scheduled
    try:
        return Task(
            name=at.text("name"),
            arrival=created,
            duration=deleted - started,
            gpus=gpus,
            gpu_milli=gpu_milli,
            gpu_types=_gpu_types(at.text("gpu_spec", empty=True)),
            qos=at.text("qos"),
            cpu_milli=at.integer("cpu_milli", MAX_CPU_MILLI),
            memory_mib=at.integer("memory_mib", MAX_MEMORY_MIB),
            phase=at.text("pod_phase", empty=True),
        )
    except ValueError as err:
        raise at.error(str(err)) from err


def _rebased(task: Task, start: float) -> Task:
    return Task(
        task.name,
        task.arrival - start,
        task.duration,
        task.gpus,
        task.gpu_milli,
        task.gpu_types,
        task.qos,
        task.cpu_milli,
        task.memory_mib,
        task.phase,
    )


def _gpu_types(spec: str) -> tuple[str, ...]:
    return tuple(sorted({part.strip() for part in spec.split("|") if part.strip()}))


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows as dicts with their line numbers; the header must name every column.

    Raises:
        ValueError: a missing column or one named twice, more than ``MAX_ROWS`` rows,
            or a line the csv module refuses (a field over its 128 KiB limit;
            ``csv.Error`` is no ValueError and came out as a traceback), naming the file
            and line.
        UnitscaleError: not a regular file (``/dev/zero``), a line over
            ``MAX_LINE_BYTES`` or not UTF-8 (``replay.trace``'s line reader).
    """
    reader = csv.DictReader(_text_lines(path))
    try:
        header = list(reader.fieldnames or ())
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)}")
        twice = [c for c in columns if header.count(c) > 1]
        if twice:  # the csv module kept the last copy, silently (hostile pass 48)
            raise ValueError(f"{path}:1: column {twice[0]} is named twice in the header")
        for number, row in enumerate(reader, start=2):
            if number > MAX_ROWS + 1:
                raise ValueError(f"{path}:{reader.line_num}: more than {MAX_ROWS:,} rows")
            yield number, row
    except csv.Error as err:  # raised before the module counts the line it is on
        raise ValueError(f"{path}:{reader.line_num + 1}: {err}") from err


def _text_lines(path: Path) -> Iterator[str]:
    """``path``'s lines as text, through the trace reader's bounds (a byte-order mark off)."""
    from replay.trace import _lines

    for _, line in _lines(path, "CSV"):
        yield line


@dataclass(frozen=True, slots=True)
class _Cell:
    """One row's cells, read with errors that name the file, the line and the column."""

    path: Path
    line: int
    row: Mapping[str, str | None]

    def error(self, message: str, column: str | None = None) -> ValueError:
        where = f"{self.path}:{self.line}" + (f": column {column}" if column else "")
        return ValueError(f"{where}: {message}")

    def text(self, column: str, empty: bool = False) -> str:
        value = (self.row.get(column) or "").strip()
        if not value and not empty:
            raise self.error("is empty", column)
        return value

    def integer(self, column: str, high: int) -> int:
        """An integer of ASCII digits at most ``high`` (a negative one is the row's to refuse).

        ``int()`` took ``'٢'`` and 4,000 digits, which overflowed later as a float.
        """
        value = self.text(column)
        if not _INTEGER.fullmatch(value):
            raise self.error(f"{quote(value)} is not an integer", column)
        digits = value.lstrip("+-").lstrip("0")
        number = int(value) if len(digits) <= len(str(high)) else high + 1
        if number > high:
            raise self.error(f"{quote(value)} is above {high:,}", column)
        return number

    def seconds(self, column: str) -> float:
        """A time in ASCII decimal seconds, from 0 to ``MAX_POD_LIST_SECONDS``.

        ``float()`` took ``'١٠٠٠'`` and ``'3_600'`` as seconds (hostile pass 4, L1); one
        row at 1e308 s compressed every other arrival to 0 (hostile pass 27).
        """
        value = self.text(column)
        if not _DECIMAL.fullmatch(value):
            raise self.error(f"{quote(value)} is not a number of seconds", column)
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise self.error(f"{quote(value)} is not a time from the trace start", column)
        if number > MAX_POD_LIST_SECONDS:
            raise self.error(
                f"{quote(value)} is past {MAX_POD_LIST_SECONDS:,} s (a year) from the trace"
                " start: not a time in a pod list",
                column,
            )
        return number


def _check_fraction(fraction: float) -> None:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction {fraction!r} is not within (0, 1]")


def _hash_share(name: str) -> float:
    """Where the name's crc32 falls in [0, 1): the same on every run and platform."""
    return zlib.crc32(name.encode()) / 2**32


def _stratified(nodes: list[Node], fraction: float) -> tuple[Node, ...]:
    """``round(fraction * size)`` nodes of each (model, gpus) group, at least one, by hash."""
    groups: dict[tuple[str, int], list[int]] = {}
    for index, node in enumerate(nodes):
        groups.setdefault((node.model, node.gpus), []).append(index)
    kept: list[int] = []
    for members in groups.values():
        keep = max(1, math.floor(fraction * len(members) + 0.5))
        ranked = sorted(members, key=lambda i: (_hash_share(nodes[i].name), nodes[i].name))
        kept.extend(ranked[:keep])
    return tuple(nodes[i] for i in sorted(kept))
