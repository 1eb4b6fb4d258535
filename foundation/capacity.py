"""What one replica sustains within its SLOs, from its profile and the request mix.

``replica_capacity`` answers: up to what Poisson arrival rate of requests of this mean
size does one replica keep TTFT p95, and the p95 of each request's mean inter-token
latency, within their SLOs? It models the engine as the replay's fleet
(``replay/fleet.py``) runs it: continuous batching with chunked prefill, every step
carrying the decoding sequences plus up to ``max_num_batched_tokens`` of waiting prompt
tokens and reading the weights once (``Profile.mixed_step_seconds``). The replay's
physics is the evidence: ``tests/test_capacity.py`` bisects the rate at which simulated
replicas start to breach, and this is within 10% of it on every row of its table.
The p95s are the default ``tail`` (0.05: the share of requests each limit may leave
over its target); another tail sizes a replica for another quantile with the same
formulas (the Poisson count's, the queues' exponential tails, the pick-up's).

**The engine at rate λ** (prompt P, output O; a decoding sequence holds P + O/2 tokens
on average). Per second the replica spends ``u_p = λ·P·g(c)`` prefilling (``g(c) =
p1 + p2·c``: a prompt token's marginal cost in a chunk of c) and ``u_d = λ·(O-1)·k``
decoding (``k = b + c_kv·(P + O/2)``: one sequence's share of a step); every step also
reads the weights (``a``). Steps run back to back, so a decoding request sees the
mean step ``τ = (a + k·s) / (1 - u_p - u_d)`` and, by Little's law, the decode batch is
``B = λ·(O-1)·τ``. ``s`` is what the batch a request shares its steps with exceeds the
mean by, its peakedness (variance over mean): 1 for a Poisson batch, plus
``(u_p/(1-u_p))²`` for the prefill busy periods that stretch every decode together (the
variance of the time to decode, over its mean), over ``1 - u_d/(1-u_p)`` because the
batch feeds back on itself (a bigger batch steps slower and holds its sequences longer,
so it relaxes that much slower and its variance grows by the inverse). The replay's
batches have it: llama3-8b-h200 at 12k-token prompts, 1.7 req/s, measures 10, this
says 11.

A chunk holds the prompts admitted together: vLLM schedules every step, one prompt to a
chunk (c = P); the fleet admits once per tick T (``admission_interval_seconds``), so
``P·(1 + λ·T)`` tokens on average (the size-biased count of Poisson arrivals in T); at
most the budget left beside the decodes, ``max_num_batched_tokens - B``.

**Limits**; the first to break just above the capacity is the ``reason``:

- *ITL* (``_busy_window_step``): a request's mean ITL is the mean step over its own
  decode, a window ``L = (O-1)·(a + k·B_w) + w·N``: its steps plus the prefill (w each)
  of the N prompts that run meanwhile; each step still decodes a token, so at most every
  gap is a mixed step. At the p95 of N ~ Poisson(λ·(L + one prefill)) the window is
  busy; ITL p95 = L / (O-1). Worked number, qwen2.5-32b-h200 at 1k/200 tokens and
  5.84 req/s: τ = 77 ms (a 15.3 s decode); the busy window is 19.8 s, which sees
  116 prompts on average and 134 at the p95, whose prefill stretches it to that length:
  19.8 s / 199 gaps = 100 ms. Short outputs average few steps, so a single prompt in
  their window breaks the SLO: with long prompts and tight ITL, *more* output tokens
  can raise the sustainable rate (the replay agrees; ``tests/test_capacity.py``).
- *TTFT*: the pick-up (the rest of a step: p95 0.95·τ; the fleet rounds arrivals to
  the nearest tick: 0.45·T) + its own prefill + the wait behind other prompts + the wait
  for a seat. Behind other prompts: an M/D/1 queue served by the prefill, which runs a
  backlog as full chunks (one request's service ``S = P·(d_B + f(M - B))/(M - B)``),
  with Kingman's heavy-traffic tail ``P(W > t) ≈ ρ·exp(-t/θ)``, ``θ = S/(2(1-ρ))`` (a
  little above the exact M/D/1 p95 at moderate ρ, which the fleet's variable steps make
  up). Worked number, llama3-8b-h200 at 12k/300 tokens and 1.78 req/s: mixed steps of
  254 ms carry 8,162 prompt tokens, S = 0.37 s, ρ = 0.67, θ = 0.56 s, so the wait p95
  is θ·ln(0.67/0.05) = 1.44 s; with its own 0.37 s and a 0.05 s pick-up, TTFT p95 is
  1.87 s (the ITL p95 reaches 100 ms first). A seat: an M/D/c queue (c =
  ``max_num_seqs``, or what the KV cache holds when each request reserves P + O tokens;
  Erlang C, the M/D/c wait half the M/M/c one), and the mean number running must fit
  the seats.
- *Stability*: ``u_p + u_d < 1``.

Pure: plain numbers in, frozen dataclasses out. ``Capacity.scaler_rates`` turns a
capacity into the scaler's units (prompt and output tokens per second per replica).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from foundation.replica_model import Profile

P95_TAIL = 0.05
"""The share of requests a p95 target leaves outside: the default ``tail``."""


@dataclass(frozen=True, slots=True)
class ScalerRates:
    """Per-replica capacity in the scaler's units (``scaler.core.model.Policy`` names).

    ``prompt_rate / prefill_tokens_per_second + output_rate / decode_tokens_per_second``
    is 1 exactly when a replica carries this mix at its SLO capacity.
    """

    prefill_tokens_per_second: float
    decode_tokens_per_second: float


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica sustains within its SLOs, for one request mix."""

    requests_per_second: float
    prompt_tokens_per_second: float
    output_tokens_per_second: float
    decode_batch: float
    """Mean decode batch at that rate (Little's law)."""
    chunk_tokens: int
    """The chunked-prefill budget per step (``max_num_batched_tokens``)."""
    step_seconds: float
    """Mean engine step at that rate: the mean inter-token latency."""
    longest_step_seconds: float
    """A step carrying the decode batch and a full chunk: the per-token ITL spike."""
    prefill_share: float
    """Prefill's share of the replica's work at that rate (``u_p / (u_p + u_d)``)."""
    ttft_p95_seconds: float
    itl_p95_seconds: float
    """Predicted p95s at that rate (the binding one is at its SLO)."""
    reason: str
    """Which limit binds, in words, with its numbers."""

    def scaler_rates(self) -> ScalerRates:
        """The capacity as the scaler's prefill and decode rates.

        The work splits into prefill (``prefill_share``) and decode (the rest), so a
        prompt token costs ``prefill_share / prompt_tokens_per_second`` of a replica and
        an output token ``(1 - prefill_share) / output_tokens_per_second``; the inverses
        are the rates: each is the raw rate times the utilisation at which the SLO binds.
        These rates already stop at the SLO: planning on them at a ``target_utilization``
        below 1 keeps that share as burst headroom on top. Zero capacity gives zero rates.
        """
        if self.requests_per_second <= 0:
            return ScalerRates(0.0, 0.0)
        share = min(max(self.prefill_share, 1e-9), 1 - 1e-9)
        return ScalerRates(
            prefill_tokens_per_second=self.prompt_tokens_per_second / share,
            decode_tokens_per_second=self.output_tokens_per_second / (1 - share),
        )


