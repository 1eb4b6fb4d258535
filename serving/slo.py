"""Whether one request met the SLO, judged from what the gateway saw of it.

Pure: times are arguments (``time.monotonic`` seconds in the gateway), nothing is read or
logged. ``ResponseMeter`` reads a response body as it passes through the proxy (when it
began, when its first token came, how many tokens it carried); ``judge`` turns that, the
status and the end into a ``Verdict``.

The rule, for targets ``ttft`` and ``itl``:

- **failed** (outside): no complete response (cut or stalled mid-body), a 5xx (the
  gateway's own 502, 503 and 504 among them), a 429 (the buffer was full), or an answer
  that is none (``ResponseMeter.unanswered``: a success holding no choice, a 404 of a
  model its replica lists);
- **ttft** (outside): a stream's first token came more than ``ttft`` after the arrival. Its
  first token is its first server-sent event that carries one; with no token at all, the
  end counts. A request that got no response at all is judged so too: it waited;
- **itl** (outside): a stream's mean inter-token latency, ``(end - first token) / (tokens -
  1)``, is above ``itl``. Tokens are the body's ``usage.completion_tokens`` when it has one
  (the last event that carries usage), else the events that carry tokens, shared by the
  choices asked (``n``, times a batch's prompts), which are generated side by side. One
  token a choice (or an unknown count) is judged on TTFT alone;
- **latency** (outside): a non-streamed response (not server-sent events) took longer,
  ``end - arrival``, than the budget the two targets give its ``n`` tokens together,
  ``ttft + (n - 1) * itl``: the latest end of a stream that met both. Its first byte
  comes after its last token, so it has no TTFT of its own to judge. ``n`` is its JSON's
  ``usage.completion_tokens`` shared by its choices; with no count (an error body, a
  client that left before the answer) or under two tokens a choice the budget is ``ttft``;
- **met** (within): otherwise; a bound is met when equal.

A request whose client left (``CLIENT_CLOSED``) is judged on what it had seen: late if its
first token had not come within ``ttft``, slow if its tokens so far (to the last) came
slower than ``itl``; a user stopping a stream on time is no miss. One that left before any
token, while still within ``ttft``, is **not judged** (``LEFT``): whether it would have met
the SLO is unknown, and counting it within let clients that cancel early (an editor's
completions as the user types, or a neighbour opening and dropping requests) raise the
attainment the scaler steers by.

Worked example, targets 2 s and 100 ms: a stream whose first token comes 0.4 s after
arrival and whose 101st and last at 10.9 s has a mean ITL of (10.9 - 0.4) / 100 = 105 ms:
outside, ``itl``. The same stream ending at 10.4 s (100 ms) is within. Non-streamed, the
same 101 tokens have a budget of 2 + 100 * 0.1 = 12 s: an answer whose last byte comes
10.9 s after arrival is within (its first byte came at 10.9 s too, far past ``ttft``),
one at 12.5 s is outside, ``latency``. The budget is shared: a slow prefill is made up
for by fast decoding, which a client that waits for the whole answer cannot tell apart.

A 4xx other than 429 (a prompt too long for the model, say) is judged on its timing as any
answer: the replica answered, and more replicas would not have answered it otherwise.

A replica's ``usage`` is outside input: a count is a whole number from 0 to
``MAX_TOKENS`` (the trace reader's bound), and a completion count at most what the
request allowed (``output_token_limit``). Anything else is no count at all
(``ResponseMeter.usage_unmeasured``): a stream is judged on the events it carried, a
non-streamed answer on ``ttft`` alone. A replica that claims a trillion tokens can turn no
late answer into a met one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from serving.arrivals import MAX_TOKENS
from serving.replica_answers import MAX_CONTEXT_TOKENS

REASONS = ("met", "ttft", "itl", "latency", "failed")
"""A verdict's ``reason``: ``met`` is within, the others outside."""
CLIENT_CLOSED = 499
"""The status (nginx's) of a request whose client left: judged on what it had seen."""
LEFT = "left"
"""A verdict's ``reason`` when the client left before any token within ``ttft``: not
judged, neither within nor outside (``Verdict.judged``)."""
TOKEN_LESS_LINES = 4096
"""Lines a stream may carry beyond two per event holding a choice (its ``data:`` line and
the blank line after it) before it is flooded (``ResponseMeter.flooded``): every vLLM
event but the usage and ``[DONE]`` holds one (its role, a token, even one of no text yet,
its end). Each line is parsed on the gateway's event loop: a replica streaming
``data: {}`` lines took 227 ms of it a MB, honest requests beside it 1.1 s instead of
58 ms at two such streams (hostile pass 62). Counted against token events only, a chat
request for 2,100 choices of one token flooded an honest vLLM's stream, and a client
ejected every replica with a few (hostile pass 63)."""
PARSED_BYTES = 1024**2
"""Bytes of a stream's lines parsed beyond ``PARSED_BYTES_PER_EVENT`` an event holding a
choice; past them the meter reads no more (the stream is relayed, judged on what was
read): token events carrying 80 MB of junk each held the event loop (honest requests
1.2 s at 24 such streams, ``/health`` past a probe's second, hostile pass 63)."""
PARSED_BYTES_PER_EVENT = 64 * 1024
"""An event's share of ``PARSED_BYTES``: vLLM's with 20 top logprobs is ~4 KB."""
HEAD_BYTES = 64 * 1024
"""Bytes of a non-streamed body's beginning kept to see its choices (vLLM's come within
~200 bytes: an id, the object, the time, the model)."""
SSE_LINE_LIMIT = 1024**2
"""Bytes a server-sent event line may reach; a longer one is skipped, not held."""
JSON_BODY_LIMIT = 4 * 1024**2
"""Bytes of a non-streamed body kept to read its usage; past it, its last half of this
are kept (vLLM writes ``usage`` near the end): dropped whole, the answer to a client's
request id of 4 MB had no count, judged against ``ttft`` alone (hostile pass 65)."""
MAX_INDEXED = 4096
"""Choice indexes a stream's tokens are counted by (``ResponseMeter._indexed``)."""
USAGE_WINDOW = 4096
"""Bytes after a non-streamed body's ``"usage":`` its value is read from (``usage_in``):
vLLM's is ~200. Past it (or unreadable there) the count is unknown."""
_CHOICES = re.compile(rb'"choices"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}\[[ \t\r\n]{0,64}\{')
"""A list of choices opening with an object, as a key (a quote in a JSON string is
escaped); blanks bounded, so a match is at most ``_CHOICES_SPAN`` bytes across chunks."""
_CHOICES_SPAN = 9 + 3 * 64 + 3
"""A ``choices`` key whose list opens with an object."""
_USAGE_KEY = re.compile(rb'"usage"[ \t\r\n]*:[ \t\r\n]*')
_LAST_USAGE_KEY = re.compile(rb'.*"usage"[ \t\r\n]*:[ \t\r\n]*', re.DOTALL)
"""Up to the value of the last ``"usage":`` key, in one search from the end, however many
``"usage"`` texts (a token's, in the logprobs) come after it: a loop over them in Python
cost 27 times a body's bytes of filler (hostile pass 67)."""
_OBJECT = re.compile(rb"[ \t\r\n]*\{")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class SloTargets:
    """The SLO the gateway judges every request against: the scaler's defaults."""

    ttft_seconds: float = 2.0
    """Time to first token, from the gateway's arrival (``slo_ttft_seconds``)."""
    itl_seconds: float = 0.1
    """Mean inter-token latency of one request (``slo_itl_seconds``)."""
    attainment: float = 0.99
    """The share of requests that should be within both (``slo_attainment``): reported
    for dashboards and alerts; the judging does not use it."""
    window_seconds: float = 60.0
    """The window the within and outside rates the scaler steers by are counted over:
    the replay's (its stable window), long enough to hold a minute's requests."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One request's judgment."""

    within: bool
    reason: str
    """One of ``REASONS``."""
    ttft_seconds: float | None
    """Arrival to first token (to the end without one, or for a non-streamed response);
    None when it failed."""
    itl_seconds: float | None
    """Mean inter-token latency; None when not measured (failed, non-streamed, or under
    two tokens)."""

    @property
    def judged(self) -> bool:
        """False when the client left too early to tell (``LEFT``): counted neither way."""
        return self.reason != LEFT


