"""What a replica answers the gateway, read at one boundary. Pure.

Every body a replica sends the gateway outside the proxied requests (``/v1/models``,
``/is_sleeping``, ``/wake_up``) is read here: at most ``MAX_ANSWER_BYTES``, UTF-8 JSON
nested at most ``MAX_DEPTH`` deep, of the shape vLLM answers. Anything else raises
``AnswerError``, whose ``reason`` is one of ``REASONS`` (a bounded metric label) and whose
message names the field; no other exception leaves this module, whatever the bytes.

A replica is one pod on the network, not a trusted part of the gateway: an answer that
is a list, nested 100,000 deep, or 2 GB long fails that replica's probe, never the loop
that probes every replica.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_ANSWER_BYTES = 1024**2
"""The longest answer read: vLLM lists a model in ~450 bytes, so ~2,000 models or adapters."""
MAX_DEPTH = 32
"""The deepest JSON nesting read: vLLM's ``/v1/models`` is 4 deep (data, model, permission)."""
MAX_MODELS = 2048
"""The most models (base and LoRA adapters) one replica may list: what fits in
``MAX_ANSWER_BYTES`` at vLLM's ~450 bytes a model. 1 MiB of bare ``{"id": "m1"}`` entries
would be 80,000 names, each remembered by the gateway."""
MAX_MODEL_ID_CHARS = 512
"""The longest model id read: a served name or a path to the weights, far below this."""
MAX_CONTEXT_TOKENS = 10_000_000
"""The longest ``max_model_len`` taken (the trace reader's token bound); longer is none."""

REASONS = ("too-large", "not-json", "too-deep", "wrong-shape")
"""The ``reason`` of a ``AnswerError``: the answer is too long, not JSON, too deep, or not
the shape asked for."""


class AnswerError(ValueError):
    """A replica's answer the gateway cannot use; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def decode(body: bytes, what: str) -> object:
    """The JSON value of ``body``, the answer to ``what`` (a path, for the message).

    Raises:
        AnswerError: over ``MAX_ANSWER_BYTES``, not UTF-8 JSON (an integer past Python's
            4,300 digits included), or nested deeper than ``MAX_DEPTH``.
    """
    if len(body) > MAX_ANSWER_BYTES:
        raise AnswerError("too-large", f"{what}: {len(body):,} bytes, over {MAX_ANSWER_BYTES:,}")
    try:
        value = json.loads(body)
    except RecursionError:  # deeper than the parser's stack: deeper than MAX_DEPTH too
        raise AnswerError("too-deep", f"{what}: nested deeper than {MAX_DEPTH}") from None
    except ValueError as err:  # malformed, not UTF-8, an integer of too many digits
        raise AnswerError("not-json", f"{what}: not JSON ({str(err)[:80]})") from None
    if _deeper_than(value, MAX_DEPTH):
        raise AnswerError("too-deep", f"{what}: nested deeper than {MAX_DEPTH}")
    return value


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` arrays and objects (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


@dataclass(frozen=True, slots=True)
class ModelList:
    """What a ``/v1/models`` answer lists."""

    models: frozenset[str]
    max_model_len: int | None = None
    """The longest context its models take (vLLM lists ``max_model_len`` per model): no
    answer runs longer. None when none lists a whole number from 1 to
    ``MAX_CONTEXT_TOKENS`` (unmeasured, not a refusal)."""


def read_models(body: bytes) -> frozenset[str]:
    """The ids in a ``/v1/models`` answer (``read_model_list``)."""
    return read_model_list(body).models


def read_model_list(body: bytes) -> ModelList:
    """The ids in a ``/v1/models`` answer: ``{"data": [{"id": str, ...}, ...]}``.

    Raises:
        AnswerError: not that shape (a list, ``data`` not a list or empty, an entry
            without a non-empty string ``id``), not readable JSON, more than
            ``MAX_MODELS`` models or an id longer than ``MAX_MODEL_ID_CHARS``.
    """
    data = _field(decode(body, "/v1/models"), "data", "/v1/models")
    if not isinstance(data, list):
        raise AnswerError("wrong-shape", f"/v1/models: data is {_kind(data)}, not an array")
    if not data:
        # vLLM lists its served model from its first answer: "none" is no replica to route
        # to (routing reads no models as "any model", and asked for any, it would 404).
        raise AnswerError("wrong-shape", "/v1/models: data is empty, a replica serving no model")
    if len(data) > MAX_MODELS:
        raise AnswerError(
            "too-large", f"/v1/models: {len(data):,} models, more than {MAX_MODELS:,}"
        )
    models, longest = set(), None
    for index, entry in enumerate(data):
        model = _field(entry, "id", f"/v1/models: data[{index}]")
        if not isinstance(model, str) or not model:
            raise AnswerError(
                "wrong-shape", f"/v1/models: data[{index}].id is {_kind(model)}, not a name"
            )
        if len(model) > MAX_MODEL_ID_CHARS:
            raise AnswerError(
                "too-large",
                f"/v1/models: data[{index}].id is {len(model):,} characters,"
                f" more than {MAX_MODEL_ID_CHARS}",
            )
        models.add(model)
        length = _field(entry, "max_model_len", "")
        if type(length) is int and 1 <= length <= MAX_CONTEXT_TOKENS:
            longest = max(longest or 0, length)
    return ModelList(frozenset(models), longest)


def read_is_sleeping(body: bytes) -> bool:
    """A ``/is_sleeping`` answer: ``{"is_sleeping": bool}``.

    Raises:
        AnswerError: not that shape, or not readable JSON.
    """
    answer = _field(decode(body, "/is_sleeping"), "is_sleeping", "/is_sleeping")
    if not isinstance(answer, bool):
        raise AnswerError("wrong-shape", f"/is_sleeping: is_sleeping is {_kind(answer)}")
    return answer


def read_wake(body: bytes) -> str:
    """The ``status`` of a ``/wake_up`` answer (``"awake"`` once woken).

    An empty body is ``"awake"``: vLLM answered its wakes with an empty 200 before it
    answered JSON, and the gateway confirms every wake by the next ``/is_sleeping`` (one
    still asleep is a relapse). Read as "not JSON", every such wake failed and backed off,
    never reset, though the replica woke: 240 s at zero, past the buffer's timeout.

    Raises:
        AnswerError: not ``{"status": str, ...}``, or not readable JSON.
    """
    if not body.strip():
        return "awake"
    status = _field(decode(body, "/wake_up"), "status", "/wake_up")
    if not isinstance(status, str):
        raise AnswerError("wrong-shape", f"/wake_up: status is {_kind(status)}")
    return status


def _field(value: object, key: str, what: str) -> object:
    """``value[key]`` (None when absent) of a JSON object; ``AnswerError`` for any other value."""
    if not isinstance(value, dict):
        raise AnswerError("wrong-shape", f"{what}: {_kind(value)}, not an object")
    return value.get(key)


_JSON_TYPES = {dict: "an object", list: "an array", bool: "a boolean", int: "a number"}


def _kind(value: object) -> str:
    """What a JSON value is, for a message: short, never the whole (hostile) value."""
    if value is None:
        return "null or absent"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return _JSON_TYPES.get(type(value), "a number")
