"""HAMi's GPU inventory, read from its node and pod annotations (pure).

HAMi (``Project-HAMi/HAMi``, v2.10.0) keeps no CRD: the device plugin writes each
node's cards into ``hami.io/node-nvidia-register`` (a JSON array since v2.8.0, a
``:``-separated text before), the scheduler writes what it gave each pod into
``hami.io/vgpu-devices-allocated`` and rebuilds its view of free capacity from those
two, as this module does. The inventory says, per node, what every card still offers
(slots, memory, cores) once the pods HAMi placed are taken off, and lists every node or
annotation it had to leave out with the reason (``Inventory.problems``); one malformed
node or pod never hides the others. Every value read is bounded (lengths, digits, device
and share counts: the ``MAX_*`` constants), so no annotation can make a pass slow or big.

What HAMi does and this module follows (its ``pkg/device/devices.go``,
``pkg/scheduler/scheduler.go``, ``pkg/device/nvidia/device.go``):

- a pod holds its allocation until its phase is ``Succeeded`` or ``Failed``; its node is
  ``hami.io/vgpu-node`` (the scheduler's choice), else ``spec.nodeName``;
- a MIG instance (``GPU-…[1-2]``) counts against its physical card. A malformed
  allocation counts as nothing in HAMi; here its node offers nothing while it stays
  unreadable (and it is listed), since what the pod holds there is unknown;
- ``hami.io/node-handshake`` ``Requesting_<time>`` older than the timeout means the
  device plugin stopped answering: the node offers nothing unless the kubelet still
  allocates ``nvidia.com/gpu`` there (HAMi keeps such a node); an unreadable time is
  taken as healthy, as HAMi does. HAMi parses the time in its own local zone; this
  module reads it as UTC, the zone of a container that sets no ``TZ``;
- unhealthy cards and the UUIDs in ``hami.io/device-cordon`` take no new pods.

Left out on purpose: MIG-mode cards (HAMi fits MIG profiles, not memory shares: they are
listed as a problem and offered nowhere), HAMi's ResourceQuota accounting, and the
device plugin's memory/core scaling factors (the register already carries the scaled
values).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Final, NamedTuple

from admission import annotations as names
from foundation.errors import UnitscaleError, quote
from foundation.objects import RawObject

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases in which HAMi no longer counts what the pod was given."""

HANDSHAKE_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y.%m.%d %H:%M:%S")
"""Go's ``time.DateTime`` (HAMi today) and the dotted layout older releases wrote."""

