"""Seconds since the epoch: to and from protobuf and the API server's RFC 3339 times."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

_NS = 10**9


def _nanoseconds(seconds: float) -> int:
    """The nearest nanosecond to ``seconds``, computed exactly.

    ``seconds * 1e9`` in floats rounds first (to 256 ns at today's epoch seconds), and the
    float that comes back could differ by one ulp.
    """
    return round(Fraction(seconds) * _NS)


def to_timestamp(seconds: float) -> Timestamp:
    """A Timestamp of ``seconds`` since the epoch (nanosecond resolution)."""
    stamp = Timestamp()
    stamp.FromNanoseconds(_nanoseconds(seconds))
    return stamp


def from_timestamp(stamp: Timestamp) -> float:
    """Seconds since the epoch of a Timestamp."""
    # int / int is one correctly rounded division; int / 1e9 would round the int first.
    return stamp.ToNanoseconds() / _NS


def to_duration(seconds: float) -> Duration:
    """A Duration of ``seconds`` (nanosecond resolution)."""
    duration = Duration()
    duration.FromNanoseconds(_nanoseconds(seconds))
    return duration


def from_duration(duration: Duration) -> float:
    """Seconds in a Duration."""
    return duration.ToNanoseconds() / _NS


def parse_time(text: object) -> float | None:
    """Unix seconds of an RFC 3339 time as the API server writes it, None when not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    seconds = parsed.timestamp()
    # Within the years a time can be written back in: 9999-12-31T23:59:59-23:59 is year
    # 10000 in UTC, and writing it (``format_time``) raised on every pass (hostile pass 12).
    return seconds if _FIRST <= seconds <= _LAST else None


_FIRST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
_LAST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def format_time(seconds: float) -> str:
    """``seconds`` as a Kubernetes ``metav1.Time`` (RFC 3339, whole seconds, UTC)."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
