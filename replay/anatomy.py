"""Why requests missed the SLO: every miss gets exactly one cause, its first failure.

Pure: the run's ``Requests`` arrays and the targets they were judged against in, one
cause per request out (numpy over all requests at once). A request *meets* the SLO when
it was served, its TTFT (first token - arrival) is within its own target
(``replay.simulate.ttft_target``) and its mean inter-token latency within the ITL SLO;
``met`` is exactly the replay's ``Result.met``. Each miss is then taken, in order (the
first that applies decides), along the request's path through gateway, engine queue,
prefill and decode:

1. ``dropped``: never served (the gateway's buffer was full or it timed out there, or
   prompt plus output exceed a replica's KV cache).
2. ``unreachable``: not even an idle replica could meet it: its own idle prefill
   (``Profile.prefill_seconds(prompt)``) exceeds its TTFT target, or its mean ITL alone
   on a replica (one decode step at batch 1, at its mean context) exceeds the ITL SLO.
   Rare by construction (the TTFT target is at least 1.5x the idle prefill by
   default); it keeps the switch total.
3. ``cold_start``: it was buffered at the gateway (routed more than half a tick after
   it arrived: the gateway buffers only while no replica is ready, the fleet at zero or
   its replicas still starting) and without that wait it would have met its target.
4. ``queued_for_seat``: without the gateway wait and the wait for a seat (KV cache or
   ``max_num_seqs``: admitted - routed) too, it would have met its target.
5. ``queued_behind_prompts``: its TTFT missed even without both waits: its prompt's
   chunks shared the steps with other prompts (admission to first token too long).
6. ``decode_interference``: TTFT met, mean ITL over the SLO (prefill chunks stretching
   the decode steps, or a decode batch too large).

Half a tick: arrivals join the tick up to ``dt / 2`` ahead, so a request routed at
once has ``routed - arrival`` within ``[-dt/2, dt/2)``; a buffered one is routed a tick
or more later. The wait of an unbuffered request is the replay's rounding, no cause.

Worked numbers (llama3-8b-h200, TTFT SLO 2 s, ITL SLO 100 ms, ``dt`` 0.2 s), ten
requests of 1,000-token prompts (target 2 s; idle prefill 0.03 s), five met:

- A arrives at 10.0 with the fleet at zero, is routed at 48.6 when the first replica is
  ready, first token at 48.75: TTFT 38.75 s; without its 38.6 s at the gateway 0.15 s,
  so ``cold_start``, 36.75 s over its target.
- B is routed at once (10.0) but gets a seat at 13.0, first token at 13.2: TTFT 3.2 s,
  0.2 s without the seat wait: ``queued_for_seat``, 1.2 s over.
- C is routed and admitted at once, first token at 12.5 (its chunks behind a burst of
  long prompts): ``queued_behind_prompts``, 0.5 s over.
- D has its first token after 0.3 s, then 200 tokens in 25 s: mean ITL 25 / 199 =
  126 ms: ``decode_interference``.
- E timed out at the gateway: ``dropped``.

Shares of all ten: 0.1 each for those five causes, 0 for ``unreachable``; they add up to
0.5 = 1 - SLO attainment. The median excess is per TTFT cause (36.75, 1.2 and 0.5 s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from foundation.replica_model import Profile
from replay.fleet import DONE, FEW, Requests

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

CAUSES = (
    "dropped",
    "unreachable",
    "cold_start",
    "queued_for_seat",
    "queued_behind_prompts",
    "decode_interference",
)
"""Every cause, in the switch's order; a request's cause is its index here."""
MET = -1
"""The cause of a request that met the SLO."""
TTFT_CAUSES = ("cold_start", "queued_for_seat", "queued_behind_prompts")
"""The causes of a TTFT over target: each has a median excess over it."""


@dataclass(frozen=True, slots=True)
class Targets:
    """What each request was judged against, and what an idle replica would give it."""

    ttft: Floats
    """Per request, its TTFT target in seconds (``replay.simulate.ttft_target``)."""
    itl: float
    """The mean inter-token latency SLO, seconds."""
    idle_prefill: Floats
    """Per request, seconds to prefill its prompt alone (``Profile.prefill_seconds``)."""
    idle_itl: Floats
    """Per request, its mean ITL alone on a replica (``idle_itl``); 0 below 2 tokens."""
    tick: float
    """The replay's ``dt``: routed within half of it after arriving is not buffered."""