MAX_ANNOTATION_CHARS: Final = 256 * 1024
"""Characters of one annotation value read. Kubernetes caps all of an object's
annotations together at 256 KiB, so a longer value did not come through the API server;
refusing it keeps a pass from parsing megabytes for every node on every pass."""
MAX_DEVICES_PER_NODE: Final = 64
"""Cards one node may register. Real nodes carry 1 to 16 (an HGX board has 8, the
largest 16); 64 leaves room for denser boxes, while a node of 10**7 cards (each one a
branch of every fit's search, every pass) is refused as unmeasured."""
MAX_SPLIT_COUNT: Final = 1024
"""Containers one card may be shared by (HAMi's ``deviceSplitCount``, default 10; real
settings stay below 100). More is not a share count HAMi was configured with."""
MAX_ALLOCATION_ENTRIES: Final = 1024
"""Containers (``;``) or cards (``:``) one pod's allocation may list. A pod has a handful
of containers, each holding a few of its node's cards; 256 KiB of ``;`` is 262,144 empty
containers, which took half a second to parse on every pass (past the memo's size)."""
MAX_NAMED_UUIDS: Final = 4
"""Card UUIDs a problem names (the rest counted)."""
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.\[\]]{0,63}")
INT32_MAX: Final = 2**31 - 1
"""HAMi's register and allocation fields are Go ``int32`` (``DeviceInfo``,
``ContainerDevice``): a value beyond it, or a 5,000-digit one, was not written by HAMi."""
INT64_MAX: Final = 2**63 - 1
"""``Quantity.AsInt64`` reads nothing beyond int64; neither does ``parse_quantity``."""
MAX_QUANTITY_CHARS: Final = 64
"""A Kubernetes quantity longer than this is no quantity (int64 needs 19 digits)."""
MAX_DEVICE_TEXT_CHARS: Final = 128
"""Characters of a card's ``type`` or ``mode``. NVIDIA's names stay under 50 with HAMi's
``NVIDIA-`` prefix; both are part of every node's key, which the fit's bound cache keeps
4,096 of: 200 KB types there held ~800 MiB against the controller's 1 GiB."""
MAX_HANDSHAKE_CHARS: Final = 64
"""Characters of a handshake HAMi writes (``Requesting_2006.01.02 15:04:05``: 30). A
longer one is unreadable without being parsed, so it never reaches the parse's cache."""

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# [0-9], never \d: \d matches any Unicode digit ("١٠" is 10 to Python, not to Go's strconv)
_GO_INT = re.compile(r"[+-]?[0-9]{1,10}")
# The exponent has at most 3 digits: 1e999999999 would ask Decimal for a billion digits.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:[eE](?P<exponent>[+-]?[0-9]{1,3})|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?"
)
_SUFFIX = {
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


class HamiFormatError(UnitscaleError, ValueError):
    """A HAMi annotation value HAMi would not have written; names the device and field."""


# --- values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """One card as the device plugin registered it."""

    uuid: str
    index: int
    type: str
    """As HAMi spells it, e.g. ``NVIDIA-NVIDIA H200``; type constraints match substrings."""
    split_count: int
    """How many containers may share the card (``deviceSplitCount``, default 10)."""
    memory_mib: int
    cores: int
    """Percent of the card's SMs; 100 is the whole card."""
    numa: int
    healthy: bool
    mode: str
    """``hami-core``, ``mig`` or ``mps``; empty when the JSON register left it out."""


@dataclass(frozen=True)
class DeviceUse:
    """What one container of a pod holds on one card."""

    container: int
    """Index among the pod's containers as HAMi numbers them (init containers first)."""
    uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class DeviceState:
    """A card and what the pods on it already hold."""

    device: Device
    used_slots: int = 0
    used_memory_mib: int = 0
    used_cores: int = 0

    @property
    def free_slots(self) -> int:
        """Containers the card can still take (``count - used``)."""
        return max(0, self.device.split_count - self.used_slots)

    @property
    def free_memory_mib(self) -> int:
        """Memory not yet given out; never negative, even when HAMi over-committed."""
        return max(0, self.device.memory_mib - self.used_memory_mib)

    @property
    def free_cores(self) -> int:
        """Percent of SMs not yet given out; never negative."""
        return max(0, self.device.cores - self.used_cores)

    @property
    def untouched(self) -> bool:
        """No container holds anything on the card."""
        return self.used_slots == 0 and self.used_memory_mib == 0 and self.used_cores == 0

    @functools.cached_property
    def key(self) -> DeviceKey:
        """Everything that decides what the card can still take (not its UUID or index).

        Cached on the state (as ``usage``): a state never changes, ``taking`` makes a new
        one, and the fit compares every node by these on every search.
        """
        d = self.device
        return (
            d.type,
            d.memory_mib,
            d.cores,
            d.split_count,
            d.mode,
            self.used_slots,
            self.used_memory_mib,
            self.used_cores,
        )

    @functools.cached_property
    def usage(self) -> float:
        """How full the card is (HAMi's device score without the request): slots, cores, memory."""
        d = self.device
        return (
            (self.used_slots / d.split_count if d.split_count else 1.0)
            + (self.used_cores / d.cores if d.cores else 0.0)
            + (self.used_memory_mib / d.memory_mib if d.memory_mib else 0.0)
        )

    def taking(self, memory_mib: int, cores: int) -> DeviceState:
        """The card after one more container takes ``memory_mib`` and ``cores``."""
        return replace(
            self,
            used_slots=self.used_slots + 1,
            used_memory_mib=self.used_memory_mib + memory_mib,
            used_cores=self.used_cores + cores,
        )


@dataclass(frozen=True)
class NodeGpus:
    """One node's cards (those it offers, or in ``Inventory.pool`` all it has)."""

    name: str
    devices: tuple[DeviceState, ...]

    def device(self, uuid: str) -> DeviceState | None:
        """The card with this UUID, if the node offers it."""
        return next((d for d in self.devices if d.device.uuid == uuid), None)

    @functools.cached_property
    def key(self) -> NodeKey:
        """The multiset of its cards' keys: nodes with equal keys take the same pods."""
        return node_key(self.devices)

    @functools.cached_property
    def usage(self) -> float:
        """How full the node is: its cards' mean ``usage`` (0 without cards)."""
        return node_usage(self.devices)


DeviceKey = tuple[str, int, int, int, str, int, int, int]
"""``DeviceState.key``: type, memory, cores, slots, mode, then slots, MiB and cores used."""
NodeKey = tuple[DeviceKey, ...]


MAX_INTERNED_CARDS = 262_144
"""Cards' keys the interned node keys hold at most, all keys together (a card's key is
about 150 bytes: some 40 MB). Bounded by cards, not keys: a key holds one tuple per card,
and node states change with every pod allocated, so 65,536 keys of 64-card nodes held
600 MB (issue 27, hostile pass 9)."""


class _Interned:
    """The interned node keys and the cards they hold."""

    keys: ClassVar[dict[NodeKey, NodeKey]] = {}
    cards: ClassVar[int] = 0


def node_key(devices: Iterable[DeviceState]) -> NodeKey:
    """``NodeGpus.key`` of a node holding these cards, interned: equal keys are one object.

    A key is a tuple of tuples whose hash Python computes again on every lookup; the
    fit counts and compares nodes by their keys' ids instead, so a search over a large
    pool sets up in one pass over its nodes without hashing any (issue 28). Once the keys
    kept hold ``MAX_INTERNED_CARDS`` cards the table starts again: an equal key made after
    that is another object, which a search only tries once more (it prunes less, never
    wrongly: a search holds every key it used, so no id it remembers is reused).
    """
    key = tuple(sorted(d.key for d in devices))
    table = _Interned.keys
    known = table.get(key)
    if known is None:
        if _Interned.cards + len(key) > MAX_INTERNED_CARDS:
            table.clear()
            _Interned.cards = 0
        known = table.setdefault(key, key)
        _Interned.cards += len(key)
    return known


def node_usage(devices: Sequence[DeviceState]) -> float:
    """``NodeGpus.usage`` of a node holding these cards."""
    return sum(d.usage for d in devices) / len(devices) if devices else 0.0


class NodeColumns(NamedTuple):
    """Nodes' names, cards, keys and usage by place: what a fit starts from."""

    names: tuple[str, ...]
    devices: tuple[tuple[DeviceState, ...], ...]
    keys: tuple[NodeKey, ...]
    usage: tuple[float, ...]
    counts: Mapping[int, int]
    """Nodes per key, by the interned key's id."""


def node_columns(nodes: Sequence[NodeGpus]) -> NodeColumns:
    """``NodeColumns`` of these nodes."""
    keys = tuple(n.key for n in nodes)
    return NodeColumns(
        tuple(n.name for n in nodes),
        tuple(n.devices for n in nodes),
        keys,
        tuple(n.usage for n in nodes),
        Counter(map(id, keys)),
    )


def _moved(
    columns: NodeColumns, nodes: Sequence[NodeGpus], touched: Collection[int]
) -> NodeColumns:
    """``columns`` with the ``touched`` places read again from ``nodes``."""
    devices, keys, usage = list(columns.devices), list(columns.keys), list(columns.usage)
    counts = Counter(columns.counts)
    for i in touched:
        counts[id(keys[i])] -= 1
        if not counts[id(keys[i])]:
            del counts[id(keys[i])]
        devices[i], keys[i], usage[i] = nodes[i].devices, nodes[i].key, nodes[i].usage
        counts[id(keys[i])] += 1
    return NodeColumns(columns.names, tuple(devices), tuple(keys), tuple(usage), counts)


def _ranked(nodes: Sequence[NodeGpus], sign: float) -> tuple[int, ...]:
    """Node places by ``(sign * usage, name)``: as tuples, compared in C."""
    ranks = [sign * n.usage for n in nodes]
    names = [n.name for n in nodes]
    return tuple(i for *_, i in sorted(zip(ranks, names, range(len(nodes)), strict=True)))


@dataclass(frozen=True)
class Problem:
    """A node or pod the inventory left out or read only in part, and why."""

    subject: str
    """``node/NAME`` or ``pod/NAMESPACE/NAME``."""
    reason: str


@dataclass(frozen=True)
class DeviceTake:
    """What one container takes on one card when placed."""

    uuid: str
    memory_mib: int
    cores: int
    type: str = ""
    """The card's type as registered (what ``nvidia.com/use-gputype`` would name)."""


@dataclass(frozen=True)
class PodPlacement:
    """Where one pod of a gang goes: its node, and per GPU container the cards it takes."""

    pod_set: str
    index: int
    """The pod's number within its podSet (0-based)."""
    node: str
    containers: tuple[tuple[DeviceTake, ...], ...]

    def takes(self) -> Iterator[DeviceTake]:
        """Every card take of the pod, container after container."""
        for container in self.containers:
            yield from container


@dataclass(frozen=True)
class Inventory:
    """What HAMi's nodes offer now, the pool's hardware, and what was left out."""

    nodes: tuple[NodeGpus, ...] = ()
    """Nodes that take new pods, each with the cards it offers and their usage."""
    pool: tuple[NodeGpus, ...] = ()
    """Every node HAMi registered in the pool (also unschedulable or silent ones), every
    card on it, nothing held: the hardware a gang would have if nothing else ran."""
    problems: tuple[Problem, ...] = ()

    def node(self, name: str) -> NodeGpus | None:
        """The offering node of this name, if any."""
        i = self.positions.get(name)
        return None if i is None else self.nodes[i]

    @functools.cached_property
    def positions(self) -> Mapping[str, int]:
        """Each offering node's place in ``nodes``, by name (the same in every reserve)."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    @functools.cached_property
    def columns(self) -> NodeColumns:
        """The offering nodes as columns (``NodeColumns``)."""
        return node_columns(self.nodes)

    @functools.cached_property
    def fullest_first(self) -> tuple[int, ...]:
        """The offering nodes' places, fullest first, then by name (binpack's order)."""
        return _ranked(self.nodes, -1.0)

    @functools.cached_property
    def emptiest_first(self) -> tuple[int, ...]:
        """The offering nodes' places, emptiest first, then by name (spread's order)."""
        return _ranked(self.nodes, 1.0)

    def forget_derived(self) -> None:
        """Let go of the columns and orders worked out of the nodes.

        They take about six times the nodes' own size: an inventory kept while others
        are reserved from it keeps its nodes only (worked out again if fitted on).
        """
        for name in ("columns", "fullest_first", "emptiest_first"):
            self.__dict__.pop(name, None)

    def _derived(self, nodes: Sequence[NodeGpus], touched: Collection[int]) -> Inventory:
        """This inventory with ``nodes`` (the same names in place, those ``touched`` new).

        What was worked out of the nodes and is still known is carried, moved for the
        touched nodes only: the fit sorted a large pool's nodes for every gang it held.
        """
        after = replace(self, nodes=tuple(nodes))
        known = self.__dict__
        if "positions" in known:
            after.__dict__["positions"] = known["positions"]
        if "columns" in known:
            after.__dict__["columns"] = _moved(known["columns"], nodes, touched)
        for name, sign in (("fullest_first", -1.0), ("emptiest_first", 1.0)):
            order = known.get(name)
            if order is None:
                continue
            moved = list(order)
            for i in touched:
                moved.remove(i)

            def rank(i: int, sign: float = sign) -> tuple[float, str]:
                return (sign * nodes[i].usage, nodes[i].name)

            for i in touched:
                bisect.insort(moved, i, key=rank)
            after.__dict__[name] = tuple(moved)
        return after

    def reserve(self, placements: Iterable[PodPlacement]) -> Inventory:
        """A new inventory with these placements taken (the caller decides one by one).

        Only the nodes the placements touch are new; the others are the same objects,
        their cached keys and usage kept (a pass reserves once per Ready gang).

        Raises:
            ValueError: a placement names a node or card this inventory does not offer.
        """
        position = self.positions
        touched: dict[int, dict[str, DeviceState]] = {}
        for placement in placements:
            i = position.get(placement.node)
            if i is None:
                raise ValueError(
                    f"placement of {placement.pod_set}[{placement.index}] names node "
                    f"{placement.node!r}, which the inventory does not offer"
                )
            cards = touched.get(i)
            if cards is None:
                cards = touched[i] = {d.device.uuid: d for d in self.nodes[i].devices}
            for take in placement.takes():
                state = cards.get(take.uuid)
                if state is None:
                    raise ValueError(
                        f"placement of {placement.pod_set}[{placement.index}] names card "
                        f"{take.uuid!r}, which node {placement.node!r} does not offer"
                    )
                cards[take.uuid] = state.taking(take.memory_mib, take.cores)
        nodes = list(self.nodes)
        for i, cards in touched.items():
            nodes[i] = NodeGpus(nodes[i].name, tuple(cards.values()))
        return self._derived(nodes, touched)

    @functools.cached_property
    def pool_shapes(self) -> tuple[tuple[NodeKey, int], ...]:
        """The pool's nodes grouped by ``NodeGpus.key``: each shape and how many have it.

        What ``fit.fits_ever`` bounds a gang by, once per inventory instead of per node
        and gang (a 1,250-node pool of one kind of node is one shape).
        """
        return tuple(Counter(n.key for n in self.pool).items())


# --- parsing --------------------------------------------------------------------------


def parse_quantity(value: object) -> int | None:
    """A Kubernetes quantity as an integer, as ``Quantity.AsInt64`` reads it.

    ``None`` when it is not a whole number (``500m``, ``1.5``), beyond int64 (as
    ``AsInt64`` fails there) or no quantity at all; HAMi then ignores the resource, and so
    does the fit. Never raises, whatever ``value`` is.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) <= INT64_MAX else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= INT64_MAX else None
    if not isinstance(value, str) or len(value) > MAX_QUANTITY_CHARS:
        return None
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        return None
    if match["exponent"] is not None:
        number = number.scaleb(int(match["exponent"]))
    elif match["suffix"] is not None:
        number *= _SUFFIX[match["suffix"]]
    if abs(number) > INT64_MAX or number != number.to_integral_value():
        return None
    return int(number)


