"""What a Kueue Workload asks of HAMi's GPUs: its podSets' pods and containers (pure).

A Workload's ``spec.podSets[]`` become demands (``count`` pods of one template); each
container's GPU request is read the way HAMi's webhook and scheduler read it
(``pkg/device/nvidia/device.go``: limits before requests; memory, cores or a memory
percentage without ``nvidia.com/gpu`` get one GPU; a count with neither cores nor a
memory size, or with 100 % of memory, is exclusive: ``gpucores=100``). Every size a
Workload carries is bounded here, before the search (``admission.fit``) builds anything
per pod or container: a request past a bound is an error naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission import annotations as names
from admission.hami import Device, parse_quantity
from foundation.errors import quote
from foundation.objects import RawObject

MAX_GANG_PODS = 10_000
"""Pods one Workload may ask for, all podSets together. The largest training jobs run a
few thousand pods (4,096 eight-GPU nodes is 4,096 pods); past 10,000 the fit, which
builds one search level per pod, would cost seconds and hundreds of MB every pass (a gang
of 10**6 took 4.8 s and 332 MB), so such a Workload is Rejected, naming the limit."""

MAX_GPU_CONTAINERS = 16
"""GPU containers (and, apart, GPU init containers) one pod template may have. A pod runs
a few containers, the largest boards have 16 cards, and each container is a level of
every pod's placement on every node tried: 10,000 pods of 10,000 containers took 100 s
for one decision. Past it the Workload is Rejected, naming the limit."""
MAX_GPU_TYPES = 16
"""Entries ``nvidia.com/use-gputype`` or ``nouse-gputype`` may list. HAMi's own lists
name a few card models; 40,000 entries (268 KB) were tried per card per pod: 23 s for
one decision. Past it the Workload is Rejected, naming the annotation."""
MAX_GPU_TYPE_CHARS = 64
"""Characters one entry of those lists may have (HAMi's card types, such as
``NVIDIA-NVIDIA H200``, are under 40)."""
MAX_CONTAINER_NAME_CHARS = 63
"""A GPU container's name: a DNS label, as the API server holds a Job's. A Workload's
``podSets[].template`` is not validated so, and 250 KB names were kept by the fit's
cache after their Workloads were gone (hostile pass 4, H4)."""


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of HAMi, webhook defaults applied."""

    container: str = field(compare=False, hash=False)
    """Its name, for messages: no part of what it asks, so not of the fit's cache key."""
    gpus: int
    """Distinct cards the container needs."""
    memory_mib: int | None = None
    """Memory per card; ``None`` when asked as a share (``memory_percent``)."""
    memory_percent: int | None = None
    """Percent of each card's memory when no MiB were asked (HAMi's default: 100)."""
    cores: int = 0
    """Percent of each card's SMs; 100 means the card alone."""

    def memory_on(self, device: Device) -> int:
        """MiB the container takes on ``device`` (a percentage as HAMi rounds it)."""
        return self.memory_of(device.memory_mib)

    def memory_of(self, card_mib: int) -> int:
        """MiB the container takes on a card of ``card_mib``."""
        if self.memory_mib:
            return self.memory_mib
        percent = 100 if self.memory_percent is None else self.memory_percent
        return card_mib * percent // 100


