"""Go-style durations ("500ms", "30s", "2m3s") for config files and trigger metadata.

Kubernetes users write durations the Go way; pydantic's ``timedelta`` accepts only
ISO 8601 ("PT30S") and plain numbers. ``Seconds`` accepts both Go strings and bare
numbers (read as seconds) and yields a float number of seconds.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str | float | int) -> float:
    """Return the number of seconds in a Go duration string or a bare number.

    >>> parse_duration("2m3.5s")
    123.5
    >>> parse_duration("90")
    90.0

    Raises:
        ValueError: the text is not a duration, or it is negative or not finite.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as '30s', got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = text.strip()
        try:
            seconds = float(raw)
        except ValueError:
            seconds = _parse_go(raw)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a non-negative duration such as '30s', got {text!r}")
    return seconds


def _parse_go(raw: str) -> float:
    if not raw:
        raise ValueError("expected a duration such as '30s', got an empty string")
    position = 0
    total = 0.0
    for match in _PART.finditer(raw):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(raw):
        raise ValueError(
            f"expected a duration such as '500ms', '30s' or '2m3s' (units ns, us, ms, s, m, h),"
            f" got {raw!r}"
        )
    return total


def format_duration(seconds: float) -> str:
    """Render seconds the way a user would write them: 0.5 -> '500ms', 90 -> '1m30s'."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    minutes, rest = divmod(seconds, 60)
    if minutes == 0:
        return f"{rest:g}s"
    return f"{minutes:g}m{rest:g}s" if rest else f"{minutes:g}m"


Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A pydantic field type: a duration given as '30s' or 30, held as float seconds."""