def parse_node_register(value: str) -> tuple[Device, ...]:
    """The cards of ``hami.io/node-nvidia-register``, either format.

    A value starting with ``[`` (or ``{``) is the JSON array of HAMi v2.8.0+ (every field
    ``omitempty``: absent ``health`` is false, absent ``index``/``numa`` are 0); anything
    else is the older text, ``uuid,count,devmem,devcore,type,numa,health[,index,mode]:``
    per card (7 or 9 fields; 7 means index 0 and mode ``hami-core``).

    Every field is bounded (``INT32_MAX``, ``MAX_SPLIT_COUNT``, at most
    ``MAX_DEVICES_PER_NODE`` cards): whatever the string, the result is cards HAMi could
    have registered, or this error.

    Raises:
        HamiFormatError: the value is not one HAMi writes; names the device and field.
    """
    text = _bounded(value).strip()
    if not text:
        raise HamiFormatError("the register value is empty")
    devices = _register_json(text) if text[0] in "[{" else _register_text(text)
    for i, device in enumerate(devices):
        if device.split_count > MAX_SPLIT_COUNT:
            raise HamiFormatError(
                f"device {i} ({_named(device.uuid)}): field 'count' is {device.split_count}, more "
                f"than the {MAX_SPLIT_COUNT} containers a card may be shared by"
            )
    return devices