def is_failure(status: int | None) -> bool:
    """No complete response (None), a 5xx or a 429: outside, whatever the timing."""
    return status is None or status >= 500 or status == 429


def latency_budget(targets: SloTargets, output_tokens: float | None) -> float:
    """The longest a non-streamed answer of ``output_tokens`` may take: within both targets.

    A stream whose first token came at ``ttft`` and whose next ``n - 1`` each came ``itl``
    apart ends at ``ttft + (n - 1) * itl``: 2 + 199 * 0.1 = 21.9 s for 200 tokens at
    2 s and 100 ms. With no count, or under two tokens, the budget is ``ttft``.
    """
    if output_tokens is None or output_tokens < 2:
        return targets.ttft_seconds
    return targets.ttft_seconds + (output_tokens - 1) * targets.itl_seconds


def judge(
    targets: SloTargets,
    arrival: float,
    first_token: float | None,
    end: float,
    output_tokens: float | None,
    status: int | None,
    streamed: bool,
    choices: int = 1,
) -> Verdict:
    """Within or outside the SLO, and why (the rule is the module's docstring).

    Args:
        targets: the TTFT and ITL targets.
        arrival: when the request reached the gateway.
        first_token: when a stream's first token (or first byte) passed; None if none
            did. For a non-streamed response only whether any byte passed: a client
            that left (``CLIENT_CLOSED``) before any, within ``ttft``, is ``LEFT``.
        end: when its response ended, failed, or its client left.
        output_tokens: tokens it generated; None when unknown.
        status: the HTTP status its client got; None when the response was cut off.
        streamed: False for a non-streamed response (not server-sent events), judged on
            its whole latency; True for a stream, or a request that got no response.
        choices: the choices generated side by side, sharing ``output_tokens``: a stream
            of 8 whose choices each came 10 ms a token was judged at 1.3 ms (pass 65).
    """
    per_choice = None if output_tokens is None else output_tokens / max(1, choices)
    if is_failure(status):
        return Verdict(False, "failed", None, None)
    if status == CLIENT_CLOSED and first_token is None and end - arrival <= targets.ttft_seconds:
        return Verdict(False, LEFT, end - arrival, None)
    if not streamed:
        latency = end - arrival
        if latency > latency_budget(targets, per_choice):
            return Verdict(False, "latency", latency, None)
        return Verdict(True, "met", latency, None)
    ttft = (end if first_token is None else first_token) - arrival
    itl = None
    if first_token is not None and per_choice is not None and per_choice > 1:
        itl = (end - first_token) / (per_choice - 1)
    if ttft > targets.ttft_seconds:
        return Verdict(False, "ttft", ttft, itl)
    if itl is not None and itl > targets.itl_seconds:
        return Verdict(False, "itl", ttft, itl)
    return Verdict(True, "met", ttft, itl)