@dataclass(frozen=True, slots=True)
class _State:
    """The engine's steady state at one arrival rate."""

    rate: float
    step: float
    batch: float
    chunk: float
    prefill_share: float
    load: float
    running: float
    seats: int
    ttft_p95: float
    itl_p95: float
    seat_wait_p95: float
    prefill_wait_p95: float


@dataclass(frozen=True, slots=True)
class _Mix:
    profile: Profile
    prompt: float
    output: float
    admission_interval: float
    tail: float = P95_TAIL
    """The share of requests each limit may leave over its target (0.05: the p95s)."""

    @property
    def context(self) -> float:
        return self.prompt + self.output / 2

    @property
    def gaps(self) -> float:
        """Decode steps per request: the first token comes with the prefill."""
        return max(self.output - 1.0, 0.0)

    @property
    def seats(self) -> int:
        p = self.profile
        by_kv = int(p.kv_capacity_tokens // max(1.0, self.prompt + self.output))
        return min(p.max_num_seqs, by_kv)


def _ms(profile: Profile, value: float) -> float:
    """Kernel milliseconds to engine seconds."""
    return profile.overhead * value / 1000.0


def _state(mix: _Mix, rate: float) -> _State | None:
    """Solve the engine's fixed point at ``rate``; None when it cannot keep up."""
    p = mix.profile
    a_ms, b_ms, c_ms = p.decode_ms
    _, p1, p2 = p.prefill_ms
    weights = _ms(p, a_ms)
    per_seq = _ms(p, b_ms + c_ms * mix.context)
    decode_share = rate * mix.gaps * per_seq
    budget = float(p.max_num_batched_tokens)
    # Prompts admitted together share a chunk: P·(1 + λ·T) tokens on average.
    coalesced = mix.prompt * (1.0 + rate * mix.admission_interval)
    step, batch, chunk, prefill_share, seen = weights, 0.0, coalesced, 0.0, 1.0
    for _ in range(200):
        # A longer step means a bigger batch and less room for the chunk: the loop
        # damps itself.
        chunk = min(max(budget - batch, 1.0), coalesced)
        prefill_share = rate * mix.prompt * _ms(p, p1 + p2 * chunk)
        load = prefill_share + decode_share
        if load >= 1.0:
            return None
        # A decoding request shares its steps with the batch it sees: the mean batch
        # plus its peakedness (variance over mean; see the module's docstring).
        free = 1.0 - prefill_share
        echo = decode_share / free
        seen = (1.0 + (prefill_share / free) ** 2) / (1.0 - echo)
        new_step = (weights + seen * per_seq) / (1.0 - load)
        batch = rate * mix.gaps * new_step
        if abs(new_step - step) <= 1e-12 + 1e-9 * step:
            step = new_step
            break
        step = new_step
    load = prefill_share + decode_share
    w_p = mix.prompt * _ms(p, p1 + p2 * chunk)

    decode_step = weights + batch * per_seq
    chunk_cost = _ms(p, p1 * chunk + p2 * chunk * chunk)
    # Its own prefill: the mixed steps that carry its prompt.
    own = max(1.0, mix.prompt / chunk) * (decode_step + chunk_cost)
    itl_p95 = _busy_window_step(
        mix, rate, step, batch + seen, weights, per_seq, w_p, own, chunk_cost
    )

    # TTFT p95: pick-up + own prefill + behind other prompts + for a seat.
    pick_up = max((1.0 - mix.tail) * step, 0.45 * mix.admission_interval)
    # Queued prompts run as full chunks, the budget left beside the decodes.
    full = max(budget - batch, 1.0)
    service = mix.prompt * (decode_step + _ms(p, p1 * full + p2 * full * full)) / full
    prefill_wait = _kingman_md1_quantile(rate, service, mix.tail)
    lifetime = own + mix.gaps * step
    running = rate * lifetime
    seats = mix.seats
    seat_wait = _mdc_wait_quantile(rate, lifetime, seats, mix.tail)
    ttft_p95 = pick_up + own + prefill_wait + seat_wait
    return _State(
        rate=rate,
        step=step,
        batch=batch,
        chunk=chunk,
        prefill_share=prefill_share,
        load=load,
        running=running,
        seats=seats,
        ttft_p95=ttft_p95,
        itl_p95=itl_p95,
        seat_wait_p95=seat_wait,
        prefill_wait_p95=prefill_wait,
    )


def _busy_window_step(
    mix: _Mix,
    rate: float,
    step: float,
    batch: float,
    weights: float,
    per_seq: float,
    prefill: float,
    prefill_time: float,
    chunk_cost: float,
) -> float:
    """Mean step over a busy decode window: the p95 of a request's mean ITL.

    A request's decode lasts ``L = (O-1)·(a + k·B_w) + prefill·N``: its steps plus the
    prefill (``prefill`` of engine time each) of the N prompts that run meanwhile, those
    arriving during it or up to one prefill (``prefill_time``) before it. Every step
    still decodes a token, so the prefill adds at most one chunk (``chunk_cost``) per
    gap. N is Poisson with mean ``λ·(L + prefill_time)``, so the window stretches with
    its own arrivals; at the p95 of N the window is busy, and half the arrivals beyond
    the mean already decode beside it (``B_w = B + ΔN/2``: the batch is the arrivals of
    one window, half of them in this one). Returns ``L / (O-1)``.

    The replay's fleet gives every sequence decoding in a tick the tick's mean step, so
    a decode shorter than a tick T sees the mean step of its tick,
    ``d_w·T / (T - prefill·N)`` with N over T (the two agree at L = T), at most a step
    with a chunk.
    """
    if mix.gaps <= 0:
        return 0.0
    tick = mix.admission_interval
    window = mix.gaps * step
    decode_step, arrivals = weights + per_seq * batch, 0.0
    for attempt in range(200):
        mean = rate * (max(window, tick) + prefill_time)
        arrivals = _poisson_quantile(mean, mix.tail)
        decode_step = weights + per_seq * max(batch + 0.5 * (arrivals - mean), 1.0)
        stall = min(prefill * arrivals, mix.gaps * chunk_cost)
        new_window = mix.gaps * decode_step + stall
        if abs(new_window - window) <= 1e-9 * window:
            break
        # The count is an integer: near a step of it the window can flip between two
        # lengths; after a while keep the longer.
        window = max(window, new_window) if attempt > 100 else new_window
    window = max(window, new_window)
    if window >= tick:
        return window / mix.gaps
    stall = prefill * arrivals
    if stall * (decode_step + chunk_cost) >= tick * chunk_cost:
        return decode_step + chunk_cost  # every step of the tick carries a chunk
    return decode_step * tick / (tick - stall)


def _poisson_quantile(mean: float, tail: float) -> float:
    """The ``1 - tail`` quantile of a Poisson count (an integer; Cornish-Fisher when large)."""
    if mean <= 0:
        return 0.0
    if mean > 500:
        z = NormalDist().inv_cdf(1.0 - tail)
        return math.ceil(mean + z * math.sqrt(mean) + (z * z - 1.0) / 6.0)
    term = math.exp(-mean)
    total, count = term, 0
    while total < 1.0 - tail:
        count += 1
        term *= mean / count
        total += term
    return float(count)


def _kingman_md1_quantile(rate: float, service: float, tail: float) -> float:
    """M/D/1 wait exceeded by ``tail``: ``P(W > t) ≈ ρ·exp(-t/θ)``, ``θ = S / (2(1-ρ))``."""
    rho = rate * service
    if rho >= 1.0:
        return math.inf
    if rho <= tail:
        return 0.0
    theta = service / (2.0 * (1.0 - rho))
    return theta * math.log(rho / tail)


def _mdc_wait_quantile(rate: float, service: float, servers: int, tail: float) -> float:
    """Wait for one of ``servers`` seats, each held ``service`` seconds, exceeded by ``tail``.

    Erlang C gives the chance to wait and the M/M/c wait's exponential tail (rate
    ``c/S - λ``); deterministic service halves the wait (the M/D/c approximation).
    """
    if servers <= 0:
        return math.inf
    offered = rate * service
    if offered >= servers:
        return math.inf
    erlang_b = 1.0
    for k in range(1, servers + 1):
        erlang_b = offered * erlang_b / (k + offered * erlang_b)
    utilisation = offered / servers
    wait_chance = erlang_b / (1.0 - utilisation * (1.0 - erlang_b))
    if wait_chance <= tail:
        return 0.0
    drain = servers / service - rate
    return 0.5 * math.log(wait_chance / tail) / drain


def _fits(state: _State | None, slo_ttft: float, slo_itl: float) -> bool:
    return (
        state is not None
        and state.itl_p95 <= slo_itl
        and state.ttft_p95 <= slo_ttft
        and state.running <= state.seats
    )


def _reason(mix: _Mix, state: _State, above: _State | None, slo_ttft: float, slo_itl: float) -> str:
    """Which limit the next rate up breaks, with the numbers at capacity."""
    at = (
        f"at {state.rate:.3g} req/s: step {state.step * 1000:.1f} ms, decode batch "
        f"{state.batch:.0f}, TTFT p95 {state.ttft_p95:.2f} s, ITL p95 "
        f"{state.itl_p95 * 1000:.0f} ms"
    )
    if above is None:
        return f"engine saturated (prefill and decode fill every step); {at}"
    if above.itl_p95 > slo_itl:
        return f"ITL p95 reaches the {slo_itl * 1000:.0f} ms SLO; {at}"
    if above.running > above.seats or above.seat_wait_p95 >= above.prefill_wait_p95:
        seats = (
            f"max_num_seqs {mix.profile.max_num_seqs}"
            if state.seats == mix.profile.max_num_seqs
            else f"KV cache for {state.seats} requests"
        )
        return f"seats ({seats}) fill: TTFT p95 reaches the {slo_ttft:g} s SLO; {at}"
    return f"prefill queue: TTFT p95 reaches the {slo_ttft:g} s SLO; {at}"


def replica_capacity(
    profile: Profile,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    slo_ttft_seconds: float,
    slo_itl_seconds: float,
    *,
    admission_interval_seconds: float = 0.0,
    tail: float = P95_TAIL,
) -> Capacity:
    """The request rate (and token rates) one replica sustains within its SLOs.

    Args:
        profile: the model on its accelerator (step-time fits, KV cache, batch caps).
        mean_prompt_tokens: mean prompt length of the mix (at least 1).
        mean_output_tokens: mean output length of the mix (at least 1).
        slo_ttft_seconds: the TTFT p95 target.
        slo_itl_seconds: the target for each request's mean inter-token latency, p95.
        admission_interval_seconds: how often the engine admits new requests: 0 for
            vLLM, which schedules every step; the replay's fleet admits once per tick
            (``SimConfig.dt``, 0.2 s), which coalesces more prompts into one chunk.
        tail: the share of requests each limit may leave over its SLO: 0.05 keeps the
            p95s within them; the scaler asks for ``1 - attainment`` (0.01 at 99%), so
            a replica is sized for the quantile its SLO is judged at.

    Returns:
        The highest rate at which every limit holds, found by bisection over the
        engine's steady state (monotone in the rate); zero with the reason when even an
        idle replica misses the SLOs.
    """
    if min(mean_prompt_tokens, mean_output_tokens) < 1:
        raise ValueError(
            f"a request has at least one prompt and one output token, not "
            f"{mean_prompt_tokens} and {mean_output_tokens}"
        )
    if not 0.0 < tail < 0.5:
        raise ValueError(f"the tail is a share of requests in (0, 0.5), not {tail}")
    if min(slo_ttft_seconds, slo_itl_seconds) <= 0 or admission_interval_seconds < 0:
        raise ValueError(
            f"SLOs must be positive and the admission interval not negative: TTFT "
            f"{slo_ttft_seconds}, ITL {slo_itl_seconds}, interval {admission_interval_seconds}"
        )
    mix = _Mix(
        profile,
        float(mean_prompt_tokens),
        float(mean_output_tokens),
        admission_interval_seconds,
        tail,
    )
    chunk_tokens = profile.max_num_batched_tokens
    lowest = 1e-9
    idle = _state(mix, lowest)
    if not _fits(idle, slo_ttft_seconds, slo_itl_seconds):
        return _zero(mix, idle, slo_ttft_seconds, slo_itl_seconds)
    # Upper bound: the rate whose work alone fills the replica at the cheapest chunk.
    _, p1, _ = profile.prefill_ms
    _, b_ms, c_ms = profile.decode_ms
    per_request = mean_prompt_tokens * _ms(profile, p1) + mix.gaps * _ms(
        profile, b_ms + c_ms * mix.context
    )
    low, high = lowest, 1.0 / per_request
    for _ in range(100):
        mid = 0.5 * (low + high)
        if _fits(_state(mix, mid), slo_ttft_seconds, slo_itl_seconds):
            low = mid
        else:
            high = mid
        if high - low <= 1e-6 * high:
            break
    state = _state(mix, low)
    assert state is not None  # low fits
    return Capacity(
        requests_per_second=low,
        prompt_tokens_per_second=low * mean_prompt_tokens,
        output_tokens_per_second=low * mean_output_tokens,
        decode_batch=state.batch,
        chunk_tokens=chunk_tokens,
        step_seconds=state.step,
        longest_step_seconds=profile.mixed_step_seconds(
            state.batch, state.batch * mix.context, max(0.0, chunk_tokens - state.batch)
        ),
        prefill_share=state.prefill_share / state.load if state.load > 0 else 0.0,
        ttft_p95_seconds=state.ttft_p95,
        itl_p95_seconds=state.itl_p95,
        reason=_reason(mix, state, _state(mix, high), slo_ttft_seconds, slo_itl_seconds),
    )


def _zero(mix: _Mix, idle: _State | None, slo_ttft: float, slo_itl: float) -> Capacity:
    """No rate fits: say which SLO an idle replica already misses."""
    if idle is None or idle.seats < 1:
        why = f"one request ({mix.prompt:.0f} + {mix.output:.0f} tokens) does not fit the KV cache"
    elif idle.itl_p95 > slo_itl:
        why = f"an idle decode step takes {idle.itl_p95 * 1000:.0f} ms, over the ITL SLO"
    else:
        why = f"an idle replica's TTFT p95 is {idle.ttft_p95:.2f} s, over the {slo_ttft:g} s SLO"
    return Capacity(
        requests_per_second=0.0,
        prompt_tokens_per_second=0.0,
        output_tokens_per_second=0.0,
        decode_batch=0.0,
        chunk_tokens=mix.profile.max_num_batched_tokens,
        step_seconds=idle.step if idle else math.inf,
        longest_step_seconds=mix.profile.mixed_step_seconds(
            0.0, 0.0, float(mix.profile.max_num_batched_tokens)
        ),
        prefill_share=0.0,
        ttft_p95_seconds=idle.ttft_p95 if idle else math.inf,
        itl_p95_seconds=idle.itl_p95 if idle else math.inf,
        reason=f"no rate fits: {why}",
    )