@dataclass(frozen=True)
class PodRequest:
    """What one pod of a podSet asks: its GPU containers and the pod's type constraints."""

    containers: tuple[GpuRequest, ...] = ()
    """The containers that ask for GPUs (others do not matter here)."""
    init_containers: tuple[GpuRequest, ...] = ()
    use_types: tuple[str, ...] = ()
    """``nvidia.com/use-gputype``: a card's type must contain one of these."""
    nouse_types: tuple[str, ...] = ()
    """``nvidia.com/nouse-gputype``: a card's type must contain none of these."""
    _accepted: dict[str, bool] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    """``accepts`` by card type: decided once per type, not once per card tried."""
    _hash: int | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __hash__(self) -> int:
        # A search hashes its pods' kinds at every level: hash the fields once.
        found = self._hash
        if found is None:
            found = hash((self.containers, self.init_containers, self.use_types, self.nouse_types))
            object.__setattr__(self, "_hash", found)
        return found

    @property
    def gpus(self) -> int:
        """Cards the pod holds while it runs."""
        return sum(c.gpus for c in self.containers)

    @property
    def asks_gpus(self) -> bool:
        """Whether any of the pod's containers needs a card at all."""
        return bool(self.containers or self.init_containers)

    def accepts(self, device: Device) -> bool:
        """Whether the pod's type constraints allow this card."""
        return self.accepts_type(device.type)

    def accepts_type(self, type_: str) -> bool:
        """Whether the pod's type constraints allow cards of this type."""
        known = self._accepted.get(type_)
        if known is None:
            card = type_.upper()
            known = not (
                self.use_types and not any(t.upper() in card for t in self.use_types)
            ) and not any(t.upper() in card for t in self.nouse_types)
            if len(self._accepted) < _TYPES_REMEMBERED:
                self._accepted[type_] = known
        return known


_TYPES_REMEMBERED = 256
"""Card types one ``PodRequest`` remembers its answer for (a cluster has a few)."""


@dataclass(frozen=True)
class PodSetDemand:
    """``count`` identical pods of one Kueue podSet."""

    name: str
    count: int
    pod: PodRequest


def container_request(container: Mapping[str, Any]) -> GpuRequest | None:
    """One container's GPU request as HAMi sees it, or None when it asks for no GPU.

    Raises:
        ValueError: a memory percentage that is not a whole number 1-100, or cores that
            are not a whole number >= 0 (above 100 they are capped, as HAMi caps them),
            naming the resource: such a request reserves nothing real (-100 % of a
            card's memory let two full-card gangs onto one card). A GPU container's name
            past ``MAX_CONTAINER_NAME_CHARS``.
    """
    resources = container.get("resources") or {}
    limits: Mapping[str, Any] = resources.get("limits") or {}
    requests: Mapping[str, Any] = resources.get("requests") or {}

    def present(key: str) -> bool:
        return key in limits or key in requests

    def raw(key: str) -> object:
        return limits[key] if key in limits else requests.get(key)

    def value(key: str) -> int | None:
        return parse_quantity(raw(key))

    def share(key: str, low: int, high: int | None) -> int | None:
        """A percentage resource as a whole number ``low``-``high``, None when absent."""
        if not present(key):
            return None
        found = value(key)
        if found is None or found < low or (high is not None and found > high):
            allowed = f"{low} to {high}" if high is not None else f">= {low}"
            raise ValueError(f"{key} {quote(raw(key))} is not a whole number {allowed}")
        return found

    shares = (names.GPU_CORES, names.GPU_MEMORY, names.GPU_MEMORY_PERCENT)
    # The webhook adds nvidia.com/gpu=1 (defaultGPUNum) to limits naming only a share.
    gpus = 1 if names.GPU not in limits and any(k in limits for k in shares) else value(names.GPU)
    if gpus is None or gpus <= 0:
        return None
    memory = max(value(names.GPU_MEMORY) or 0, 0)
    percent = share(names.GPU_MEMORY_PERCENT, 1, 100)
    cores = share(names.GPU_CORES, 0, None)
    if not present(names.GPU_CORES):
        # The webhook makes a count without a memory size (or with 100 %) exclusive.
        if present(names.GPU_MEMORY_PERCENT):
            exclusive = percent == 100
        else:
            exclusive = not present(names.GPU_MEMORY)
        if exclusive:
            cores = 100
    cores = min(cores or 0, 100)  # HAMi caps cores at 100 (score.go: "can't exceed 100")
    name = container.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_CONTAINER_NAME_CHARS:
        raise ValueError(f"name: not a text of at most {MAX_CONTAINER_NAME_CHARS} characters")
    if memory > 0:
        return GpuRequest(name, gpus, memory_mib=memory, cores=cores)
    return GpuRequest(name, gpus, memory_percent=100 if percent is None else percent, cores=cores)


