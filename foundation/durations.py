"""Go-style durations ("500ms", "30s", "2m3s") for config files and trigger metadata.

Kubernetes users write durations the Go way; pydantic's ``timedelta`` accepts only
ISO 8601 ("PT30S") and plain numbers. ``Seconds`` accepts both Go strings and bare
numbers (read as seconds) and yields a float number of seconds.

Only the documented forms are durations: ASCII digits (no ``_``, no other scripts'
digits, no exponent, no ``inf``), Go's units, and Go's range (an int64 of nanoseconds,
about 292 years). Anything else, whatever its type, is a ``ValueError``, the one
exception pydantic turns into a validation error that names the key.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

from foundation.errors import kind, quote

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN, as Go spells it
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU, which Go accepts too
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # [0-9], not \d: ASCII digits only
_UNIT = r"(?:ns|us|µs|μs|ms|s|m|h)"
_BARE = re.compile(_NUMBER)
_GO = re.compile(f"(?:{_NUMBER}{_UNIT})+")
_PART = re.compile(f"({_NUMBER})({_UNIT})")

MAX_SECONDS = (2**63 - 1) / 1e9
"""Go's longest duration (an int64 of nanoseconds): 2562047h47m16.854775807s."""
MAX_LENGTH = 100
"""Characters a duration may have; a longer text is refused before it is parsed."""
_FORMS = "a duration such as '500ms', '30s' or '2m3s' (units ns, us, ms, s, m, h)"


def parse_duration(text: object) -> float:
    """Return the number of seconds in a Go duration string or a bare number.

    >>> parse_duration("2m3.5s")
    123.5
    >>> parse_duration("90")
    90.0

    Raises:
        ValueError: not a duration (whatever the type), or negative, not finite or
            longer than Go allows. The message quotes the value with a length cap.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"expected {_FORMS} or a number of seconds, got {kind(text)}")
    if isinstance(text, str):
        seconds = _parse_text(text)
    else:
        try:
            seconds = float(text)
        except OverflowError:
            seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a non-negative duration such as '30s', got {quote(text)}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"expected a duration of at most 2562047h (Go's limit), got {quote(text)}")
    return seconds


def _parse_text(text: str) -> float:
    raw = text.strip(" \t\r\n")
    if not raw:
        raise ValueError("expected a duration such as '30s', got an empty string")
    if len(raw) > MAX_LENGTH:
        raise ValueError(f"expected {_FORMS}, got {quote(text)}")
    if _BARE.fullmatch(raw):
        return float(raw)
    if not _GO.fullmatch(raw):
        raise ValueError(f"expected {_FORMS}, got {quote(raw)}")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(raw))


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
