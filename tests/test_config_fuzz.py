"""Fuzzing the config loaders: any YAML at any key parses or is a ConfigError.

A ConfigMap may say anything. For the scaler's, the exporter's and the gateway's config
models, every key path of the model (nested ones too: ``signal-sources.0.reconnect-min``,
``deployments.0.accelerator.price-per-hour``) gets values of every type YAML can write,
inside an otherwise valid config, and the text goes through the same YAML loader and
validation as a file or a hot reload. The only allowed outcomes are a model or a
``ConfigError`` with a bounded message. Every crash these found is a row of
``test_config.py::test_a_value_of_the_wrong_type_is_a_config_error_naming_the_key``.
"""

from __future__ import annotations

import datetime
import itertools
import os
import types
import typing
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from exporter.config import ExporterConfig
from exporter.config import parse_config as parse_exporter
from foundation.errors import ConfigError
from scaler.config import ScalerConfig
from scaler.config import parse_config as parse_scaler
from serving.config import GatewayConfig
from serving.config import parse_config as parse_gateway

# A few seconds in `make test`; UNITSCALE_FUZZ_EXAMPLES=20000 searches deeper.
EXAMPLES = int(os.environ.get("UNITSCALE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MESSAGE_LIMIT = 8192

Path = tuple[str | int, ...]


def key_paths(model: type[BaseModel], prefix: Path = ()) -> list[Path]:
    """Every key path of ``model``: a list of models is entered at index 0."""
    paths: list[Path] = []
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name.replace("_", "-"))
        paths.append(path)
        for inner, in_list in _models_in(field.annotation):
            paths.extend(key_paths(inner, (*path, 0) if in_list else path))
    return paths


def _models_in(annotation: Any, in_list: bool = False) -> list[tuple[type[BaseModel], bool]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, in_list)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0], in_list)
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg, in_list)]
    if origin in (list, tuple):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg, True)]
    return []


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**20, max_value=10**400),
    st.floats(),  # nan and infinities included
    st.text(max_size=30),
    st.sampled_from(["30s", "5_0s", "\u0663s", "inf", "1e400", "-1s", "http://[::1", "a:99999"]),
    st.dates(),
    st.datetimes(),
    st.binary(max_size=10),
)
YAML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), inner, max_size=3),
    ),
    max_leaves=8,
)

# A valid config that reaches every nested model, so a path leads somewhere real.
BASES: dict[str, dict[str, Any]] = {
    "scaler": {
        "signal-sources": [{"address": "127.0.0.1:1"}],
        "demo-source": {},
        "policy": {},
    },
    "exporter": {
        "deployments": [
            {
                "targets": ["127.0.0.1:1"],
                "accelerator": {},
                "endpoint-slices": {"service": "llama", "port": 8000},
            }
        ],
    },
    "gateway": {"endpoint-slices": {"service": "llama", "port": 8000}},
}
MODELS: dict[str, tuple[type[BaseModel], Callable[[str], BaseModel]]] = {
    "scaler": (ScalerConfig, lambda text: parse_scaler(text, "fuzz.yaml")),
    "exporter": (ExporterConfig, lambda text: parse_exporter(text, "fuzz.yaml")),
    "gateway": (GatewayConfig, lambda text: parse_gateway(text, "fuzz.yaml")),
}


def with_value(base: dict[str, Any], path: Path, value: object) -> dict[str, Any]:
    """A copy of ``base`` with ``value`` at ``path`` (containers made as needed)."""
    data = yaml.safe_load(yaml.safe_dump(base))
    node: Any = data
    for part, following in itertools.pairwise(path):
        if isinstance(part, int):
            while len(node) <= part:
                node.append({})
        elif not isinstance(node.get(part), dict | list):
            node[part] = [] if isinstance(following, int) else {}
        node = node[part]
    last = path[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append(None)
    node[last] = value
    return data


def check(parse: Callable[[str], BaseModel], model: type[BaseModel], text: str) -> None:
    try:
        parsed = parse(text)
    except ConfigError as err:
        assert len(str(err)) < MESSAGE_LIMIT, len(str(err))
        return
    assert isinstance(parsed, model)


def test_the_bases_are_valid():
    for role, (model, parse) in MODELS.items():
        assert isinstance(parse(yaml.safe_dump(BASES[role])), model)


@pytest.mark.parametrize("role", list(MODELS))
def test_every_key_path_is_fuzzed(role):
    model, _ = MODELS[role]
    paths = key_paths(model)
    assert len(paths) == len(set(paths))
    nested = {"scaler": "signal-sources", "exporter": "deployments", "gateway": "endpoint-slices"}
    assert any(len(path) > 1 and path[0] == nested[role] for path in paths)


@pytest.mark.parametrize("role", list(MODELS))
@FUZZ
@given(data=st.data())
def test_any_value_at_any_key_parses_or_is_a_config_error(role, data):
    model, parse = MODELS[role]
    path = data.draw(st.sampled_from(key_paths(model)), label="path")
    value = data.draw(YAML_VALUES, label="value")
    text = yaml.safe_dump(with_value(BASES[role], path, value))
    check(parse, model, text)


@pytest.mark.parametrize("role", list(MODELS))
@FUZZ
@given(text=st.text(max_size=60))
def test_any_text_parses_or_is_a_config_error(role, text):
    model, parse = MODELS[role]
    check(parse, model, text)


@FUZZ
@given(value=YAML_VALUES)
def test_flag_overrides_and_flag_deployments_parse_or_are_a_config_error(value):
    """The exporter's command line adds to the file; a file's odd ``deployments`` too."""
    text = yaml.safe_dump({"deployments": value, "interval": "5s"})
    try:
        parse_exporter(text, "fuzz.yaml", {"timeout": "1s"}, [{"targets": ["127.0.0.1:1"]}])
    except ConfigError as err:
        assert len(str(err)) < MESSAGE_LIMIT


def test_dates_and_times_reach_the_models():
    """YAML's own types are among the values: the fuzzer does not only try strings."""
    text = yaml.safe_dump({"max-signal-age": datetime.date(2024, 1, 1)})
    assert "2024-01-01" in text
    with pytest.raises(ConfigError, match="max-signal-age"):
        parse_scaler(text, "fuzz.yaml")