def output_token_limit(body: dict[str, object], chat: bool = True) -> int | None:
    """The most completion tokens a request may get; None when it sets no usable bound.

    A chat request's ``max_completion_tokens``, else its ``max_tokens`` (a completion's
    ``max_tokens`` only), times its choices ``n``: vLLM's usage counts the tokens of every
    choice. The order is vLLM's (``max_completion_tokens or max_tokens``): read the other
    way, a chat request giving both, 5 and 100, had its good 100-token stream cut at 21
    events as the replica's overrun. vLLM's completions take no ``max_completion_tokens``.
    """
    limit = None
    if chat:
        given = body.get("max_completion_tokens")
        if given is not None and given != 0:  # 0 falls through, as vLLM's ``or``
            limit = _count(given)
            if limit is None:
                # vLLM reads 300.0 or "300" as 300: a bound of max_tokens beside it cut
                # honest streams as overruns, a client ejecting replicas (pass 67).
                return None
    if limit is None:
        limit = _count(body.get("max_tokens"))
    n = choices(body, chat)
    if limit is None or n is None:
        return None
    return limit * n


def choices(body: dict[str, object], chat: bool = False) -> int | None:
    """The choices a request asks for (``n``, at least 1); None when ``n`` is no count.

    ``"n": null`` is one, as vLLM reads it (its default): read as no count, it left the
    stream of a chat request without ``max_tokens`` unbounded.
    """
    n = _count(body.get("n") if body.get("n") is not None else 1)
    if n is None:
        return None
    if chat:  # a chat request's prompt is its messages: a "prompt" field is ignored
        return max(n, 1)
    # A completion's prompt may be a batch (strings, or lists of token ids), and its
    # prompt embeddings another (one, or a list): vLLM answers n choices for each, and a
    # batch of 18 prompts, or of 8 embeddings, had honest streams cut past a bound of one
    # prompt's, their replicas ejected by a client (hostile passes 64 and 66).
    return max(n, 1) * max(1, _prompts(body.get("prompt")) + _prompts(body.get("prompt_embeds")))