def _bounded(value: str) -> str:
    if len(value) > MAX_ANNOTATION_CHARS:
        raise HamiFormatError(
            f"{len(value)} characters, more than the {MAX_ANNOTATION_CHARS} an annotation holds"
        )
    return value


def _too_many(count: int) -> HamiFormatError:
    return HamiFormatError(
        f"{count} devices, more than the {MAX_DEVICES_PER_NODE} a node may register"
    )


def _register_json(text: str) -> tuple[Device, ...]:
    try:
        items = json.loads(text)
    except ValueError as error:  # also an integer of more than 4,300 digits
        raise HamiFormatError(f"not valid JSON: {str(error)[:200]}") from None
    except RecursionError:
        raise HamiFormatError("JSON nested too deeply for a list of devices") from None
    if not isinstance(items, list):
        raise HamiFormatError(f"{quote(text)} is not a JSON array of devices")
    if len(items) > MAX_DEVICES_PER_NODE:
        raise _too_many(len(items))
    devices = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise HamiFormatError(f"device {i}: not a JSON object but {quote(item)}")
        uuid = item.get("id")
        if not isinstance(uuid, str) or not uuid:
            what = "is missing" if uuid is None else f"is {quote(uuid)}, not a UUID"
            raise HamiFormatError(f"device {i}: field 'id' {what}")
        where = f"device {i} ({_named(uuid)})"
        devices.append(
            Device(
                uuid=uuid,
                index=_json_int(item, "index", where),
                type=_device_text(_json_str(item, "type", where), "type", where),
                split_count=_json_int(item, "count", where),
                memory_mib=_json_int(item, "devmem", where),
                cores=_json_int(item, "devcore", where),
                numa=_json_int(item, "numa", where, negative=True),
                healthy=_json_bool(item, "health", where),
                mode=_device_text(_json_str(item, "mode", where), "mode", where),
            )
        )
    return tuple(devices)


