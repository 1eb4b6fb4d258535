"""What a pass keeps for the next: each pool's inventory and its fit answers (pure).

A pass used to build every pool's inventory from every node and pod, refit every gang
admitted and not yet placed, and search again for every gang that did not fit. All of
that depends on a few objects only, so ``Memo`` keeps each pool's result with the
*fingerprint* of what it read, and the next pass takes it back when the fingerprint is
equal (and the time it holds for has not passed):

- a node, by what the inventory reads of it: name, HAMi register, cordons,
  ``unschedulable`` and whether its handshake offers its cards at ``now`` (HAMi rewrites
  the handshake every few seconds: its new text alone changes nothing);
- a pod on one of the pool's nodes or tied to a gang held there, by its node, its HAMi
  allocation, its phase and its ties (owners, JobSet, Kueue's Workload name);
- a Workload one of the pool's checks holds Ready, by what holding its gang back reads:
  its spec by ``metadata.generation`` (which moves with every spec change and only then;
  without one, by ``resourceVersion``), its owners, our entries' state, time and
  nodeSelector, whether it finished or was evicted, Kueue's pod counts, and for a gang
  with pods whether a reclaim may write to it. Kueue marking it Admitted, or any other
  status write, changes nothing else (one without uid or either version: nothing is kept
  for the pool, it is built every pass).

With the inventory kept, so are the fit answers made on it: ``fits_ever`` per gang (the
pool's hardware), and the gangs that did not fit the pool as the pass began (the pass
only takes cards away, so they miss for the rest of it). A gang that does not fit is
thus searched again only once something on its pool changed, a Workload admitted or
finished, a pod placed or gone, a node changed, or at the resync.

``RESYNC_SECONDS``: the controller's safety net. Every so often it also plans and decides
a pass's view from scratch, beside its loop, counts what the kept state answered
otherwise, and on any difference starts a new ``Memo``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from admission import annotations as names
from admission import hami
from admission.fit import FitResult
from admission.hami import Inventory
from admission.workload import condition_status, reclaim_guard
from foundation.objects import RawObject

RESYNC_SECONDS = 300.0
"""Seconds between passes whose view is also decided from scratch and compared: its thread
takes the GIL from the loop's passes while it runs (2 to 3 s on a 10,000-card pool)."""
MAX_POOLS = 256
"""Pools kept at most (one per pool selector, handshake limit, policy and checks)."""
MAX_ANSWERS = 4096
"""Fit answers kept per pool at most (gang shapes x node selections)."""
HELD_CHECKPOINT = 16
"""Of the gangs held back in a pool, every so many keeps the pool after it (``Held.pool``),
which a later pass resumes from: the pool after each of 5,000 gangs held on a
10,000-card pool was 70 MB more peak memory, and at most this many less one gangs are
fitted again."""


_T = TypeVar("_T")
MAX_KEYS = 262_144
"""Objects' keys kept at most (a pass's, and the last pass's)."""


class Keys:
    """What was read of each object, by the object's ``id`` and what else the read took.

    A watch replaces an object that changed and never edits it, so a read of the very
    same object stands: each entry holds its object (kept alive, so an id is never
    another object's while the entry lasts), and the keys of one pass are taken back
    by the next. Objects no pass read since the last ``begin`` are let go.
    """

    def __init__(self) -> None:
        self._now: dict[tuple[int, Hashable], tuple[RawObject, Any]] = {}
        self._last: dict[tuple[int, Hashable], tuple[RawObject, Any]] = {}

    def begin(self) -> None:
        """A new pass: the keys read before it are kept for it, the older ones let go."""
        self._last, self._now = self._now, {}

    def read(self, obj: RawObject, also: Hashable, read: Callable[[], _T]) -> _T:
        """``read()``, or what was read before of this very object (with the same ``also``)."""
        at = (id(obj), also)
        known = self._now.get(at)
        if known is None:
            known = self._last.get(at)
            if known is not None and known[0] is obj:
                self._now[at] = known
        if known is not None and known[0] is obj:
            value: _T = known[1]
            return value
        if len(self._now) >= MAX_KEYS:
            self._now.clear()
        self._now[at] = (obj, value := read())
        return value

    def __len__(self) -> int:
        return len(self._now)


