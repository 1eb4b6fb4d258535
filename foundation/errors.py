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
