"""The simulated replica's engine: continuous batching on the shared replica physics.

An engine loop runs continuous batching with chunked prefill, each step lasting what
``foundation.replica_model`` says (divided by ``speedup``), and emits one token per step to
every decoding request; it keeps vLLM's metrics (``serving.vllm_metrics``) as it goes.

**Keeping wall-clock pace.** The engine keeps its own ideal clock: a step ends exactly one
model step (divided by ``speedup``) after the previous one ended; an idle engine's clock
restarts at the arrival of the request that wakes it. It sleeps only while that clock is
ahead of the wall clock, and hands a step's tokens out only once the wall clock has
reached the step's end: a client may get a token slightly late (a loaded process, a
coarse timer), never early. A late engine runs its next steps back to back, yielding to
the event loop between them, until it has caught up, so its throughput stays what the
model says. Latency metrics (TTFT, ITL, e2e, queue time) are differences on the ideal
clock, i.e. what the engine model says, even while the process runs a little late. A
request's arrival is the wall clock at submit; it joins the first step that starts
(ideally) at or after it, so no request is served in a step that began before it came.

Per step the work is small: one bulk observation for the inter-token latencies of the
whole batch (``BulkHistogram``), cached metric children, and queue items only for
streaming requests (a non-streaming request is woken once, when it finishes). At
``--speedup 20`` an 8B model steps every ~0.4 ms of wall time, so this matters.

Tokens are counted, not computed: a request generates exactly ``max_tokens`` tokens of
filler text (``token_text``).

**Sleep mode** is vLLM 0.32's (vllm/v1/engine/core.py): ``sleep(level, mode)`` pauses the
scheduler first (``abort``: every request ends with ``finish_reason`` "abort"; ``wait``: the
batch runs to its end; ``keep``: the batch freezes), then at level 1 or 2 the weights and KV
cache go to sleep. A sleeping engine still accepts requests and queues them, unscheduled
and, as in vLLM (whose stats come from engine steps), not counted in
``num_requests_waiting``, until ``wake_up``. Waking takes ``Profile.wake_seconds(level)``
(divided by ``speedup``): the weights' part for the ``weights`` tag, the remap for
``kv_cache``; scheduling resumes once neither sleeps. A level-2 wake here includes the
weights' reload, which a real vLLM leaves to a separate ``reload_weights`` call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from foundation.replica_model import WAKE_REINIT_SECONDS, Profile
from serving.vllm_metrics import VllmMetrics

WORDS = ("the", "model", "token", "cache", "replica", "scale", "quick", "answer")

MIN_SLEEP = 0.001
"""Shortest sleep (s) when the engine is ahead of the wall clock. Event-loop timers are
millisecond-grained (uvloop rounds to the nearest ms, so a shorter sleep may return at once
and spin); sleeping at least 1 ms caps wake-ups at ~1,000/s, and the steps it oversleeps are
run back to back afterwards."""


SLEEP_TAGS = ("weights", "kv_cache")
"""What sleeps at level 1 or 2, and what ``wake_up`` may wake one at a time."""
PauseMode = Literal["abort", "wait", "keep"]


def token_text(index: int) -> str:
    """The filler text of a request's ``index``-th output token."""
    return " " + WORDS[index % len(WORDS)]


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the simulated engine; times are on the engine's ideal clock."""

    prompt_tokens: int
    max_tokens: int
    arrived: float
    """Wall clock (``time.monotonic``) at submit."""
    done: asyncio.Future[None]
    """Set when the last token is out."""
    tokens: asyncio.Queue[str | None] | None = None
    """Streaming requests only: each token as it is generated, then None."""
    prefilled: int = 0
    generated: int = 0
    admitted: float | None = None
    last_token: float | None = None
    aborted: bool = False
    finish_reason: str = "length"
    """``abort`` when a sleep aborted it (its tokens so far are its answer)."""