class Fingerprint(NamedTuple):
    """What a pool's inventory read (``pool_fingerprint``)."""

    nodes: tuple[Hashable, ...]
    held: tuple[tuple[Any, ...], ...]
    """What is read of each Workload its checks hold Ready, its uid first."""
    pods: tuple[Hashable, ...]


class Held(NamedTuple):
    """One gang held back on a pool, and the pool after it (``decide._hold``)."""

    order: Any
    """Its place in the order of holding back."""
    uid: str
    placed: float
    """Cards' worth its placed pods hold (counted against what it is promised)."""
    has_pods: bool
    deadline: float
    """When it lets go with no event (a gang none of whose pods are matched)."""
    pool: Inventory | None
    """The pool once it (and every gang before it) is held back; None between checkpoints
    (``HELD_CHECKPOINT``): the last step, and every so many, keep theirs."""
    promised: float


class Built(NamedTuple):
    """A pool as built (``decide._pool_inventory``) or from a kept one (``Memo.pool``)."""

    pool: Inventory
    promised: float
    valid_until: float
    base: Inventory | None = None
    """The pool before any gang is held back (None: not kept)."""
    held: tuple[Held, ...] = ()
    """The gangs held back, in order, each with the pool after it."""
    ignored: frozenset[str] = frozenset()
    """The pods whose allocations ``base`` leaves out (the held gangs' pods)."""


@dataclass
class PoolEntry:
    """One pool's inventory as a pass built it, and the fit answers given on it."""

    fingerprint: Fingerprint
    built_at: float
    valid_until: float
    """The inventory holds until then (a gang held without pods lets go at its deadline)."""
    pool: Inventory
    promised: float = 0.0
    """Cards' worth promised to gangs admitted and not placed (``decide._pool_inventory``)."""
    base: Inventory | None = None
    """The pool before any gang is held back (None: not kept)."""
    held: tuple[Held, ...] = ()
    """The gangs held back in ``pool``, in order, each with the pool after it."""
    ignored: frozenset[str] = frozenset()
    """The pods whose allocations ``base`` leaves out (the held gangs' pods)."""
    ever: dict[Hashable, FitResult] = field(default_factory=dict)
    """``fits_ever`` by gang: the pool's hardware is in the fingerprint."""
    misses: dict[Hashable, FitResult] = field(default_factory=dict)
    """Gangs (with their node selection and policies) that did not fit ``pool``."""

    def remember(self, cache: dict[Hashable, FitResult], key: Hashable, fit: FitResult) -> None:
        """Keep one fit answer, a bounded number of them."""
        if len(cache) >= MAX_ANSWERS:
            cache.clear()
        cache[key] = fit


@dataclass
class Memo:
    """Pools kept across passes, by key; the controller holds one, a test a fresh one."""

    pools: dict[Hashable, PoolEntry] = field(default_factory=dict)
    built: int = 0
    """Pools built (a fingerprint not seen, or the time passed)."""
    reused: int = 0
    """Pools taken back unchanged."""
    extended: int = 0
    """Pools taken back with gangs admitted since held back on them (``extend``)."""
    touched: set[Hashable] = field(default_factory=set)
    """Pools read since ``begin``: the ones this pass's answers rest on."""
    keys: Keys = field(default_factory=Keys)
    """What each node, pod and held Workload read: the pools of one pass read the same
    objects, each once, and the next pass takes back what it read of those unchanged."""

    def begin(self) -> None:
        """A new pass: no pool read yet."""
        self.touched.clear()
        self.keys.begin()

    def pool(
        self,
        key: Hashable,
        fingerprint: Fingerprint | None,
        now: float,
        build: Callable[[], Built],
        extend: Callable[[PoolEntry], Built | None] | None = None,
    ) -> PoolEntry:
        """The pool under ``key``: the one kept if its fingerprint and time hold, else built.

        A fingerprint of None (an input that cannot be told apart from its next version)
        is built every time. ``extend`` may make the new pool from the kept one (gangs
        admitted or gone since, pods added), or say it cannot (None).
        """
        self.touched.add(key)
        kept = self.pools.get(key)
        timely = kept is not None and kept.built_at <= now < kept.valid_until
        if kept is not None and timely and fingerprint is not None:
            if kept.fingerprint == fingerprint:
                self.reused += 1
                return kept
            grown = extend(kept) if extend is not None else None
            if grown is not None:
                self.extended += 1
                entry = self._keep(key, fingerprint, now, grown)
                # The same hardware. Not the misses: a miss says what the pool had then
                # ("1 of 2 pods fit"), and a build on the pool now would say what it has.
                entry.ever = kept.ever
                return entry
        self.built += 1
        return self._keep(key, fingerprint, now, build())

    def _keep(
        self, key: Hashable, fingerprint: Fingerprint | None, now: float, built: Built
    ) -> PoolEntry:
        entry = PoolEntry(
            fingerprint or _NOTHING,
            now,
            built.valid_until,
            built.pool,
            built.promised,
            built.base,
            built.held,
            built.ignored,
        )
        if fingerprint is None:
            entry.valid_until = -math.inf  # never taken back
        if len(self.pools) >= MAX_POOLS:
            self.pools.clear()
        self.pools[key] = entry
        return entry


