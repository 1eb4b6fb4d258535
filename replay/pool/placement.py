"""Where a task's GPUs go in a heterogeneous pool: HAMi's binpack and spread, and FGD.

Pure numpy over plain state: ``Pool`` holds, per node, the CPU (milli-cores) and memory
(MiB) free and the model, and per GPU the free share in milli (0..1000), all in node
order; ``place`` and ``release`` change it, nothing else does.

What a task takes (``replay.pool.cluster.Task``):

- ``gpus > 1``: that many whole GPUs (1000 free each) on ONE node;
- ``gpus == 1``: ``gpu_milli`` of one GPU that has at least that much free (a fractional
  share, as HAMi's ``gpucores``/``gpumem`` split one card; 1000 needs an idle GPU);
- ``gpus == 0``: nothing on a GPU (a CPU-only task still takes CPU and memory);
- always its CPU and memory on that node, on a node whose model is in ``gpu_types``
  (exact names, ``()`` = any; HAMi's ``nvidia.com/use-gputype`` matches substrings, the
  trace's specs are whole model names).

The policies (``PlacementPolicy``):

- ``binpack``: HAMi's ``hami.io/node-scheduler-policy: binpack`` with
  ``gpu-scheduler-policy: binpack`` (``pkg/scheduler/policy/node_policy.go``,
  ``gpu_policy.go``): the node with the highest score first, then within it the GPU
  with the highest score that fits. HAMi scores a node (and a GPU) as slots used over
  slots, plus cores used over cores, plus memory used over memory; here cores and
  memory are both the milli share, and each GPU has HAMi's default
  ``deviceSplitCount`` of ``HAMI_SLOTS`` slots, one per task on it: score = tasks /
  (``HAMI_SLOTS`` x GPUs) + 2 x milli used / capacity. The slot term only scores (the
  split count's limit of tasks per GPU is not enforced, for any policy): at equal
  shares it packs onto the GPU, or node, with more tasks, as HAMi does.
- ``spread``: the same scores the other way: the lowest-scored node, then GPU.
- ``fgd``: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23, §4; their
  simulator's ``NodeGpuShareFragAmount``): the (node, GPUs) whose placement increases the
  node's fragmentation measure least. For a task class m of the target workload
  (``TaskMix``) with popularity p_m, a node's fragmented capacity F_n(m) is all its free
  GPU milli when m cannot fit the node at all (CPU, memory, model or not enough GPUs
  with m's per-GPU need free), otherwise the free milli of the GPUs whose free share is
  below m's per-GPU need (1000 for whole-GPU classes). A node's fragmentation is
  Σ_m p_m F_n(m); the cluster's unallocatable GPUs are Σ_n of it. Memory is checked as
  well as CPU (their simulator checks CPU only): the trace's nodes run out of both.

Ties, for reproducible replays: the lower node index, then (binpack) the highest-scored
GPU or (spread) the lowest, then the lower GPU index. FGD breaks a tie in its gradient by
binpack's order (HAMi's default), which left the least unallocatable of the orders
tried (node index alone, spread). One placement on the full 1,213-node pool costs about
0.15 ms (binpack, spread) and 0.5 ms (fgd, p99 1.1 ms; bench/pool_placement.py).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from replay.pool.cluster import MILLI, Node, Task

PlacementPolicy = Literal["binpack", "spread", "fgd"]
POLICIES: tuple[PlacementPolicy, ...] = ("binpack", "spread", "fgd")

MIX_CLASSES = 20
"""Task shapes FGD's target workload keeps, most frequent first (99.9% of the default
pod list's GPU tasks fall in its top 20 of 24 shapes; 91% of gpuspec33's 84)."""

HAMI_SLOTS = 10
"""HAMi's default ``deviceSplitCount``: the task slots one GPU offers (its scores' slot
term; ``charts/hami/values.yaml``)."""

WEIGHT_TOLERANCE = 1e-9
"""How far a mix's popularities may sum from 1 (floating-point sums)."""

