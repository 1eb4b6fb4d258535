"""What a replica answers the gateway, read at one boundary; how a failing replica backs off.

``serving.replica_answers`` in tables and properties (any JSON value, any bytes, any depth:
a value of the right shape or ``AnswerError`` with a bounded reason, never another
exception), and ``serving.routing.Backoff`` with time passed in.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.replica_answers import (
    MAX_ANSWER_BYTES,
    MAX_DEPTH,
    REASONS,
    AnswerError,
    decode,
    read_is_sleeping,
    read_models,
    read_wake,
)
from serving.routing import BACKOFF_DOUBLINGS, Backoff

READERS = (read_models, read_is_sleeping, read_wake)


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def reason_of(reader, body: bytes) -> str | None:
    try:
        reader(body)
    except AnswerError as err:
        return err.reason
    return None


@pytest.mark.parametrize(
    ("body", "models"),
    [
        pytest.param(
            b'{"object": "list", "data": [{"id": "m", "permission": [{}]}, {"id": "m-lora"}]}',
            {"m", "m-lora"},
            id="vllm's answer lists the base model and its adapters",
        ),
    ],
)
def test_read_models(body, models):
    assert read_models(body) == models


@pytest.mark.parametrize(
    ("reader", "body", "reason", "fragment"),
    [
        pytest.param(
            read_models, b'[{"id": "m"}]', "wrong-shape", "an array, not an object",
            id="models as a JSON list (the loop-stopper of issue 27) is the wrong shape",
        ),
        pytest.param(
            read_models, b'{"data": 5}', "wrong-shape", "data is a number",
            id="models whose data is not a list are the wrong shape",
        ),
        pytest.param(
            read_models, b'{"object": "list"}', "wrong-shape", "data is null or absent",
            id="models without data are the wrong shape",
        ),
        pytest.param(
            read_models, b'{"data": [{"id": "m"}, {"id": 3}]}', "wrong-shape", "data[1].id",
            id="a model whose id is not a string names its index",
        ),
        pytest.param(
            read_models, b'{"data": []}', "wrong-shape", "data is empty",
            id="a replica that lists no model is the wrong shape, not one serving any",
        ),
        pytest.param(
            read_models, b'{"data": [{"id": ""}]}', "wrong-shape", "data[0].id",
            id="a model with an empty id is the wrong shape",
        ),
        pytest.param(
            read_models, b'{"data": ["m"]}', "wrong-shape", "data[0]: the string 'm'",
            id="a model that is a bare string is the wrong shape",
        ),
        pytest.param(
            read_is_sleeping, nested(100_000), "too-deep", "nested deeper than",
            id="is_sleeping nested 100000 deep (the parser's RecursionError) is too deep",
        ),
        pytest.param(
            read_is_sleeping, nested(MAX_DEPTH + 1), "too-deep", "nested deeper than",
            id="one level past the bound is too deep though it parses",
        ),
        pytest.param(
            read_is_sleeping, b'{"is_sleeping": "yes"}', "wrong-shape", "'yes'",
            id="is_sleeping as a string is the wrong shape",
        ),
        pytest.param(
            read_is_sleeping, b'{"is_sleeping": 1}', "wrong-shape", "a number",
            id="is_sleeping as a number is not a boolean",
        ),
        pytest.param(
            read_is_sleeping, b"null", "wrong-shape", "null",
            id="is_sleeping answered null is the wrong shape",
        ),
        pytest.param(
            read_wake, b"caf\xe9", "not-json", "utf-8",
            id="a wake answer that is not utf-8 is not json",
        ),
        pytest.param(
            read_wake, b"9" * 5000, "not-json", "4300 digits",
            id="a wake answer of a 5000-digit integer is not json",
        ),
        pytest.param(
            read_wake, b'{"status": {"awake": true}}', "wrong-shape", "an object",
            id="a wake answer whose status is an object is the wrong shape",
        ),
        pytest.param(
            read_wake,
            b'{"status": "awake", "pad": "' + b"x" * MAX_ANSWER_BYTES + b'"}',
            "too-large",
            "over",
            id="a wake answer over the byte bound is never parsed",
        ),
    ],
)  # fmt: skip
def test_an_answer_out_of_shape_is_refused_with_a_reason_naming_the_field(
    reader, body, reason, fragment
):
    with pytest.raises(AnswerError) as refused:
        reader(body)
    assert refused.value.reason == reason
    assert fragment in str(refused.value)
    assert len(str(refused.value)) < 200  # the message never carries the hostile body


def test_the_answers_vllm_gives_are_read():
    assert read_is_sleeping(b'{"is_sleeping": true}') is True
    assert read_is_sleeping(b'{"is_sleeping": false}') is False
    assert read_wake(b'{"status": "awake", "tags": null}') == "awake"
    assert decode(nested(MAX_DEPTH - 1), "x") is not None  # the bound itself is read


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)
"""Any JSON value."""

shaped = st.fixed_dictionaries(
    {},
    optional={
        "data": st.lists(st.fixed_dictionaries({}, optional={"id": json_values}) | json_values),
        "is_sleeping": json_values,
        "status": json_values,
    },
)
"""A value near the shapes asked for, so the properties reach past the first check."""


def assert_read_or_refused(reader, body: bytes) -> None:
    try:
        value = reader(body)
    except AnswerError as err:
        assert err.reason in REASONS
        return
    if reader is read_models:
        assert isinstance(value, frozenset) and all(isinstance(m, str) and m for m in value)
    else:
        assert isinstance(value, bool if reader is read_is_sleeping else str)


@given(st.sampled_from(READERS), json_values | shaped)
def test_any_json_value_is_read_or_refused_with_a_reason_never_raised_otherwise(reader, value):
    assert_read_or_refused(reader, json.dumps(value).encode())


@given(st.sampled_from(READERS), st.binary(max_size=512))
def test_any_bytes_are_read_or_refused_with_a_reason_never_raised_otherwise(reader, body):
    assert_read_or_refused(reader, body)


@given(
    st.sampled_from(READERS),
    st.integers(0, 50_000),
    st.sampled_from([b"[", b'{"a":']),
    st.booleans(),
)
def test_any_depth_is_read_or_refused_as_too_deep_never_a_recursion_error(
    reader, depth, opener, closed
):
    closer = b"]" if opener == b"[" else b"}"
    body = opener * depth + b"1" + (closer * depth if closed else b"")
    reason = reason_of(reader, body)
    if depth > MAX_DEPTH:
        assert reason in ("too-deep", "not-json")
        assert reason == "too-deep" or not closed
    else:
        assert reason in (None, "wrong-shape", "not-json")


# --- backing off a replica whose wakes or sleeps fail ------------------------------------


@pytest.mark.parametrize(
    ("failures", "delay"),
    [
        pytest.param(1, 30.0, id="the first failure waits the base delay"),
        pytest.param(2, 60.0, id="the second in a row waits twice as long"),
        pytest.param(3, 120.0, id="the third four times"),
        pytest.param(4, 240.0, id="the fourth eight times"),
        pytest.param(5, 240.0, id="and never longer than eight times"),
        pytest.param(10_000, 240.0, id="however many failures, the cap holds (no overflow)"),
    ],
)
def test_a_failing_replica_backs_off_exponentially_to_a_cap(failures, delay):
    backoff = Backoff()
    now = 1000.0
    for _ in range(failures):
        backoff = backoff.failed(now, 30.0)
    assert backoff.failures == failures
    assert backoff.until == now + delay
    assert not backoff.allows(now + delay - 0.001)
    assert backoff.allows(now + delay)


def test_a_replica_never_failed_may_be_asked_at_any_time():
    assert Backoff().allows(-math.inf) and Backoff().allows(0.0)


@given(
    st.lists(st.floats(0, 1e6), min_size=1, max_size=12),
    st.floats(0.001, 3600),
)
def test_a_backoff_never_shrinks_in_a_row_and_never_passes_the_cap(times, base):
    backoff, delays = Backoff(), []
    for offset in sorted(times):
        backoff = backoff.failed(offset, base)
        delays.append(backoff.until - offset)
    slack = 1e-6  # until - now: float rounding of times up to 1e6 s
    assert all(later >= earlier - slack for earlier, later in itertools.pairwise(delays))
    assert all(base - slack <= d <= base * 2**BACKOFF_DOUBLINGS + slack for d in delays)
