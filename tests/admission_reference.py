"""The admission fit's straightforward forms, to check the optimised ones against.

``straightforward()`` swaps every shortcut the fit and the inventory take for the plain
computation it stands for, for as long as the context lasts:

- the cached keys and usage of cards and nodes (``DeviceState.key``, ``NodeGpus.key``,
  their ``usage``) are computed again at every read;
- a node's bound is computed from its cards at every read, not looked up by key
  (``fit._key_bound``);
- the search sets up each node's key and usage from its cards, orders the nodes by
  usage computed from their cards at every level (not from the order it keeps), and
  remembers a refuted state by its sorted keys (not by counts of interned keys);
- ``fits_ever`` always searches (no answer from the pool's shapes);
- ``Inventory.reserve`` rebuilds every node, as it did before it kept the untouched ones.

A property test runs the same inputs with and without it and asks for equal answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import pytest

from admission import fit, hami, requests
from admission.hami import DeviceState, Inventory, NodeGpus, PodPlacement


def device_key(state: DeviceState) -> hami.DeviceKey:
    d = state.device
    return (
        d.type,
        d.memory_mib,
        d.cores,
        d.split_count,
        d.mode,
        state.used_slots,
        state.used_memory_mib,
        state.used_cores,
    )


def device_usage(state: DeviceState) -> float:
    d = state.device
    return (
        (state.used_slots / d.split_count if d.split_count else 1.0)
        + (state.used_cores / d.cores if d.cores else 0.0)
        + (state.used_memory_mib / d.memory_mib if d.memory_mib else 0.0)
    )


def node_key(node: NodeGpus) -> hami.NodeKey:
    return tuple(sorted(device_key(d) for d in node.devices))


def node_usage(node: NodeGpus) -> float:
    devices = node.devices
    return sum(device_usage(d) for d in devices) / len(devices) if devices else 0.0


def key_bound(key: hami.NodeKey, pod: requests.PodRequest) -> int:
    return fit._node_bound(tuple(fit._state_of(k) for k in key), pod)


def reserve(self: Inventory, placements: Iterable[PodPlacement]) -> Inventory:
    """``Inventory.reserve`` as it was: every node rebuilt."""
    states = {n.name: {d.device.uuid: d for d in n.devices} for n in self.nodes}
    for placement in placements:
        cards = states.get(placement.node)
        if cards is None:
            raise ValueError(f"node {placement.node!r} not offered")
        for take in placement.takes():
            state = cards.get(take.uuid)
            if state is None:
                raise ValueError(f"card {take.uuid!r} not offered")
            cards[take.uuid] = state.taking(take.memory_mib, take.cores)
    nodes = tuple(NodeGpus(n.name, tuple(states[n.name].values())) for n in self.nodes)
    return Inventory(nodes, self.pool, self.problems)


def reset(self: fit._Search, *, bounded: bool) -> None:
    """``_Search._reset`` computing every node's key and bounds from its cards."""
    self.bounded = bounded
    self.state = list(self.start)
    self.keys = [tuple(sorted(device_key(d) for d in devices)) for devices in self.state]
    self.usage = [0.0] * len(self.state)  # read by nothing: candidates() computes it
    self.bounds = [
        tuple(fit._node_bound(devices, pod) for pod in self.kinds) if bounded else ()
        for devices in self.state
    ]
    self.totals = [sum(b[k] for b in self.bounds) if bounded else 0 for k in range(len(self.kinds))]


def candidates(self: fit._Search, level: int) -> Iterator[fit._Candidate]:
    """``_Search._candidates`` ordering nodes by usage computed from their cards."""

    def usage(n: int) -> float:
        devices = self.state[n]
        return sum(device_usage(d) for d in devices) / len(devices) if devices else 0.0

    pod = self.items[level].pod
    sign = 1.0 if self.spread_nodes else -1.0
    order = sorted(range(len(self.names)), key=lambda n: (sign * usage(n), self.names[n]))
    tried: set[hami.NodeKey] = set()
    for n in order:
        if self.keys[n] in tried:
            continue
        tried.add(self.keys[n])
        seen: set[hami.NodeKey] = set()
        for takes, devices in fit._pod_options(pod, self.state[n], self.spread_cards):
            after = tuple(sorted(device_key(d) for d in devices))
            if after not in seen:
                seen.add(after)
                yield n, takes, devices, after


def memo_key(self: fit._Search, level: int) -> tuple[int, tuple[hami.NodeKey, ...]]:
    """``_Search._memo_key`` as the level and the nodes' keys, sorted."""
    return level, tuple(sorted(self.keys))


@contextlib.contextmanager
def straightforward() -> Iterator[None]:
    """Every shortcut replaced by its plain computation (see the module docstring)."""
    with pytest.MonkeyPatch.context() as patch:
        # A property is a data descriptor: it wins over a value cached on the instance.
        patch.setattr(DeviceState, "key", property(device_key))
        patch.setattr(DeviceState, "usage", property(device_usage))
        patch.setattr(NodeGpus, "key", property(node_key))
        patch.setattr(NodeGpus, "usage", property(node_usage))
        patch.setattr(fit, "_key_bound", key_bound)
        patch.setattr(fit, "_fits_by_bounds", lambda items, inventory: False)
        patch.setattr(Inventory, "reserve", reserve)
        patch.setattr(fit._Search, "_reset", reset)
        patch.setattr(fit._Search, "_candidates", candidates)
        patch.setattr(fit._Search, "_track", lambda self, n, key, usage: None)
        patch.setattr(fit._Search, "_memo_key", memo_key)
        yield