def _json_int(item: Mapping[str, Any], key: str, where: str, *, negative: bool = False) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise HamiFormatError(f"{where}: field {key!r} is {quote(value)}, not an integer")
    if abs(value) > INT32_MAX:
        raise HamiFormatError(f"{where}: field {key!r} is beyond int32")
    if value < 0 and not negative:
        raise HamiFormatError(f"{where}: field {key!r} is {value}, negative")
    return value


def _json_str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise HamiFormatError(f"{where}: field {key!r} is {quote(value)}, not a string")
    return value


def _device_text(value: str, key: str, where: str) -> str:
    if len(value) > MAX_DEVICE_TEXT_CHARS:
        raise HamiFormatError(
            f"{where}: field {key!r} is {len(value)} characters, more than {MAX_DEVICE_TEXT_CHARS}"
        )
    return value


def _json_bool(item: Mapping[str, Any], key: str, where: str) -> bool:
    value = item.get(key, False)
    if not isinstance(value, bool):
        raise HamiFormatError(f"{where}: field {key!r} is {quote(value)}, not a boolean")
    return value


def _register_text(text: str) -> tuple[Device, ...]:
    if ":" not in text:
        raise HamiFormatError(f"{quote(text)} has no ':' device separator")
    segments = [s for s in text.split(":") if s]
    if len(segments) > MAX_DEVICES_PER_NODE:
        raise _too_many(len(segments))
    devices = []
    for i, segment in enumerate(segments):
        if "," not in segment:
            raise HamiFormatError(f"device {i}: no ',' in {quote(segment)}")
        fields = segment.split(",")
        where = f"device {i} ({_named(fields[0])})"
        if len(fields) not in (7, 9):
            raise HamiFormatError(f"{where}: {len(fields)} fields, not 7 or 9")
        long_form = len(fields) == 9
        devices.append(
            Device(
                uuid=fields[0],
                index=_text_int(fields[7], "index", where) if long_form else 0,
                type=_device_text(fields[4], "type", where),
                split_count=_text_int(fields[1], "count", where),
                memory_mib=_text_int(fields[2], "devmem", where),
                cores=_text_int(fields[3], "devcore", where),
                numa=_text_int(fields[5], "numa", where, negative=True),
                healthy=_text_bool(fields[6], "health", where),
                mode=_device_text(fields[8], "mode", where) if long_form else "hami-core",
            )
        )
    return tuple(devices)


def _text_int(text: str, key: str, where: str, *, negative: bool = False) -> int:
    if not _GO_INT.fullmatch(text):
        # more than 10 digits is nothing HAMi writes (int32), and int() of 5,000 raises
        what = (
            "beyond int32"
            if text.lstrip("+-").isascii() and text.lstrip("+-").isdecimal()
            else "not an integer"
        )
        raise HamiFormatError(f"{where}: field {key!r} is {quote(text)}, {what}")
    value = int(text)
    if abs(value) > INT32_MAX:
        raise HamiFormatError(f"{where}: field {key!r} is {text}, beyond int32")
    if value < 0 and not negative:
        raise HamiFormatError(f"{where}: field {key!r} is {quote(text)}, negative")
    return value


def _text_bool(text: str, key: str, where: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise HamiFormatError(f"{where}: field {key!r} is {quote(text)}, not a boolean")


def parse_devices_allocated(value: str) -> tuple[DeviceUse, ...]:
    """The cards of ``hami.io/vgpu-devices-allocated``, container by container.

    ``UUID,TYPE,usedmemMiB,usedcores:`` per card, ``;`` after each container (a container
    without GPUs leaves an empty entry, so indices follow the pod's containers).

    Raises:
        HamiFormatError: the value is not one HAMi writes; names the container and field.
    """
    for separator, what in ((";", "containers"), (":", "cards")):
        count = _bounded(value).count(separator)  # before splitting anything
        if count > MAX_ALLOCATION_ENTRIES:
            raise HamiFormatError(
                f"{count} {what}, more than the {MAX_ALLOCATION_ENTRIES} a pod's allocation lists"
            )
    uses = []
    for c, container in enumerate(value.split(";")):
        for d, segment in enumerate(s for s in container.split(":") if s):
            where = f"container {c}, device {d}"
            if "," not in segment:
                raise HamiFormatError(f"{where}: no ',' in {quote(segment)}")
            fields = segment.split(",")
            if len(fields) < 4:
                raise HamiFormatError(f"{where}: {len(fields)} fields, not 4")
            if not fields[0]:
                raise HamiFormatError(f"{where}: no UUID in {quote(segment)}")
            if not fields[1]:
                raise HamiFormatError(f"{where} ({_named(fields[0])}): no device type")
            where = f"{where} ({_named(fields[0])})"
            uses.append(
                DeviceUse(
                    container=c,
                    # a MIG instance is GPU-…[template-slot]: it holds its physical card
                    uuid=fields[0].split("[", 1)[0],
                    memory_mib=_text_int(fields[2], "usedmem", where),
                    cores=_text_int(fields[3], "usedcores", where),
                )
            )
    return tuple(uses)


# --- the inventory --------------------------------------------------------------------


@functools.lru_cache(maxsize=2048)
def _register_once(value: str) -> tuple[Device, ...]:
    return parse_node_register(value)


@functools.lru_cache(maxsize=16_384)
def _allocation_once(value: str) -> tuple[DeviceUse, ...]:
    return parse_devices_allocated(value)


MEMO_REGISTER_CHARS = 8192
"""A register this long or shorter (a node of 40 cards) is parsed once per distinct value,
not on every pass (each pass builds the inventory again from every node); at most 2,048
values are kept, 16 MiB of text at worst. Longer ones are parsed each time."""
MEMO_ALLOCATION_CHARS = 2048
"""The same for a pod's allocation (a few hundred characters for 8 cards): 16,384 values,
32 MiB of text at worst. The parsed values are immutable, so sharing them is safe."""


def _node_register(value: str) -> tuple[Device, ...]:
    if len(value) > MEMO_REGISTER_CHARS:
        return parse_node_register(value)
    return _register_once(value)


def _devices_allocated(value: str) -> tuple[DeviceUse, ...]:
    if len(value) > MEMO_ALLOCATION_CHARS:
        return parse_devices_allocated(value)
    return _allocation_once(value)


def holds_cards(pod: RawObject, nodes: Collection[str]) -> bool:
    """Whether HAMi placed ``pod`` and it stays: bound where HAMi chose, a card allocated.

    Bound (``spec.nodeName``) to the node HAMi's scheduler wrote (``hami.io/vgpu-node``),
    one of ``nodes`` (the Nodes there are: on one deleted undrained, a spot instance
    gone, a pod stays bound and Running until PodGC's sweep, pass 38),
    its allocation naming a card (an unreadable one counts: its node then offers
    nothing), neither finished nor being deleted. The annotations alone are no placement:
    a tenant's template may carry them (Kueue copies a template's annotations onto the
    pods), and the pods of a Ready gang not yet scheduled, or one asking no card, then
    held none while another gang was admitted onto them (hostile passes 35 to 37). A pod
    finished (a failed one a Job replaces) or being deleted (a drained or dead node's)
    holds none its gang can count on: its replacement needs one.
    """
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES or not bound_where_placed(pod):
        return False
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.HAMI_DEVICES_ALLOCATED)
    if not value or not isinstance(value, str) or pod["spec"]["nodeName"] not in nodes:
        return False
    try:
        return bool(_devices_allocated(value))
    except HamiFormatError:
        return True