def pool_fingerprint(
    nodes: Sequence[RawObject],
    pods: Sequence[RawObject],
    workloads: Sequence[RawObject],
    owned: Callable[[Any], Sequence[RawObject]],
    *,
    selector: Mapping[str, str] | None,
    handshake_timeout: float,
    checks: frozenset[str],
    now: float,
    keys: Keys | None = None,
) -> Fingerprint | None:
    """What a pool's inventory reads, as a value equal across passes while it is unchanged.

    Args:
        nodes: every Node.
        pods: every Pod.
        workloads: every Workload.
        owned: a Workload's pods (``workload.owned_pods`` over the pass's index).
        selector: the pool's node selector (None: every node).
        handshake_timeout: the pool's handshake limit.
        checks: the checks whose Ready gangs hold cards here (empty: none are read).
        now: unix seconds.
        keys: the keys of objects read before (``Memo.keys``), filled in; an object
            must never be edited while it is kept (a changed object is a new one).

    Returns:
        The fingerprint, or None when a held Workload has no uid, no generation and
        no resourceVersion, a field read is not a plain value (not hashable), or two
        Nodes share a name.
    """
    in_pool: set[str] = set()
    named: set[str] = set()
    node_part: list[Hashable] = []
    for obj in nodes:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name"))
        if name in named:
            # Two Nodes of one name (a broken watch cache): a gang's node selector reads
            # labels by name, from either, in or out of the pool (hostile pass 31).
            return None
        named.add(name)
        if selector and any(labels.get(k) != v for k, v in selector.items()):
            continue
        in_pool.add(name)
        until, offering, refusing = _known(
            keys,
            obj,
            ("node", handshake_timeout),
            functools.partial(_node_keys, obj, name, handshake_timeout),
        )
        node_part.append(offering if now < until else refusing)
    held: list[tuple[Any, ...]] = []
    tied: dict[int, RawObject] = {}
    for w in workloads if checks else ():
        reads = _known(keys, w, checks, functools.partial(_held_reads, w, checks))
        if reads is None:
            continue  # not held Ready by the pool's checks
        gang = owned(w)
        read = reads[bool(gang)]
        if read is None:
            return None
        held.append(read)
        tied.update((id(pod), pod) for pod in gang)
    pod_part = []
    elsewhere: set[str] = set()
    for pod in pods:
        read = _known(keys, pod, "pod", functools.partial(_pod_key, pod))
        if read[3] in in_pool or id(pod) in tied:
            pod_part.append(read)
            if read[5] and read[5] not in in_pool:
                elsewhere.add(read[5])
    # A held gang's pod bound outside the pool counts while its Node is there
    # (``hami.holds_cards``): that Node gone undrained, the kept pool had still counted
    # the pod placed and admitted a gang onto the card the hold was for (hostile pass 39).
    node_part.append(("bound outside the pool", frozenset(elsewhere & named)))
    return Fingerprint(tuple(node_part), tuple(held), tuple(pod_part))


