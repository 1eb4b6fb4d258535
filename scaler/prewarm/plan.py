"""Prewarm planning: when to warm a ScaledObject's Fluid Dataset, and what to create.

Pure: the ScaledObject's prewarm settings, its latest decision (active, desired), the
Dataset and DataLoads as the API server's JSON (Fluid v1.0.8) and ``now`` go in; a
``PrewarmPlan`` comes out with the state, the reason, at most one write (a DataLoad to
create, or one of ours to delete before loading again) and the tracking state for the
next call. Nothing here ever holds a scale decision back: the plan only says what to
load and how the warm-up stands, and the decision's reason carries that.

When the cache is wanted
    While the decision is active (replicas wanted) or a forecast expects traffic soon,
    and for ``keep_warm_seconds`` after it went to zero (``keepWarmAfterZero``), so a
    return within that time finds it warm.
    Otherwise the plan is ``idle``: nothing is loaded, nothing deleted (Fluid evicts a
    cache under pressure on its own).

Triggers
    A scale-from-zero (inactive to active: the first buffered arrival activates the
    decision), each scale-out step (more replicas desired than before), and at zero a
    forecast of returning traffic (``Decision.prewarm_forecast``) start a
    warm-up clock when the cache is cold; ``timeout_seconds`` later the plan reports
    ``timed-out`` (the load may go on; the replicas start cold) until the cache is warm
    or the next trigger. A warm cache starts no clock.

What is created
    One DataLoad per ScaledObject and Dataset (``dataload_name``), ``policy: Once``,
    ``loadMetadata`` first, the configured paths as targets. Nothing is created while
    any DataLoad of the Dataset (anyone's) is pending or executing. A completed load of
    ours is not repeated (no churn) unless the cache was seen warm after it and then
    fell below the threshold (evicted): then ours is deleted (precondition: its UID, so
    two scalers never delete each other's fresh one) and created again. A completed load
    of ours created before this scaler watched Fluid (a restart: whether the cache was
    warm after it was not seen, so an eviction looks like a small cache) is loaded again
    the same way, once. A failed load of ours is retried the same way, at the next
    trigger only.

Time from Fluid
    A finished load is judged only ``STATUS_LAG_SECONDS`` after it finished, when
    Fluid's figures have caught up. The finish time is the DataLoad's own unless it
    cannot be (before its creation, or ahead of this clock, beyond the clock slack):
    then it is when this scaler first saw the load finished. Every reload (evicted,
    failed, unseen) backs off: the n-th in a row waits ``RELOAD_MIN_SECONDS`` x 2^(n-2)
    (at most ``RELOAD_MAX_SECONDS``) after its predecessor finished; a load that lasted
    ``RELOAD_RESET_SECONDS`` starts the count again. A cache that flips between warm
    and cold costs a few loads an hour, not one a status update.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, get_args

from foundation.fluid import (
    DNS_SUBDOMAIN,
    FINISHED_PHASES,
    FLUID_API,
    STATUS_LAG_SECONDS,
    CachedPercentage,
    FluidIndex,
    active_phase,
    bounded_name,
    condition_text,
    dataload_manifest,
    dataset_cache,
    finished_at,
    meta,
    phase,
)
from foundation.objects import RawObject
from foundation.timestamps import format_time, parse_time

PrewarmState = Literal[
    "unknown",
    "dataset-missing",
    "not-bound",
    "idle",
    "warm",
    "loading",
    "cache-unknown",
    "below-threshold",
    "failed",
    "timed-out",
]
STATES: Final[tuple[PrewarmState, ...]] = get_args(PrewarmState)
"""Every state, for the metric's label set."""


MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "unitscale-scaler"
CLOCK_SLACK_SECONDS: Final = 120.0
"""How far the API server's clock may differ from the scaler's: a DataLoad's finish time
further ahead, or before its creation by more, is no time at all."""
RELOAD_MIN_SECONDS: Final = 300.0
RELOAD_MAX_SECONDS: Final = 3600.0
RELOAD_RESET_SECONDS: Final = 2 * RELOAD_MAX_SECONDS
"""Reload back-off: the first reload goes at once, the second waits 300 s after its
predecessor finished, doubling to an hour; a load that stood two hours resets it (past
the longest wait, so a thrashing cache never reaches the reset by waiting)."""
FOR_SCALED_OBJECT: Final = "unitscale.io/scaled-object"
"""Annotation on a DataLoad we made: ``namespace/name`` of the ScaledObject it warms for."""


@dataclass(frozen=True, slots=True)
class PrewarmSpec:
    """A ScaledObject's prewarm settings (from its trigger metadata)."""

    dataset: str
    namespace: str
    """The Dataset's namespace (the DataLoad is created there too)."""
    paths: tuple[str, ...] = ("/",)
    timeout_seconds: float = 300.0
    keep_warm_seconds: float = 900.0
    warm_percent: float = 100.0
    """``cachedPercentage`` at or above which the cache counts as warm."""

    def __post_init__(self) -> None:
        if not DNS_SUBDOMAIN.match(self.dataset) or len(self.dataset) > 253:
            raise ValueError(f"Dataset name {self.dataset!r} is not a Kubernetes object name")
        if not self.paths or any(not p.startswith("/") for p in self.paths):
            raise ValueError(f"prewarm paths must be absolute, got {self.paths!r}")
        if not 0 < self.warm_percent <= 100:
            raise ValueError(f"warm_percent must be within (0, 100], got {self.warm_percent}")


@dataclass(frozen=True)
class FluidView:
    """What the scaler's watches know of Fluid's objects.

    Indexed once a view (``loads_of``, ``named``): a plan looks up its Dataset's loads,
    so a pass over every ScaledObject is linear in them, not their product.
    """

    listed: bool
    """Both watches have listed at least once (before that, nothing is known)."""
    datasets: Mapping[str, RawObject] = field(default_factory=dict)
    """``namespace/name`` -> Dataset."""
    dataloads: Sequence[RawObject] = ()
    problem: str = ""
    """Why the watches cannot see Fluid's objects (its last error), "" when they can."""
    first_done: Mapping[str, float] = field(default_factory=dict)
    """UID -> when the watches first saw that DataLoad finished (this scaler's clock):
    the figures lag from then at the latest, whatever the load's own dates say."""
    before: frozenset[str] = frozenset()
    """UIDs of the DataLoads the watches' first list held: how those fared, no plan here
    saw. By UID, not by creation time: an API server whose clock ran behind made every
    new load look older than the watches, reloaded about hourly (hostile pass 15)."""

    def loads_of(self, namespace: str, dataset: str) -> Sequence[Mapping[str, Any]]:
        """The DataLoads of ``namespace/dataset`` that are not being deleted."""
        return self._index.loads_of(namespace, dataset)

    def named(self, namespace: str, name: str) -> RawObject | None:
        """The DataLoad of this name, if the watch has it."""
        return self._by_name.get((namespace, name))

    @functools.cached_property
    def _index(self) -> FluidIndex:
        return FluidIndex((), self.dataloads)  # Datasets are looked up by key already

    @functools.cached_property
    def _by_name(self) -> Mapping[tuple[str, str], RawObject]:
        return {(meta(d, "namespace"), meta(d, "name")): d for d in self.dataloads}


