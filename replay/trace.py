"""Request traces: the Azure LLM CSV and Mooncake JSONL formats, scaled for replay."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from foundation.errors import UnitscaleError


class TraceError(UnitscaleError):
    """A trace file cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests sorted by arrival: seconds from the start, prompt and output tokens."""

    name: str
    arrival: npt.NDArray[np.float64]
    prompt: npt.NDArray[np.int64]
    output: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival[-1]) if len(self.arrival) else 0.0


def read_trace(path: Path) -> Trace:
    """Read an Azure CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``) or Mooncake JSONL.

    Raises:
        TraceError: unknown format, bad row (named by line), or no requests.
    """
    try:
        with path.open(encoding="utf-8") as handle:
            first = handle.readline()
    except OSError as err:
        raise TraceError(f"cannot read trace {path}: {err.strerror}") from err
    if first.lstrip().startswith("{"):
        arrival, prompt, output = _mooncake(path)
    elif "TIMESTAMP" in first and "ContextTokens" in first:
        arrival, prompt, output = _azure(path)
    else:
        raise TraceError(
            f"{path}: neither an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"
            " nor a Mooncake JSONL (timestamp, input_length, output_length)"
        )
    if not arrival:
        raise TraceError(f"{path}: no requests")
    order = np.argsort(np.array(arrival), kind="stable")
    times = np.array(arrival, dtype=np.float64)[order]
    return Trace(
        path.stem,
        times - times[0],
        np.maximum(np.array(prompt, dtype=np.int64)[order], 1),
        np.maximum(np.array(output, dtype=np.int64)[order], 1),
    )


def _azure(path: Path) -> tuple[list[float], list[int], list[int]]:
    arrival, prompt, output = [], [], []
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):
            try:
                # Python 3.11 reads the 7-digit fractions these files use.
                arrival.append(datetime.fromisoformat(row["TIMESTAMP"].strip()).timestamp())
                prompt.append(int(row["ContextTokens"]))
                output.append(int(row["GeneratedTokens"]))
            except (KeyError, ValueError, TypeError) as err:
                raise TraceError(f"{path}:{number}: bad row {row!r}: {err}") from err
    return arrival, prompt, output


def _mooncake(path: Path) -> tuple[list[float], list[int], list[int]]:
    arrival, prompt, output = [], [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                arrival.append(float(record["timestamp"]) / 1000.0)
                prompt.append(int(record["input_length"]))
                output.append(int(record["output_length"]))
            except (KeyError, ValueError, TypeError) as err:
                raise TraceError(f"{path}:{number}: bad record: {err}") from err
    return arrival, prompt, output


def scale(trace: Trace, rate_multiplier: float, time_compression: float, seed: int) -> Trace:
    """More traffic with the same shape, and/or the same traffic faster.

    ``rate_multiplier`` X keeps each request and adds copies: floor(X) - 1 more, plus one
    with probability frac(X); each copy arrives uniformly within one second after its
    original (seeded), so per-second shape and token mix stay the trace's.
    ``time_compression`` Y divides every arrival time by Y (an hour in 1/Y hours).
    """
    if rate_multiplier <= 0 or time_compression <= 0:
        raise ValueError("rate multiplier and time compression must be positive")
    rng = np.random.default_rng(seed)
    whole = int(np.floor(rate_multiplier))
    copies = np.full(len(trace), whole, dtype=np.int64)
    copies += rng.random(len(trace)) < (rate_multiplier - whole)
    index = np.repeat(np.arange(len(trace)), copies)
    first = np.r_[True, index[1:] != index[:-1]]
    jitter = np.where(first, 0.0, rng.random(len(index)))
    arrival = (trace.arrival[index] + jitter) / time_compression
    order = np.argsort(arrival, kind="stable")
    return Trace(trace.name, arrival[order], trace.prompt[index][order], trace.output[index][order])
