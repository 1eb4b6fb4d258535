"""Whether a Kueue Workload's gang fits HAMi's GPUs all at once: the search (pure).

A gang is its demands as ``admission.requests`` reads them (``count`` pods of one
template, each container's GPU request as HAMi's webhook leaves it). A card takes a
container when HAMi's ``Fit`` would let it: the type matches ``nvidia.com/use-gputype``
and not ``nouse-gputype`` (case-insensitive substrings), a slot is free (``count`` per
card), the memory (MiB, or a percentage of the card) and cores are free, an exclusive
request finds the card unused, and a request without cores finds some cores left.

The gang fits when every pod of every podSet has a node at once, each pod's containers
on one node, each container on as many distinct cards as it asks. Pods are placed
largest first; nodes and cards are tried in the policy's order (binpack: the busiest
first, spread: the idlest), so the first placement found is the greedy one HAMi's
scheduler would likely make. When that pass misses, a depth-first search tries the
other nodes and card choices (states already refuted are remembered, identical nodes
and cards tried once) within a step budget; a search that runs out says ``undecided``.

Not modelled: GPU topology (NVLink pair scores of ``topology-aware`` are read as
binpack), NUMA binding, ``use-gpuuuid`` pins, ``vgpu-mode``, MIG, HAMi's ResourceQuota,
the order in which HAMi will really see the pods, and everything kube-scheduler checks
besides GPUs (CPU, memory, taints, affinity). An init container must fit on its own on
the node before the pod's containers, and holds nothing afterwards (HAMi's peak model).
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from admission.hami import (
    Device,
    DeviceKey,
    DeviceState,
    DeviceTake,
    Inventory,
    NodeColumns,
    NodeGpus,
    NodeKey,
    PodPlacement,
    node_key,
    node_usage,
)
from admission.requests import GpuRequest, PodRequest, PodSetDemand

DEFAULT_BUDGET = 5_000
"""Placements the search may try before it answers undecided. A step costs about 0.3 ms
on a pool of 100 eight-GPU nodes, so the worst case stays near 1.5 s; the capacity bound
settles most misses within a few steps."""

VISITS_PER_STEP = 4
"""Partial placements of one pod's containers on one node (states its containers reach,
each counted once) a search may visit per step of its budget, beyond two per container
of the gang (what the greedy pass visits placing pods that fit at once). Pods of many
containers of different sizes reach as many states as ways to share the cards out (one
pod of 64 such containers on one node: minutes), so the visits are bounded too: 20,000
take about 0.4 s."""

GPU_POLICIES = {"binpack": False, "spread": True, "topology-aware": False}
"""``hami.io/gpu-scheduler-policy`` values and whether cards are spread."""
NODE_POLICIES = {"binpack": False, "spread": True}
"""``hami.io/node-scheduler-policy`` values and whether nodes are spread."""

NAMES_SHOWN = 8
"""Node names a message lists before it counts the rest."""


@dataclass(frozen=True)
class FitResult:
    """Whether the gang fits, where each GPU pod would go, and a one-line reason."""

    fits: bool
    reason: str
    placements: tuple[PodPlacement, ...] = ()
    """One per pod that asks for GPUs (pods without GPU requests fit anywhere)."""
    gpu_types: tuple[str, ...] = ()
    """The card types the placements use, sorted."""
    undecided: bool = False
    """The search ran out of steps (or had nothing to search); ``fits`` is then the
    safe answer: False from ``fit_gang`` (wait), True from ``fits_ever`` (do not reject)."""

    def nodes(self, pod_set: str | None = None) -> tuple[str, ...]:
        """The nodes the placements use (of one podSet, or of all), sorted."""
        return tuple(sorted({p.node for p in self.placements if pod_set in (None, p.pod_set)}))

    def types_for(self, pod_set: str) -> tuple[str, ...]:
        """The card types one podSet's placements use, sorted."""
        takes = (t for p in self.placements if p.pod_set == pod_set for t in p.takes())
        return tuple(sorted({t.type for t in takes}))


# --- fitting --------------------------------------------------------------------------


