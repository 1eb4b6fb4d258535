"""Fuzzing the trigger metadata parser: any map of strings parses or is a MetadataError.

KEDA sends whatever a ScaledObject says, as strings. Whatever that is, the parser's only
outcomes are a ``TriggerMetadata`` holding finite numbers, or a ``MetadataError`` whose
message fits far inside gRPC's 8 KB status limit. Every crash these found is a row of
``test_metadata.py``'s tables (``test_only_the_documented_forms_parse``,
``test_an_oversized_input_gives_a_short_message``).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundation.errors import MetadataError
from scaler.metadata import ALLOWED_KEYS, TriggerMetadata, parse_metadata

# A few seconds in `make test`; UNITSCALE_FUZZ_EXAMPLES=20000 searches deeper.
EXAMPLES = int(os.environ.get("UNITSCALE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MESSAGE_LIMIT = 2048

# Strings near the documented forms (so the fuzzer reaches past the first check) and far
# from them: numbers with signs, exponents, underscores and other scripts' digits,
# durations, booleans, names, and anything at all.
NEAR_NUMBERS = st.from_regex(r"\A[-+]?[0-9_\u0660-\u0669.]{0,6}([eE][-+]?[0-9]{0,4})?\Z")
NEAR_DURATIONS = st.from_regex(r"\A([0-9\u0660.]{0,4}(ns|us|µs|ms|s|m|h|d)){0,3}\Z")
WORDS = st.sampled_from(
    ["true", "false", "True", "yes", "1", "0", "inf", "-inf", "nan", "1e400", "llama", ""]
)
VALUES = st.one_of(NEAR_NUMBERS, NEAR_DURATIONS, WORDS, st.text(max_size=40))
KEYS = st.one_of(st.sampled_from(ALLOWED_KEYS), st.text(max_size=20))


def check(raw: dict[str, str], name: str | None = None, namespace: str = "") -> None:
    ref = {"name": name, "namespace": namespace} if name is not None else {}
    try:
        parsed = parse_metadata(raw, **ref)
    except MetadataError as err:
        assert len(str(err).encode()) < MESSAGE_LIMIT, len(str(err))
        return
    assert isinstance(parsed, TriggerMetadata)
    for value in parsed.model_dump().values():
        if isinstance(value, float):
            assert math.isfinite(value), parsed
    assert parsed.min_replicas <= parsed.max_replicas


@FUZZ
@given(st.dictionaries(KEYS, VALUES, max_size=12))
def test_any_map_parses_or_is_a_metadata_error(extra):
    check({"scalerAddress": "s:1", "deployment": "llama"} | extra)


@FUZZ
@given(st.dictionaries(st.text(), st.text()))
def test_any_map_of_any_strings_parses_or_is_a_metadata_error(raw):
    check(raw)


@FUZZ
@given(
    st.dictionaries(KEYS, VALUES, max_size=6),
    st.one_of(st.none(), st.text(max_size=300)),
    st.text(max_size=80),
)
def test_any_name_and_namespace_parse_or_are_a_metadata_error(extra, name, namespace):
    check({"scalerAddress": "s:1", "deployment": "llama"} | extra, name, namespace)


@FUZZ
@given(st.sampled_from(ALLOWED_KEYS), st.text(max_size=20).map(lambda tail: "9" * 4097 + tail))
def test_an_oversized_value_at_any_key_is_a_short_error(key, value):
    check({"scalerAddress": "s:1", "deployment": "llama", key: value})