def bound_where_placed(pod: RawObject) -> bool:
    """Bound (``spec.nodeName``) to the node HAMi's scheduler wrote, and not being deleted."""
    meta = pod.get("metadata") or {}
    bound = (pod.get("spec") or {}).get("nodeName")
    if not bound or not isinstance(bound, str) or meta.get("deletionTimestamp"):
        return False
    return bool((meta.get("annotations") or {}).get(names.HAMI_VGPU_NODE) == bound)


def allocation_size(pod: RawObject) -> tuple[int, int, int] | None:
    """What ``inventory`` takes off for ``pod``: (distinct cards, MiB, cores on one card).

    MiB and cores are summed over the pod's containers on each card, the most of any
    card. (0, 0, 0) when it takes nothing (finished, no allocation, no node named); None
    when the allocation is unreadable (its node then offers nothing at all).
    """
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return (0, 0, 0)
    annotations = meta.get("annotations") or {}
    value = annotations.get(names.HAMI_DEVICES_ALLOCATED)
    node = annotations.get(names.HAMI_VGPU_NODE) or (pod.get("spec") or {}).get("nodeName")
    if not value or not isinstance(node, str):
        return (0, 0, 0)
    try:
        uses = _devices_allocated(str(value))
    except HamiFormatError:
        return None
    mib: dict[str, int] = {}
    cores: dict[str, int] = {}
    for use in uses:
        mib[use.uuid] = mib.get(use.uuid, 0) + use.memory_mib
        cores[use.uuid] = cores.get(use.uuid, 0) + use.cores
    return (len(mib), max(mib.values(), default=0), max(cores.values(), default=0))


def largest_card_mib(nodes: Iterable[RawObject]) -> int:
    """The most memory of any card the Nodes register (0 when none reads)."""
    most = 0
    for obj in nodes:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(names.HAMI_NODE_REGISTER)
        if not value or not isinstance(value, str):
            continue
        try:
            devices = _node_register(value)
        except HamiFormatError:
            continue
        most = max([most, *(d.memory_mib for d in devices)])
    return most


def inventory(
    nodes: Iterable[RawObject],
    pods: Iterable[RawObject],
    *,
    now: float,
    handshake_timeout: float = 60.0,
    node_selector: Mapping[str, str] | None = None,
    ignore_pods: frozenset[str] = frozenset(),
) -> Inventory:
    """What every HAMi node offers once the pods HAMi placed are taken off.

    Args:
        nodes: Node objects (all, or those of the pool).
        pods: Pod objects; only those carrying a HAMi allocation matter.
        now: Unix seconds, for the handshake's age.
        handshake_timeout: Seconds after which an unanswered ``Requesting_`` handshake
            means the device plugin is gone (HAMi's own limit is 60).
        node_selector: Labels a pool node must carry; ``None`` takes every node HAMi
            registered. With a selector, a pool node HAMi never registered is reported.
        ignore_pods: Pod UIDs or ``namespace/name`` keys whose allocation the caller
            already counts (pods of a gang it reserved).

    Returns:
        The inventory; every node or annotation left out is in ``problems``.
    """
    problems: list[Problem] = []
    offered: dict[str, dict[str, DeviceState]] = {}
    registered: dict[str, frozenset[str]] = {}
    pool: list[NodeGpus] = []
    for obj in nodes:
        try:
            read = _read_node(obj, now, handshake_timeout, node_selector, problems)
        except Exception as error:  # one node must never hide the others
            problems.append(Problem(_subject("node", obj), f"unreadable: {_describe(error)}"))
            continue
        if read is None:
            continue
        name, devices, offers = read
        registered[name] = frozenset(d.uuid for d in devices)
        pool.append(NodeGpus(name, tuple(DeviceState(d) for d in devices)))
        if offers is not None:
            offered[name] = {d.uuid: DeviceState(d) for d in offers}
    for obj in pods:
        try:
            _take_off(obj, offered, registered, ignore_pods, problems)
        except Exception as error:  # one pod must never hide the others
            # Where its cards are is unknown too: no node is dropped for it, but it is
            # listed, and the controller warns of it.
            problems.append(Problem(_subject("pod", obj), f"unreadable: {_describe(error)}"))
    return Inventory(
        nodes=tuple(NodeGpus(name, tuple(cards.values())) for name, cards in offered.items()),
        pool=tuple(pool),
        problems=tuple(problems),
    )