def _prompts(prompt: object) -> int:
    """Prompts in a completion's ``prompt`` or ``prompt_embeds``: a batch's, one, or none.

    A string is one, empty too: vLLM answers ``""`` beside 8 embeddings with 9 choices.
    """
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1 if isinstance(prompt, str) or (isinstance(prompt, list) and prompt) else 0


class ResponseMeter:
    """What one response body says about its tokens, read chunk by chunk as it passes.

    The shell sets ``status`` (the client's, None once cut off) and feeds every chunk with
    the time it came; ``verdict`` judges the request at its end. ``max_tokens``: the most
    completion tokens the request allowed (``output_token_limit``), None for no bound.
    """

    def __init__(
        self, arrival: float, max_tokens: int | None = None, choices: int | None = 1
    ) -> None:
        self.arrival = arrival
        self.max_tokens = max_tokens
        self.choices = choices
        """The choices the request asked for (``n``); None when it gave no count."""
        self.context_bound = MAX_CONTEXT_TOKENS
        """Its replica's ``max_model_len`` times ``choices`` (no answer of vLLM's is
        longer), set once the replica is chosen (``bound_by``); ``MAX_CONTEXT_TOKENS``
        while either is unknown."""
        self.usage_unmeasured = False
        """A usage count came that is no count (out of bounds): ignored, for the shell to count."""
        self.status: int | None = None
        """The status the client got; None while no response began, or once cut off."""
        self.first_byte: float | None = None
        self.first_token: float | None = None
        """A stream's first event carrying a token (the first byte of any other body)."""
        self.last_token: float | None = None
        """A stream's latest event carrying a token."""
        self.token_events = 0
        self._indexed: dict[int, int] = {}
        """A stream's events carrying tokens by choice index, for its first
        ``MAX_INDEXED`` choices: the longest choice sets its pace (``verdict``)."""
        self.choice_events = 0
        """A stream's events holding a choice, with text or not (``_holds_choice``)."""
        self.lines = 0
        """A stream's lines read so far: past ``TOKEN_LESS_LINES`` more than two per event
        holding a choice, it is ``flooded`` and no more are read."""
        self.parsed_bytes = 0
        """Bytes of a stream's lines parsed (``PARSED_BYTES``)."""
        self.data_lines = 0
        """A stream's event lines (``data:`` opening a line), read or not: past the parse
        budget, the count of its events (``serving.gateway.overrun``)."""
        self.last_data_line: float | None = None
        """When a stream's latest event line began: past the parse budget, its pace."""
        self._tail = b"\n"
        """The last bytes of the body before this chunk (a stream's start opens a line)."""
        self.choices_seen = False
        """Whether a list of choices opening with an object passed, read or not (``_scan``)."""
        self.skipped = False
        """A stream's line was longer than ``SSE_LINE_LIMIT``, skipped unread."""
        self.stream_error = False
        """A stream carried an error event (vLLM streams its errors in a 200) of the
        replica's: a 5xx code, or none."""
        self.client_error = False
        """A stream carried an error event of a 4xx code (``_is_client_error``): the
        client's request refused, as an answer of HTTP 400 is."""
        self.unanswered = False
        """The replica's answer was none, whatever its status (``serving.gateway`` sets it:
        a success holding no choice, a 404 of a model it lists, a 429): judged failed."""
        self.usage_tokens: int | None = None
        """``usage.completion_tokens``, the latest seen."""
        self.prompt_tokens: int | None = None
        """``usage.prompt_tokens``, the latest seen (for the arrivals record)."""
        self._streamed: bool | None = None
        """Whether the response is server-sent events; None until its headers came."""
        self._cr_ended = False
        """The last chunk ended with a CR: an LF opening the next ends no other line."""
        self._pending = bytearray()
        """A stream's bytes after its last full line (grown in place: a 1 MiB line sent
        256 bytes at a time was copied whole per chunk, quadratic on the event loop)."""
        self._body: bytearray | None = bytearray()
        """Any other body so far, its last bytes past ``JSON_BODY_LIMIT`` (``_cut``);
        None once read."""
        self._cut = False
        """Whether ``_body`` lost its start: its opening is read from ``_head``."""
        self._usage_cut: bytes | None = None
        """The window of the last ``usage`` key's value cut from ``_body``: vLLM writes a
        chat answer's ``prompt_logprobs`` after it, 1.4 KB a prompt token."""
        self._head = bytearray()
        """Any other body's first ``HEAD_BYTES`` (``holds_choices``)."""

    def bound_by(self, max_model_len: int | None) -> None:
        """Its replica's context (``max_model_len``, None where it lists none).

        Unknown (no length listed, or an ``n`` that is no count), it is
        ``MAX_CONTEXT_TOKENS``, the longest context a replica's list is taken with: a
        replica listing none, or a request with ``"n": null``, left its stream without
        any bound, held in flight for good by a replica that kept generating.
        """
        self.context_bound = MAX_CONTEXT_TOKENS
        if max_model_len is not None and self.choices is not None:
            self.context_bound = min(max_model_len, MAX_CONTEXT_TOKENS) * self.choices

    @property
    def token_bound(self) -> int:
        """The most tokens the answer may carry: the request's, within its replica's context.

        The smaller of the two: a request's ``max_tokens`` of 10,000,000 (vLLM refuses
        it past the context) made a replica streaming forever past its context of 8 run.
        """
        if self.max_tokens is None:
            return self.context_bound
        return min(self.max_tokens, self.context_bound)

    def begin(self, status: int, streamed: bool) -> None:
        """The response's headers: its status, and whether it is server-sent events."""
        self.status, self._streamed = status, streamed

    def feed(self, chunk: bytes, now: float) -> None:
        """A chunk of the body, as it passed at ``now``."""
        if not chunk:
            return
        if self.first_byte is None:
            self.first_byte = now
            if not self._streamed:
                self.first_token = now
        self._scan(chunk, now)
        if self._streamed:
            self._feed_events(chunk, now)
        else:
            if len(self._head) < HEAD_BYTES:
                self._head += chunk[: HEAD_BYTES - len(self._head)]
            if self._body is not None:
                self._body += chunk
                if len(self._body) > JSON_BODY_LIMIT:  # at most once a half: linear
                    cut = len(self._body) - JSON_BODY_LIMIT // 2
                    at = _last_usage_value(self._body, cut + 64)  # one across the cut too
                    if at >= 0:
                        self._usage_cut = bytes(self._body[at : at + USAGE_WINDOW])
                    del self._body[:cut]
                    self._cut = True

    @property
    def streamed(self) -> bool:
        """Whether the response is server-sent events (False until its headers came)."""
        return bool(self._streamed)

    @property
    def flooded(self) -> bool:
        """Whether a stream carried ``TOKEN_LESS_LINES`` more lines than its events explain."""
        return self.lines - 2 * self.choice_events > TOKEN_LESS_LINES

    @property
    def read_whole(self) -> bool:
        """Whether every line of the stream so far was read (``PARSED_BYTES``)."""
        return self.parsed_bytes <= PARSED_BYTES + PARSED_BYTES_PER_EVENT * self.choice_events

    def _scan(self, chunk: bytes, now: float) -> None:
        """What every byte tells, parsed or not: choices, and a stream's event lines.

        A line end can sit in no JSON text, so ``data:`` after one opens an event; past
        the parse budget, a replica that padded its first events had the rest of its
        stream unbounded, its pace unread: a byte a gap held its request for good
        (hostile pass 64). Choices not read (a body past its head, a line too long or
        past the budget) were taken as there: a replica answering ``{"id": <70 KB>}`` at
        once took 92% of the traffic, judged within (hostile pass 65).
        """
        if self.choices_seen and not self._streamed:
            return  # all a body's bytes could tell
        window = self._tail + chunk
        if self._streamed:
            start = max(0, len(self._tail) - 5)  # a line start in the tail was counted
            found = window.count(b"\ndata:", start) + window.count(b"\rdata:", start)
            if found:
                self.data_lines += found
                self.last_data_line = now
        if not self.choices_seen:
            self.choices_seen = _CHOICES.search(window) is not None
        self._tail = window[-_CHOICES_SPAN:]

    def _feed_events(self, chunk: bytes, now: float) -> None:
        if self.flooded or not self.read_whole:
            return
        # A CRLF split between two chunks is one line end, as the SSE spec reads it: split
        # as two, it added an empty line, and honest CRLF streams counted lines twice.
        skip = 1 if self._cr_ended and chunk.startswith(b"\n") else 0
        self._cr_ended = chunk.endswith(b"\r")
        self._pending += memoryview(chunk)[skip:]
        if b"\n" not in chunk and b"\r" not in chunk:  # the line goes on: nothing to split
            if len(self._pending) > SSE_LINE_LIMIT:
                self._pending.clear()
                self.skipped = True
            return
        # CR, LF or CRLF, as the SSE spec allows: split on LF alone, a stream of CR line
        # ends showed no token, and was cut as stalled (hostile pass 56).
        *lines, rest = _LINE_ENDS.split(self._pending)
        self._pending = bytearray(rest) if len(rest) <= SSE_LINE_LIMIT else bytearray()
        self.skipped = self.skipped or len(rest) > SSE_LINE_LIMIT
        for line in lines:
            self.lines += 1
            self.parsed_bytes += len(line)
            if self.flooded or not self.read_whole:
                return
            event = _event(line)
            if event is None:
                continue
            self._read_usage(event)
            if _is_error(event):
                if _is_client_error(event):
                    self.client_error = True
                else:
                    self.stream_error = True
            if _holds_choice(event):
                self.choice_events += 1
            if _carries_tokens(event):
                self.token_events += 1
                index = _choice_index(event)
                if index in self._indexed or len(self._indexed) < MAX_INDEXED:
                    self._indexed[index] = self._indexed.get(index, 0) + 1
                self.last_token = now
                if self.first_token is None:
                    self.first_token = now

    def holds_choices(self) -> bool:
        """Whether the body answers a completion, read before ``output_tokens``.

        A stream answers one with an event holding a choice, any other body as a JSON
        object whose ``"choices"`` list opens with an object (``choices_seen``, anywhere
        in it). In lines not parsed, a stream's choices are those ``choices_seen``.

        A vLLM answer always holds one (an answer of no token too: its choice says why it
        stopped); a replica answering 200 with anything else at once took ~95% of the
        traffic from least-outstanding routing, each answer judged within (hostile pass 62).
        """
        if self._streamed:
            # A line not read (too long, or past the parse budget) may have held one: a
            # client's request id of 1 MiB (vLLM's answer ids carry it) made every
            # honest event such a line, each stream "empty" (hostile pass 64); taken as
            # held unseen, a replica padding its lines passed off none (pass 65).
            unread = self.skipped or not self.read_whole
            return self.choice_events > 0 or (unread and self.choices_seen)
        return _OBJECT.match(self._head) is not None and self.choices_seen

    def output_tokens(self) -> int | None:
        """Tokens generated: the usage's count, else the events carrying tokens.

        A stream's is at least its events carrying tokens: a usage claiming fewer (1, or
        0) made 21 tokens 300 ms apart a stream within the ITL target (hostile pass 63).
        """
        if not self._streamed and self._body:
            usage = usage_in(self._body, self._head if self._cut else None)
            if usage is None and self._usage_cut is not None:
                usage = _usage_value(self._usage_cut)
            self._body = None  # read once
            if usage is not None:
                self._read_usage(usage)
        if self._streamed:
            counted = self.token_events
            if self.skipped or not self.read_whole:
                # Events not read carried tokens too: all but each choice's role and end,
                # the usage and [DONE]. Uncounted, a client's request id of 200 KB (in
                # every event) had honest streams judged slow (hostile pass 65).
                counted = max(counted, self.data_lines - 2 * (self.choices or 1) - 2)
            return max(self.usage_tokens or 0, counted)
        return self.usage_tokens

    def _read_usage(self, body: dict[str, object]) -> None:
        """A body's (or event's) ``usage``, at the boundary: counts in bounds, or none."""
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return
        for key in ("completion_tokens", "prompt_tokens"):
            if key not in usage:
                continue
            tokens = _count(usage[key])
            limit = self.max_tokens if key == "completion_tokens" else None
            if tokens is None or (limit is not None and tokens > limit):
                self.usage_unmeasured = True
                continue
            if key == "completion_tokens":
                self.usage_tokens = tokens
            else:
                self.prompt_tokens = tokens

    def verdict(self, targets: SloTargets, end: float, status: int | None) -> Verdict:
        """The request's judgment, ended at ``end`` with the client's ``status``.

        A stream whose client left (``CLIENT_CLOSED``) after some tokens is judged on those,
        to the last: the wait after it was the client's, not an inter-token gap. A request
        whose response never began is judged as a stream: on its wait for a first token,
        not at all (``LEFT``) when its client left before ``ttft`` had passed.

        A stream that ended with no event we read a token from is timed from its first
        byte (an engine's events of another shape); one whose client left is not: a
        keep-alive comment or the role chunk of an engine that never sent a token made a
        client that gave up waiting a request within the SLO (hostile pass 44).
        """
        if self.unanswered:
            return Verdict(False, "failed", None, None)
        first = self.first_token
        if first is None and status != CLIENT_CLOSED:
            first = self.first_byte
        if status == CLIENT_CLOSED and self.last_token is not None:
            end = self.last_token
        streamed = self._streamed is not False
        tokens: float | None = self.output_tokens()
        choices = self.choices or 1
        if choices > 1 and len(self._indexed) > 1 and self.read_whole and not self.skipped:
            # The choices end when the longest does: its tokens are the pace. Shared
            # evenly, one choice of 500 tokens at 20 ms beside seven of one token was
            # judged at 160 ms (hostile pass 66).
            # Never fewer than the usage shared: events of several tokens each (vLLM's
            # stream interval, speculative decoding) read n=2 at 4x its pace (pass 67).
            longest = max(max(self._indexed.values()), (tokens or 0) / choices)
            tokens, choices = longest, 1
        return judge(targets, self.arrival, first, end, tokens, status, streamed, choices)


