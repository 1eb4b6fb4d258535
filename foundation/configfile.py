"""Reading a YAML config (a mounted ConfigMap) into a validated model, one way for all.

The scaler, the exporter and the gateway parse their files the same way: YAML to a
mapping, then pydantic validation, with every problem reported at once, each naming
its key path (``key 'signal-sources.0.address'``), as ``ConfigError``.

Whatever the file holds, parsing ends in a model or a ``ConfigError``: a value of the
wrong type (null, a list, a mapping, a date where a duration goes) is a problem like
any other, and a message quotes each value with a length cap and lists at most
``MAX_PROBLEMS`` problems, so a megabyte of bad YAML gives a short line.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from foundation.errors import ConfigError, quote

M = TypeVar("M", bound=BaseModel)

KEBAB_CASE = ConfigDict(
    frozen=True,
    extra="forbid",
    alias_generator=lambda name: name.replace("_", "-"),
    validate_by_name=True,
    allow_inf_nan=False,
)
"""Every config model's settings: frozen, unknown keys refused, kebab-case keys, finite
numbers only."""

DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object or DNS name (RFC 1123 subdomain)."""


_URL_NOISE = re.compile(r"[\x00-\x20\x7f]")


def printable_url(url: str) -> bool:
    """Whether ``url`` is printable ASCII without spaces: a URL taken from a config or flag.

    yarl and urllib fold Unicode (NFKC) as they parse, so "http://\u2474:1" named host
    "(1)" and "http://h\uff0eevil" reached "h.evil"; a control character or a space
    ends up in a host name or a log line. An internationalised host is written as
    punycode.
    """
    return url.isascii() and _URL_NOISE.search(url) is None


_HOST_PORT = re.compile(r"(?P<host>[^\s/]{1,253}):(?P<port>[0-9]{1,5})")


def host_port(value: str) -> str:
    """``value`` when it is ``host:port`` (a port 1-65535 in ASCII digits), for validators.

    Raises:
        ValueError: anything else; the message quotes the value with a length cap.
    """
    match = _HOST_PORT.fullmatch(value)
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ValueError(f"expected host:port, got {quote(value)}")
    return value


def no_booleans_for_numbers(model: type[BaseModel], data: object) -> object:
    """``data`` unchanged, for a ``mode="before"`` model validator of ``model``.

    pydantic's lax mode reads ``true`` as 1 for a number: a boolean where a number goes is
    a mistake (a key swapped for another), never a count or a rate.

    Raises:
        ValueError: a key of a field that is not a ``bool`` holds a boolean (named).
    """
    if isinstance(data, dict):
        for key, value in data.items():
            field = model.model_fields.get(str(key).replace("-", "_"))
            if isinstance(value, bool) and field is not None and field.annotation is not bool:
                raise ValueError(f"{quote(str(key))}: expected a number, got {value}")
    return data


MAX_PROBLEMS = 10
"""Problems a message lists; the rest are counted."""
KEY_LIMIT = 100
"""Characters of a key path a message shows."""
_MESSAGE_LIMIT = 300


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one YAML mapping (``UniqueKeyLoader``)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing a key written twice in one mapping.

    PyYAML keeps the last of two, silently: ``policy:`` written twice dropped the first
    section's every key, and ``{target-concurrency: 8, target-concurrency: 64}`` read as
    64 (hostile pass 1 L6, pass 6 M3). Keys are compared as written (tag and text) when
    the mapping is composed, before a merge key (``<<``) adds any: a key that overrides a
    merged one is still fine.
    """

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:  # the stubs' type is wrong
        """The mapping node, once its keys are known to be distinct.

        Raises:
            DuplicateKeyError: a key met twice, named with both lines.
        """
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], yaml.Node] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                raise DuplicateKeyError(
                    f"key {quote(key.value, KEY_LIMIT)} is written twice (lines"
                    f" {first.start_mark.line + 1} and {key.start_mark.line + 1})"
                )
        return node


_MERGE = "tag:yaml.org,2002:merge"


def load_mapping(text: str, origin: str) -> dict[str, object]:
    """The YAML text as a mapping (empty text is an empty mapping).

    Raises:
        ConfigError: not YAML, YAML nested deeper than the parser goes, a scalar PyYAML
            cannot build (an integer of more than 4,300 digits, a date that does not
            exist), a key written twice in one mapping, or YAML that is not a mapping.
    """
    try:
        loaded = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as err:
        raise ConfigError(f"{origin}: not valid YAML: {_clip(str(err))}") from err
    except RecursionError as err:
        raise ConfigError(f"{origin}: not a usable config: YAML nested too deeply") from err
    except (ValueError, OverflowError) as err:
        # PyYAML's constructors call int() and datetime() on what its patterns matched:
        # an integer of more than 4,300 digits, or a date such as 2025-02-30, raises here.
        raise ConfigError(f"{origin}: not a usable config: {_clip(str(err))}") from err
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{origin}: expected a mapping of keys, got {type(loaded).__name__}")
    return dict(loaded)


def validate(model: type[M], data: dict[str, object], origin: str) -> M:
    """``model`` from ``data``.

    Raises:
        ConfigError: every problem, each naming its key. An exception other than a
            validation error (a validator that met a type it did not expect) is one
            too, naming the top-level key whose value raised it when one does.
    """
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin}: {describe(err)}") from err
    except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError) as err:
        raise ConfigError(f"{origin}: {_unexpected(model, data, err)}") from err
    except RecursionError as err:
        raise ConfigError(f"{origin}: a value is nested too deeply") from err


def describe(err: ValidationError) -> str:
    """One clause per problem, each naming the key path; at most ``MAX_PROBLEMS``."""
    errors = err.errors()
    problems = [_problem(error) for error in errors[:MAX_PROBLEMS]]
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more problems")
    return "; ".join(problems)


def _problem(error: object) -> str:
    assert isinstance(error, dict)
    key = ".".join(str(part) for part in error["loc"])
    shown = quote(key, KEY_LIMIT)
    if error["type"] == "extra_forbidden":
        return f"unknown key {shown}"
    if error["type"] == "missing":
        return f"missing required key {shown}"
    message = _clip(str(error["msg"]).removeprefix("Value error, "))
    where = f"key {shown}={quote(error.get('input'))}: " if key else ""
    return where + message


def _unexpected(model: type[BaseModel], data: dict[str, object], err: Exception) -> str:
    """Name the key whose value made validation raise ``err``, when one alone does."""
    for key, value in data.items():
        try:
            model.model_validate({key: value})
        except (ValidationError, RecursionError):
            continue
        except Exception:
            return f"key {quote(str(key), KEY_LIMIT)}={quote(value)}: invalid ({_clip(repr(err))})"
    return f"invalid config ({_clip(repr(err))})"


def _clip(text: str) -> str:
    if len(text) <= _MESSAGE_LIMIT:
        return text
    return f"{text[:_MESSAGE_LIMIT]}… ({len(text)} characters)"