def taking_pods(
    pool: Inventory, pods: Iterable[RawObject], ignore_pods: frozenset[str] = frozenset()
) -> Inventory | None:
    """``pool`` with these pods' HAMi allocations taken off too, as ``inventory`` takes them.

    For a pool built from every pod but these (a pass that saw pods only added): the
    result equals ``inventory`` over all of them, since a card's use is a sum. None when
    one of these pods is a problem ``inventory`` would report (an unreadable allocation,
    a card its node does not register): the problems' order is the pods', so only a
    build gives it.
    """
    hardware = {n.name: n for n in pool.pool}
    position = pool.positions
    registered: dict[str, frozenset[str]] = {}
    offered: dict[str, dict[str, DeviceState]] = {}
    problems: list[Problem] = []
    for obj in pods:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        node = annotations.get(names.HAMI_VGPU_NODE) or (obj.get("spec") or {}).get("nodeName")
        if isinstance(node, str) and node in hardware and node not in registered:
            registered[node] = frozenset(d.device.uuid for d in hardware[node].devices)
            if node in position:
                offered[node] = {d.device.uuid: d for d in pool.nodes[position[node]].devices}
        try:
            _take_off(obj, offered, registered, ignore_pods, problems)
        except Exception:  # as ``inventory``: a problem, which only a build reports in order
            return None
    if problems:
        return None
    nodes = list(pool.nodes)
    touched = []
    for name, cards in offered.items():
        before = nodes[position[name]]
        if any(a is not b for a, b in zip(before.devices, cards.values(), strict=True)):
            nodes[position[name]] = NodeGpus(name, tuple(cards.values()))
            touched.append(position[name])
    return pool._derived(nodes, touched)


def unreadable(kind: str, obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(subject, why)`` when a node's register or a live pod's allocation cannot be read.

    What ``inventory`` lists among its problems for the same object, found without
    building an inventory: the controller warns of each object once, by its version.
    ``kind`` is ``node`` or ``pod``; never raises.
    """
    try:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if kind == "node":
            value = annotations.get(names.HAMI_NODE_REGISTER)
            if value is not None:
                parse_node_register(str(value))
        elif (obj.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            value = annotations.get(names.HAMI_DEVICES_ALLOCATED)
            if value:
                parse_devices_allocated(str(value))
    except HamiFormatError as error:
        key = names.HAMI_NODE_REGISTER if kind == "node" else names.HAMI_DEVICES_ALLOCATED
        return _subject(kind, obj), f"{key}: {error}"
    except Exception as error:  # anything else the object holds: still only this one
        return _subject(kind, obj), f"unreadable: {_describe(error)}"
    return None


def _subject(kind: str, obj: object) -> str:
    """``node/NAME`` or ``pod/NAMESPACE/NAME`` of whatever ``obj`` is, never raising."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    parts = [meta.get("namespace")] if kind == "pod" else []
    parts.append(meta.get("name"))
    return "/".join([kind, *(p if isinstance(p, str) else "?" for p in parts)])[:300]


def _named(text: str) -> str:
    """A card's UUID as a problem names it: as written, or quoted where it is no plain name.

    A plain name (``GPU-a``, ``GPU-...[1-2]``) stays as written; anything else is quoted
    (``foundation.errors.quote``: 64 characters, escaped). A pod's allocation is a
    tenant's text: a 200 KB UUID holding newlines went whole into the controller's
    WARNING, forged log lines with it (hostile pass 7).
    """
    return text if _PLAIN_NAME.fullmatch(text) else quote(text)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:200]}"


