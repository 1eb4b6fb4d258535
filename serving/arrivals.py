"""The gateway's record of its traffic: what a row says and when a file rotates. Pure.

Each request that counts as an arrival becomes one CSV row when it ends: its arrival time
(UTC, microseconds), its prompt tokens and its output tokens, never its content. The
files are the Azure LLM trace's shape (``TIMESTAMP,ContextTokens,GeneratedTokens``), so
``unitscale replay --trace`` reads one as it is. The shell that writes them off the
event loop is ``serving.arrival_recorder``.

Prompt tokens are the replica's ``usage.prompt_tokens`` when its answer carries one (a
non-streamed answer always does in vLLM; a stream with ``stream_options:
{include_usage: true}``); otherwise ``estimate_prompt_tokens`` of the request body. Output
tokens are what ``serving.slo.ResponseMeter`` counted: the usage's count, else the stream
events carrying tokens, else 0 (a request that failed or was abandoned before an answer
records what it had).

Disk is bounded by two numbers: a file holds at most ``max_file_bytes`` (the rows that
would pass it go to the next file, ``plan_writes``), and at most ``max_files`` files are
kept (opening one more deletes the oldest, ``to_delete``). A file also ends when a later
UTC day begins (``is_a_later_day``): each holds about a day, and a day's traffic is a few
files. The replay reads the 31 days of a directory that hold the most requests (a run left
from weeks before, or a flush on a clock far ahead, is left out with a warning), and a
last row cut short by a kill or a full disk is left out too. Files are named
``arrivals-<sequence>-<UTC start>.csv`` with an 8-digit sequence that orders them, across
restarts too. The sequence is a ring (after 99999999 comes 00000000): the oldest file is
the one after the largest gap between the sequences present (``ring_order``), so a
directory that already holds 99999999 goes on with 00000000 and deletes 99999999 in its
turn, never the file just opened.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
"""The Azure LLM trace's header, which ``replay.trace.read_trace`` recognises."""
MAX_TOKENS = 10_000_000
"""A count is clamped to this: ``replay.limits.MAX_TOKENS``, above which the reader refuses
the row (a test keeps the two equal; ``serving`` cannot import ``replay``)."""
CHARS_PER_TOKEN = 4
"""Characters per token of an estimated prompt: English text under Llama 3's and OpenAI's
tokenizers averages about four."""
MESSAGE_TOKENS = 4
"""Tokens a chat template adds per message (role and separators), as OpenAI counts them."""
MIN_FILE_BYTES = 1024
"""The smallest ``max_file_bytes``: the header and a few rows of at most ``MAX_ROW_BYTES``."""
MAX_ROW_BYTES = 64
"""The longest row: a 32-character time and two counts of at most 8 digits."""
FILE_NAME = re.compile(r"arrivals-(\d{8})-\d{8}T\d{6}Z\.csv")
"""A recorded file's name; the first group is its sequence number."""
MAX_SEQUENCE = 10**8 - 1


@dataclass(frozen=True, slots=True)
class ArrivalSettings:
    """Where the gateway records its arrivals, and how much disk they may take."""

    directory: str | None = None
    """The directory the files go to (created if missing); None: nothing is recorded."""
    max_file_bytes: int = 64 * 1024**2
    """Bytes of one file, header included: about 1.3 million requests."""
    max_files: int = 16
    """Files kept, the one being written included: 16 x 64 MiB = 1 GiB at most, about
    three weeks of a million requests a day."""


def format_row(arrival: float, prompt_tokens: int, output_tokens: int) -> str:
    """One request's row: ``2025-01-02 03:04:05.678901+00:00,1020,129``.

    Counts are clamped to 0 to ``MAX_TOKENS``; the time keeps its UTC offset, so the row
    means the same wherever it is read (a naive time would be read as local).
    """
    stamp = datetime.fromtimestamp(arrival, UTC).isoformat(sep=" ", timespec="microseconds")
    return f"{stamp},{_clamp(prompt_tokens)},{_clamp(output_tokens)}\n"


def _clamp(count: int) -> int:
    return min(max(count, 0), MAX_TOKENS)


