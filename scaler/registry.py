"""Every ScaledObject KEDA has asked about, and its current decision: no gRPC here.

Decisions are made when new signals arrive (``SignalStore`` tells the registry), and
every KEDA call reads the stored decision: O(1), no scrape, no I/O per call. The gRPC
service (``scaler.service``) and the replay (``replay.policies``) both answer from this
registry, so the replay runs the code that serves KEDA.

The metric is the desired replica count itself, with AverageValue target 1, so the
HPA computes ``ceil(value / 1)`` replicas (subject to its 10% tolerance).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from foundation.errors import (
    MetadataError,
    NoDataError,
    StaleSignalError,
    UnitscaleError,
    quote,
)
from foundation.signals import TargetKey, describe_target
from scaler.confirm import Confirmer, Standing, standing
from scaler.core import Decision, DecisionState, Policy, decide
from scaler.core.hpa import metric_for
from scaler.core.standby import StandbySetup, StandbyState, standby_setup, with_standby
from scaler.metadata import TriggerMetadata, parse_metadata, refuse_oversized
from scaler.signals import SignalStore, observe, shows_load

log = logging.getLogger(__name__)

METRIC_NAME = "unitscale-desired-replicas"
"""The one metric every unitscale ScaledObject gets (HPA name ``sN-`` + this)."""
TARGET_VALUE = 1.0
"""AverageValue target: one unit of the metric per replica."""

ObjectKey = tuple[str, str]
"""(namespace, name) of a ScaledObject."""

MAX_SCALED_OBJECTS = 10_000
"""ScaledObjects one scaler keeps (the scale it is built and benched for).

Each is kept for ``scaled-object-ttl`` after KEDA last asks about it and becomes a target
every Prometheus round queries; without a bound, anyone who can reach the port grows the
scaler by about 22 KB per distinct name until the kernel kills it. KEDA's own are known
before the bound is reached, and stay; only new ones past it are refused."""


_NOT_THE_API_SERVERS = {
    Standing.ABSENT: "the API server has no ScaledObject of this namespace and name (a call"
    " that is not KEDA's, or one just created: KEDA asks again)",
    Standing.DIFFERS: "this metadata is no trigger of the ScaledObject as the API server has"
    " it (a call that is not KEDA's, or an edit not seen here yet: KEDA asks again)",
}
SECOND_TRIGGER_WINDOW = 600.0
"""Seconds within which a return to the metadata a ScaledObject just had counts towards
"two triggers" (KEDA asks about both in every evaluation, seconds apart; an edit and its
revert are minutes apart and return once), and how long after the current trigger was
last asked about the other is still refused."""


MAX_PER_TARGET = 8
"""ScaledObjects naming one target deployment (whatever model: one per model made 8,000
of one workload, each in every GetStandbyPlan answer of it, hostile pass 60) from its own
namespace, and as many from all others together. Each snapshot of a target decided every
ScaledObject naming it: 4,000 naming one live deployment held the event loop at 99% of a
core, KEDA's calls at half a second and every other target's signals past their age
(hostile pass 57). A snapshot showing load still decides each at zero with an open
stream, and each costs memory. One names a target; a migration, two."""


MAX_RIVALS = 8
"""Other triggers' metadata maps (and replaced ones) remembered per ScaledObject: KEDA
sends every trigger of a ScaledObject under its one name, so three triggers cycle
A, B, C; remembering only the last map replaced took each call for an edit."""


PUSH_DECISION_GAP = 0.25
"""Seconds a served ScaledObject waits between two decisions on pushed signals.