def fit_gang(
    demand: Sequence[PodSetDemand],
    inventory: Inventory,
    policy: str = "binpack",
    *,
    node_policy: str = "binpack",
    budget: int = DEFAULT_BUDGET,
) -> FitResult:
    """Whether every pod of ``demand`` fits what the inventory's nodes offer now.

    Args:
        demand: The gang (all podSets of one Workload).
        inventory: What HAMi's nodes offer (``admission.hami.inventory``).
        policy: ``hami.io/gpu-scheduler-policy``: ``binpack``, ``spread`` or
            ``topology-aware`` (tried as binpack).
        node_policy: ``hami.io/node-scheduler-policy``: ``binpack`` or ``spread``.
        budget: Placements the search may try before it answers undecided.

    Raises:
        ValueError: an unknown policy.
    """
    spread_cards = _policy(policy, GPU_POLICIES, "gpu scheduler policy")
    spread_nodes = _policy(node_policy, NODE_POLICIES, "node scheduler policy")
    items = _items(demand)
    if not items:
        return FitResult(True, "no pod asks for a GPU")
    order = inventory.emptiest_first if spread_nodes else inventory.fullest_first
    search = _Search(items, inventory.columns, spread_cards, spread_nodes, budget, order)
    found = search.run()
    if found is not None:
        return _fitted(found)
    reason = _missed(demand, items, search, inventory.nodes)
    if search.out_of_steps:
        return FitResult(
            False, f"could not decide within {budget} placement steps; {reason}", undecided=True
        )
    return FitResult(False, reason)


def fits_ever(
    demand: Sequence[PodSetDemand], inventory: Inventory, *, budget: int = DEFAULT_BUDGET
) -> FitResult:
    """Whether the gang would fit the pool's hardware if nothing else ran.

    The pool is every node HAMi registered there, unschedulable or silent ones too, with
    every card, none held (``Inventory.pool``): only a gang that misses even that can
    never run, so only then is ``fits`` False and the caller may Reject. An empty pool or
    a search out of steps gives ``fits=True, undecided=True``: not a reason to reject.
    The placements of a fit are on the pool, for the message: never reserve them.

    A gang of one kind of pod with one GPU container (most training Jobs) is answered
    from the pool's shapes (``Inventory.pool_shapes``, once per inventory) in
    O(shapes): for such pods a node's bound is exact, so the gang fits exactly when
    the bounds add up to its pods; that fit carries no placements. Any other gang, and
    any miss (whose message says how far it got), is searched.
    """
    items = _items(demand)
    if not items:
        return FitResult(True, "no pod asks for a GPU")
    pool = inventory.pool
    if not pool:
        return FitResult(
            True,
            "no HAMi GPU node in the pool: cannot tell whether the gang fits it",
            undecided=True,
        )
    cards = sum(len(n.devices) for n in pool)
    size = f"the pool ({cards} GPU{_s(cards)} on {len(pool)} node{_s(len(pool))})"
    if _fits_by_bounds(items, inventory):
        return FitResult(True, f"fits {size} with nothing else running")
    hardware = Inventory(nodes=pool)
    search = _Search(items, hardware.columns, False, False, budget, hardware.fullest_first)
    found = search.run()
    if found is not None:
        fitted = _fitted(found)
        return FitResult(
            True, f"fits {size} with nothing else running", fitted.placements, fitted.gpu_types
        )
    reason = _missed(demand, items, search, pool)
    if search.out_of_steps:
        return FitResult(
            True,
            f"could not decide within {budget} placement steps whether it ever fits "
            f"{size}; {reason}",
            undecided=True,
        )
    return FitResult(False, f"never fits {size} even with nothing else running: {reason}")