GRADIENT_DECIMALS = 6
"""FGD's gradient (milli) is rounded to this many decimals before ties are broken, so
equal placements summed in a different order still tie."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One task class of a ``TaskMix``: what its tasks ask for (``Task``'s fields)."""

    gpus: int
    gpu_milli: int
    gpu_types: tuple[str, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1 or not 1 <= self.gpu_milli <= MILLI:
            raise ValueError(f"task shape {self}: a class needs 1+ GPUs and 1..1000 milli")
        if self.gpus > 1 and self.gpu_milli != MILLI:
            raise ValueError(f"task shape {self}: a multi-GPU class takes whole GPUs")

    @property
    def cards(self) -> float:
        """GPUs' worth one task of the class holds."""
        return self.gpus * self.gpu_milli / MILLI


@dataclass(frozen=True, slots=True)
class TaskMix:
    """The target workload FGD measures fragmentation against: shapes and popularities.

    Popularities are positive and sum to 1. CPU-only tasks are not classes: a class that
    uses no GPU would count every free GPU as fragmented for its share, on every node,
    whatever the placement.
    """

    classes: tuple[tuple[TaskShape, float], ...]

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("a task mix needs at least one GPU task class")
        if any(not weight > 0 for _, weight in self.classes):
            raise ValueError("task mix popularities must be positive")
        total = sum(weight for _, weight in self.classes)
        if abs(total - 1) > WEIGHT_TOLERANCE:
            raise ValueError(f"task mix popularities sum to {total}, not 1")

    @classmethod
    def of(cls, tasks: Sequence[Task], top: int = MIX_CLASSES) -> TaskMix:
        """The ``top`` most frequent (gpus, gpu_milli, gpu_types) shapes of the GPU tasks.

        A class's CPU and memory are its tasks' (lower) medians: FGD keys classes on CPU
        too, which splits the default pod list into 126 shapes whose top 20 hold 79% of
        the tasks; the GPU shape alone keeps 99.9%. Ties in frequency: the smaller shape.

        Raises:
            ValueError: no task uses a GPU.
        """
        members: dict[tuple[int, int, tuple[str, ...]], list[Task]] = {}
        for task in tasks:
            if task.gpus > 0:
                members.setdefault((task.gpus, task.gpu_milli, task.gpu_types), []).append(task)
        if not members:
            raise ValueError("no GPU task to measure fragmentation against")
        counts = Counter({key: len(group) for key, group in members.items()})
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: max(1, top)]
        kept = sum(count for _, count in ranked)
        return cls(
            tuple(
                (
                    TaskShape(
                        *key,
                        cpu_milli=statistics.median_low(t.cpu_milli for t in members[key]),
                        memory_mib=statistics.median_low(t.memory_mib for t in members[key]),
                    ),
                    count / kept,
                )
                for key, count in ranked
            )
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a task went: its node (index) and (flat GPU index, milli) for each GPU."""

    task: str
    node: int
    gpus: tuple[tuple[int, int], ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def cards(self) -> float:
        """GPUs' worth the placement holds."""
        return sum(milli for _, milli in self.gpus) / MILLI


@dataclass(frozen=True, slots=True)
class _Candidates:
    """Ways to place one task: ``k`` GPUs of ``node`` go from ``before`` to ``after`` free."""

    node: IntArray
    gpu: IntArray
    before: IntArray
    after: IntArray
    k: int
    tasks: IntArray


@dataclass(frozen=True, slots=True)
class _MixArrays:
    """A ``TaskMix`` as arrays over the pool (one row per class), and its per-node state.

    ``count`` (GPUs with the class's need free), ``under`` (milli free on GPUs below it)
    and ``total`` (milli free) are kept up to date by ``Pool`` node by node, so a
    placement costs one node's refresh instead of a pass over every GPU.
    """

    need: IntArray
    gpus: IntArray
    cpu: IntArray
    memory: IntArray
    weight: FloatArray
    type_ok: BoolArray
    count: IntArray
    under: IntArray
    total: IntArray


class Pool:
    """The mutable state of a GPU pool; see the module docstring for the semantics."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        if not nodes:
            raise ValueError("a pool needs at least one node")
        self.nodes = tuple(nodes)
        self.models = tuple(sorted({node.model for node in nodes}))
        self._model = np.array([self.models.index(n.model) for n in nodes], dtype=np.int64)
        per_node = np.array([n.gpus for n in nodes], dtype=np.int64)
        self._offsets: IntArray = np.concatenate(([0], np.cumsum(per_node))).astype(np.int64)
        self._gpu_node: IntArray = np.repeat(np.arange(len(nodes), dtype=np.int64), per_node)
        self._capacity: IntArray = per_node * MILLI
        self.cards = int(per_node.sum())
        self._free: IntArray = np.full(self.cards, MILLI, dtype=np.int64)
        self._used: IntArray = np.zeros(len(nodes), dtype=np.int64)
        # Tasks holding each GPU (a multi-GPU task counts once on each): HAMi's slots.
        self._gpu_tasks: IntArray = np.zeros(self.cards, dtype=np.int64)
        self._node_tasks: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self._cpu: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self._memory: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self._ids = tuple(f"{n.name}/{i}" for n in nodes for i in range(n.gpus))
        self._live: dict[str, Placement] = {}
        self._types: dict[tuple[str, ...], BoolArray] = {}
        self._mix: tuple[TaskMix, _MixArrays] | None = None

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> Pool:
        """An empty pool of these nodes (GPUs flattened in node order)."""
        return cls(nodes)

    def free_milli(self) -> IntArray:
        """Each GPU's free milli, flattened in node order (a read-only view)."""
        return _read_only(self._free)

    def free_cpu_milli(self) -> IntArray:
        """Each node's free CPU in milli-cores (a read-only view)."""
        return _read_only(self._cpu)

    def free_memory_mib(self) -> IntArray:
        """Each node's free memory in MiB (a read-only view)."""
        return _read_only(self._memory)

    def card_ids(self) -> list[str]:
        """``<node>/<i>`` for each GPU, in ``free_milli``'s order."""
        return list(self._ids)

    def taken(self) -> dict[str, float]:
        """Card id -> share taken, for the cards with something on them."""
        used = np.flatnonzero(self._free < MILLI)
        return {self._ids[g]: (MILLI - int(self._free[g])) / MILLI for g in used}

    def allocated_cards(self) -> float:
        """GPUs' worth placed now."""
        return int(self._used.sum()) / MILLI

    def unallocatable_cards(self, mix: TaskMix) -> float:
        """FGD's fragmented GPUs of the current state against ``mix``, in cards.

        0 on a full pool; 0 on an empty one only when every class fits every node (a
        node too small for a class, or of a model it may not use, counts all its free
        GPUs for that class's share, as FGD defines it).
        """
        a = self._mix_arrays(mix)
        frag = _fragmented(a, a.type_ok, a.count, a.under, a.total, self._cpu, self._memory)
        return float(a.weight @ frag.sum(axis=1)) / MILLI

    def place(self, task: Task, policy: PlacementPolicy, mix: TaskMix) -> Placement | None:
        """Place ``task`` by ``policy``; None when it does not fit now (state unchanged).

        Raises:
            ValueError: an unknown policy, or a task of that name placed already.
        """
        if policy not in POLICIES:
            raise ValueError(f"placement policy {policy!r} is not one of {', '.join(POLICIES)}")
        if task.name in self._live:
            raise ValueError(f"task {task.name!r} is placed already")
        candidates = self._candidates(task)
        if len(candidates.node) == 0:
            return None
        best = self._choose(candidates, task, policy, mix)
        node = int(candidates.node[best])
        if candidates.k == 0:
            gpus: tuple[tuple[int, int], ...] = ()
        elif task.gpus == 1:
            gpus = ((int(candidates.gpu[best]), task.gpu_milli),)
        else:
            idle = self._idle_gpus(node)[: task.gpus]
            gpus = tuple((int(g), MILLI) for g in idle)
        placement = Placement(task.name, node, gpus, task.cpu_milli, task.memory_mib)
        self._apply(placement, -1)
        self._live[task.name] = placement
        return placement

    def release(self, placement: Placement) -> None:
        """Give back what ``placement`` took.

        Raises:
            ValueError: the placement is not live in this pool (released twice, or never
                placed here).
        """
        if self._live.get(placement.task) != placement:
            raise ValueError(f"placement of {placement.task!r} is not live in this pool")
        del self._live[placement.task]
        self._apply(placement, +1)

    def _apply(self, placement: Placement, sign: int) -> None:
        for gpu, milli in placement.gpus:
            self._free[gpu] += sign * milli
            self._gpu_tasks[gpu] -= sign
        self._node_tasks[placement.node] -= sign * len(placement.gpus)
        self._used[placement.node] -= sign * sum(milli for _, milli in placement.gpus)
        self._cpu[placement.node] += sign * placement.cpu_milli
        self._memory[placement.node] += sign * placement.memory_mib
        if self._mix is not None:
            self._refresh(self._mix[1], placement.node)

    def _refresh(self, arrays: _MixArrays, node: int) -> None:
        """Recount one node's per-class state after its GPUs changed."""
        free = self._free[self._offsets[node] : self._offsets[node + 1]][None, :]
        enough = free >= arrays.need[:, None]
        arrays.count[:, node] = enough.sum(axis=1)
        arrays.under[:, node] = np.where(enough, 0, free).sum(axis=1)
        arrays.total[node] = free.sum()

    def _node_ok(self, task: Task) -> BoolArray:
        """Nodes with the task's CPU and memory free and an allowed model."""
        ok: BoolArray = (self._cpu >= task.cpu_milli) & (self._memory >= task.memory_mib)
        if task.gpu_types:
            ok &= self._type_ok(task.gpu_types)
        return ok

    def _type_ok(self, types: tuple[str, ...]) -> BoolArray:
        if types not in self._types:
            allowed = [i for i, model in enumerate(self.models) if model in types]
            self._types[types] = np.isin(self._model, allowed)
        return self._types[types]

    def _candidates(self, task: Task) -> _Candidates:
        ok = self._node_ok(task)
        if task.gpus == 0:
            nodes = np.flatnonzero(ok)
            none = np.zeros(len(nodes), dtype=np.int64)
            return _Candidates(nodes, none - 1, none, none, 0, none)
        if task.gpus == 1:
            gpus = np.flatnonzero((self._free >= task.gpu_milli) & ok[self._gpu_node])
            # GPUs of one node with the same free share and tasks are interchangeable:
            # the first (lowest index) stands for them, the tie-break's choice too.
            tasks = np.minimum(self._gpu_tasks[gpus], MILLI)
            shape = (self._gpu_node[gpus] * (MILLI + 1) + self._free[gpus]) * (MILLI + 1)
            _, first = np.unique(shape + tasks, return_index=True)
            gpus = gpus[np.sort(first)]
            before = self._free[gpus]
            return _Candidates(
                self._gpu_node[gpus],
                gpus,
                before,
                before - task.gpu_milli,
                1,
                self._gpu_tasks[gpus],
            )
        idle = np.bincount(self._gpu_node[self._free == MILLI], minlength=len(self.nodes))
        nodes = np.flatnonzero(ok & (idle >= task.gpus))
        whole = np.full(len(nodes), MILLI, dtype=np.int64)
        return _Candidates(nodes, np.full(len(nodes), -1), whole, whole * 0, task.gpus, whole * 0)

    def _idle_gpus(self, node: int) -> IntArray:
        start, stop = int(self._offsets[node]), int(self._offsets[node + 1])
        idle: IntArray = start + np.flatnonzero(self._free[start:stop] == MILLI)
        return idle

    def _choose(
        self, candidates: _Candidates, task: Task, policy: PlacementPolicy, mix: TaskMix
    ) -> int:
        """The index of the best candidate under ``policy`` (ties as the docstring says)."""
        usage = self._usage()[candidates.node]
        gpu_score = candidates.tasks / HAMI_SLOTS + 2 * (MILLI - candidates.before) / MILLI
        if policy == "spread":
            keys: list[npt.NDArray[np.generic]] = [gpu_score, candidates.node, usage]
        else:
            keys = [-gpu_score, candidates.node, -usage]
        if policy == "fgd":
            gradient = self._gradient(candidates, task, mix)
            keys.append(np.round(gradient, GRADIENT_DECIMALS))
        # lexsort: the last key is the primary one; stable, so the lower GPU index wins.
        return int(np.lexsort(keys)[0])

    def _usage(self) -> FloatArray:
        """HAMi's node score: slots used over slots, plus twice the milli share used."""
        slots = self._node_tasks / HAMI_SLOTS + 2 * self._used / MILLI
        return np.divide(
            slots,
            self._capacity / MILLI,
            out=np.zeros(len(self.nodes), dtype=np.float64),
            where=self._capacity > 0,
        )

    def _gradient(self, candidates: _Candidates, task: Task, mix: TaskMix) -> FloatArray:
        """The increase of each candidate's node fragmentation, Σ_m p_m ΔF_n(m), milli."""
        arrays = self._mix_arrays(mix)
        count, under, total = arrays.count, arrays.under, arrays.total
        node, k = candidates.node, candidates.k
        need = arrays.need[:, None]
        before, after = candidates.before[None, :], candidates.after[None, :]
        was = _fragmented(
            arrays,
            arrays.type_ok[:, node],
            count[:, node],
            under[:, node],
            total[node],
            self._cpu[node],
            self._memory[node],
        )
        count_after = count[:, node] + k * ((after >= need).astype(np.int64) - (before >= need))
        under_after = under[:, node] + k * (
            np.where(after < need, after, 0) - np.where(before < need, before, 0)
        )
        now = _fragmented(
            arrays,
            arrays.type_ok[:, node],
            count_after,
            under_after,
            total[node] - k * (candidates.before - candidates.after),
            self._cpu[node] - task.cpu_milli,
            self._memory[node] - task.memory_mib,
        )
        gradient: FloatArray = arrays.weight @ (now - was)
        return gradient

    def _mix_arrays(self, mix: TaskMix) -> _MixArrays:
        if self._mix is not None and self._mix[0] is mix:
            return self._mix[1]
        shapes = [shape for shape, _ in mix.classes]
        everywhere: BoolArray = np.ones(len(self.nodes), dtype=np.bool_)
        need = np.array([s.gpu_milli for s in shapes], dtype=np.int64)
        free = self._free[None, :]
        enough = free >= need[:, None]
        arrays = _MixArrays(
            need=need,
            gpus=np.array([s.gpus for s in shapes], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
            memory=np.array([s.memory_mib for s in shapes], dtype=np.int64),
            weight=np.array([w for _, w in mix.classes], dtype=np.float64),
            type_ok=np.array(
                [self._type_ok(s.gpu_types) if s.gpu_types else everywhere for s in shapes]
            ),
            count=_segment_sum(enough.astype(np.int64), self._offsets),
            under=_segment_sum(np.where(enough, 0, free), self._offsets),
            total=_segment_sum(free, self._offsets)[0],
        )
        # One mix at a time: the replay measures against one target workload.
        self._mix = (mix, arrays)
        return arrays


def _read_only(values: IntArray) -> IntArray:
    view = values.view()
    view.flags.writeable = False
    return view


def _segment_sum(values: IntArray, offsets: IntArray) -> IntArray:
    """Row-wise sums over each node's GPUs (``offsets`` as in ``Pool``; empty nodes sum 0)."""
    cumulative = np.zeros((values.shape[0], values.shape[1] + 1), dtype=np.int64)
    np.cumsum(values, axis=1, out=cumulative[:, 1:])
    segment: IntArray = cumulative[:, offsets[1:]] - cumulative[:, offsets[:-1]]
    return segment


def _fragmented(
    arrays: _MixArrays,
    type_ok: BoolArray,
    count: IntArray,
    under: IntArray,
    total: IntArray,
    cpu: IntArray,
    memory: IntArray,
) -> IntArray:
    """F_n(m) per class (rows) and node column: all free when m cannot fit, else ``under``."""
    fits = (
        type_ok
        & (cpu[None, :] >= arrays.cpu[:, None])
        & (memory[None, :] >= arrays.memory[:, None])
        & (count >= arrays.gpus[:, None])
    )
    fragmented: IntArray = np.where(fits, under, np.broadcast_to(total, under.shape))
    return fragmented