def added_pods(
    before: Fingerprint, after: Fingerprint, pods: Sequence[RawObject], keys: Keys
) -> list[RawObject] | None:
    """The pods ``after`` reads beyond ``before``, or None unless pods were only added.

    A watch keeps its objects in the order they first came, a changed one in its place,
    so when every pod read before is read again unchanged the new ones are the last
    read; they are found from the end of ``pods`` by the very keys this pass read.
    """
    count = len(before.pods)
    if after.pods[:count] != before.pods:
        return None  # a pod changed or gone
    wanted = {id(read) for read in after.pods[count:]}
    found: list[RawObject] = []
    for pod in reversed(pods):
        if not wanted:
            break
        read = keys.read(pod, "pod", functools.partial(_pod_key, pod))
        if id(read) in wanted:
            wanted.discard(id(read))
            found.append(pod)
    return None if wanted else found[::-1]


def _held_reads(
    w: RawObject, checks: Collection[str]
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None] | None:
    """``_held_key`` without pods and with, or None when no check of ``checks`` holds it Ready."""
    entries = (w.get("status") or {}).get("admissionChecks") or ()
    if not any(
        isinstance(e, Mapping) and e.get("name") in checks and e.get("state") == "Ready"
        for e in entries
    ):
        return None
    return _held_key(w, checks, False), _held_key(w, checks, True)


def held_changes(
    before: Sequence[tuple[Any, ...]], after: Sequence[tuple[Any, ...]]
) -> tuple[set[Any], set[Any]]:
    """The uids (each key's first item) of the held keys gone since ``before``, and added.

    A key read again of an unchanged Workload is the very same tuple (``Keys``), so
    most compare by identity; by uid, not by hashing every key of the pool again.
    """
    was = {h[0]: h for h in before}
    now = {h[0]: h for h in after}
    if len(was) != len(before) or len(now) != len(after):  # a uid twice: by the whole key
        old, new = set(before), set(after)
        return {h[0] for h in old - new}, {h[0] for h in new - old}
    gone = {uid for uid, h in was.items() if (n := now.get(uid)) is None or (n is not h and n != h)}
    added = {
        uid for uid, h in now.items() if (b := was.get(uid)) is None or (b is not h and b != h)
    }
    return gone, added


def _held_key(w: RawObject, checks: Collection[str], has_pods: bool) -> tuple[Any, ...] | None:
    """What holding a Ready gang back reads of its Workload (``decide._pool_inventory``)."""
    meta = w.get("metadata") or {}
    version = meta.get("generation") or ("rv", meta.get("resourceVersion"))
    if not meta.get("uid") or not (meta.get("generation") or meta.get("resourceVersion")):
        return None
    status = w.get("status") or {}
    ours = tuple(
        (
            e.get("name"),
            e.get("state"),
            e.get("lastTransitionTime"),
            repr(
                [
                    u.get("nodeSelector")
                    for u in e.get("podSetUpdates") or ()
                    if isinstance(u, Mapping)
                ]
            ),
        )
        for e in status.get("admissionChecks") or ()
        if isinstance(e, Mapping) and e.get("name") in checks
    )
    counts = tuple(
        (a.get("name"), a.get("count"))
        for a in (status.get("admission") or {}).get("podSetAssignments") or ()
        if isinstance(a, Mapping)
    )
    owners = tuple(
        str(o.get("uid")) for o in meta.get("ownerReferences") or () if isinstance(o, Mapping)
    )
    read = (
        meta.get("uid"),
        meta.get("namespace"),
        meta.get("name"),
        version,
        owners,
        ours,
        condition_status(w, "Finished"),
        condition_status(w, "Evicted"),
        counts,
        # The cards of a gang's placed pods count against it only where a reclaim could.
        reclaim_guard(w) if has_pods else None,
    )
    # A value of another JSON type (a generation, count or entry time that is a list)
    # cannot be told apart from its next version by a set: nothing is kept, as without a
    # uid. It raised TypeError and failed every check of the pool (hostile pass 6, H2).
    try:
        hash(read)
    except TypeError:
        return None
    return read


