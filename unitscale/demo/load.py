"""The demo's clients: a trace replayed through the gateway at its (compressed) times.

Each request is a vLLM ``/v1/completions`` call whose prompt is the trace's prompt
length in token ids (exact for the sim replica and for vLLM) and whose ``max_tokens``
with ``ignore_eos`` is the trace's output length. Every ``stream_every``-th request
streams, so that time to first token is measured as a user sees it (gateway buffering
included) on a uniform sample, without paying for every token's chunk on 2 cores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from replay.trace import Trace


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it; times in wall seconds since the demo's start."""

    scheduled: float
    prompt: int
    output: int
    streamed: bool
    sent: float | None = None
    first_token: float | None = None
    finished: float | None = None
    status: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.finished is not None and not self.error


@dataclass
class LoadGenerator:
    """Plays ``trace`` (arrivals already in wall seconds) against ``url``."""

    trace: Trace
    url: str
    model: str
    clock: Callable[[], float]
    stream_every: int = 8
    token_id: int = 100

    def __post_init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.sent = 0

    async def run(self) -> None:
        """Send every request at its time, then wait for all of them."""
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks = []
            for i in range(len(self.trace)):
                outcome = self._outcome(i)
                self.outcomes.append(outcome)
                delay = outcome.scheduled - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._send(session, outcome)))
            await asyncio.gather(*tasks, return_exceptions=True)

    def _outcome(self, i: int) -> Outcome:
        return Outcome(
            float(self.trace.arrival[i]),
            int(self.trace.prompt[i]),
            int(self.trace.output[i]),
            i % self.stream_every == 0,
        )

    async def _send(self, session: aiohttp.ClientSession, outcome: Outcome) -> None:
        body = {
            "model": self.model,
            "prompt": [self.token_id] * outcome.prompt,
            "max_tokens": outcome.output,
            "ignore_eos": True,
            "stream": outcome.streamed,
        }
        outcome.sent = self.clock()
        self.sent += 1
        try:
            async with session.post(self.url + "/v1/completions", json=body) as response:
                outcome.status = response.status
                if outcome.streamed and response.status == 200:
                    async for _ in response.content.iter_any():
                        if outcome.first_token is None:
                            outcome.first_token = self.clock()
                else:
                    await response.read()
                outcome.finished = self.clock()
        except (aiohttp.ClientError, TimeoutError) as err:
            outcome.error = f"{type(err).__name__}: {err}"
            outcome.finished = self.clock()


def clip(trace: Trace, max_prompt: int, max_total: int) -> Trace:
    """Prompts of at most ``max_prompt`` tokens, prompt + output at most ``max_total``."""
    prompt = np.minimum(trace.prompt, max_prompt)
    output = np.maximum(np.minimum(trace.output, max_total - prompt), 1)
    return Trace(trace.name, trace.arrival, prompt, output)


def wall_trace(trace: Trace, compression: float, offset: float) -> Trace:
    """``trace`` with arrivals in wall seconds, starting ``offset`` seconds from now."""
    return Trace(trace.name, trace.arrival / compression + offset, trace.prompt, trace.output)
