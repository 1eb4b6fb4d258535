"""What the simulated replica refuses, as vLLM 0.32 refuses it. Pure.

Prompts are counted, not tokenized: a text prompt is ~1.3 tokens per word (+1 for BOS), a
token-id prompt is exactly as long as its list. A refused request raises ``RequestError``,
which carries vLLM's error body (``{"error": {"message", "type", "param", "code"}}``); the
HTTP app answers it (``serving.sim_http``).
"""

from __future__ import annotations

DEFAULT_MAX_TOKENS = 16
"""vLLM's ``max_tokens`` when a request names none."""


class RequestError(Exception):
    """A request vLLM would refuse.

    Answered in vLLM 0.32's error shape: ``{"error": {"message", "type", "param", "code"}}``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param

    def body(self) -> dict[str, object]:
        """The JSON body vLLM answers with (HTTP status ``status``)."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


def count_tokens(text: str) -> int:
    """About 1.3 tokens per word, plus BOS."""
    return 1 + max(1, round(len(text.split()) * 1.3))


def json_object(body: object) -> dict[str, object]:
    """The decoded request body, which must be a JSON object.

    Raises:
        RequestError: it is not.
    """
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


def check_model(body: dict[str, object], served: str) -> None:
    """A request naming a model must name the one served (no ``model`` means that one).

    Raises:
        RequestError: 404, as vLLM answers an unknown model.
    """
    model = body.get("model")
    if model is not None and model != served:  # null: vLLM serves its default model
        raise RequestError(
            f"The model `{model}` does not exist. Valid aliases: {served}.",
            status=404,
            kind="NotFoundError",
            param="model",
        )


def _invalid(loc: str, kind: str, message: str, value: object) -> RequestError:
    """What vLLM's request validation answers (pydantic's first error, its ``loc`` cleaned)."""
    shown = value
    if isinstance(value, list | dict):
        shown = f"<{type(value).__name__} of {len(value)} items>"
    error = {"type": kind, "loc": loc, "msg": message, "input": str(shown)}
    return RequestError(f"1 validation error:\n  {error}", kind="Bad Request", param=loc)


def prompt_length(prompt: object) -> int:
    """Prompt tokens of a ``/v1/completions`` ``prompt``.

    A string is estimated from its words; a list of token ids counts exactly its length.

    vLLM also takes a list of prompts (strings or token-id lists) and answers each; the
    simulated replica serves one prompt per request and refuses those with a 400 too.

    Raises:
        RequestError: what vLLM 0.32 answers for that prompt (messages as vLLM words them).
    """
    if prompt is None or prompt == "":
        raise RequestError(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            param="prompt",
        )
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if not isinstance(prompt, list):
        raise _invalid("body.prompt", "string_type", "Input should be a valid string", prompt)
    if not prompt:
        raise RequestError("You must pass at least one prompt")
    if all(isinstance(p, str | list) for p in prompt):
        raise RequestError(
            f"prompt is a list of {len(prompt)} prompts: the simulated replica serves one"
            " prompt (a string or a list of token ids) per request",
            param="prompt",
        )
    for i, token in enumerate(prompt):
        _check_token_id(i, token)
    return len(prompt)


def _check_token_id(i: int, token: object) -> None:
    """The ``i``-th token id of a prompt, as pydantic's lax ``int >= 0`` takes it."""
    # JSON numbers as pydantic's lax int takes them: true/false and 3.0 are ids too.
    if isinstance(token, float) and not token.is_integer():
        raise _invalid(
            f"body.prompt.{i}",
            "int_from_float",
            "Input should be a valid integer, got a number with a fractional part",
            token,
        )
    if not isinstance(token, int | float):
        raise _invalid(f"body.prompt.{i}", "int_type", "Input should be a valid integer", token)
    if token < 0:
        raise _invalid(
            f"body.prompt.{i}",
            "greater_than_equal",
            "Input should be greater than or equal to 0",
            token,
        )


def chat_prompt_length(messages: object) -> int:
    """Prompt tokens of a ``/v1/chat/completions`` ``messages`` list (~4 a message of framing).

    Raises:
        RequestError: ``messages`` is not a list of objects.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestError("messages must be a list of objects", param="messages")
    for i, message in enumerate(messages):
        _check_message(i, message)
    text = " ".join(str(m.get("content") or "") for m in messages)
    return count_tokens(text) + 4 * len(messages)


def _check_message(i: int, message: dict[str, object]) -> None:
    """A chat message as vLLM's schema takes it.

    A string ``role``; ``content`` a string, null, or a list of content parts (objects).
    """
    role = message.get("role")
    if not isinstance(role, str):
        kind, text = ("missing", "Field required") if role is None else ("string_type", "")
        raise _invalid(
            f"body.messages.{i}.role", kind, text or "Input should be a valid string", role
        )
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise _invalid(
            f"body.messages.{i}.content",
            "string_type",
            "Input should be a valid string or a list of content parts",
            content,
        )


def check_options(body: dict[str, object]) -> None:
    """``stream_options`` an object (or null); ``n`` 1: the simulated replica's one choice.

    Raises:
        RequestError: vLLM's 400 for ``stream_options``; the simulated replica's for ``n``.
    """
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _invalid(
            "body.stream_options", "model_type", "Input should be a valid dictionary", options
        )
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise RequestError(
            f"n is {str(n)[:20]}: the simulated replica serves one choice per request",
            param="n",
        )


def max_tokens_of(body: dict[str, object], chat: bool = False) -> int:
    """The request's ``max_tokens``: the tokens it generates, exactly.

    A chat request's ``max_completion_tokens`` comes first, as vLLM reads them
    (``max_completion_tokens or max_tokens``); its completions have no such field.

    Raises:
        RequestError: it is not a positive integer.
    """
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") else "max_tokens"
    max_tokens = body.get(name, DEFAULT_MAX_TOKENS)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"{name} must be a positive integer", param=name)
    return max_tokens


def too_long(prompt_tokens: int, max_tokens: int, capacity: int) -> RequestError:
    """A request larger than the whole KV cache (``capacity`` tokens): it could never run."""
    return RequestError(
        f"This model's KV cache holds {capacity} tokens. However, you requested"
        f" {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt,"
        f" {max_tokens} in the completion).",
        param="input_tokens",
    )