def pod_request(template: RawObject) -> PodRequest:
    """What each pod of a PodTemplateSpec asks for (its containers and type constraints).

    Raises:
        ValueError: more than ``MAX_GPU_CONTAINERS`` GPU containers (or init containers),
            a type list past ``MAX_GPU_TYPES`` entries or ``MAX_GPU_TYPE_CHARS`` a
            entry, or a share out of range (``container_request``); names the field.
    """
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    spec = template.get("spec") or {}
    return PodRequest(
        containers=_requests(spec.get("containers"), "containers"),
        init_containers=_requests(spec.get("initContainers"), "initContainers"),
        use_types=_types(annotations.get(names.HAMI_USE_GPUTYPE), names.HAMI_USE_GPUTYPE),
        nouse_types=_types(annotations.get(names.HAMI_NOUSE_GPUTYPE), names.HAMI_NOUSE_GPUTYPE),
    )


def _requests(
    containers: Iterable[Mapping[str, Any]] | None, field_name: str
) -> tuple[GpuRequest, ...]:
    found: list[GpuRequest] = []
    for container in containers or ():
        try:
            request = container_request(container)
        except ValueError as err:
            raise ValueError(f"{field_name} {quote(container.get('name', ''))}: {err}") from err
        if request is None:
            continue
        if len(found) == MAX_GPU_CONTAINERS:
            raise ValueError(
                f"{field_name}: more than the {MAX_GPU_CONTAINERS} GPU containers a pod may have"
            )
        found.append(request)
    return tuple(found)


def _types(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ()
    types = tuple(t.strip() for t in value.split(",") if t.strip())
    if len(types) > MAX_GPU_TYPES:
        raise ValueError(
            f"annotation {key} lists {len(types)} types, more than the {MAX_GPU_TYPES} allowed"
        )
    long = next((t for t in types if len(t) > MAX_GPU_TYPE_CHARS), None)
    if long is not None:
        raise ValueError(
            f"annotation {key}: type {quote(long)} is longer than {MAX_GPU_TYPE_CHARS} characters"
        )
    return types


def workload_demand(workload: RawObject) -> tuple[PodSetDemand, ...]:
    """The demand of a Kueue Workload, one entry per ``spec.podSets[]``.

    ``name`` defaults to ``main`` and ``count`` to 1, as Kueue defaults them; a count in
    ``status.admission.podSetAssignments`` (partial admission) wins over the spec's.

    Raises:
        ValueError: a podSet that is not one (not an object, a count that is not a whole
            number >= 0), or a gang of more than ``MAX_GANG_PODS`` pods, checked before
            anything is built per pod; a template ``pod_request`` refuses (too many GPU
            containers or types, a share out of range), naming the podSet.
    """
    admission = (workload.get("status") or {}).get("admission") or {}
    assigned = {
        a.get("name"): a["count"]
        for a in admission.get("podSetAssignments") or ()
        if isinstance(a, Mapping) and isinstance(a.get("count"), int)
    }
    pod_sets = (workload.get("spec") or {}).get("podSets") or ()
    if not isinstance(pod_sets, Sequence) or isinstance(pod_sets, str):
        raise ValueError("spec.podSets is not a list")
    counted: list[tuple[str, int, Mapping[str, Any]]] = []
    for i, pod_set in enumerate(pod_sets):
        if not isinstance(pod_set, Mapping):
            raise ValueError(f"spec.podSets[{i}] is not an object")
        name = str(pod_set.get("name") or "main")
        count = assigned.get(name, pod_set.get("count", 1))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"podSet {name}: count {quote(count)} is not a whole number >= 0")
        counted.append((name, count, pod_set))
    pods = sum(count for _, count, _ in counted)
    if pods > MAX_GANG_PODS:
        raise ValueError(f"the gang has {pods} pods, more than the {MAX_GANG_PODS} a gang may have")
    demand = []
    for name, count, pod_set in counted:
        try:
            pod = pod_request(pod_set.get("template") or {})
        except ValueError as err:
            raise ValueError(f"podSet {name}: {err}") from err
        demand.append(PodSetDemand(name, count, pod))
    return tuple(demand)