@dataclass(frozen=True, slots=True)
class Track:
    """What one plan hands the next, for one ScaledObject."""

    active: bool = False
    desired: int = 0
    forecast: bool = False
    """At zero, a forecast expected traffic soon (the last decision said so)."""
    idle_since: float | None = None
    """When the decision went to zero (None while active, or never active)."""
    wait_since: float | None = None
    """When the current warm-up began (a trigger found the cache cold)."""
    wait_for: str = ""
    """What the warm-up is for: ``scale-from-zero``, ``scale-out to 3``."""
    timed_out: bool = False
    warm_after: str = ""
    """UID of our DataLoad that the cache was seen warm after (eviction shows against it)."""
    time_to_warm: float | None = None
    """Seconds the last warm-up took, from its trigger to a warm cache."""
    timeouts: int = 0
    """Warm-ups that timed out, since the scaler started."""
    finished: tuple[str, float] = ("", 0.0)
    """UID of our last DataLoad seen finished, and when this scaler first saw it so."""
    reloads: int = 0
    """Reloads in a row (each one of ours deleted to load again), for the back-off."""
    reloaded: str = ""
    """UID of the last DataLoad deleted to load again (a reload is counted once)."""
    made_at: float | None = None
    """When this scaler last created our DataLoad (None: never; a load of its own is
    never one it did not see, whatever UID the API server hands it)."""
    ours: str = ""
    """UID of our DataLoad as last seen (any phase): gone, not by us, it was cleaned up."""


@dataclass(frozen=True, slots=True)
class Delete:
    """One of our DataLoads to delete (only if its UID is still ``uid``)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PrewarmPlan:
    """What the prewarm should do now, and why."""

    state: PrewarmState
    reason: str
    track: Track
    cached_percent: float | None = None
    dataload: str = ""
    """The DataLoad the state refers to (ours, or the one under way)."""
    create: RawObject | None = None
    delete: Delete | None = None

    @property
    def note(self) -> str:
        """The text a decision's reason carries ("" when there is nothing to say)."""
        return "" if self.state == "idle" else f"prewarm {self.state}: {self.reason}"


def dataload_name(scaled_object: tuple[str, str], spec: PrewarmSpec, dataset_uid: str) -> str:
    """Our DataLoad's name: the same for every scaler replica that plans it.

    The hash covers the ScaledObject, the Dataset (with its UID: a recreated Dataset's
    predecessor's DataLoad may still be terminating) and the paths.
    """
    namespace, name = scaled_object
    key = "/".join((namespace, name, spec.namespace, spec.dataset, dataset_uid, *spec.paths))
    return bounded_name(f"prewarm-{name}", key, "prewarm")


def dataload_for(
    scaled_object: tuple[str, str], spec: PrewarmSpec, dataset: Mapping[str, Any]
) -> RawObject:
    """Our DataLoad of ``spec.paths``, once, owned by the Dataset.

    Owned by the Dataset, not the ScaledObject: an owner must be in the same namespace
    (the Dataset always is; the ScaledObject may not be), and KEDA tells the scaler no
    ScaledObject UID. Deleting the Dataset deletes its loads; a deleted ScaledObject
    leaves one finished ``Once`` DataLoad, which holds nothing but its record.
    ``blockOwnerDeletion: false``: Fluid's finalizer on the DataLoad must not hold up a
    foreground deletion of the Dataset.

    Raises:
        ValueError: the Dataset has no UID (an owner reference needs one).
    """
    uid = meta(dataset, "uid")
    if not uid:
        raise ValueError(f"Dataset {spec.namespace}/{spec.dataset} has no metadata.uid")
    return dataload_manifest(
        name=dataload_name(scaled_object, spec, uid),
        namespace=spec.namespace,
        dataset=spec.dataset,
        paths=spec.paths,
        owner=(FLUID_API, "Dataset", spec.dataset, uid),
        labels={MANAGED_BY: MANAGER},
        annotations={FOR_SCALED_OBJECT: "/".join(scaled_object)},
    )