def _node_key(obj: RawObject, name: str, now: float, timeout: float) -> Hashable:
    """What ``hami.inventory`` reads of a node in the pool, with its handshake read at ``now``."""
    until, offering, refusing = _node_keys(obj, name, timeout)
    return offering if now < until else refusing


def _node_keys(obj: RawObject, name: str, timeout: float) -> tuple[float, Hashable, Hashable]:
    """``_node_key`` without the time, kept by ``Keys`` across passes.

    Until when the handshake offers the node's cards, the key while it does, and the key
    once it does not.
    """
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    allocatable = ((obj.get("status") or {}).get("allocatable") or {}).get(names.GPU)
    until = hami.handshake_offers_until(
        annotations.get(names.HAMI_NODE_HANDSHAKE), timeout, hami.parse_quantity(allocatable)
    )
    read = (
        name,
        str(annotations.get(names.HAMI_NODE_REGISTER)),
        str(annotations.get(names.HAMI_DEVICE_CORDON, "")),
        (obj.get("spec") or {}).get("unschedulable") is True,
        # A held gang is fitted on the nodes its granted selector names (Fluid's cache
        # labels, a LoRA seat's hostname): a label that moved left the kept pool fitting
        # it where it no longer could, and admitted another onto its cards (pass 30).
        str(sorted(labels.items()) if isinstance(labels, dict) else labels),
    )
    return until, (*read, True), (*read, False)


def _pod_node(pod: RawObject) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    node = annotations.get(names.HAMI_VGPU_NODE) or (pod.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) else None


def _known(keys: Keys | None, obj: RawObject, also: Hashable, read: Callable[[], Hashable]) -> Any:
    """``read()``, or what was read before of this very object (``Keys.read``)."""
    return read() if keys is None else keys.read(obj, also, read)


def _pod_key(pod: RawObject) -> tuple[Any, ...]:
    """What the inventory and a held gang's count read of a pod (its node fourth)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    owners = tuple(
        str(o.get("uid")) for o in meta.get("ownerReferences") or () if isinstance(o, Mapping)
    )
    return (
        meta.get("namespace"),
        meta.get("name"),
        meta.get("uid"),
        _pod_node(pod),
        str(annotations.get(names.HAMI_DEVICES_ALLOCATED, "")),
        str((pod.get("spec") or {}).get("nodeName", "")),  # bound: ``hami.holds_cards``
        bool(meta.get("deletionTimestamp")),
        str(annotations.get(names.HAMI_VGPU_NODE, "")),  # ``hami.holds_cards`` compares it
        str(annotations.get(names.KUEUE_WORKLOAD, "")),
        str(labels.get(names.JOBSET_UID, "") if isinstance(labels, Mapping) else ""),
        (pod.get("status") or {}).get("phase") in hami.TERMINAL_PHASES,
        owners,
    )


def pool_states(memo: Memo) -> dict[Any, object]:
    """Each pool read this pass as a value to compare: its nodes, hardware, cards promised."""
    return {
        k: (e.pool.nodes, e.pool.pool, e.promised)
        for k, e in memo.pools.items()
        if k in memo.touched
    }


def differences(
    compared: Mapping[str, tuple[Mapping[Any, object], Mapping[Any, object]]],
) -> dict[str, int]:
    """Per kind, how many keys the kept state and a from-scratch pass answer differently.

    ``compared`` maps a kind (``decision``, ``plan``, ``inventory``) to the two answers by
    key; a key only one side has counts for ``decision`` and ``plan`` (the same pending
    checks and pools are decided both ways), not for ``inventory`` (a kept pool no check
    reads this pass is not built from scratch).
    """
    found: dict[str, int] = {}
    for kind, (kept, fresh) in compared.items():
        keys = kept.keys() & fresh.keys() if kind == "inventory" else kept.keys() | fresh.keys()
        count = sum(1 for k in keys if kept.get(k, _ABSENT) != fresh.get(k, _ABSENT))
        if count:
            found[kind] = count
    return found


_ABSENT = object()
_NOTHING = Fingerprint((), (), ())