def _fits_by_bounds(items: Sequence[_Item], inventory: Inventory) -> bool:
    """Whether a gang of one kind of single-container pod surely fits the idle pool.

    For such pods ``_node_bound`` is exact, not only an upper bound: a node takes ``p``
    pods of ``g`` distinct cards each exactly when its cards' ``min(units, p)`` add up
    to ``g * p`` (a flow of ``p`` rows of ``g`` over cards of ``units``), and nodes do
    not share pods. So the gang fits exactly when the bounds add up to its pods.
    False means "search it": other gangs, and gangs this count says miss.
    """
    pod = items[0].pod
    if len(pod.containers) != 1 or pod.init_containers:
        return False
    if any(item.pod != pod for item in items):
        return False
    room = 0
    for key, count in inventory.pool_shapes:
        room += count * _key_bound(key, pod)
        if room >= len(items):
            return True
    return False


def whole_free_gpus(inventory: Inventory) -> int:
    """Offered cards nobody holds anything on (what inference could still take whole)."""
    return sum(1 for n in inventory.nodes for d in n.devices if d.untouched)


def _policy(value: str, known: Mapping[str, bool], what: str) -> bool:
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(known)}")
    return known[value]


@dataclass(frozen=True)
class _Item:
    pod_set: str
    index: int
    pod: PodRequest


def _items(demand: Sequence[PodSetDemand]) -> list[_Item]:
    """The gang's GPU pods, largest first (first-fit decreasing); a podSet stays together."""
    # Sized once per podSet, not per pod: a stable sort of the podSets, then their pods,
    # is the order sorting the pods would give.
    ordered = sorted((d for d in demand if d.pod.asks_gpus), key=lambda d: _size(d.pod))
    return [_Item(d.name, i, d.pod) for d in ordered for i in range(d.count)]


def _size(pod: PodRequest) -> tuple[int, int, int, int]:
    containers = pod.containers or pod.init_containers
    return (
        -pod.gpus,
        -max(c.cores for c in containers),
        -max(c.memory_mib or 0 for c in containers),
        -max(c.memory_percent or 0 for c in containers),
    )


def _fitted(placements: Sequence[PodPlacement]) -> FitResult:
    nodes = sorted({p.node for p in placements})
    shown = ", ".join(nodes[:NAMES_SHOWN]) + (
        f" and {len(nodes) - NAMES_SHOWN} more" if len(nodes) > NAMES_SHOWN else ""
    )
    pods = f"{len(placements)} pod{_s(len(placements))}"
    reason = f"{pods} fit on {len(nodes)} node{_s(len(nodes))}: {shown}"
    types = tuple(sorted({t.type for p in placements for t in p.takes()}))
    return FitResult(True, reason, tuple(placements), types)


def _missed(
    demand: Sequence[PodSetDemand],
    items: Sequence[_Item],
    search: _Search,
    nodes: Sequence[NodeGpus],
) -> str:
    """Why a search found no placement.

    The first pod the greedy pass could not place, then what the gang is short of
    together when the capacity check refuted it.
    """
    reason = _miss(demand, items, search.best, nodes)
    return f"{reason}; {search.short}" if search.short else reason


def _miss(
    demand: Sequence[PodSetDemand],
    items: Sequence[_Item],
    best: Sequence[PodPlacement],
    nodes: Sequence[NodeGpus],
) -> str:
    """``podSet P: k of n pods fit; each needs …; at most m such GPUs free on one node``."""
    placed = {(p.pod_set, p.index) for p in best}
    first = next(i for i in items if (i.pod_set, i.index) not in placed)
    count = next(d.count for d in demand if d.name == first.pod_set)
    fitted = sum(1 for p in best if p.pod_set == first.pod_set)
    pod = first.pod
    request = (pod.containers or pod.init_containers)[0]
    most = max((sum(1 for d in n.devices if _take(d, request, pod)) for n in nodes), default=0)
    return (
        f"podSet {first.pod_set}: {fitted} of {count} pods fit; each needs {_describe(pod)}; "
        f"at most {most} such GPU{_s(most)} free on one node"
    )


def _describe(pod: PodRequest) -> str:
    text = " + ".join(_describe_container(c) for c in pod.containers or pod.init_containers)
    if pod.use_types:
        text += f" (type {'/'.join(pod.use_types)})"
    if pod.nouse_types:
        text += f" (not {'/'.join(pod.nouse_types)})"
    return text