def plan(
    scaled_object: tuple[str, str],
    spec: PrewarmSpec,
    track: Track,
    *,
    active: bool,
    desired: int,
    fluid: FluidView,
    now: float,
    forecast: bool = False,
) -> PrewarmPlan:
    """Where the prewarm of ``scaled_object`` stands after a decision (see the module).

    Args:
        scaled_object: its (namespace, name).
        spec: its prewarm settings.
        track: the previous plan's ``track`` (``Track()`` the first time).
        active: whether the latest decision wants replicas.
        desired: the replicas it wants.
        fluid: what the watches see of Datasets and DataLoads.
        now: unix seconds.
        forecast: at zero, a forecast expects traffic within about one load time
            (``Decision.prewarm_forecast``): a trigger, and the cache
            is wanted while it lasts.
    """
    track = _on_this_clock(track, now)
    track, triggered = _follow(track, active, desired, forecast and not active, now)
    result = _assess(scaled_object, spec, track, fluid, now, triggered)
    return _timed(result, spec, now)


def _on_this_clock(track: Track, now: float) -> Track:
    """``track`` with every time later than ``now`` taken as ``now``.

    The wall clock stepped back (NTP correcting a clock a day ahead): a wait timed from
    what the clock said then would last until it caught up, a day without a reload.
    """
    times = (track.idle_since, track.wait_since, track.made_at, track.finished[1])
    if all(t is None or t <= now for t in times):
        return track
    return replace(
        track,
        idle_since=None if track.idle_since is None else min(track.idle_since, now),
        wait_since=None if track.wait_since is None else min(track.wait_since, now),
        made_at=None if track.made_at is None else min(track.made_at, now),
        finished=(track.finished[0], min(track.finished[1], now)),
    )


def _follow(
    track: Track, active: bool, desired: int, forecast: bool, now: float
) -> tuple[Track, bool]:
    """The tracking state after this decision, and whether it is a trigger."""
    trigger = ""
    if active and not track.active:
        trigger = "scale-from-zero"
    elif active and desired > track.desired:
        trigger = f"scale-out to {desired}"
    elif forecast and not track.forecast:
        trigger = "forecast return of traffic"
    idle_since = track.idle_since
    if active:
        idle_since = None
    elif track.active:
        idle_since = now
    new = replace(
        track,
        active=active,
        desired=desired if active else 0,
        idle_since=idle_since,
        forecast=forecast,
    )
    if trigger:
        # A new trigger restarts the clock; what it found is judged by _assess.
        new = replace(new, wait_since=now, wait_for=trigger, timed_out=False)
    return new, bool(trigger)


