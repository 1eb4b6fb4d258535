"""Which replica gets a request, and whether a request may wait for one. Pure.

- Route to the ready replica serving the requested model (a LoRA adapter name counts
  as a model a replica serves) with the fewest outstanding requests; ties go to the
  replica listed first, so routing is deterministic.
- With no such replica, a request may wait in the buffer while it holds fewer than
  ``capacity`` requests and its body fits in the buffer's bytes; a full buffer answers
  429, a wait past the timeout 503.
- A request for a model certainly served by nobody is answered 404 at once. With ready
  (or sleeping, or waking) replicas that have listed their models, they decide. With
  none, the known models decide (those configured plus every one a replica has listed
  since the gateway started): a model outside them is 404; with nothing known yet,
  every model may wait.
- A replica's quick failures and refusals of the last ``FAILURE_SECONDS`` weigh as
  requests outstanding: one answering at once is idle again at once, and least-outstanding
  routing would send it nearly everything.
- A replica that failed fast in a row (server errors, broken answers) is ejected: passed
  over while others serve the model, at most half of them.
- A sleeping replica (vLLM sleep mode) is never routed to. When no ready replica serves
  a request's model, one sleeping replica serving it is woken (``choose_wakes``): the
  first listed not backing off a failed wake, and none while another wake for that
  model is under way.
- Under pressure (``WakePressure``: every ready replica holds at least the threshold, the
  larger of a floor and a multiple of the last minute's load per running replica),
  ``sleepers_to_wake`` says how many sleepers to wake at once so that the load per replica
  is back at what the running ones carried: a burst finds capacity in a wake (seconds),
  not behind the scaler's next decision and a cold start. ``choose`` with a threshold
  sends requests to the Deployment's running replicas first and to the woken surplus only
  above it, so the surplus falls idle and sleeps again once the scaler has caught up.
- A replica whose wake or sleep failed backs off (``Backoff``): it is not asked again for
  the base delay, doubled per failure in a row up to ``2 ** BACKOFF_DOUBLINGS`` times it;
  meanwhile another replica is woken or slept where one can be.
- The scaler's standby plan (``running`` replicas and ``sleeping`` ones beside them) is
  held by ``choose_standby``: the surplus idle replicas sleep, least recently used first,
  never one with a request outstanding nor one backing off a failed sleep; a sleeper
  wakes early only when the running target lacks awake replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FAILURE_SECONDS = 10.0
"""How long a replica's quick failure (or refusal of a client's request) weighs in routing
as a request outstanding: about an honest request's time, so that a replica answering at
once is sent about as much as it is given back."""
MAX_FAILURES = 64
"""Quick failures a replica's weight counts at most: a bound on what each keeps."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the router knows of one replica."""

    url: str
    ready: bool
    outstanding: int
    models: frozenset[str]
    """Base model and loaded LoRA adapters (from its /v1/models); empty: not known yet."""
    sleeping: bool = False
    """Healthy, listed, and asleep (its /is_sleeping says so): wakeable, not routable."""
    waking: bool = False
    """A wake of it is under way."""
    wake_overdue: bool = False
    """Its wake has been under way past the gateway's wake patience: it no longer stands
    for a replica on its way (``choose_wakes`` wakes another beside it)."""
    wake_failed: bool = False
    """Its last wake failed recently: wake another."""
    wake_failures: int = 0
    """Its wakes that failed in a row: of the sleepers, those failing least are woken first."""
    falling_asleep: bool = False
    """A sleep of it is under way: not routable, but it serves its models (a request for
    one waits, and wakes it once asleep, rather than being told the model is unserved)."""
    idle_seconds: float = math.inf
    """Since its last request ended, it turned ready or it woke (0 while one is outstanding)."""
    sleep_mode: bool = True
    """False once its /is_sleeping answered 404: it cannot be put to sleep."""
    sleep_failed: bool = False
    """Its last sleep failed recently (it backs off): put another to sleep."""
    surplus: bool = False
    """Woken by the gateway beyond the replicas the scaler runs: routed to above the
    pressure threshold only, so that it falls idle and sleeps again."""
    failures: int = 0
    """Its quick failures and refusals of a client's request of the last
    ``FAILURE_SECONDS``: each weighs in routing as a request outstanding. A replica
    answering 401 to everything kept 91% of the traffic beside a healthy one, and a
    client's requests that fail everywhere all went to the one least loaded, ejecting it."""
    ejected: bool = False
    """It failed fast in a row recently (server errors, broken answers): passed over while
    others serve the model (a sick engine behind a live HTTP server fails fast, so
    least-outstanding routing would send it nearly everything), at most half of them."""

    def serves(self, model: str | None) -> bool:
        """Whether it may serve ``model`` (a replica that has not listed its models may)."""
        return not model or not self.models or model in self.models