def usage_in(
    body: bytes | bytearray, head: bytes | bytearray | None = None
) -> dict[str, object] | None:
    """A non-streamed JSON object's ``usage`` as ``{"usage": value}``; None if none is read.

    ``head``: the body's opening bytes, where ``body`` holds only its last ones.

    Only the usage is read, not the body: parsing a whole answer held the gateway's event
    loop 0.1 s for an honest 3 MB one (2,500 tokens with 20 top logprobs each, a request
    any client may send) and 0.17 s for 4 MiB of empty objects from a hostile replica, at
    every such answer. vLLM writes ``usage`` after ``choices`` (the text, the logprobs)
    and before fields that hold no ``usage`` key, so it is the last ``"usage"`` followed
    by a colon (in a string a quote is escaped, so such bytes are a key); its value is
    read from at most ``USAGE_WINDOW`` bytes. However many ``"usage"`` texts follow it (a
    token's, in the logprobs): 16 of them hid the count (hostile pass 67).
    """
    if _OBJECT.match(body if head is None else head) is None:
        return None
    at = _last_usage_value(body, len(body))
    return None if at < 0 else _usage_value(body[at : at + USAGE_WINDOW])


def _last_usage_value(body: bytes | bytearray, end: int) -> int:
    """Where the value of the last ``"usage":`` key before ``end`` begins, or -1.

    In one pass, however many ``"usage"`` values (a token's text in the logprobs) follow.
    """
    match = _LAST_USAGE_KEY.match(body, 0, end)
    return -1 if match is None else match.end()


