"""Seconds since the epoch to and from ``google.protobuf`` Timestamp and Duration."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp


def to_timestamp(seconds: float) -> Timestamp:
    """A Timestamp of ``seconds`` since the epoch (nanosecond resolution)."""
    stamp = Timestamp()
    stamp.FromNanoseconds(round(seconds * 1e9))
    return stamp


def from_timestamp(stamp: Timestamp) -> float:
    """Seconds since the epoch of a Timestamp."""
    return stamp.ToNanoseconds() / 1e9  # one correctly rounded division


def to_duration(seconds: float) -> Duration:
    """A Duration of ``seconds`` (nanosecond resolution)."""
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def from_duration(duration: Duration) -> float:
    """Seconds in a Duration."""
    return duration.ToNanoseconds() / 1e9
