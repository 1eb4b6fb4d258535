"""Errors that unitscale raises on purpose.

::

    UnitscaleError
     ├── ConfigError        a config file or ConfigMap value is invalid (names the key)
     ├── MetadataError      a ScaledObject's trigger metadata is invalid (names the key)
     └── NoDataError        no usable signal for a target: none yet, or too old
          └── StaleSignalError

The gRPC shell maps them in one place (``scaler.service``): MetadataError to
INVALID_ARGUMENT, NoDataError to UNAVAILABLE (so KEDA's fallback applies instead of a
made-up zero).
"""

from __future__ import annotations

QUOTE_LIMIT = 64
"""Characters of a value an error message shows; the rest is counted, not echoed."""


class UnitscaleError(Exception):
    """Base of every error unitscale raises on purpose."""


class ConfigError(UnitscaleError):
    """A configuration value is invalid; the message names the key."""


class MetadataError(UnitscaleError):
    """A ScaledObject's ``scalerMetadata`` is invalid; the message names the key."""


class NoDataError(UnitscaleError):
    """There is no usable signal for a target."""


class StaleSignalError(NoDataError):
    """The newest signal for a target is older than the allowed age."""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as an error message shows it: short, whatever was submitted.

    A string is quoted with at most ``limit`` characters shown
    (``'xxxx'… (1000000 characters)``); a list or mapping is described by its size, a
    huge integer by its digits; anything else is its ``repr``, capped the same way. The
    result stays short for any input, so a message never carries a submitted megabyte.

    >>> quote("soon")
    "'soon'"
    >>> quote("x" * 100, limit=4)
    "'xxxx'… (100 characters)"
    >>> quote([1, 2])
    'a list of 2 items'
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value)} characters)"
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() <= 64:
            return repr(value)
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list | tuple | set | frozenset):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} keys"
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not hide the error being reported
        return f"a {type(value).__name__}"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def kind(value: object) -> str:
    """What sort of value ``value`` is, in words: 'a list', 'null', 'a date'."""
    if value is None:
        return "null"
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        tuple: "a list",
        dict: "a mapping",
        bytes: "binary data",
    }
    for cls, name in names.items():
        if type(value) is cls:
            return name
    if type(value).__name__ == "datetime":
        return "a timestamp"
    if type(value).__name__ == "date":
        return "a date"
    return f"a {type(value).__name__}"