Each decision adds a sample to its state's windows (``scaler.core.window.Recent``, a
tuple copied whole), so a decision per snapshot cost the square of the snapshot rate:
1,000 snapshots a second for 20 s took 6.5 ms each (65 s of CPU on the event loop),
and a gateway publishes on every buffered request. Snapshots within the gap are one
trailing decision at its end, so an activation is pushed at most this late."""


def _look_again(scaled: ScaledObject) -> None:
    """Have ``scaled`` decided again when next asked, as on signals it has not seen.

    Through the push gap (``ScaledObjectRegistry._decide``): a reload deciding every
    ScaledObject at once held the loop 0.4-0.6 s at 10,000, and one flapping every 25 ms
    kept a decision (a window sample) for each, each time (hostile pass 62).
    """
    scaled.signals_version = -1


class RegistryFullError(UnitscaleError):
    """The registry holds ``MAX_SCALED_OBJECTS`` already: a new ScaledObject is refused."""


def _second_trigger_error(scaled: ScaledObject, raw: Mapping[str, str]) -> MetadataError:
    return MetadataError(
        "a second unitscale trigger with other metadata (deployment"
        f" {quote(raw.get('deployment'))}, beside"
        f" {quote(scaled.raw_metadata.get('deployment'))}): one unitscale trigger"
        " per ScaledObject, as both would share its decisions; this one is refused"
        f" while the other is asked about (and for {SECOND_TRIGGER_WINDOW:.0f} s"
        " after)"
    )


def metric_value(decision: Decision) -> float:
    """What GetMetrics reports so that the HPA lands on the decision (``core.hpa``).

    The pods wanted are the running replicas and the sleepers: the Deployment must keep
    the sleeping pods, which the gateway puts to sleep.
    """
    wanted = decision.desired_replicas + decision.sleeping_replicas
    return metric_for(wanted, decision.current_replicas)


@dataclass(slots=True, eq=False)
class ScaledObject:
    """What the scaler keeps per ScaledObject: its trigger and its latest decision."""

    key: ObjectKey
    raw_metadata: dict[str, str]
    metadata: TriggerMetadata
    target: TargetKey
    policy: Policy
    max_signal_age: float
    state: DecisionState = field(default_factory=DecisionState)
    decision: Decision | None = None
    decided_at: float | None = None
    """When ``decision`` was made (clock seconds); None without one."""
    error: NoDataError | None = None
    signals_version: int = -1
    valid_until: float = -math.inf
    active: bool = False
    """Whether the last valid decision was active (for push transitions)."""
    activation_listeners: set[Callable[[], None]] = field(default_factory=set)
    """Called on each inactive-to-active transition (open StreamIsActive calls)."""
    last_seen: float = 0.0
    """When KEDA last asked about it (clock seconds); long silence means it is gone."""
    standby: StandbySetup | None = None
    """With ``standby: true``: what its warm-tier plan is made with."""
    standby_state: StandbyState = field(default_factory=StandbyState)
    decision_errors: int = 0
    """Decisions that raised something other than "no data" (counted; KEDA got UNAVAILABLE)."""
    listener_errors: int = 0
    """Activation listeners that raised when told of a transition (counted; the others
    were told, the decision kept)."""
    replaced: tuple[dict[str, str], ...] = ()
    """The metadata maps the current one replaced (at most ``MAX_RIVALS``), the last edit
    at ``changed_at``: a quick return to one, twice, is another trigger, not an edit
    (``_second_trigger``)."""
    changed_at: float = 0.0
    returns: int = 0
    rivals: tuple[dict[str, str], ...] = ()
    """Other unitscale triggers' metadata on this ScaledObject (at most ``MAX_RIVALS``):
    refused while the first is asked about."""
    edit_logged_at: float = -math.inf
    """When a metadata change was last logged at INFO (at most one a minute)."""
    push_pending: bool = False
    """A trailing decision is due (signals came within ``push_gap`` of the last one)."""


DecisionHook = Callable[[ScaledObject, Decision, float], Decision]
"""Sees each new decision of a ScaledObject at ``now`` and returns the one to keep."""


class ScaledObjectRegistry:
    """Every ScaledObject KEDA has asked about, and its current decision."""

    def __init__(
        self,
        store: SignalStore,
        default_max_signal_age: float,
        clock: Callable[[], float] = time.time,
        policy_defaults: Policy | None = None,
        max_objects: int = MAX_SCALED_OBJECTS,
        push_gap: float = 0.0,
        later: Callable[[float, Callable[[], None]], bool] | None = None,
    ) -> None:
        """Keep the store's ScaledObjects; decide on its signals.

        A decision is made when KEDA asks, or at once on signals showing load for a
        ScaledObject at zero with an open StreamIsActive (``_on_signals``). ``push_gap``: the least
        seconds between two decisions (``PUSH_DECISION_GAP`` where a wire feeds the
        store; 0, none, for the replay, which asks once a simulated call). ``later(delay,
        call)`` runs ``call`` after ``delay`` seconds (the server's event loop) and says
        whether it will: the trailing decision; without it the next snapshot or KEDA
        call decides.
        """
        self._push_gap = push_gap
        self._later = later
        self._store = store
        self._max_objects = max_objects
        self.confirm: Confirmer | None = None
        self._scanned: object = None
        """The list ``_forget_absent`` last scanned (each event brings a new one)."""
        """The API server's ScaledObjects (``scaler.scaled_objects``), once the server
        has them: a call whose ScaledObject or trigger they do not have is refused, and
        their trigger replaces metadata they do not vouch for at once. None (the
        replay, tests without an API server) or not listed yet: every call is believed."""
        self._full_logged = False
        self._crowded_logged: set[tuple[str, str]] = set()
        """Deployments whose ``MAX_PER_TARGET`` refusal was logged (once a filling)."""
        self.errors: Counter[str] = Counter()
        """Units of work refused or failed, by reason: ``full`` (a new ScaledObject past
        ``max_objects``), ``target-full`` (one naming a target past ``MAX_PER_TARGET``),
        ``pool-demand`` (a pool's inference demand not encodable),
        ``unconfirmed`` (a ScaledObject declaring a pool that the API server does not
        have, left out of the pool), ``unconfirmed-call`` (a call refused as the API
        server has no such ScaledObject or trigger), and the ScaledObject watch's
        (``scaler.scaled_objects``)."""
        self._policy_defaults = policy_defaults or Policy()
        self._default_max_age = default_max_signal_age
        self._clock = clock
        self._objects: dict[ObjectKey, ScaledObject] = {}
        self._by_target: dict[TargetKey, set[ScaledObject]] = {}
        self._by_workload: dict[tuple[str, str], set[ScaledObject]] = {}
        """The ScaledObjects naming each deployment, whatever model: ``MAX_PER_TARGET``."""
        self._decision_hooks: list[DecisionHook] = []
        store.add_listener(self._on_signals)
        store.set_bound(lambda target: bool(self._by_target.get(target)))

    def __len__(self) -> int:
        return len(self._objects)

    def set_default_max_signal_age(self, seconds: float) -> None:
        """A reloaded ``max-signal-age``: applies to every ScaledObject without its own.

        Each is decided again when next asked (``_look_again``), not here.
        """
        self._default_max_age = seconds
        for scaled in self._objects.values():
            if scaled.metadata.max_signal_age is None and scaled.max_signal_age != seconds:
                scaled.max_signal_age = seconds
                _look_again(scaled)

    def set_policy_defaults(self, defaults: Policy) -> None:
        """A reloaded ``policy`` section: every ScaledObject's policy is rebuilt over it.

        Each is decided again on it when next asked (``_look_again``); one whose profile
        the reload dropped plans as before until its metadata changes (its next change
        is refused the same way, to KEDA), logged once per profile.
        """
        if defaults == self._policy_defaults:
            return
        if defaults.profiles == self._policy_defaults.profiles:
            # The same tuple, not an equal one: each ScaledObject's policy is compared
            # below, and 256 profiles compared one by one held a reload 1.2 s at 10,000
            # ScaledObjects (hostile pass 63).
            defaults = replace(defaults, profiles=self._policy_defaults.profiles)
        self._policy_defaults = defaults
        kept: dict[str, list[ObjectKey]] = {}
        for scaled in self._objects.values():
            try:
                policy = scaled.metadata.policy(defaults)
                standby = _standby(scaled.metadata, policy)
            except MetadataError as err:
                # A profile it names dropped, or a standby left without one: raised out of
                # the loop, the ScaledObjects after it kept the old policy, and the rest of
                # the reload (the signal sources) never landed (hostile pass 63).
                kept.setdefault(str(err), []).append(scaled.key)
                continue
            if policy != scaled.policy:
                scaled.policy, scaled.standby = policy, standby
                _look_again(scaled)
        for why, keys in kept.items():
            # One line a reason, not one a ScaledObject (2,000 a reload, hostile pass 62).
            log.error(
                "%d ScaledObject(s) keep their policy (%s/%s among them): %s",
                len(keys),
                *keys[0],
                why,
            )

    def evict_idle(self, ttl: float) -> list[ObjectKey]:
        """Forget ScaledObjects KEDA has not asked about for ``ttl`` seconds.

        KEDA never says a ScaledObject was deleted; without this the registry (and its
        metrics) would keep every one ever seen. One with an open StreamIsActive stays.
        """
        now = self._clock()
        gone = [
            key
            for key, scaled in self._objects.items()
            if now - scaled.last_seen > ttl and not scaled.activation_listeners
        ]
        for key in gone:
            self._unbind(self._objects.pop(key))
            log.info("forgot ScaledObject %s/%s (not asked about for %.0fs)", *key, ttl)
        return gone

    def _forget_absent(self) -> bool:
        """Forget every ScaledObject the API server does not have; whether any went.

        Names made up before the API server's list came (or kept refreshed by their
        caller) would otherwise hold the registry full against KEDA's own new ones.
        """
        listed = None if self.confirm is None else self.confirm.listed
        if listed is None or listed is self._scanned:
            return False  # a list already scanned finds nothing new
        self._scanned = listed
        gone = [
            key
            for key, scaled in self._objects.items()
            if self._standing(key, scaled.raw_metadata) is Standing.ABSENT
        ]
        for key in gone:
            self._unbind(self._objects.pop(key))
        if gone:
            log.warning(
                "registry full: forgot %d ScaledObjects the API server does not have", len(gone)
            )
        return bool(gone)

    def _unbind(self, scaled: ScaledObject) -> None:
        """Take ``scaled`` off its target; a target nothing scales any more is dropped.

        An emptied target's set was kept: a client editing one ScaledObject to name a
        new deployment each call grew the registry by a target a call, for good (50,000
        edits: +28 MiB, every Prometheus round and eviction walking them; issue 27,
        hostile pass 7, SY-H3).
        """
        bound = self._by_target.get(scaled.target)
        self._crowded_logged.discard(scaled.target[:2])  # room again: a new filling is logged
        if bound is not None:
            bound.discard(scaled)
            if not bound:
                del self._by_target[scaled.target]
        named = self._by_workload.get(scaled.target[:2])
        if named is not None:
            named.discard(scaled)
            if not named:
                del self._by_workload[scaled.target[:2]]

    def objects(self) -> list[ScaledObject]:
        """Every ScaledObject KEDA has asked about."""
        return list(self._objects.values())

    def naming(self, namespace: str, deployment: str) -> list[ScaledObject]:
        """The ScaledObjects naming one deployment, whatever model, by key.

        At most twice ``MAX_PER_TARGET``: a walk over every ScaledObject a call, 10,000
        of them, held the loop for anyone reaching the port (hostile pass 61).
        """
        return sorted(self._by_workload.get((namespace, deployment), ()), key=lambda s: s.key)

    def targets(self) -> list[TargetKey]:
        """Every target some ScaledObject scales (what a polling source must query)."""
        return [target for target, bound in self._by_target.items() if bound]

    def get(self, namespace: str, name: str) -> ScaledObject | None:
        """The ScaledObject if KEDA has asked about it."""
        return self._objects.get((namespace, name))

    def resolve(self, name: str, namespace: str, raw: Mapping[str, str]) -> ScaledObject:
        """The ScaledObject for a KEDA ref, (re)parsing its metadata when it changed.

        Raises:
            MetadataError: the metadata is invalid; an earlier valid entry is kept.
            RegistryFullError: a new ScaledObject past ``max_objects``.
        """
        if not name or not namespace:
            raise MetadataError("ScaledObjectRef needs both name and namespace")
        refuse_oversized(raw, name=name, namespace=namespace)
        key = (namespace, name)
        existing = self._objects.get(key)
        metadata_map = dict(raw)
        found = self._standing(key, metadata_map)
        if found in (Standing.ABSENT, Standing.DIFFERS):
            self.errors["unconfirmed-call"] += 1
            raise MetadataError(_NOT_THE_API_SERVERS[found])
        if existing is not None and existing.raw_metadata == metadata_map:
            existing.last_seen = self._clock()
            return existing
        if found is Standing.CONFIRMED and existing is not None:
            if self._standing(key, existing.raw_metadata) is Standing.CONFIRMED:
                # Both are the API server's: two triggers, not an edit (which lists one).
                raise _second_trigger_error(existing, metadata_map)
            # The API server's trigger replaces what it does not vouch for at once.
            existing.rivals, existing.replaced, existing.returns = (), (), 0
            existing.changed_at = -math.inf
        # An edit right after an edit waits for the push gap as signals do (a client
        # sending new metadata each call decided each call); KEDA edits minutes apart.
        quick_edit = existing is not None and self._clock() - existing.changed_at < self._push_gap
        if existing is None:
            self._check_room()
        elif self._second_trigger(existing, metadata_map):
            raise _second_trigger_error(existing, metadata_map)
        own_profiles = [own.name for own in self._policy_defaults.profiles]
        metadata = parse_metadata(
            metadata_map, name=name, namespace=namespace, profiles=own_profiles
        )
        policy = metadata.policy(self._policy_defaults)
        standby = _standby(metadata, policy)
        target: TargetKey = (metadata.namespace or namespace, metadata.deployment, metadata.model)
        self._check_target_room(target, namespace, existing)
        max_age = metadata.max_signal_age or self._default_max_age
        if existing is None:
            scaled = ScaledObject(key, metadata_map, metadata, target, policy, max_age)
            scaled.standby = standby
            scaled.last_seen = self._clock()
            self._objects[key] = scaled
            log.info("tracking ScaledObject %s/%s for %s", namespace, name, describe_target(target))
        else:
            # Update in place: open StreamIsActive calls keep their listeners.
            scaled = existing
            self._unbind(scaled)
            if target != scaled.target:
                # Another deployment's load, mix and season are no history of this one's:
                # kept, a retarget from 40 replicas to 2 asked for 40 through the window.
                scaled.state, scaled.standby_state = DecisionState(), StandbyState()
            scaled.raw_metadata, scaled.metadata, scaled.target = metadata_map, metadata, target
            scaled.policy, scaled.standby = policy, standby
            scaled.max_signal_age = max_age
            scaled.signals_version = -1
            scaled.last_seen = now = self._clock()
            # One INFO line a minute: a client sending new metadata each call is no log flood.
            level = logging.INFO if now - scaled.edit_logged_at >= 60.0 else logging.DEBUG
            if level == logging.INFO:
                scaled.edit_logged_at = now
            log.log(level, "ScaledObject %s/%s metadata changed", namespace, name)
        self._by_target.setdefault(target, set()).add(scaled)
        self._by_workload.setdefault(target[:2], set()).add(scaled)
        now = self._clock()
        if not quick_edit:
            self._refresh(scaled, now)
            return scaled
        self._decide(scaled, now, asked=False)  # kept at most once a gap, as signals are
        if scaled.signals_version == -1:
            # Not decided: the call is still answered on its own metadata, never on the
            # edit before (a caller sending other metadata under KEDA's name just before
            # each of its calls had KEDA answered 0 for a busy deployment, hostile pass
            # 60); what this decision learns is not kept, so edits grow no window.
            self._refresh(scaled, now, keep=False)
        return scaled

    def _standing(self, key: ObjectKey, raw: Mapping[str, str]) -> Standing:
        """What the API server says of a call for ``key`` with ``raw`` metadata."""
        if self.confirm is None:
            return Standing.UNLISTED
        return standing(self.confirm.listed, key, raw)

    def _second_trigger(self, scaled: ScaledObject, raw: dict[str, str]) -> bool:
        """Whether ``raw`` is another trigger's metadata, not an edit of the first.

        KEDA sends a ScaledObject's every trigger with the same name, so two unitscale
        triggers alternate: each call replaced the other's metadata and both shared one
        decision state (the idle one answered the busy one's peak). A quick return to a
        metadata map just replaced, the second time running, is taken for that; from
        then on the other is refused while the current one is asked about, and so is any
        further quick return (a third trigger: A, B, C, A, ... had been an edit a call,
        two INFO lines each, issue 27, hostile pass 6, S6-M1). Otherwise the change is an
        edit, remembered for the next.
        """
        now = self._clock()
        if raw in scaled.rivals:
            if now - scaled.last_seen <= SECOND_TRIGGER_WINDOW:
                return True
            scaled.rivals = ()  # the current one is gone: this is the trigger now
        returning = now - scaled.changed_at <= SECOND_TRIGGER_WINDOW and raw in scaled.replaced
        scaled.returns = scaled.returns + 1 if returning else 0
        if returning and (scaled.rivals or scaled.returns >= 2):
            scaled.returns = 0
            if len(scaled.rivals) < MAX_RIVALS:
                scaled.rivals = (*scaled.rivals, raw)
                log.warning(
                    "ScaledObject %s/%s has more than one unitscale trigger (deployments %s"
                    " and %s): the other is refused",
                    *scaled.key,
                    quote(scaled.raw_metadata.get("deployment")),
                    quote(raw.get("deployment")),
                )
            return True
        kept = [m for m in scaled.replaced if m != raw and m != scaled.raw_metadata]
        scaled.replaced = (*kept, scaled.raw_metadata)[-MAX_RIVALS:]
        scaled.changed_at = now
        return False

    def _check_target_room(
        self, target: TargetKey, namespace: str, existing: ScaledObject | None
    ) -> None:
        """Refuse one more ScaledObject of ``namespace`` naming ``target`` past its share.

        Two shares of ``MAX_PER_TARGET``: the ScaledObjects of the target's own namespace,
        and those of every other namespace together (the trigger's ``namespace`` names
        another's deployment). Another tenant never takes the own namespace's slots, and
        no spread over namespaces grows a target's decisions past twice the bound (500
        namespaces of 8 each brought pass 57's freeze back, hostile pass 58).

        Raises:
            RegistryFullError: the target's share is full (counted, logged once a filling
                of that target).
        """
        own = namespace == target[0]
        workload = target[:2]
        named = self._by_workload.get(workload, ())
        bound = {s for s in named if (s.key[0] == target[0]) == own}
        if len(bound) < MAX_PER_TARGET:
            self._crowded_logged.discard(workload)
            return
        if existing is not None and existing in bound:
            return
        where = describe_target((*workload, ""))
        # Names made up before the API server's list came held the share for their whole
        # TTL against the ScaledObject it has (hostile pass 59): those it lacks go first.
        absent = [s for s in bound if self._standing(s.key, s.raw_metadata) is Standing.ABSENT]
        for scaled in absent:
            self._unbind(self._objects.pop(scaled.key))
        if absent:
            log.warning(
                "%s: forgot %d ScaledObjects naming it that the API server does not have",
                where,
                len(absent),
            )
            return
        self.errors["target-full"] += 1
        if workload not in self._crowded_logged:
            self._crowded_logged.add(workload)
            log.error(
                "refusing ScaledObjects naming %s: %d name it already, the most one"
                " deployment takes",
                where,
                len(bound),
            )
        whose = "its own namespace" if own else "other namespaces"
        raise RegistryFullError(
            f"{where} is named by {len(bound)} ScaledObjects of {whose}"
            f" already (whatever model), the most one deployment takes from them"
            f" ({MAX_PER_TARGET})"
        )

    def _check_room(self) -> None:
        """Refuse a new ScaledObject past ``max_objects``: counted, logged once a filling.

        Raises:
            RegistryFullError: the registry is full.
        """
        if len(self._objects) < self._max_objects:
            self._full_logged = False
            return
        if self._forget_absent():
            return
        self.errors["full"] += 1
        if not self._full_logged:
            self._full_logged = True
            log.error(
                "refusing new ScaledObjects: %d kept already, the most one scaler keeps"
                " (each is forgotten after scaled-object-ttl without a KEDA call)",
                len(self._objects),
            )
        raise RegistryFullError(
            f"this scaler keeps {self._max_objects:,} ScaledObjects already, the most it"
            " keeps; run another scaler for more"
        )

    def current(self, scaled: ScaledObject) -> Decision:
        """The decision to answer KEDA with now.

        Raises:
            NoDataError: no signals, or only stale ones, for the ScaledObject's target.
        """
        now = self._clock()
        signals = self._store.get(scaled.target)
        version = signals.version if signals is not None else 0
        if now > scaled.valid_until:
            # Stale or failed: looked at again at once, but kept at most once a gap (a
            # source dating its snapshots just inside the age made every call a kept
            # decision, each a window sample, hostile pass 61).
            self._refresh(scaled, now, keep=self._gap_left(scaled, now) is None)
        elif version != scaled.signals_version:
            self._decide(scaled, now, asked=True)
        if scaled.decision is None:
            assert scaled.error is not None
            # The error is kept between calls: raised as it is, each raise added the
            # caller's frames to its traceback, held for good (5.5 KB a call, a scaler
            # at 3 GB in 20 s of calls about ScaledObjects without signals, hostile pass
            # 60); a copy is raised, so the kept one holds no frames at all (pass 61).
            raise copy.copy(scaled.error)
        return scaled.decision

    def add_decision_hook(self, hook: DecisionHook) -> None:
        """Pass every new decision through ``hook(scaled, decision, now)``, in order.

        What the hook returns is the decision kept (the prewarm adds to its reason). It
        runs inside the decision, so it must not block.
        """
        self._decision_hooks.append(hook)

    def add_activation_listener(self, scaled: ScaledObject, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on each inactive-to-active transition of ``scaled``."""
        scaled.activation_listeners.add(listener)

    def remove_activation_listener(
        self, scaled: ScaledObject, listener: Callable[[], None]
    ) -> None:
        """Stop calling ``listener``."""
        scaled.activation_listeners.discard(listener)

    def _on_signals(self, target: TargetKey) -> None:
        """Decide at once only where a decision cannot wait for KEDA's next call.

        That is a ScaledObject at zero with an open StreamIsActive, on signals showing
        load: its inactive-to-active transition is pushed the moment they show it (quiet
        snapshots of idle targets decided each such ScaledObject: 16 on each of 300 idle
        targets, 94% of a core, hostile pass 60). Every other decision is made
        when asked (``current`` decides on signals it has not seen), as the replay has
        always judged the scaler: deciding each ScaledObject on each snapshot cost the
        scaler a core at 16 ScaledObjects on each of 200 busy targets, another target's
        calls UNAVAILABLE (issue 27, hostile pass 59).
        """
        waiting = [
            scaled
            for scaled in self._by_target.get(target, ())
            if scaled.activation_listeners and not scaled.active
        ]
        if waiting and shows_load(self._store.get(target)):
            now = self._clock()
            for scaled in waiting:
                self._decide(scaled, now, asked=False)

    def _decide(self, scaled: ScaledObject, now: float, *, asked: bool) -> None:
        """Decide on new signals or metadata now, or once at the end of the push gap.

        Every way in is gated alike (pushed signals, KEDA's calls, quick metadata edits):
        each decision copies its windows (``Recent``), and KEDA's calls had decided on
        every snapshot not yet seen, so a fast source and a fast caller cost 3.4 ms a
        call after 10 s, growing with the window (issue 27, hostile pass 6, S6-H1). A
        decision less than the gap old stands, answered as it is; the one trailing
        decision sees the newest. Without a loop to schedule it (``later`` says no) a
        call (``asked``) decides at once, as before; pushed signals wait for the next call.
        """
        left = self._gap_left(scaled, now)
        if left is not None:
            self._decide_later(scaled, left)
            if scaled.push_pending or not asked:
                return
        self._refresh(scaled, now)

    def _gap_left(self, scaled: ScaledObject, now: float) -> float | None:
        """Seconds until the push gap since the last kept decision ends; None when past it.

        A clock that went back (``since`` negative) counts as past the gap.
        """
        if scaled.decided_at is None:
            return None
        since = now - scaled.decided_at
        return self._push_gap - since if 0 <= since < self._push_gap else None

    def _decide_later(self, scaled: ScaledObject, delay: float) -> None:
        """One trailing decision for signals that came within the push gap.

        Without ``later`` none is scheduled: the next snapshot or KEDA call decides
        (``current`` decides on any signals it has not seen).
        """
        if not scaled.push_pending and self._later is not None:
            scaled.push_pending = self._later(delay, lambda: self._decide_due(scaled))

    def _decide_due(self, scaled: ScaledObject) -> None:
        scaled.push_pending = False
        if self._objects.get(scaled.key) is not scaled:
            return  # forgotten, or its metadata replaced meanwhile
        signals = self._store.get(scaled.target)
        if (signals.version if signals is not None else 0) != scaled.signals_version:
            self._refresh(scaled, self._clock())

    def _refresh(self, scaled: ScaledObject, now: float, *, keep: bool = True) -> None:
        """Decide on the newest signals; without ``keep`` the decision is only answered.

        An answer-only decision leaves the state it learned, the transition and the
        time of the last kept decision as they were, and is decided again on the next
        call past the gap.
        """
        signals = self._store.get(scaled.target)
        scaled.signals_version = signals.version if signals is not None else 0
        try:
            observation, valid_until = observe(scaled.target, signals, now, scaled.max_signal_age)
            decision = decide(observation, scaled.policy, scaled.state)
            standby_state = scaled.standby_state
            if scaled.standby is not None:
                decision, standby_state = with_standby(
                    decision, standby_state, scaled.standby, scaled.policy, now
                )
            for hook in self._decision_hooks:
                decision = hook(scaled, decision, now)
        except NoDataError as err:
            if scaled.error is None or _kind(scaled.error) != _kind(err):
                log.info("ScaledObject %s/%s: %s", *scaled.key, err)
            self._no_decision(scaled, err, now, retry=isinstance(err, StaleSignalError))
            return
        except Exception as err:  # one ScaledObject's failure is its own, never the pass's
            scaled.decision_errors += 1
            failed = NoDataError(f"no decision for {describe_target(scaled.target)}: {err!r}")
            if scaled.error is None or str(scaled.error) != str(failed):
                log.warning("ScaledObject %s/%s: %s", *scaled.key, failed, exc_info=err)
            self._no_decision(scaled, failed, now, retry=True)
            return
        if keep:
            self._keep(scaled, decision, standby_state, valid_until, now)
            return
        scaled.decision, scaled.error, scaled.valid_until = decision, None, valid_until
        scaled.signals_version = -1

    @staticmethod
    def _no_decision(scaled: ScaledObject, err: NoDataError, now: float, retry: bool) -> None:
        """KEDA is answered UNAVAILABLE (its fallback acts) until a decision is made.

        With ``retry`` the next call looks again: stale signals age with every call (the
        message says how old), a failed decision may not fail twice. "No signals yet"
        stays true until a source reports.
        """
        scaled.decision, scaled.decided_at = None, None
        scaled.error = err.with_traceback(None)  # kept for calls, without the frames it held
        scaled.valid_until = now if retry else math.inf

    def _keep(
        self,
        scaled: ScaledObject,
        decision: Decision,
        standby_state: StandbyState,
        valid_until: float,
        now: float,
    ) -> None:
        previous = scaled.decision
        scaled.decision, scaled.error, scaled.state = decision, None, decision.state
        scaled.standby_state = standby_state
        scaled.decided_at = now
        scaled.valid_until = valid_until
        if previous is None or previous.desired_replicas != decision.desired_replicas:
            log.info(
                "ScaledObject %s/%s: desired replicas %d (%s)",
                *scaled.key,
                decision.desired_replicas,
                decision.reason,
            )
        if scaled.standby is not None and (
            previous is None or previous.sleeping_replicas != decision.sleeping_replicas
        ):
            log.info(
                "ScaledObject %s/%s: %d sleeping beside %d running (%s)",
                *scaled.key,
                decision.sleeping_replicas,
                decision.desired_replicas,
                decision.reason,
            )
        if decision.active and not scaled.active:
            self._activated(scaled)
        scaled.active = decision.active

    @staticmethod
    def _activated(scaled: ScaledObject) -> None:
        """Tell every activation listener; one that raises is its own failure.

        A listener is an open StreamIsActive (or whatever else subscribed): its bug must
        not keep the others from hearing of the transition, nor undo the decision just
        kept (that would also tell the others again on the next one). Transitions are
        rare, so each failure is one WARNING.
        """
        for listener in list(scaled.activation_listeners):
            try:
                listener()
            except Exception as err:
                scaled.listener_errors += 1
                log.warning(
                    "ScaledObject %s/%s: an activation listener failed: %r",
                    *scaled.key,
                    err,
                    exc_info=err,
                )


def _standby(metadata: TriggerMetadata, policy: Policy) -> StandbySetup | None:
    """The standby plan's setup for a trigger with ``standby: true``, else None.

    Raises:
        MetadataError: standby without a profile to price the sleepers with.
    """
    knobs = metadata.standby_policy()
    if knobs is None:
        return None
    try:
        return standby_setup(policy, knobs, cache=metadata.fluid_dataset is not None)
    except ValueError as err:
        raise MetadataError(f"invalid scalerMetadata: standby: {err}") from err


def _kind(err: NoDataError) -> str:
    """What a no-data error says, less the ages in it: a change is worth a log line."""
    return "stale" if isinstance(err, StaleSignalError) else str(err)