@dataclass(frozen=True, slots=True)
class MissAnatomy:
    """How many requests missed for each cause, and by how much for the TTFT causes."""

    requests: int
    counts: Mapping[str, int]
    """Per cause (every one of ``CAUSES``, in order), the requests it decided."""
    excess_p50_seconds: Mapping[str, float]
    """Per TTFT cause (``TTFT_CAUSES``), the median TTFT over target; NaN with none."""

    @property
    def shares(self) -> dict[str, float]:
        """Per cause, its share of all requests (NaN with no requests)."""
        n = self.requests
        return {c: self.counts[c] / n if n else math.nan for c in CAUSES}

    def metrics(self) -> dict[str, float | int]:
        """``miss_<cause>`` shares and ``<cause>_excess_p50_seconds``, for ``Result.metrics``."""
        return {
            **{f"miss_{cause}": share for cause, share in self.shares.items()},
            **{f"{c}_excess_p50_seconds": v for c, v in self.excess_p50_seconds.items()},
        }


def idle_itl(profile: Profile, prompt: Ints, output: Ints) -> Floats:
    """Each request's mean ITL alone on a replica: one batch-1 step at its mean context.

    Decoding token ``k`` (1 to output - 1) steps over ``prompt + k`` tokens of context, so
    the mean step holds ``prompt + output / 2``; a request of fewer than 2 tokens has no
    inter-token gap (0). Example: 1,000 in, 200 out: one step over 1,100 tokens.
    """
    context = prompt.astype(np.float64) + output.astype(np.float64) / 2.0
    step = profile.decode_step_seconds(np.ones_like(context), context)
    return np.where(output > 1, step, 0.0)


def met(requests: Requests, targets: Targets, index: Ints | None = None) -> npt.NDArray[np.bool_]:
    """Whether each request (of ``index``, or every one) met the SLO.

    Met: served, TTFT within its target and mean ITL within the SLO. The replay's gateway
    judges by it as requests end; ``classify`` is its first case.
    """
    at = slice(None) if index is None else index
    with np.errstate(invalid="ignore"):  # a request never served has NaN times: not met
        ttft = requests.first_token[at] - requests.arrival[at]
        itl = requests.decode_time[at] / np.maximum(requests.output[at] - 1, 1)
        ok: npt.NDArray[np.bool_] = (
            (requests.state[at] == DONE) & (ttft <= targets.ttft[at]) & (itl <= targets.itl)
        )
    return ok


def met_count(requests: Requests, targets: Targets, index: Ints) -> int:
    """How many of ``index`` met the SLO: ``met``'s count, element by element for a few.

    The gateway judges each tick's finished requests; a day's replay finishes one or two
    a tick, where ``met``'s dozen numpy calls were most of the judging. The same float64
    operations in the same order, so the same count.
    """
    if len(index) > FEW:
        return int(met(requests, targets, index).sum())
    state, first, arrival = requests.state, requests.first_token, requests.arrival
    decode, output, ttft, itl = requests.decode_time, requests.output, targets.ttft, targets.itl
    count = 0
    for i in index.tolist():
        if state[i] != DONE:
            continue
        waited = float(first[i]) - float(arrival[i])
        if waited <= float(ttft[i]) and float(decode[i]) / max(int(output[i]) - 1, 1) <= itl:
            count += 1
    return count


def classify(requests: Requests, targets: Targets) -> Ints:
    """Per request, its cause's index in ``CAUSES``, or ``MET``; the module doc's switch."""
    served = requests.state == DONE
    # A request never served has NaN times: its comparisons are False, and ``dropped``
    # takes it before any of them is read.
    with np.errstate(invalid="ignore"):
        ttft = requests.first_token - requests.arrival
        ttft_over = ~(ttft <= targets.ttft)
        waited = requests.routed - requests.arrival
        gateway = np.where(waited > targets.tick / 2, waited, 0.0)
        seat = np.maximum(requests.admitted - requests.routed, 0.0)
        unreachable = (targets.idle_prefill > targets.ttft) | (targets.idle_itl > targets.itl)
        cause = np.select(
            [
                met(requests, targets),
                ~served,
                unreachable,
                ttft_over & (ttft - gateway <= targets.ttft),
                ttft_over & (ttft - gateway - seat <= targets.ttft),
                ttft_over,
            ],
            [MET, *range(len(CAUSES) - 1)],
            default=len(CAUSES) - 1,  # decode_interference: served, TTFT met, ITL over
        )
    codes: Ints = np.asarray(cause, dtype=np.int64)
    return codes


def anatomy(requests: Requests, targets: Targets, cause: Ints | None = None) -> MissAnatomy:
    """Counts per cause and the median TTFT excess per TTFT cause.

    ``cause`` is ``classify(requests, targets)`` when the caller has it already.
    """
    if cause is None:
        cause = classify(requests, targets)
    counts = np.bincount(cause[cause != MET], minlength=len(CAUSES))
    excess = requests.first_token - requests.arrival - targets.ttft
    medians = {}
    for name in TTFT_CAUSES:
        over = excess[cause == CAUSES.index(name)]
        medians[name] = float(np.median(over)) if len(over) else math.nan
    return MissAnatomy(
        len(cause),
        {name: int(counts[i]) for i, name in enumerate(CAUSES)},
        medians,
    )