def _assess(
    key: tuple[str, str],
    spec: PrewarmSpec,
    track: Track,
    fluid: FluidView,
    now: float,
    triggered: bool,
) -> PrewarmPlan:
    """The state, before the timeout."""
    ref = f"{spec.namespace}/{spec.dataset}"
    dataset = fluid.datasets.get(ref)
    unusable = _unusable(ref, dataset, track, fluid)
    if unusable is not None:
        return unusable
    assert dataset is not None  # _unusable reports a missing one
    cache = dataset_cache(dataset)
    mine = dataload_name(key, spec, meta(dataset, "uid"))
    loads = fluid.loads_of(spec.namespace, spec.dataset)
    own = next((d for d in loads if meta(d, "name") == mine), None)
    named = fluid.named(spec.namespace, mine)
    deleting = named is not None and bool(meta(named, "deletionTimestamp"))
    if own is not None and track.ours != meta(own, "uid"):
        track = replace(track, ours=meta(own, "uid"))
    if own is not None and phase(own) in FINISHED_PHASES and track.finished[0] != meta(own, "uid"):
        track = replace(track, finished=(meta(own, "uid"), now))
    if cache.value is not None and cache.value >= spec.warm_percent:
        return _warm(track, ref, cache, own, now, triggered)
    wanted = (
        track.active
        or track.forecast
        or (track.idle_since is not None and now - track.idle_since < spec.keep_warm_seconds)
    )
    held = f"Dataset {ref} holds {cache.describe()} of the {spec.warm_percent:g}% warm"
    if cache.value is None:
        held = f"Dataset {ref}: {cache.reason}"
    base = PrewarmPlan("loading", held, track, cache.value, mine)
    if not wanted:
        return replace(
            base, state="idle", reason=f"{held}; no replicas wanted", track=_settled(track)
        )
    active = [d for d in loads if phase(d) not in FINISHED_PHASES]
    if active:
        load = min(active, key=lambda d: (meta(d, "name") != mine, meta(d, "name")))
        return replace(
            base,
            reason=f"{held}; DataLoad {spec.namespace}/{meta(load, 'name')} is "
            f"{active_phase(load)}",
            dataload=meta(load, "name"),
        )
    if deleting:
        return replace(base, reason=f"{held}; waiting for our old DataLoad {mine} to go")
    other = _latest_other(own, loads, now, fluid.first_done)
    if other is not None and now - other[1] < STATUS_LAG_SECONDS:
        # Another ScaledObject's load of this Dataset just finished: the figures may not
        # show it yet. Judged at once, each sharing ScaledObject took the lagging figures
        # for an eviction, or for no load, and loaded the same data again (20 loads for
        # one eviction, hostile pass 15).
        return replace(
            base,
            reason=f"{held}; DataLoad {spec.namespace}/{other[0]} of the same Dataset"
            " completed: waiting for Fluid's figures",
        )
    if own is None and named is not None:
        # Our name, another Dataset's load (or none readable): creating ours answered
        # 409, taken for ours, and was asked again at every watch event (hostile pass 16).
        return replace(
            base,
            state="failed",
            reason=f"{held}; DataLoad {spec.namespace}/{mine} exists and is not a load of"
            " this Dataset: nothing is created under its name (delete it to load)",
        )
    if own is None:
        return _create(base, key, spec, dataset, now)
    return _finished(base, own, cache, track, now, triggered, fluid.before)


def _create(
    base: PrewarmPlan,
    key: tuple[str, str],
    spec: PrewarmSpec,
    dataset: Mapping[str, Any],
    now: float,
) -> PrewarmPlan:
    """No load of ours: create one, or wait out the reload back-off if ours is gone."""
    track, held, mine = base.track, base.reason, base.dataload
    gone = track.ours
    if gone and track.reloaded != gone:
        # Our load is gone, not by us (a TTL clean-up, maybe as it finished): loading
        # again is a reload, and backs off like one (720 loads an hour when each went at
        # once), from its finish if seen, else from its creation by us, else from when
        # it was first missed (kept: timed from each plan's now, it never came, and the
        # prewarm stopped for good, hostile pass 17).
        if track.finished[0] != gone:
            start = track.made_at if track.made_at is not None else now
            track = replace(track, finished=(gone, start))
        reloads, ready = _backoff(track, gone, now)
        ready = max(ready, track.finished[1] + STATUS_LAG_SECONDS)
        if now < ready:
            return replace(
                base,
                track=track,
                reason=f"{held}; our DataLoad {spec.namespace}/{mine} is gone (not by us):"
                f" loading again at {format_time(ready)} (reload {reloads} in a row)",
            )
        track = replace(track, reloads=reloads)
    # A new load: what was seen of the last one is not of it, even should the API server
    # hand it the same UID (its finish was then never seen, and every load reloaded at
    # once as "evicted": 2,940 writes an hour, hostile pass 15).
    fresh = replace(track, finished=("", 0.0), reloaded="", warm_after="", ours="", made_at=now)
    return replace(
        base,
        reason=f"{held}: creating DataLoad {spec.namespace}/{mine}",
        track=fresh,
        create=dataload_for(key, spec, dataset),
    )