def choose(
    replicas: Sequence[ReplicaView], model: str | None, surplus_above: float = math.inf
) -> str | None:
    """The URL to send a request for ``model`` to, or None when no ready replica serves it.

    The ready replica with the fewest outstanding and recent ``failures``; a ``surplus``
    one only when every other holds at least ``surplus_above`` (or none other is ready).
    ``ejected`` ones are passed over, at most half of the ready replicas serving the model
    (first listed first): a client whose requests make replicas answer 500 ejected three
    of four healthy ones with nine requests, and every other request went to the fourth.
    Past half, the failures follow the requests more than the replicas.
    """
    candidates = [r for r in replicas if r.ready and r.serves(model)]
    ejected = [r.url for r in candidates if r.ejected][: len(candidates) // 2]
    if ejected:
        passed_over = set(ejected)
        candidates = [r for r in candidates if r.url not in passed_over]
    best: ReplicaView | None = None
    spare: ReplicaView | None = None
    for replica in candidates:
        if replica.surplus:
            if spare is None or _load(replica) < _load(spare):
                spare = replica
        elif best is None or _load(replica) < _load(best):
            best = replica
    if spare is not None and (
        best is None or (best.outstanding >= surplus_above and _load(spare) < _load(best))
    ):
        best = spare
    return best.url if best is not None else None


def _load(replica: ReplicaView) -> int:
    return replica.outstanding + replica.failures


MAX_WAKE_FLOOR = 10_000
"""The largest ``wake-at-outstanding``: requests outstanding on one replica (vLLM takes
256 at once; a floor past this would never be reached)."""
MAX_WAKE_RATIO = 1000.0
"""The largest multiple of the mean load that counts as pressure."""


@dataclass(frozen=True, slots=True)
class WakePressure:
    """When the gateway wakes sleepers ahead of the scaler: its ``wake-at-outstanding``.

    The baseline is the load: the requests outstanding on every ready replica together,
    averaged over the last ``window_seconds``. The threshold is the larger of ``floor``
    requests outstanding per replica and ``ratio`` times the baseline's share of one
    running replica (the Deployment's, not the woken surplus): a burst is load well above
    what the fleet has been carrying, so a fleet the scaler sized for a steady high load
    does not wake its sleepers for ordinary fluctuation, and a scale-down, the same load
    on fewer replicas, is no burst. Kept per replica instead, the business day's 8
    replicas kept after its lunch peak of 19 read as pressure, woke the 11 just put to
    sleep and kept them awake serving the spill for the rest of the day (US$ 0.111 per
    1M tokens against 0.080, day 3 at the default knobs).
    """

    floor: int
    ratio: float = 2.0
    window_seconds: float = 60.0

    def __post_init__(self) -> None:
        # The floor's bound keeps float(floor) finite: a 400-digit floor raised
        # OverflowError on every request.
        if (
            not 1 <= self.floor <= MAX_WAKE_FLOOR
            or not 1.0 <= self.ratio <= MAX_WAKE_RATIO
            or not 0 < self.window_seconds < math.inf
        ):
            raise ValueError(
                f"a wake pressure needs 1 <= floor <= {MAX_WAKE_FLOOR}, 1 <= ratio <="
                f" {MAX_WAKE_RATIO:g}, 0 < window < inf: {self}"
            )

    def baseline(self, previous: float | None, outstanding: float, elapsed: float) -> float:
        """The mean load (requests outstanding in all), ``elapsed`` seconds after ``previous``.

        An exponential mean over ``window_seconds``. Example: previous 40, now 80
        outstanding, 6 s later, 60 s window: 40 + (80 - 40) * 0.1 = 44.
        """
        if previous is None:
            return outstanding
        return previous + (outstanding - previous) * min(1.0, elapsed / self.window_seconds)

    def threshold(self, baseline: float | None, running: int = 1) -> float:
        """Requests outstanding on every ready replica that count as pressure.

        ``running``: the Deployment's ready replicas (the woken surplus not among them;
        all ready ones when none is). Example: baseline 200 over 5 running, ratio 2,
        floor 8: max(8, 2 * 200 / 5) = 80.
        """
        return max(float(self.floor), self.ratio * (baseline or 0.0) / max(running, 1))

    def fill(self, baseline: float | None, running: int = 1) -> float:
        """Requests per replica the wakes size for: the baseline's share, at least ``floor``.

        What one running replica carried before the burst: waking only enough to bring
        the load under the threshold woke one sleeper at a time on the business day's
        4x lunch step while 5 replicas sized for the load before it rose to 240 requests
        each (first tokens up to 9 s late). Never under the floor: a replica holding
        less is no pressure. Example: baseline 200 over 5 running, floor 8: 40.
        """
        return max(float(self.floor), (baseline or 0.0) / max(running, 1))


def sleepers_to_wake(
    ready: int,
    least: int,
    total: int,
    waking: int,
    buffered: int,
    threshold: float | None,
    fill: float | None = None,
) -> int:
    """How many more sleepers to wake now (the caller bounds it by those asleep).

    Args:
        ready: replicas ready for the model (the woken surplus among them).
        least: the fewest requests outstanding on one of them.
        total: the requests outstanding on all of them.
        waking: wakes already under way.
        buffered: requests waiting with no ready replica.
        threshold: ``WakePressure.threshold``; None wakes only at zero, one at a time.
        fill: ``WakePressure.fill``, the load per replica the wakes size for; None: the
            threshold.

    Returns:
        At zero with requests waiting: one (as many as the buffer fills to the threshold).
        Under pressure (``least >= threshold``): enough that ``total`` fits ``fill`` per
        replica, at least one. Wakes under way count as replicas already there.
        Example: 4 ready holding 40 outstanding, threshold 8, fill 4: ceil(40 / 4) - 4 = 6.
    """
    if ready == 0:
        wanted = 1 if threshold is None else math.ceil(buffered / threshold)
        return max(0, min(wanted, buffered) - waking) if buffered else 0
    if threshold is None or least < threshold:
        return 0
    per_replica = threshold if fill is None else fill
    return max(0, max(1, math.ceil(total / per_replica) - ready) - waking)


def choose_wakes(
    replicas: Sequence[ReplicaView],
    model: str | None,
    threshold: float | None = None,
    buffered: int = 1,
    fill: float | None = None,
) -> tuple[str, ...]:
    """The sleeping replicas to wake now for requests for ``model``.

    Args:
        replicas: what the router sees.
        model: the model asked for.
        threshold: the pressure threshold (``WakePressure.threshold``); None wakes only
            when no ready replica serves ``model``.
        buffered: requests waiting for a replica (this one among them).
        fill: the load per replica the wakes size for (``WakePressure.fill``).

    Returns:
        As many as ``sleepers_to_wake`` says, of those that sleep, serve ``model`` and did
        not just fail a wake, those with the fewest failed wakes in a row first (then first
        listed first); none while a ready replica can take the requests or wakes under way
        will (an ejected one cannot, nor an overdue wake).
    """
    serving = [r for r in replicas if r.serves(model)]
    # An ejected replica fails what it is sent: it takes no request a sleeper could, or a
    # sick one awake kept a healthy sleeper asleep while every request failed.
    ready = [r.outstanding for r in serving if r.ready and not r.ejected]
    count = sleepers_to_wake(
        len(ready),
        min(ready, default=0),
        sum(ready),
        # A wake that hangs held every other sleeper asleep for wake-timeout (60 s)
        # while requests waited (hostile pass 27): past the patience it counts no more.
        sum(r.waking and not r.wake_overdue for r in serving),
        buffered,
        threshold,
        fill,
    )
    sleepers = [r for r in serving if r.sleeping and not r.wake_failed and not r.waking]
    sleepers.sort(key=lambda r: r.wake_failures)  # stable: first listed among equals
    return tuple(r.url for r in sleepers[:count])


BACKOFF_DOUBLINGS = 3
"""A replica whose wakes (or sleeps) keep failing is next asked after the base delay, then
twice, four and at most eight times it: 30, 60, 120, 240, 240 s with ``wake-retry-after:
30s``, where a retry every round would ask a refusing replica every second, forever."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """When a replica may be asked again (to wake, or to sleep) after failing in a row.

    Pure: ``now`` is passed in (``time.monotonic`` in the gateway), never read here.
    A success is ``Backoff()`` again.
    """

    failures: int = 0
    """Failures in a row."""
    until: float = -math.inf
    """It is not asked again before this time."""

    def allows(self, now: float) -> bool:
        """Whether it may be asked at ``now``."""
        return now >= self.until

    def failed(self, now: float, base: float) -> Backoff:
        """Failed at ``now``: the next ask waits ``base`` doubled per earlier failure, capped.

        Example: ``base`` 30 s and two failures before this one: 120 s, until ``now + 120``.
        """
        delay = base * 2 ** min(self.failures, BACKOFF_DOUBLINGS)
        return Backoff(self.failures + 1, now + delay)


@dataclass(frozen=True, slots=True)
class StandbyMoves:
    """The replicas to put to sleep and to wake so that the fleet holds the plan."""

    sleep: tuple[str, ...]
    wake: tuple[str, ...]
    reason: str
    surplus: tuple[str, ...] = ()
    """Awake replicas the plan would have asleep that are not idle yet: routed to only
    above the pressure threshold (``choose``'s ``surplus_above``), so that they fall idle
    and the next round sleeps them. Without it the router spread the load over every
    awake pod and none ever idled: the demo ran 6 awake where the plan held 2 + 4 asleep."""


def choose_standby(
    replicas: Sequence[ReplicaView], running: int, sleeping: int, min_idle: float
) -> StandbyMoves:
    """Which replicas to put to sleep, or to wake, to hold ``sleeping`` beside ``running``.

    Args:
        replicas: what the router sees.
        running: the replicas the scaler's decision wants awake.
        sleeping: the replicas its standby plan holds asleep beside them.
        min_idle: a replica sleeps only after this many seconds without a request.

    Returns:
        The held replicas are the pods the Deployment keeps (routable, asleep or waking);
        ``min(sleeping, held - running)`` of them should sleep. With fewer asleep, the
        awake ones with sleep mode, no failed sleep to back off from, nothing outstanding
        and idle for ``min_idle`` sleep,
        least recently used first (ties: listed first). With more, only as many wake as
        ``running`` lacks awake: a sleeper beyond the plan is the Deployment's to remove.
        Those that should sleep but are busy or not idle long enough are ``surplus``,
        those marked surplus already first, then the least outstanding; every other
        replica is not (the caller clears an earlier plan's marks).
    """
    held = [r for r in replicas if r.ready or r.sleeping or r.waking]
    asleep = [r for r in held if r.sleeping and not r.waking]
    awake = len(held) - len(asleep)
    want = min(sleeping, max(len(held) - running, 0))
    plan = f"plan: {running} running, {sleeping} sleeping; held {awake} awake, {len(asleep)} asleep"
    if len(asleep) < want:
        idle = [
            r
            for r in held
            if r.ready
            and r.sleep_mode
            and not r.sleep_failed
            and not r.outstanding
            and r.idle_seconds >= min_idle
        ]
        idle.sort(key=lambda r: -r.idle_seconds)
        chosen = tuple(r.url for r in idle[: want - len(asleep)])
        others = [
            r
            for r in held
            if r.ready and r.sleep_mode and not r.sleep_failed and r.url not in chosen
        ]
        # Those marked already first: the mark stays where it is, not moved round to
        # round (a replica falling idle under it is the one the next round sleeps).
        others.sort(key=lambda r: (not r.surplus, r.outstanding))
        surplus = tuple(r.url for r in others[: want - len(asleep) - len(chosen)])
        return StandbyMoves(
            chosen, (), f"{plan}: {len(chosen)} of {want - len(asleep)} idle", surplus
        )
    short = min(len(asleep) - want, running - awake)
    if short > 0:
        woken = tuple(r.url for r in asleep if not r.wake_failed)[:short]
        return StandbyMoves((), woken, f"{plan}: {short} more to run")
    return StandbyMoves((), (), plan)


def may_buffer(
    buffered: int, capacity: int, buffered_bytes: int, size: int, byte_capacity: int
) -> bool:
    """Whether one more request, of ``size`` bytes, may wait for a replica.

    Args:
        buffered: requests waiting now.
        capacity: the most requests that may wait.
        buffered_bytes: the bytes of their bodies.
        size: the bytes of this request's body.
        byte_capacity: the most bytes of bodies that may wait.
    """
    return buffered < capacity and buffered_bytes + size <= byte_capacity


def is_unserved(
    replicas: Sequence[ReplicaView],
    model: str,
    known: frozenset[str] = frozenset(),
    configured: frozenset[str] = frozenset(),
) -> bool:
    """Whether ``model`` is certainly served by nobody: a 404 beats waiting for nothing.

    Args:
        replicas: what the router sees.
        model: the model asked for.
        known: the models configured or listed by a replica since the gateway started.
        configured: the models the gateway is configured with (``models``).

    Returns:
        False for a model configured: it waits, counted, whatever the replicas list (a
        stray pod ready beside replicas still starting made every request for it a 404
        never counted, and the deployment never left zero: hostile pass 62). Else, with
        some replica ready, asleep, waking or falling asleep: True when every one of them
        has listed its models and none lists ``model`` (a model only a sleeper serves
        waits and wakes it, as at zero). With none: True when ``known`` is not empty and
        does not hold ``model``.
    """
    if model in configured:
        return False
    ready = [r for r in replicas if r.ready or r.sleeping or r.waking or r.falling_asleep]
    if ready:
        return all(r.models and model not in r.models for r in ready)
    return bool(known) and model not in known


def known_models(replicas: Sequence[ReplicaView]) -> Mapping[str, int]:
    """Every model some replica serves, with how many ready replicas serve it."""
    counts: dict[str, int] = {}
    for replica in replicas:
        if replica.ready:
            for model in replica.models:
                counts[model] = counts.get(model, 0) + 1
    return counts
