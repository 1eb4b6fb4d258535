"""A fleet of simulated vLLM replicas, advanced in small time steps, all at once.

Each tick of ``dt`` seconds every replica runs ``dt / step`` engine steps of continuous
batching with chunked prefill (``foundation.replica_model``): its decoding sequences gain
one token per step, and a chunk of waiting prompt tokens (first come, first served, up
to ``max_num_batched_tokens`` per step with the decodes) is prefilled. Within a tick,
completion times are interpolated linearly, so TTFT and latency are finer than ``dt``.

Admission reserves KV cache for a request's whole prompt plus output (vLLM allocates
blocks as it goes and preempts when full; reserving up front trades preemption, which
is not modelled, for an earlier queue). The engines' ``waiting`` and ``running`` gauges
follow vLLM v1's scheduler (``Fleet.scheduler_queues``): a request waits until a step
gives it prefill tokens, not only until it has a seat. Everything is vectorised over
requests and replicas with numpy: the replay's hot loop. A fleet holding at most ``FEW``
requests ticks in plain Python instead, with the same results bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from foundation.replica_model import Profile

# Request states.
WAITING, QUEUED, PREFILL, DECODE, DONE, DROPPED = range(6)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

FEW = 32
"""With at most this many requests in the fleet a tick runs in plain Python
(``Fleet._advance_few``), computing exactly what the vectorised tick computes, the same
float operations in the same order. A day at 1% of a production service holds about five
requests at a time; there numpy's cost per call (about 150 calls a tick) was the tick."""