def _unusable(
    ref: str, dataset: Mapping[str, Any] | None, track: Track, fluid: FluidView
) -> PrewarmPlan | None:
    """Why the Dataset cannot be warmed now (unknown, missing, not Bound), or None."""
    if not fluid.listed:
        shown = fluid.problem or "waiting for the first list of Fluid Datasets and DataLoads"
        return PrewarmPlan("unknown", shown, track)
    if dataset is None:
        extra = f" ({fluid.problem})" if fluid.problem else ""
        message = f"Fluid Dataset {ref} does not exist (trigger key fluidDataset){extra}"
        return PrewarmPlan("dataset-missing", message, _settled(track))
    bound = phase(dataset)
    if meta(dataset, "deletionTimestamp") or bound != "Bound":
        shown = "is being deleted" if meta(dataset, "deletionTimestamp") else f"is {bound or 'new'}"
        message = f"Dataset {ref} {shown}, not Bound: its runtime is not ready"
        return PrewarmPlan("not-bound", message, track)
    return None


def _warm(
    track: Track,
    ref: str,
    cache: CachedPercentage,
    own: Mapping[str, Any] | None,
    now: float,
    triggered: bool,
) -> PrewarmPlan:
    # A trigger that finds the cache warm waited for nothing: no time-to-warm.
    waited = track.wait_since is not None and not triggered
    took = now - track.wait_since if waited and track.wait_since is not None else None
    # Eviction is judged against a finished load of ours seen warm after it.
    seen = meta(own, "uid") if own is not None and phase(own) in FINISHED_PHASES else ""
    new = replace(
        _settled(track),
        warm_after=seen or track.warm_after,
        time_to_warm=took if took is not None else track.time_to_warm,
    )
    message = f"Dataset {ref} is warm ({cache.describe()} cached)"
    if took is not None:
        message += f" {took:.0f} s after the {track.wait_for}"
    return PrewarmPlan("warm", message, new, cache.value, meta(own, "name") if own else "")


def _finished(
    base: PrewarmPlan,
    own: Mapping[str, Any],
    cache: CachedPercentage,
    track: Track,
    now: float,
    triggered: bool,
    before: frozenset[str],
) -> PrewarmPlan:
    """Our DataLoad finished and the cache is not warm: wait, reload, or say why not."""
    ref = f"{meta(own, 'namespace')}/{meta(own, 'name')}"
    if phase(own) == "Failed":
        failed = f"{base.reason}; DataLoad {ref} failed ({condition_text(own, 'Failed')})"
        if triggered:  # a scale-up since: a Once load never reruns, so load anew
            return _reload(replace(base, reason=failed), own, track, now)
        return replace(base, state="failed", reason=f"{failed}; retried at the next scale-up")
    done, dated = _finish_time(own, track)
    if now - done < STATUS_LAG_SECONDS:
        return replace(
            base, reason=f"{base.reason}; DataLoad {ref} completed: waiting for Fluid's figures"
        )
    if not dated:
        base = replace(
            base,
            reason=f"{base.reason}; DataLoad {ref}'s finish time cannot be (none, before its"
            " creation, or ahead of this clock): timed from when this scaler saw it finished",
        )
    if cache.value is None:
        return replace(
            base, state="cache-unknown", reason=f"{base.reason}; DataLoad {ref} completed"
        )
    if track.warm_after and track.warm_after == meta(own, "uid"):
        return _reload(
            replace(base, reason=f"{base.reason}, down from warm: evicted"), own, track, now
        )
    if meta(own, "uid") in before and not track.warm_after and track.made_at is None:
        # Made before this scaler watched Fluid: an eviction after it was not seen.
        return _reload(
            replace(
                base,
                reason=f"{base.reason}; DataLoad {ref} was made before this scaler watched"
                " Fluid (evicted since, or never warm: not known)",
            ),
            own,
            track,
            now,
        )
    return replace(
        base,
        state="below-threshold",
        reason=f"{base.reason}, though DataLoad {ref} completed: the cache is smaller than "
        "the data, or prewarmCachedPercentage is too high; not loading again (it would "
        "churn)",
    )