def plan_writes(rows: list[str], size: int, max_bytes: int) -> list[tuple[bool, str]]:
    """How ``rows`` go to files: ``(rotate first, text)`` per write, in order.

    ``size`` is the current file's bytes (0: no file is open, so the first write opens
    one). A new file starts with ``HEADER``, in the text; a file is full when the next row
    would take it past ``max_bytes``. Example at ``max_bytes`` 100 (header 40, rows 30):
    a file of 70 bytes and two rows is ``[(False, row1), (True, HEADER + row2)]``.
    """
    writes: list[tuple[bool, str]] = []
    rotate = size == 0
    text = [HEADER] if rotate else []
    size = len(HEADER) if rotate else size
    for row in rows:
        # full; a file of its header alone takes any row, so every row lands somewhere
        if size + len(row) > max_bytes and size > len(HEADER):
            if text:
                writes.append((rotate, "".join(text)))
            rotate, text, size = True, [HEADER], len(HEADER)
        text.append(row)
        size += len(row)
    if rows:
        writes.append((rotate, "".join(text)))
    return writes


def is_a_later_day(opened: float, now: float) -> bool:
    """Whether ``now`` falls on a later UTC day than ``opened`` (both Unix seconds).

    Only later: a wall clock stepping back and forth over midnight would otherwise open a
    file a batch, and the bound on files would delete the history.
    """
    return int(now // 86_400) > int(opened // 86_400)


def file_name(sequence: int, started: float) -> str:
    """The name of the ``sequence``-th file, opened at ``started`` (Unix seconds)."""
    stamp = datetime.fromtimestamp(started, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"arrivals-{sequence % (MAX_SEQUENCE + 1):08d}-{stamp}.csv"


def ring_order(sequences: set[int]) -> list[int]:
    """``sequences`` oldest first, on the ring of ``MAX_SEQUENCE + 1``.

    The newest is the one before the largest gap. Example: {99999998, 99999999, 0} is in
    that order (the largest gap runs from 0 up to 99999998).
    """
    ordered = sorted(sequences)
    if len(ordered) < 2:
        return ordered
    size = MAX_SEQUENCE + 1
    gaps = [(ordered[(i + 1) % len(ordered)] - s) % size for i, s in enumerate(ordered)]
    oldest = (gaps.index(max(gaps)) + 1) % len(ordered)
    return ordered[oldest:] + ordered[:oldest]


def _sequences(names: list[str]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for name in names:
        if m := FILE_NAME.fullmatch(name):
            found.setdefault(int(m[1]), []).append(name)
    return found


def next_sequence(names: list[str]) -> int:
    """The sequence after the newest among ``names`` (others ignored), wrapping; 0 for none."""
    order = ring_order(set(_sequences(names)))
    return (order[-1] + 1) % (MAX_SEQUENCE + 1) if order else 0


def to_delete(names: list[str], max_files: int, keep: str | None = None) -> list[str]:
    """The recorded files among ``names`` to delete so that ``max_files`` remain: the oldest.

    ``keep`` (the file just opened) is never among them, wherever it falls in the order.
    """
    found = _sequences(names)
    recorded = [name for seq in ring_order(set(found)) for name in sorted(found[seq])]
    doomed = recorded[: max(len(recorded) - max_files, 0)]
    return [name for name in doomed if name != keep]


def estimate_prompt_tokens(body: dict[str, object]) -> int:
    """A request's prompt tokens from its body, for when the replica reports none.

    Token ids count one each (``"prompt": [1, 2, 3]`` or a list of such lists); text
    (``prompt``, a chat message's ``content`` or its ``text`` parts) counts one token per
    ``CHARS_PER_TOKEN`` characters, and each chat message ``MESSAGE_TOKENS`` more. Only
    these fixed paths are walked, each list once: no deeper than the body's parse went.
    """
    ids, chars = 0, 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], int):
            ids += len(prompt)
        for item in prompt:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, list):
                ids += len(item)
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            ids += MESSAGE_TOKENS
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if isinstance(part, dict) else None
                    chars += len(text) if isinstance(text, str) else 0
    return _clamp(ids + math.ceil(chars / CHARS_PER_TOKEN))