@dataclass(slots=True)
class Requests:
    """Every request of the run, by index; times are simulation seconds (NaN: not yet)."""

    arrival: Floats
    prompt: Ints
    output: Ints
    state: Ints = field(init=False)
    replica: Ints = field(init=False)
    admitted: Floats = field(init=False)
    prefilled: Floats = field(init=False)
    generated: Floats = field(init=False)
    first_token: Floats = field(init=False)
    finished: Floats = field(init=False)
    routed: Floats = field(init=False)
    """When the gateway handed the request to a replica (the engine's own clock starts)."""
    decode_time: Floats = field(init=False)
    """Seconds spent in decode steps after the first token: mean ITL = this / (tokens - 1)."""

    def __post_init__(self) -> None:
        n = len(self.arrival)
        self.state = np.full(n, WAITING, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.admitted = np.full(n, np.nan)
        self.prefilled = np.zeros(n)
        self.generated = np.zeros(n)
        self.first_token = np.full(n, np.nan)
        self.finished = np.full(n, np.nan)
        self.decode_time = np.zeros(n)
        self.routed = np.full(n, np.nan)


@dataclass(slots=True)
class TickResult:
    """What one tick did: requests that got their first token or finished, busy replicas."""

    first_tokens: Ints
    finished: Ints
    busy: Floats
    """Seconds of the tick each replica slot spent stepping."""
    generated: Floats
    """Tokens each replica slot generated this tick, first tokens included (vLLM counts
    ``vllm:generation_tokens`` per step, not when a request finishes)."""


class Fleet:
    """Replica slots 0..capacity-1; the caller decides which slots hold a ready replica."""

    def __init__(self, profile: Profile, requests: Requests, capacity: int) -> None:
        self.profile = profile
        self.requests = requests
        self.capacity = capacity
        self.kv_capacity = float(profile.kv_capacity_tokens)
        self._active: Ints = np.empty(0, dtype=np.int64)
        self._routed: list[int] = []
        """Requests assigned since ``active`` was last read: one concatenation a tick, not
        an ``np.append`` (a copy of every active request) per arrival."""
        self.queued: dict[int, None] = {}
        """Requests routed and not yet admitted, in routing order: with none, admission
        has nothing to do (most ticks of a day's replay), and a few are found without a
        pass over every active request."""
        self.total_outstanding = 0
        """``outstanding``'s sum, the gateway's in-flight count read every tick."""
        self.kv_reserved = np.zeros(capacity)
        self.outstanding = np.zeros(capacity, dtype=np.int64)
        self.running = np.zeros(capacity, dtype=np.int64)
        self.last_step = np.zeros(capacity)

    @property
    def active(self) -> Ints:
        """Requests queued at, prefilling on or decoding on a replica, in routing order."""
        if self._routed:
            self._active = np.concatenate((self._active, self._routed))
            self._routed.clear()
        return self._active

    def assign(self, index: int, replica: int, now: float) -> None:
        """Queue request ``index`` on ``replica`` (the gateway routed it there)."""
        r = self.requests
        r.state[index] = QUEUED
        r.replica[index] = replica
        r.routed[index] = now
        self._routed.append(index)
        self.queued[index] = None
        self.outstanding[replica] += 1
        self.total_outstanding += 1

    def advance(self, now: float, dt: float) -> TickResult:
        """Run every replica for ``dt`` seconds from ``now``."""
        r, p = self.requests, self.profile
        self._admit(now)
        active = self.active
        if len(active) == 0:
            empty = np.empty(0, dtype=np.int64)
            self.last_step[:] = 0.0
            return TickResult(empty, empty, np.zeros(self.capacity), np.zeros(self.capacity))
        if len(active) <= FEW:
            return self._advance_few(active, now, dt)
        state = r.state[active]
        replica = r.replica[active]
        decoding = state == DECODE
        prefilling = state == PREFILL
        prompt = r.prompt[active]
        rd = replica[decoding]
        batch = np.bincount(rd, minlength=self.capacity).astype(np.float64)
        # Weighted bincount is float64 already; numpy's stubs do not say so.
        batch_context = cast(
            Floats,
            np.bincount(
                rd,
                weights=prompt[decoding] + r.generated[active[decoding]],
                minlength=self.capacity,
            ),
        )
        remaining_prefill = np.where(prefilling, prompt - r.prefilled[active], 0.0)
        pending = np.bincount(replica, weights=remaining_prefill, minlength=self.capacity)

        # Two phases per tick: steps carrying a prefill chunk until the pending prompt
        # tokens are done, then pure decode steps for the rest of the tick.
        chunk = np.minimum(pending, np.maximum(p.max_num_batched_tokens - batch, 0.0))
        # Profile.mixed_step_seconds, for every replica at once.
        decoding_replicas = batch > 0
        has_chunk = chunk > 0
        pure = np.where(decoding_replicas, p.decode_step_seconds(batch, batch_context), 0.0)
        mixed = np.where(
            decoding_replicas,
            pure + p.prefill_marginal_seconds(chunk),
            np.where(has_chunk, p.prefill_seconds(chunk), 0.0),
        )
        # np.divide(..., where=) leaves 0 where the divisor is not used: one call where a
        # guarded divide and a select were two (the tick's cost is its numpy calls).
        prefill_steps = np.divide(pending, chunk, out=np.zeros(self.capacity), where=has_chunk)
        phase1 = np.minimum(dt, prefill_steps * mixed)
        steps1 = np.divide(
            phase1, mixed, out=np.zeros(self.capacity), where=has_chunk & (mixed > 0)
        )
        phase2 = np.where(decoding_replicas, dt - phase1, 0.0)
        steps2 = np.divide(phase2, pure, out=np.zeros(self.capacity), where=pure > 0)
        decode_steps = np.where(decoding_replicas, steps1 + steps2, 0.0)
        busy = phase1 + phase2
        stepping = decode_steps > 0
        self.last_step = np.divide(dt, decode_steps, out=mixed.copy(), where=stepping)

        # Prefill: first come (admitted first), first served, per replica.
        first_tokens = self._prefill(
            active[prefilling], remaining_prefill[prefilling], steps1 * chunk, chunk, mixed, now
        )

        # Decode: every decoding sequence gains its replica's decode steps this tick.
        finished, gained = self._decode(
            active[decoding], decode_steps[rd], self.last_step[rd], now, dt
        )
        generated = np.bincount(rd, weights=gained, minlength=self.capacity) + np.bincount(
            r.replica[first_tokens], minlength=self.capacity
        )

        if len(finished):
            self._active = active[r.state[active] != DONE]
        return TickResult(first_tokens, finished, busy, generated.astype(np.float64))

    def _admit(self, now: float) -> None:
        """Move queued requests into the batch while seats and KV cache allow."""
        if self.queued:  # none: nothing to look at
            self._admit_queued(now)

    def _admit_queued(self, now: float) -> None:
        r, p = self.requests, self.profile
        active = self.active
        if len(active) <= FEW:
            self._admit_few(now)
            return
        queued = active[r.state[active] == QUEUED]
        if len(queued) == 0:
            return
        order = queued[np.lexsort((r.arrival[queued], r.replica[queued]))]
        replica = r.replica[order]
        need = (r.prompt[order] + r.output[order]).astype(np.float64)
        seg = _segment_starts(replica)
        cum_need = np.cumsum(need)
        cum_need -= np.concatenate(((0.0,), cum_need))[seg]
        rank = np.arange(len(order)) - seg
        free_kv = self.kv_capacity - self.kv_reserved[replica]
        seats = p.max_num_seqs - self.running[replica]
        admit = (cum_need <= free_kv) & (rank < seats)
        # FCFS: nothing behind a request that does not fit (no overtaking in the queue).
        if (~admit).any():
            blockers = np.cumsum(~admit)
            blockers -= np.concatenate(((0,), blockers))[seg]
            admit &= blockers == 0
        chosen = order[admit]
        if len(chosen) == 0:
            return
        r.state[chosen] = PREFILL
        r.admitted[chosen] = now
        for i in chosen.tolist():
            del self.queued[i]
        np.add.at(self.kv_reserved, r.replica[chosen], need[admit])
        np.add.at(self.running, r.replica[chosen], 1)

    def _admit_few(self, now: float) -> None:
        """``_admit`` over a few requests: the same arithmetic, element by element."""
        r, p = self.requests, self.profile
        queued = list(self.queued)  # in routing order, as ``active`` holds them
        replica = {i: int(r.replica[i]) for i in queued}
        queued.sort(key=lambda i: (replica[i], float(r.arrival[i])))
        kv, running = self.kv_reserved.tolist(), self.running.tolist()
        chosen: list[tuple[int, float]] = []
        total = base = 0.0
        segment, start, blocked = -1, 0, False
        for position, i in enumerate(queued):
            rep = replica[i]
            if rep != segment:
                segment, start, base, blocked = rep, position, total, False
            need = float(int(r.prompt[i]) + int(r.output[i]))
            total += need
            # The vectorised admission's running total less its value before the
            # replica's run: the same two roundings.
            fits = total - base <= self.kv_capacity - kv[rep]
            seated = position - start < p.max_num_seqs - running[rep]
            blocked = blocked or not (fits and seated)
            if not blocked:
                chosen.append((i, need))
        for i, need in chosen:
            rep = replica[i]
            r.state[i] = PREFILL
            r.admitted[i] = now
            self.kv_reserved[rep] += need
            self.running[rep] += 1
            del self.queued[i]

    def _advance_few(self, active: Ints, now: float, dt: float) -> TickResult:
        """``advance`` over a few requests: the same arithmetic, element by element."""
        r, p = self.requests, self.profile
        ids = active.tolist()
        state = r.state[active].tolist()
        replica = r.replica[active].tolist()
        prompt = r.prompt[active].tolist()
        generated = r.generated[active].tolist()
        prefilled = r.prefilled[active].tolist()
        batch: dict[int, float] = {}
        context: dict[int, float] = {}
        pending: dict[int, float] = {}
        for k, rep in enumerate(replica):
            pending.setdefault(rep, 0.0)
            if state[k] == DECODE:
                batch[rep] = batch.get(rep, 0.0) + 1.0
                context[rep] = context.get(rep, 0.0) + (prompt[k] + generated[k])
            elif state[k] == PREFILL:
                pending[rep] += prompt[k] - prefilled[k]

        # Per replica as ``advance`` has it: chunk, step lengths, the two phases.
        budget = float(p.max_num_batched_tokens)
        busy, last_step = np.zeros(self.capacity), np.zeros(self.capacity)
        steps: dict[int, float] = {}
        step_of: dict[int, float] = {}  # ``last_step`` as Python floats: the same values
        spent: dict[int, float] = {}  # prompt tokens the mixed steps carry
        chunks: dict[int, float] = {}
        mixed_steps: dict[int, float] = {}
        for rep, waiting in pending.items():
            b, decoding = batch.get(rep, 0.0), rep in batch
            chunk = min(waiting, max(budget - b, 0.0))
            has_chunk = chunk > 0
            pure = p.decode_step_seconds(b, context[rep]) if decoding else 0.0
            if decoding:
                mixed = pure + p.prefill_marginal_seconds(chunk)
            else:
                mixed = p.prefill_seconds(chunk) if has_chunk else 0.0
            prefill_steps = waiting / chunk if has_chunk else 0.0
            phase1 = min(dt, prefill_steps * mixed)
            steps1 = phase1 / mixed if has_chunk and mixed > 0 else 0.0
            phase2 = dt - phase1 if decoding else 0.0
            steps2 = phase2 / pure if pure > 0 else 0.0
            decode_steps = steps1 + steps2 if decoding else 0.0
            busy[rep] = phase1 + phase2
            last_step[rep] = step_of[rep] = dt / decode_steps if decode_steps > 0 else mixed
            steps[rep], spent[rep] = decode_steps, steps1 * chunk
            chunks[rep], mixed_steps[rep] = chunk, mixed
        self.last_step = last_step

        first_tokens = self._prefill_few(
            ids, state, replica, prompt, prefilled, spent, chunks, mixed_steps, now
        )
        finished: list[int] = []
        gained: dict[int, float] = {}
        outputs = r.output[active].tolist()
        for k, i in enumerate(ids):
            if state[k] != DECODE:
                continue
            rep = replica[k]
            before, output, granted = generated[k], outputs[k], steps[rep]
            left = output - before
            gain = min(granted, left)
            after = before + gain
            r.generated[i] = after
            r.decode_time[i] += gain * step_of[rep]
            gained[rep] = gained.get(rep, 0.0) + (after - before)
            if after >= output - 1e-9:
                fraction = left / granted if granted > 0 else 0.0
                r.finished[i] = now + dt * min(max(fraction, 0.0), 1.0)
                r.state[i] = DONE
                finished.append(i)
                self.kv_reserved[rep] += -float(prompt[k] + output)
                self.running[rep] -= 1
                self.outstanding[rep] -= 1
                self.total_outstanding -= 1
        generated_now = np.zeros(self.capacity)
        for rep, tokens in gained.items():
            generated_now[rep] = tokens
        firsts: dict[int, int] = {}
        for i in first_tokens:
            rep = int(r.replica[i])
            firsts[rep] = firsts.get(rep, 0) + 1
        for rep, count in firsts.items():
            generated_now[rep] += count
        if finished:
            done = set(finished)
            self._active = np.array([i for i in ids if i not in done], dtype=np.int64)
        return TickResult(
            np.array(first_tokens, dtype=np.int64),
            np.array(finished, dtype=np.int64),
            busy,
            generated_now,
        )

    def _prefill_few(
        self,
        ids: list[int],
        state: list[int],
        replica: list[int],
        prompt: list[int],
        prefilled: list[float],
        budget: dict[int, float],
        chunk: dict[int, float],
        step: dict[int, float],
        now: float,
    ) -> list[int]:
        """``_prefill`` over a few requests: the same arithmetic, element by element."""
        r = self.requests
        waiting = [k for k, s in enumerate(state) if s == PREFILL]
        if not waiting:
            return []
        arrival = {k: float(r.arrival[ids[k]]) for k in waiting}
        admitted = {k: float(r.admitted[ids[k]]) for k in waiting}
        waiting.sort(key=lambda k: (replica[k], arrival[k], admitted[k]))
        done: list[int] = []
        total = base = 0.0
        segment = -1
        for k in waiting:
            rep, i = replica[k], ids[k]
            if rep != segment:
                segment, base = rep, total
            remaining = prompt[k] - prefilled[k]
            total += remaining
            cum = total - base
            got = budget[rep]
            before = cum - remaining
            if cum <= got + 1e-6:
                r.prefilled[i] = prompt[k]
                per_step = max(chunk[rep], 1e-9)
                r.first_token[i] = max(now + cum / per_step * step[rep], arrival[k])
                r.state[i] = DECODE
                r.generated[i] = 1.0
                done.append(i)
            elif before < got:
                r.prefilled[i] = prefilled[k] + (got - before)
        return done

    def _prefill(
        self,
        indices: Ints,
        remaining: Floats,
        budget: Floats,
        chunk: Floats,
        step: Floats,
        now: float,
    ) -> Ints:
        """Spend each replica's prompt-token ``budget`` first come, first served.

        A request whose prompt completes after ``k`` tokens of its replica's budget gets
        its first token ``k / chunk`` steps into the tick.
        """
        r = self.requests
        if len(indices) == 0:
            return np.empty(0, dtype=np.int64)
        order = np.lexsort((r.admitted[indices], r.arrival[indices], r.replica[indices]))
        idx = indices[order]
        rem = remaining[order]
        replica = r.replica[idx]
        seg = _segment_starts(replica)
        cum = np.cumsum(rem)
        cum -= np.concatenate(((0.0,), cum))[seg]
        got = budget[replica]
        complete = cum <= got + 1e-6
        before = cum - rem
        partial = (~complete) & (before < got)
        r.prefilled[idx[complete]] = r.prompt[idx[complete]]
        r.prefilled[idx[partial]] += got[partial] - before[partial]
        done = idx[complete]
        if len(done):
            per_step = np.maximum(chunk[replica[complete]], 1e-9)
            at = now + cum[complete] / per_step * step[replica[complete]]
            r.first_token[done] = np.maximum(at, r.arrival[done])
            r.state[done] = DECODE
            r.generated[done] = 1.0
        return done

    def _decode(
        self, indices: Ints, steps: Floats, step: Floats, now: float, dt: float
    ) -> tuple[Ints, Floats]:
        """Each of ``indices`` gains ``steps`` tokens; returns those done and what each got.

        What each got is its count after less before (not the steps granted), as a
        per-step counter reads it.
        """
        r = self.requests
        if len(indices) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        before = r.generated[indices]
        output = r.output[indices]
        left = output - before
        gained = np.minimum(steps, left)
        after = before + gained
        r.generated[indices] = after
        r.decode_time[indices] += gained * step
        finishing = after >= output - 1e-9
        done = indices[finishing]
        if len(done):
            granted = steps[finishing]
            fraction = np.divide(
                left[finishing], granted, out=np.zeros(len(done)), where=granted > 0
            )
            # np.clip's dispatch costs more than the two ufuncs it is.
            np.minimum(np.maximum(fraction, 0.0, out=fraction), 1.0, out=fraction)
            r.finished[done] = now + dt * fraction
            r.state[done] = DONE
            need = (r.prompt[done] + output[finishing]).astype(np.float64)
            replica = r.replica[done]
            np.add.at(self.kv_reserved, replica, -need)
            np.add.at(self.running, replica, -1)
            np.add.at(self.outstanding, replica, -1)
            self.total_outstanding -= len(done)
        return done, after - before

    def queue_depth(self) -> npt.NDArray[np.int64]:
        """Requests queued (not yet admitted) per replica slot."""
        r = self.requests
        active = self.active
        queued = active[r.state[active] == QUEUED]
        return np.bincount(r.replica[queued], minlength=self.capacity)

    def scheduler_queues(self) -> tuple[Ints, Ints]:
        """``(waiting, running)`` per replica slot, as vLLM v1's scheduler counts them.

        vLLM v1 keeps a request in ``waiting`` until a step gives it token budget (its
        first prefill chunk, within ``max_num_batched_tokens`` after the running
        requests, and a free seat); from then on it is ``running``, chunked prefill
        or decode (``vllm/v1/core/sched/scheduler.py``, ``schedule``). Here: queued
        requests (no seat or KV yet) and admitted ones whose prompt got no prefill
        tokens in the last tick wait; the rest run. ``vllm:num_requests_waiting`` and
        ``vllm:num_requests_running`` are these two gauges.
        """
        r = self.requests
        active = self.active
        state = r.state[active]
        waiting = (state == QUEUED) | ((state == PREFILL) & (r.prefilled[active] <= 0))
        replica = r.replica[active]
        queued = np.bincount(replica[waiting], minlength=self.capacity).astype(np.int64)
        running = np.bincount(replica[~waiting], minlength=self.capacity).astype(np.int64)
        return queued, running

    def kv_usage(self) -> Floats:
        """KV cache reserved per replica slot, 0..1."""
        return self.kv_reserved / self.kv_capacity


def _segment_starts(keys: Ints) -> Ints:
    """For sorted ``keys``, the index where each element's run of equal keys starts.

    ``[3, 3, 5, 7, 7, 7]`` gives ``[0, 0, 2, 3, 3, 3]``: a running total minus its value
    at the run's start is a total per key (per replica, in the fleet).
    """
    if len(keys) == 0 or keys[0] == keys[-1]:
        return np.zeros(len(keys), dtype=np.int64)  # one run (one replica): the usual case
    new = np.empty(len(keys), dtype=bool)
    new[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    return np.maximum.accumulate(np.where(new, np.arange(len(keys)), 0))