def _latest_other(
    own: Mapping[str, Any] | None,
    loads: Sequence[Mapping[str, Any]],
    now: float,
    first_done: Mapping[str, float],
) -> tuple[str, float] | None:
    """The name and finish of the Dataset's latest finished load but ours, if any.

    Its finish is the later of its own date and when the watches first saw it finished:
    a Fluid clock behind (or no date) let each sharing ScaledObject judge the lagging
    figures at once (8 loads for one eviction, hostile pass 16). A date ahead of this
    clock beyond the slack is no time (it would hold ours up).
    """
    latest: tuple[str, float] | None = None
    for load in loads:
        if load is own or phase(load) != "Complete":
            continue
        dated = finished_at(load)
        times = [t for t in (dated, first_done.get(meta(load, "uid"))) if t is not None]
        done = max((t for t in times if t <= now + CLOCK_SLACK_SECONDS), default=None)
        if done is not None and (latest is None or done > latest[1]):
            latest = (meta(load, "name"), done)
    return latest


def _finish_time(own: Mapping[str, Any], track: Track) -> tuple[float, bool]:
    """When our finished load finished, and whether that is its own date.

    A date before its creation or ahead of this clock (beyond the slack) would skip
    the wait for Fluid's figures, or hold it for years: the time this scaler first saw
    it finished stands in (``_assess`` records it on the first sight).
    """
    seen = track.finished[1]
    done = finished_at(own)
    created = parse_time(meta(own, "creationTimestamp"))
    if done is None or done > seen + CLOCK_SLACK_SECONDS:
        return seen, False
    if created is not None and done < created - CLOCK_SLACK_SECONDS:
        return seen, False
    return done, True


def _reload(base: PrewarmPlan, own: Mapping[str, Any], track: Track, now: float) -> PrewarmPlan:
    """Delete our finished load to load again, or wait out the reload back-off."""
    uid = meta(own, "uid")
    reloads, ready = _backoff(track, uid, now)
    hold = ready - track.finished[1]
    if now < ready:
        return replace(
            base,
            reason=f"{base.reason}; reload {reloads} in a row waits {hold:.0f} s after the"
            f" last load finished (at {format_time(ready)})",
        )
    again = Delete(meta(own, "namespace"), meta(own, "name"), uid)
    return replace(
        base,
        reason=f"{base.reason}; loading again",
        delete=again,
        track=replace(track, reloads=reloads, reloaded=uid),
    )


def _backoff(track: Track, uid: str, now: float) -> tuple[int, float]:
    """The reload of our load ``uid`` (finished): its place in a row, and when it may go."""
    if track.reloaded == uid:  # planned already (the write or the watch is on its way)
        reloads = track.reloads
    else:
        lasted = now - track.finished[1]
        reloads = 1 if lasted >= RELOAD_RESET_SECONDS else track.reloads + 1
    hold = 0.0 if reloads <= 1 else min(RELOAD_MIN_SECONDS * 2 ** (reloads - 2), RELOAD_MAX_SECONDS)
    return reloads, track.finished[1] + hold


def _settled(track: Track) -> Track:
    """No warm-up under way any more."""
    return replace(track, wait_since=None, wait_for="", timed_out=False)


def _timed(result: PrewarmPlan, spec: PrewarmSpec, now: float) -> PrewarmPlan:
    """A warm-up that has lasted ``timeout_seconds`` is reported as given up."""
    track = result.track
    if track.timed_out or (
        track.wait_since is not None and now - track.wait_since >= spec.timeout_seconds
    ):
        first = not track.timed_out
        # No running count in the text: a reason that changed every second would be
        # logged every second.
        message = (
            f"gave up waiting after {spec.timeout_seconds:g} s (prewarmTimeout) for the "
            f"{track.wait_for}, which proceeds with a cold cache: {result.reason}"
        )
        new = replace(track, timed_out=True, timeouts=track.timeouts + (1 if first else 0))
        return replace(result, state="timed-out", reason=message, track=new)
    return result
