"""Reading a YAML config (a mounted ConfigMap) into a validated model, one way for all.

The scaler, the exporter and the gateway parse their files the same way: YAML to a
mapping, then pydantic validation, with every problem reported at once, each naming
its key path (``key 'signal-sources.0.address'``), as ``ConfigError``.
"""

from __future__ import annotations

from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from foundation.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

KEBAB_CASE = ConfigDict(
    frozen=True,
    extra="forbid",
    alias_generator=lambda name: name.replace("_", "-"),
    validate_by_name=True,
)
"""Every config model's settings: frozen, unknown keys refused, kebab-case keys."""

DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object or DNS name (RFC 1123 subdomain)."""


def load_mapping(text: str, origin: str) -> dict[str, object]:
    """The YAML text as a mapping (empty text is an empty mapping).

    Raises:
        ConfigError: not YAML, or YAML that is not a mapping.
    """
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{origin}: not valid YAML: {err}") from err
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{origin}: expected a mapping of keys, got {type(loaded).__name__}")
    return dict(loaded)


def validate(model: type[M], data: dict[str, object], origin: str) -> M:
    """``model`` from ``data``.

    Raises:
        ConfigError: every problem, each naming its key.
    """
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin}: {describe(err)}") from err


def describe(err: ValidationError) -> str:
    """One clause per problem, each naming the key path."""
    problems = []
    for error in err.errors():
        key = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown key {key!r}")
        elif error["type"] == "missing":
            problems.append(f"missing required key {key!r}")
        else:
            message = error["msg"].removeprefix("Value error, ")
            where = f"key {key!r}={error.get('input')!r}: " if key else ""
            problems.append(where + message)
    return "; ".join(problems)