def _describe_container(c: GpuRequest) -> str:
    if c.memory_mib is None and c.memory_percent == 100 and c.cores == 100:
        return f"{c.gpus} whole GPU{_s(c.gpus)}"
    memory = f"{c.memory_mib} MiB" if c.memory_mib else f"{c.memory_percent}% memory"
    text = f"{c.gpus} GPU{_s(c.gpus)} of {memory}"
    if c.cores == 100:
        return text + ", exclusive"
    return text + (f", {c.cores}% cores" if c.cores else "")


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# --- the search -----------------------------------------------------------------------


def _take(state: DeviceState, request: GpuRequest, pod: PodRequest) -> DeviceTake | None:
    """What ``request`` takes on this card, or None where HAMi's ``Fit`` refuses it."""
    device = state.device
    if not pod.accepts(device) or state.used_slots >= device.split_count:
        return None
    memory = request.memory_on(device)
    cores = request.cores
    if device.memory_mib - state.used_memory_mib < memory:
        return None
    if device.cores - state.used_cores < cores:
        return None
    if device.cores == 100 and cores == 100 and state.used_slots > 0:
        return None  # exclusive, and someone is on the card
    if device.cores and state.used_cores >= device.cores and cores == 0:
        return None  # every core is given out: a share without cores would get none
    return DeviceTake(device.uuid, memory, cores, device.type)


_Choice = tuple[tuple[DeviceTake, ...], tuple[DeviceState, ...]]
"""One container's cards and the node's cards after it took them."""
_PodChoice = tuple[tuple[tuple[DeviceTake, ...], ...], tuple[DeviceState, ...]]
"""A pod's cards, container by container, and the node's cards after it took them."""


def _choices(
    request: GpuRequest, pod: PodRequest, devices: tuple[DeviceState, ...], spread: bool
) -> Iterator[_Choice]:
    """Every distinct set of cards one container could take on a node, policy order first.

    Cards in the same state are interchangeable, so they form one group and only how
    many are taken from each group varies; the first choice takes from the groups the
    policy prefers (the greedy one).
    """
    eligible = [(i, take) for i, d in enumerate(devices) if (take := _take(d, request, pod))]
    if len(eligible) < request.gpus:
        return
    sign = 1.0 if spread else -1.0
    eligible.sort(key=lambda e: (sign * devices[e[0]].usage, devices[e[0]].device.index))
    groups: dict[DeviceKey, list[tuple[int, DeviceTake]]] = {}
    for entry in eligible:
        groups.setdefault(devices[entry[0]].key, []).append(entry)
    ordered = list(groups.values())
    for counts in _counts([len(g) for g in ordered], request.gpus):
        chosen = [entry for group, n in zip(ordered, counts, strict=True) for entry in group[:n]]
        after = list(devices)
        for i, take in chosen:
            after[i] = after[i].taking(take.memory_mib, take.cores)
        yield tuple(take for _, take in chosen), tuple(after)


def _counts(sizes: Sequence[int], k: int, start: int = 0) -> Iterator[tuple[int, ...]]:
    """Ways to take ``k`` items from groups of ``sizes``, most from the first group first."""
    if k == 0:
        yield (0,) * (len(sizes) - start)
        return
    if start == len(sizes) or sum(sizes[start:]) < k:
        return
    for n in range(min(k, sizes[start]), -1, -1):
        for rest in _counts(sizes, k - n, start + 1):
            yield (n, *rest)