def _usage_value(window: bytes | bytearray) -> dict[str, object] | None:
    """The JSON value opening ``window`` as ``{"usage": value}``; None if none is read."""
    text = bytes(window[:USAGE_WINDOW]).decode("utf-8", "replace")
    try:
        value, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return {"usage": value}


_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
"""An SSE line's end: CRLF, CR or LF."""


def _event(line: bytes | bytearray) -> dict[str, object] | None:
    """A ``data:`` line's JSON object; None for anything else (``[DONE]``, comments)."""
    if not line.startswith(b"data:"):
        return None
    try:
        event = json.loads(line[5:])
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _count(value: object) -> int | None:
    """A token count from outside: a whole number from 0 to ``MAX_TOKENS``; else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def _is_error(event: dict[str, object]) -> bool:
    """Whether an event is vLLM's streamed error: ``{"error": {...}}`` or ``"object": "error"``."""
    return isinstance(event.get("error"), dict) or event.get("object") == "error"


def _is_client_error(event: dict[str, object]) -> bool:
    """Whether an error event refuses the client's request: a 4xx code other than 429.

    vLLM checks much of a request after its stream began (``logprobs`` past its limit, a
    token id outside the vocabulary, a bad regex or grammar), answering
    ``{"error": {"code": 400, ...}}`` in a 200: counted as the replica's, six such
    requests ejected two of four honest replicas (hostile pass 65). A 429 is a refusal
    of the replica's (``serving.gateway``), as its status is.
    """
    error = event.get("error")
    code = error.get("code") if isinstance(error, dict) else event.get("code")
    return type(code) is int and 400 <= code < 500 and code != 429


def _holds_choice(event: dict[str, object]) -> bool:
    """Whether an event holds a choice: ``choices`` a list whose first is an object.

    vLLM's usage event holds ``"choices": []``: no choice.
    """
    choices = event.get("choices")
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)


def _choice_index(event: dict[str, object]) -> int:
    """The index of an event's first choice (vLLM streams one a event); 0 when none."""
    choices = event.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    index = first.get("index") if isinstance(first, dict) else None
    return index if type(index) is int and index >= 0 else 0


def _carries_tokens(event: dict[str, object]) -> bool:
    """A choice with text (completions) or a delta with more than its role (chat)."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return True
    return False