class SimEngine:
    """Continuous batching on an ideal clock that keeps pace with the wall clock / ``speedup``."""

    def __init__(self, profile: Profile, model: str, speedup: float = 1.0) -> None:
        self.profile = profile
        self.speedup = speedup
        # The longest request the sim accepts is its KV capacity: its max_model_len.
        self.metrics = VllmMetrics(model, profile.kv_capacity_tokens)
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        """Admitted, prompt not fully prefilled yet (in admission order)."""
        self.decoding: list[SimRequest] = []
        """Admitted, first token out: one more token every step."""
        self.clock = time.monotonic()
        """The ideal clock: when the last step ended (``time.monotonic`` seconds)."""
        self._kv_used = 0
        """KV tokens reserved by admitted requests (prompt + max_tokens each)."""
        self._context = 0
        """Tokens in the decoding requests' contexts (prompt + generated)."""
        self._wake = asyncio.Event()
        self.paused: PauseMode | None = None
        """Why the scheduler is paused (a sleep's mode), or None while it schedules."""
        self.sleep_level = 0
        self.sleeping_tags: set[str] = set()
        """What is asleep: the weights, the KV cache, both or neither."""
        self._drained = asyncio.Event()
        """Set whenever the batch is empty: a ``wait`` sleep waits for it."""
        self._drained.set()
        self._operation = asyncio.Lock()
        """Sleeps and wakes run one at a time, as vLLM's engine core runs utility calls."""
        m, labels = self.metrics, self.metrics.labels
        self._m_running = m.running.labels(*labels)
        self._m_waiting = m.waiting.labels(*labels)
        self._m_kv = m.kv.labels(*labels)
        self._m_prompt = m.prompt.labels(*labels)
        self._m_generation = m.generation.labels(*labels)
        self._m_length = m.success.labels(*labels, "length")
        self._m_abort = m.success.labels(*labels, "abort")

    @property
    def running(self) -> int:
        """Requests in the batch (prefilling or decoding)."""
        return len(self.prefilling) + len(self.decoding)

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request fits in the KV cache at all (else it could never be admitted)."""
        return prompt_tokens + max_tokens <= self.profile.kv_capacity_tokens

    def submit(self, prompt_tokens: int, max_tokens: int, stream: bool = False) -> SimRequest:
        """Queue a request.

        ``request.done`` is set when it finishes; a streaming request's tokens arrive on
        ``request.tokens`` (None ends it).
        """
        request = SimRequest(
            prompt_tokens,
            max_tokens,
            time.monotonic(),
            asyncio.get_running_loop().create_future(),
            asyncio.Queue() if stream else None,
        )
        self.waiting.append(request)
        if self.paused is None:  # a paused vLLM does not step, so its stats stand still
            self._m_waiting.set(len(self.waiting))
        self._wake.set()
        return request

    @property
    def is_sleeping(self) -> bool:
        """As vLLM's ``is_sleeping``: paused at any level, or something still asleep."""
        return self.paused is not None or bool(self.sleeping_tags)

    async def sleep(self, level: int, mode: PauseMode = "abort") -> None:
        """As vLLM's ``sleep``: pause the scheduler (``mode``), then at level 1 or 2 free memory."""
        async with self._operation:
            self.paused = mode
            if mode == "abort":
                self._abort_all()
            elif mode == "wait":
                await self._drained.wait()
            if level >= 1 and not self.sleeping_tags:  # vLLM ignores a second sleep
                self.sleeping_tags = set(SLEEP_TAGS)
                self.sleep_level = level
            self.metrics.set_sleep_state(1, level)

    async def wake_up(self, tags: Iterable[str] | None = None) -> bool:
        """As vLLM's ``wake_up``: wake ``tags`` (all when None); whether fully awake now.

        A tag that is not asleep leaves everything asleep (vLLM warns and returns).
        """
        async with self._operation:
            wanted = None if tags is None else [t for t in tags if t != "scheduling"]
            if self.sleeping_tags and (wanted is None or wanted):
                waking = set(self.sleeping_tags) if wanted is None else set(wanted)
                if waking <= self.sleeping_tags:
                    await asyncio.sleep(self._wake_seconds(waking) / self.speedup)
                    self.sleeping_tags -= waking
            if self.sleeping_tags:
                return False
            self.paused = None
            self.sleep_level = 0
            self.clock = max(self.clock, time.monotonic())  # nothing ran while asleep
            self.metrics.set_sleep_state(0, 0)
            self._m_waiting.set(len(self.waiting))
            self._wake.set()
            return True

    def _wake_seconds(self, tags: set[str]) -> float:
        """Model seconds to wake ``tags``: the weights' copy or reload, the KV remap."""
        total = self.profile.wake_seconds(self.sleep_level)
        weights = max(total - WAKE_REINIT_SECONDS, 0.0)
        return (weights if "weights" in tags else 0.0) + (
            total - weights if "kv_cache" in tags else 0.0
        )

    def _abort_all(self) -> None:
        """A sleep in ``abort`` mode: every request ends now, answered with what it has."""
        ended = [*self.waiting, *self.prefilling, *self.decoding]
        self.waiting.clear()
        self.prefilling, self.decoding = [], []
        self._kv_used = self._context = 0
        for request in ended:
            request.finish_reason = "abort"
            if request.tokens is not None:
                request.tokens.put_nowait(None)
            if not request.done.done():
                request.done.set_result(None)
        self._m_abort.inc(len(ended))
        self._update_gauges()

    def abort(self, request: SimRequest) -> None:
        """The client went away: drop the request."""
        # Not ``done.done()``: cancelling a handler that awaits ``done`` cancels it too.
        if request.aborted:
            return
        request.aborted = True
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.prefilling:
            self.prefilling.remove(request)
            self._kv_used -= request.prompt_tokens + request.max_tokens
        elif request in self.decoding:
            self.decoding.remove(request)
            self._kv_used -= request.prompt_tokens + request.max_tokens
            self._context -= request.prompt_tokens + request.generated
        else:
            return
        self._m_abort.inc()
        self._update_gauges()

    async def run(self) -> None:
        """Step forever; sleep while idle or ahead of the wall clock."""
        while True:
            if not self._has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self.clock
            if not self.prefilling and not self.decoding and self.waiting[0].arrived > start:
                # Idle until it arrived: the clock restarts at its arrival (the wall clock
                # at submit), not at the wake-up a little later, which is scheduling noise.
                start = self.waiting[0].arrived
            duration = self._schedule(start) / self.speedup
            if duration <= 0:  # nothing admissible (cannot happen with fits() checked)
                self.clock = start
                self._wake.clear()
                await self._wake.wait()
                continue
            end = start + duration
            slept = False
            while (ahead := end - time.monotonic()) > 0:
                await asyncio.sleep(max(ahead, MIN_SLEEP))
                slept = True
            self.clock = end
            self._emit(end, duration)
            self._update_gauges()
            if not slept:
                await asyncio.sleep(0)  # a late engine still lets the HTTP handlers run

    def _has_work(self) -> bool:
        """Whether a step would do anything: a paused scheduler admits none of the queue."""
        if self.paused == "keep":
            return False
        return bool(self.prefilling or self.decoding or (self.waiting and self.paused is None))

    def _schedule(self, start: float) -> float:
        """Admit what arrived by ``start`` and fits; plan prefill chunks. Model seconds."""
        p = self.profile
        while self.waiting and self.paused is None and self.running < p.max_num_seqs:
            candidate = self.waiting[0]
            if candidate.arrived > start:
                break  # it arrived after this step (ideally) began: the engine runs late
            need = candidate.prompt_tokens + candidate.max_tokens
            if self._kv_used + need > p.kv_capacity_tokens:
                break
            self.waiting.popleft()
            candidate.admitted = start
            self.metrics.queue.observe(start - candidate.arrived)
            self._kv_used += need
            self.prefilling.append(candidate)
        budget = max(p.max_num_batched_tokens - len(self.decoding), 0)
        chunk = 0
        for request in self.prefilling:
            take = min(request.prompt_tokens - request.prefilled, budget - chunk)
            if take <= 0:
                break
            request.prefilled += take
            chunk += take
        return p.mixed_step_seconds(len(self.decoding), self._context, chunk)

    def _emit(self, end: float, duration: float) -> None:
        """The step ended at ``end``: hand its tokens out.

        A token to every decoding request, the first token to each request whose prompt
        is now prefilled; finished requests leave.
        """
        finished = False
        if self.decoding:
            # Each had its last token when this step began: one ITL of ``duration`` each.
            self.metrics.itl.observe(duration, len(self.decoding))
            self._context += len(self.decoding)
            for request in self.decoding:
                request.last_token = end
                if request.tokens is not None:
                    request.tokens.put_nowait(token_text(request.generated))
                request.generated += 1
                finished = finished or request.generated >= request.max_tokens
        if self.prefilling and self.prefilling[0].prefilled >= self.prefilling[0].prompt_tokens:
            still = []
            for request in self.prefilling:
                if request.prefilled < request.prompt_tokens:
                    still.append(request)
                    continue
                # The first token comes with the last chunk.
                request.last_token = end
                self.metrics.ttft.observe(end - request.arrived)
                if request.tokens is not None:
                    request.tokens.put_nowait(token_text(0))
                request.generated = 1
                self._context += request.prompt_tokens + 1
                self.decoding.append(request)
                finished = finished or request.max_tokens <= 1
            self.prefilling = still
        if finished:
            self._finish(end)

    def _finish(self, end: float) -> None:
        prompt = generation = requests = 0
        still = []
        for request in self.decoding:
            if request.generated < request.max_tokens:
                still.append(request)
                continue
            self._kv_used -= request.prompt_tokens + request.max_tokens
            self._context -= request.prompt_tokens + request.generated
            prompt += request.prompt_tokens
            generation += request.generated
            requests += 1
            self.metrics.e2e.observe(end - request.arrived)
            self.metrics.prompt_length.observe(request.prompt_tokens)
            self.metrics.output_length.observe(request.generated)
            if request.tokens is not None:
                request.tokens.put_nowait(None)
            if not request.done.done():
                request.done.set_result(None)
        self.decoding = still
        self._m_prompt.inc(prompt)
        self._m_generation.inc(generation)
        self._m_length.inc(requests)

    def _update_gauges(self) -> None:
        if self.running:
            self._drained.clear()
        else:
            self._drained.set()
        self._m_running.set(self.running)
        self._m_waiting.set(len(self.waiting))
        self._m_kv.set(self._kv_used / self.profile.kv_capacity_tokens)