class _Visits:
    """What is left of a search's budget of partial container placements."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _OutOfStepsError


def _pod_options(
    pod: PodRequest,
    devices: tuple[DeviceState, ...],
    spread: bool,
    visits: _Visits | None = None,
) -> Iterator[_PodChoice]:
    """Every way the pod's containers could sit on one node (init containers checked first).

    Each node state the containers reach is yielded once, in depth-first policy order.
    """
    for init in pod.init_containers:
        if next(_choices(init, pod, devices, spread), None) is None:
            return
    memo = (set[tuple[int, NodeKey]](), visits or _Visits(_UNBOUNDED))
    yield from _containers(pod, pod.containers, devices, (), spread, memo)


def _containers(
    pod: PodRequest,
    remaining: tuple[GpuRequest, ...],
    devices: tuple[DeviceState, ...],
    done: tuple[tuple[DeviceTake, ...], ...],
    spread: bool,
    memo: tuple[set[tuple[int, NodeKey]], _Visits],
) -> Iterator[_PodChoice]:
    # The cards' states (not which cards) and the containers left decide every state
    # reachable from here, and a depth-first walk has given them all the first time it
    # came by: without this, proving that 64 one-share containers miss a node's last
    # 16 slots tried every order of them (minutes for a gang of 150 such pods). Containers
    # of different sizes still make many states: each one visited counts in the budget.
    visited, visits = memo
    state = (len(remaining), node_key(devices))
    if state in visited:
        return
    visits.take()
    visited.add(state)
    if not remaining:
        yield done, devices
        return
    for takes, after in _choices(remaining[0], pod, devices, spread):
        yield from _containers(pod, remaining[1:], after, (*done, takes), spread, memo)


class _OutOfStepsError(Exception):
    pass


def _units(state: DeviceState, request: GpuRequest, pod: PodRequest) -> int:
    """At most how many containers like ``request`` the card could still take."""
    if _take(state, request, pod) is None:
        return 0
    device = state.device
    if device.cores == 100 and request.cores == 100:
        return 1  # exclusive: the first one shuts the card
    units = device.split_count - state.used_slots
    memory = request.memory_on(device)
    if memory > 0:
        units = min(units, (device.memory_mib - state.used_memory_mib) // memory)
    if request.cores > 0:
        units = min(units, (device.cores - state.used_cores) // request.cores)
    return units


def _node_bound(devices: Sequence[DeviceState], pod: PodRequest) -> int:
    """At most how many such pods the node could still take (each kind of container apart).

    ``q`` containers of one kind need ``gpus`` distinct cards each, so a card gives at
    most ``q`` of its units: ``q`` is possible only while the cards' ``min(units, q)``
    add up to ``gpus * q``, and that holds from 0 up to a largest ``q``. A pod holds
    ``m`` containers of the kind, so ``p`` pods need ``q = m * p``: a pod of 64
    one-share containers is bounded by 80 slots // 64 = 1 a node, not by 80.
    """
    bound = _UNBOUNDED
    kinds = Counter(replace(c, container="") for c in pod.containers)  # the name takes nothing
    for request, many in kinds.items():
        units = [u for d in devices if (u := _units(d, request, pod))]
        low, high = 0, min(bound * many, sum(units) // request.gpus)
        while low < high:
            mid = (low + high + 1) // 2
            if sum(min(u, mid) for u in units) >= request.gpus * mid:
                low = mid
            else:
                high = mid - 1
        bound = low // many
    return bound


_UNBOUNDED = 1 << 30
"""The bound of a pod whose GPUs are all in init containers: it holds nothing after."""


@functools.lru_cache(maxsize=4096)
def _key_bound(key: NodeKey, pod: PodRequest) -> int:
    """``_node_bound`` of any node whose cards have these keys (``NodeGpus.key``).

    The bound reads nothing a key leaves out (a card's UUID and index), so it is kept
    by key: a changed node has a new key, and a pool of alike nodes computes it once
    for all of them, pass after pass. 4,096 keys x pod kinds is a few MB.
    """
    return _node_bound(tuple(_state_of(k) for k in key), pod)


@functools.lru_cache(maxsize=4096)
def _key_room(key: NodeKey) -> tuple[tuple[str, int, int, int, int], ...]:
    """What the cards of a node with this key have left, by card type and size.

    One row per (type, memory): the type, its cards' memory (MiB), then the free slots,
    cores (percent, summed over cards) and memory (MiB) of those cards together.
    """
    rows: dict[tuple[str, int], tuple[int, int, int]] = {}
    for type_, memory, cores, split, _mode, slots, used_memory, used_cores in key:
        free, left, unused = rows.get((type_, memory), (0, 0, 0))
        rows[type_, memory] = (
            free + max(0, split - slots),
            left + max(0, cores - used_cores),
            unused + max(0, memory - used_memory),
        )
    return tuple((t, m, *row) for (t, m), row in rows.items())


def _short_of(items: Sequence[_Item], keys: Mapping[int, tuple[NodeKey, int]]) -> str:
    """Why the gang cannot fit these nodes together whatever the placement, or "".

    Each GPU container takes a slot, its cores and its memory on each of its cards, and
    a card gives no more than it has left: the gang's slots, cores and MiB must be within
    what the cards any of its pods accepts have left together. A necessary condition
    only (a gang within it may still miss), but one that holds whatever the mix of
    kinds: the search bounds each kind of pod apart, so two kinds each within the pool
    alone but not together (6,000 + 6,500 whole cards on 12,000) searched to the end of
    its budget on every pass, for seconds, and stayed undecided (hostile pass 14).
    ``keys`` maps an interned node key's id to the key and its nodes.
    """
    kinds = Counter(item.pod for item in items)
    rows = [
        (type_, memory, (count * slots, count * cores, count * free))
        for key, count in keys.values()
        for type_, memory, slots, cores, free in _key_room(key)
    ]
    need = [0, 0, 0]
    accepted: set[int] = set()
    for pod, n in kinds.items():
        mine = [i for i, r in enumerate(rows) if pod.accepts_type(r[0])]
        if not mine:
            return ""  # the search's bounds refute it at once, naming the type asked
        accepted.update(mine)
        smallest = min(rows[i][1] for i in mine)  # a container takes no more on a larger card
        for c in pod.containers:
            need[0] += n * c.gpus
            need[1] += n * c.gpus * c.cores
            need[2] += n * c.gpus * c.memory_of(smallest)
    have = [sum(rows[i][2][k] for i in accepted) for k in range(3)]
    shown = (
        ("GPU slots", 1),
        ("whole cards' worth of cores", 100),
        ("MiB of GPU memory", 1),
    )
    for (what, unit), needed, left in zip(shown, need, have, strict=True):
        if needed > left:
            return (
                f"its pods together need {needed / unit:,.0f} {what} and the cards they may"
                f" use have {left / unit:,.0f} left"
            )
    return ""


def _state_of(key: DeviceKey) -> DeviceState:
    """A card in the state ``key`` describes (no UUID, index 0)."""
    type_, memory, cores, split, mode, slots, used_memory, used_cores = key
    device = Device("", 0, type_, split, memory, cores, 0, True, mode)
    return DeviceState(device, slots, used_memory, used_cores)


_Candidate = tuple[int, tuple[tuple[DeviceTake, ...], ...], tuple[DeviceState, ...], NodeKey]
_Entry = tuple[PodPlacement, int, tuple[DeviceState, ...], NodeKey, float, tuple[int, ...]]
"""A placed pod and what its node was before (cards, key, usage, bounds), to undo it."""
_MemoKey = tuple[int, frozenset[tuple[int, int]]]
"""A level and the multiset of the nodes' keys, as (interned key's id, count) pairs."""


class _Search:
    """The gang's pods placed one level per pod: a greedy pass, then a pruned search.

    The search is depth-first over nodes and card choices, refuted states remembered
    (nodes as the multiset of their cards' states, so identical nodes and permutations
    of identical pods count once), and a branch is cut as soon as some kind of pod left
    has more pods than every node's upper bound for it together (``_node_bound``).

    A node as given starts with its cached key and usage (``NodeGpus``), its bounds by
    key (``_key_bound``): setting up a search is a lookup per node, not a computation.
    """

    def __init__(
        self,
        items: Sequence[_Item],
        nodes: NodeColumns,
        spread_cards: bool,
        spread_nodes: bool,
        budget: int,
        order: Sequence[int],
    ) -> None:
        # ``nodes`` and ``order`` (their places in the candidates' order, ``_rank``) as
        # the inventory keeps them from reserve to reserve (``Inventory.columns``,
        # ``fullest_first``): sorting a large pool's nodes for every gang held was most
        # of a search's setup (issue 28).
        # Keys are interned (``hami.node_key``): equal keys are one object, compared and
        # counted by id. A node key is a tuple of tuples, hashed again on every lookup;
        # on 2,000 nodes the candidates' dedupe and the memo's sorted keys were most of a
        # step (issue 27, L6).
        self.items = items
        self.names = nodes.names
        self.start = nodes.devices
        self.start_keys = nodes.keys
        self.start_usage = nodes.usage
        self.start_counts = nodes.counts
        self.start_order = order
        self.spread_cards = spread_cards
        self.spread_nodes = spread_nodes
        # The greedy pass places each pod once: those placements are not the search's
        # budget, or every gang over ``budget`` pods (up to MAX_GANG_PODS 10,000) was
        # undecided on an empty pool, pass after pass (hostile pass 13).
        self.budget = budget + len(items)
        self.steps = 0
        greedy = sum(2 * (len(item.pod.containers) + 1) for item in items)
        self.visits = _Visits(budget * VISITS_PER_STEP + greedy)
        self.out_of_steps = False
        self.short = ""
        """Why the gang cannot fit the nodes together (``_short_of``), when it cannot."""
        self.best: list[PodPlacement] = []
        self.refuted: set[_MemoKey] = set()
        self.used: list[NodeKey] = []
        """Every key the search set on a node, held for its life: the memo remembers keys
        by id, and a key freed (the interned table started again) could leave its id to
        another state, which the memo would then take for one refuted."""
        self.kinds = list(dict.fromkeys(item.pod for item in items))
        kind = {pod: k for k, pod in enumerate(self.kinds)}
        # left[i][k]: pods of kind k from level i on
        self.left = [[0] * len(self.kinds) for _ in range(len(items) + 1)]
        for i in range(len(items) - 1, -1, -1):
            self.left[i] = list(self.left[i + 1])
            self.left[i][kind[items[i].pod]] += 1
        self._reset(bounded=False)

    def _rank(self, n: int) -> tuple[float, str, int]:
        """Where node ``n`` goes in the candidates' order (binpack: fullest first)."""
        sign = 1.0 if self.spread_nodes else -1.0
        return (sign * self.usage[n], self.names[n], n)

    def _reset(self, *, bounded: bool) -> None:
        # The greedy pass needs no bounds (they only prune the search), and computing
        # them for every node is most of a fit's cost on a large pool.
        self.bounded = bounded
        self.state = list(self.start)
        self.keys = list(self.start_keys)
        self.usage = list(self.start_usage)
        # Kept in order as nodes change, not sorted again for every pod.
        self.order = list(self.start_order)
        self.counts = Counter(self.start_counts)
        self.bounds = [self._bounds(k) if bounded else () for k in self.keys]
        self.totals = [
            sum(b[k] for b in self.bounds) if bounded else 0 for k in range(len(self.kinds))
        ]

    def run(self) -> list[PodPlacement] | None:
        """The placements of every pod, or None (``best`` then holds the deepest try)."""
        try:
            found = self._greedy()
            if found is None:
                self._reset(bounded=True)
                found = self._search()
            return found
        except _OutOfStepsError:
            self.out_of_steps = True
            return None

    def _greedy(self) -> list[PodPlacement] | None:
        """The first candidate at every level: what HAMi's scheduler would likely do."""
        path: list[_Entry] = []
        try:
            for level in range(len(self.items)):
                candidate = next(self._candidates(level), None)
                if candidate is None:
                    return None
                path.append(self._apply(level, candidate))
        finally:
            self._record(path)  # once: the greedy path only grows (a copy a pod was O(P^2))
        return [entry[0] for entry in path]

    def _search(self) -> list[PodPlacement] | None:
        # An explicit stack, not recursion: a gang may have more pods than Python frames.
        if not self._may_fit(0):
            return None
        # Each kind of pod is within the nodes alone: are they all within them together?
        keys = {id(k): k for k in self.start_keys}
        self.short = _short_of(self.items, {i: (keys[i], n) for i, n in self.start_counts.items()})
        if self.short:
            return None
        path: list[_Entry] = []
        levels: list[tuple[Iterator[_Candidate], _MemoKey]] = [
            (self._candidates(0), self._memo_key(0))
        ]
        while levels:
            candidates, key = levels[-1]
            candidate = next(candidates, None)
            if candidate is None:
                self.refuted.add(key)
                levels.pop()
                if path:
                    self._undo(path.pop())
                continue
            path.append(self._apply(len(path), candidate))
            self._record(path)
            if len(path) == len(self.items):
                return [entry[0] for entry in path]
            key = self._memo_key(len(path))
            if key in self.refuted or not self._may_fit(len(path)):
                self.refuted.add(key)
                self._undo(path.pop())
                continue
            levels.append((self._candidates(len(path)), key))
        return None

    def _apply(self, level: int, candidate: _Candidate) -> _Entry:
        self.steps += 1
        if self.steps > self.budget:
            raise _OutOfStepsError
        n, takes, devices, key = candidate
        item = self.items[level]
        entry = (
            PodPlacement(item.pod_set, item.index, self.names[n], takes),
            n,
            self.state[n],
            self.keys[n],
            self.usage[n],
            self.bounds[n],
        )
        bounds = self._bounds(key) if self.bounded else ()
        self.used.append(key)
        self._set(n, devices, key, node_usage(devices), bounds)
        return entry

    def _undo(self, entry: _Entry) -> None:
        _, n, devices, key, usage, bounds = entry
        self._set(n, devices, key, usage, bounds)

    def _set(
        self,
        n: int,
        devices: tuple[DeviceState, ...],
        key: NodeKey,
        usage: float,
        bounds: tuple[int, ...],
    ) -> None:
        if self.bounded:
            for k, (old, new) in enumerate(zip(self.bounds[n], bounds, strict=True)):
                self.totals[k] += new - old
        self._track(n, key, usage)
        self.state[n], self.keys[n], self.usage[n], self.bounds[n] = devices, key, usage, bounds

    def _track(self, n: int, key: NodeKey, usage: float) -> None:
        """Keep the keys' counts and the candidates' order as node ``n`` changes."""
        self.counts[id(key)] += 1
        self.counts[id(self.keys[n])] -= 1
        if not self.counts[id(self.keys[n])]:
            del self.counts[id(self.keys[n])]  # the memo key reads only the keys held
        if usage != self.usage[n]:
            self.order.pop(bisect.bisect_left(self.order, self._rank(n), key=self._rank))
            self.usage[n] = usage
            bisect.insort(self.order, n, key=self._rank)

    def _bounds(self, key: NodeKey) -> tuple[int, ...]:
        return tuple(_key_bound(key, pod) for pod in self.kinds)

    def _may_fit(self, level: int) -> bool:
        """Whether every kind of pod left is within what all nodes together could take."""
        return all(total >= left for total, left in zip(self.totals, self.left[level], strict=True))

    def _record(self, path: Sequence[_Entry]) -> None:
        if len(path) > len(self.best):
            self.best = [entry[0] for entry in path]

    def _memo_key(self, level: int) -> _MemoKey:
        return level, frozenset(self.counts.items())

    def _candidates(self, level: int) -> Iterator[_Candidate]:
        """Where the pod at ``level`` could go, node order by policy, duplicates once."""
        pod = self.items[level].pod
        tried: set[int] = set()
        for n in list(self.order):  # a copy: deeper levels move nodes while this waits
            key = self.keys[n]
            if id(key) in tried:
                continue  # a node in the same state as one tried already
            tried.add(id(key))
            if not _key_bound(key, pod):
                # Full for this pod: its bound is kept by key and costs no visit. Binpack
                # tries the nodes it filled first, so on nodes in distinct states (a small
                # share of its own on each) the greedy pass spent pods^2/2 visits on them
                # and a 300-pod gang that fits ended undecided (hostile pass 12).
                continue
            seen: set[int] = set()
            options = _pod_options(pod, self.state[n], self.spread_cards, self.visits)
            for takes, devices in options:
                after = node_key(devices)
                if id(after) not in seen:
                    seen.add(id(after))
                    yield n, takes, devices, after