def _read_node(
    obj: RawObject,
    now: float,
    timeout: float,
    selector: Mapping[str, str] | None,
    problems: list[Problem],
) -> tuple[str, tuple[Device, ...], tuple[Device, ...] | None] | None:
    """``(name, cards in the pool, cards offered or None)``, or None outside the pool."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem("node/?", "a node without metadata.name"))
        return None
    subject = f"node/{name}"
    labels = meta.get("labels") or {}
    if selector and any(labels.get(k) != v for k, v in selector.items()):
        wanted = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        problems.append(Problem(subject, f"labels do not match the pool selector {wanted}"))
        return None
    annotations = meta.get("annotations") or {}
    register = annotations.get(names.HAMI_NODE_REGISTER)
    if register is None:
        if selector:
            reason = f"no {names.HAMI_NODE_REGISTER} annotation: HAMi registered no GPU"
            problems.append(Problem(subject, reason))
        return None
    try:
        devices = _node_register(str(register))
    except HamiFormatError as error:
        problems.append(Problem(subject, f"{names.HAMI_NODE_REGISTER}: {error}"))
        return None
    mig = [d for d in devices if d.mode == "mig"]
    if mig:
        reason = f"{len(mig)} MIG-mode GPU(s) left out: MIG profiles are not modelled"
        problems.append(Problem(subject, reason))
        devices = tuple(d for d in devices if d.mode != "mig")
    if (obj.get("spec") or {}).get("unschedulable") is True:
        problems.append(Problem(subject, "unschedulable (cordoned)"))
        return name, devices, None
    allocatable = ((obj.get("status") or {}).get("allocatable") or {}).get(names.GPU)
    handshake = annotations.get(names.HAMI_NODE_HANDSHAKE)
    offers, stale = handshake_offers(handshake, now, timeout, parse_quantity(allocatable))
    if stale is not None:
        problems.append(Problem(subject, stale))
    if not offers:
        return name, devices, None
    cordoned = {u.strip() for u in str(annotations.get(names.HAMI_DEVICE_CORDON, "")).split(",")}
    return name, devices, tuple(d for d in devices if d.healthy and d.uuid not in cordoned)


def handshake_offers(
    value: object, now: float, timeout: float, allocatable: int | None
) -> tuple[bool, str | None]:
    """Whether the node offers its cards by HAMi's handshake, and what to report."""
    key = names.HAMI_NODE_HANDSHAKE
    offers = now < handshake_offers_until(value, timeout, allocatable)
    if not isinstance(value, str):
        return True, None
    if "Requesting" in value:
        if _handshake_asked(value) is None:
            stamp = value.partition("_")[2]
            unreadable = f"{key} {quote(value)} has an unreadable time {quote(stamp)}"
            return True, f"{unreadable}; taken as healthy, as HAMi does"
        if offers:
            return True, None
        age = now - (_handshake_asked(value) or 0.0)
        return False, (
            f"{key} asked {age:.0f} s ago (limit {timeout:.0f} s) and the device plugin has "
            f"not answered; the node allocates no {names.GPU}"
        )
    if "Deleted" in value:
        return False, f"{key} is {quote(value)}: HAMi removed its devices after a stale handshake"
    return True, None


def handshake_offers_until(value: object, timeout: float, allocatable: int | None) -> float:
    """Until when (unix seconds, exclusive) ``handshake_offers`` says the node offers cards.

    +inf: whatever the time (no handshake, an answered or unreadable one, or cards the
    device plugin allocates); -inf: never (HAMi marked it Deleted). Without ``now``, so
    that what a pass reads of a node can be kept until that time
    (``incremental.pool_fingerprint``): HAMi rewrites the text every few seconds.
    """
    if not isinstance(value, str):
        return math.inf
    if "Requesting" in value:
        asked = _handshake_asked(value)
        if asked is None or (allocatable or 0) > 0:
            return math.inf
        return asked + timeout
    return -math.inf if "Deleted" in value else math.inf


def _handshake_asked(value: str) -> float | None:
    """The time of a ``Requesting_<time>`` handshake, or None when unreadable."""
    return _handshake_time(value.partition("_")[2]) if len(value) <= MAX_HANDSHAKE_CHARS else None


@functools.lru_cache(maxsize=4096)
def _handshake_time(stamp: str) -> float | None:
    # Cached: a pass reads every node's handshake (``incremental.pool_fingerprint``).
    for fmt in HANDSHAKE_TIME_FORMATS:
        try:
            return datetime.strptime(stamp, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def _take_off(
    obj: RawObject,
    offered: dict[str, dict[str, DeviceState]],
    registered: Mapping[str, frozenset[str]],
    ignore: frozenset[str],
    problems: list[Problem],
) -> None:
    """Subtract one pod's HAMi allocation from the cards of its node."""
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    if key in ignore or meta.get("uid") in ignore:
        return
    if (obj.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return
    annotations = meta.get("annotations") or {}
    value = annotations.get(names.HAMI_DEVICES_ALLOCATED)
    if not value:
        return
    node = annotations.get(names.HAMI_VGPU_NODE) or (obj.get("spec") or {}).get("nodeName")
    if not isinstance(node, str) or node not in registered:
        return  # a node outside the pool, or one already reported
    try:
        uses = _devices_allocated(str(value))
    except HamiFormatError as error:
        # What the pod holds is unknown, so what its node has free is too: the node
        # offers nothing until the annotation reads (HAMi counts it as nothing; a check
        # that did the same could admit a gang onto cards the pod holds).
        dropped = offered.pop(node, None) is not None
        then = f"; node {node} offers nothing while it is unreadable" if dropped else ""
        problems.append(Problem(f"pod/{key}", f"{names.HAMI_DEVICES_ALLOCATED}: {error}{then}"))
        return
    unknown = sorted({u.uuid for u in uses if u.uuid not in registered[node]})
    if unknown:
        # Quoted, and a few named: a pod's own annotation (a tenant's text) is no log line.
        held = ", ".join(_named(uuid) for uuid in unknown[:MAX_NAMED_UUIDS])
        more = len(unknown) - MAX_NAMED_UUIDS
        held += f" and {more} more" if more > 0 else ""
        problems.append(Problem(f"pod/{key}", f"holds {held}, which node {node} does not register"))
    cards = offered.get(node, {})
    for use in uses:
        state = cards.get(use.uuid)
        if state is not None:
            cards[use.uuid] = state.taking(use.memory_mib, use.cores)
