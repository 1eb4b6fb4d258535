"""Placement on the Alibaba GPU trace: HAMi binpack and spread against FGD, no departures.

The whole pod list is placed in trace order onto the whole node list (1,213 nodes, 6,212
GPUs) with each policy of ``replay.pool.placement``; a task that does not fit is
skipped (counted) and nothing ever leaves, as in the FGD paper's experiment (Weng et
al., ATC '23, which reports up to 49% fewer unallocated GPUs than packing). After every
arrival the pool's unallocatable GPUs (FGD's fragmentation measure against the pod
list's own ``TaskMix``) are measured; the table gives their mean over arrivals, their
value when the allocation first reaches 80% and 90% of the GPUs, and at the end, with
the allocation when the first task failed and the time of one ``place`` call. The goal
the team is measured on: FGD's unallocatable GPUs at least 40% below binpack's.

A second table measures as the paper does (their simulator, hkust-adsl/kubernetes-
scheduler-simulator: ``experiments/run_scripts/generate_run_scripts.py`` runs ``-tune
1.3`` with ``--shuffle-pod``, ten seeds; ``analysis/merge_*`` bins by arrived GPU demand
over capacity): the pod list inflated with tasks drawn from it at random until the
arrived GPU demand is 130% of the capacity, in a shuffled order, no departures; at
arrived 100% and 130% it gives the unallocated GPUs (capacity less allocated, the
paper's Fig. 9 and its "49% fewer") and FGD's fragmented GPUs (its Fig. 7), the median
over ``--seeds`` seeds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from replay.pool.cluster import Node, Task, read_nodes, read_tasks
from replay.pool.placement import POLICIES, PlacementPolicy, Pool, TaskMix

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-2023"
MARKS = (0.8, 0.9)
INFLATION = 1.3
"""The paper's arrived GPU demand at the end, over the capacity (``-tune 1.3``)."""
ARRIVED_MARKS = (1.0, INFLATION)
SEEDS = (42, 43, 44)
"""The paper's first seeds (it runs 42..51); three keep the bench under a minute."""
GOAL = 0.40
"""FGD's unallocatable GPUs at least this far below binpack's."""


@dataclass
class Run:
    policy: PlacementPolicy
    placed: int
    failed: int
    first_failure: tuple[int, float, str] | None
    unallocatable: list[float]
    at_mark: dict[float, float | None]
    allocated: float
    cards: int
    place_ms: list[float]

    @property
    def mean_unallocatable(self) -> float:
        return statistics.fmean(self.unallocatable)


def run(nodes_path: Path, tasks_path: Path, fraction: float, policy: PlacementPolicy) -> Run:
    nodes, tasks = read_nodes(nodes_path, fraction), read_tasks(tasks_path, fraction)
    mix = TaskMix.of(tasks)
    pool = Pool.of(nodes)
    result = Run(policy, 0, 0, None, [], dict.fromkeys(MARKS), 0.0, pool.cards, [])
    for number, task in enumerate(tasks, start=1):
        start = time.perf_counter()
        placement = pool.place(task, policy, mix)
        result.place_ms.append((time.perf_counter() - start) * 1e3)
        if placement is None:
            result.failed += 1
            if result.first_failure is None:
                shape = f"{task.gpus}x{task.gpu_milli}m, {task.cpu_milli}m CPU"
                result.first_failure = (number, pool.allocated_cards() / pool.cards, shape)
        else:
            result.placed += 1
        unallocatable = pool.unallocatable_cards(mix)
        result.unallocatable.append(unallocatable)
        share = pool.allocated_cards() / pool.cards
        for mark in MARKS:
            if result.at_mark[mark] is None and share >= mark:
                result.at_mark[mark] = unallocatable
    result.allocated = pool.allocated_cards()
    return result


def inflated(tasks: tuple[Task, ...], cards: int, seed: int) -> list[Task]:
    """The pod list plus tasks drawn from it until the demand is ``INFLATION`` x cards,
    shuffled: the paper's workload (copies renamed, so each places once)."""
    rng = random.Random(seed)
    workload = list(tasks)
    demand = sum(task.cards for task in tasks)
    copies = 0
    while demand < INFLATION * cards:
        drawn = rng.choice(tasks)
        copies += 1
        workload.append(
            Task(
                f"{drawn.name}#{copies}",
                drawn.arrival,
                drawn.duration,
                drawn.gpus,
                drawn.gpu_milli,
                drawn.gpu_types,
                drawn.qos,
                drawn.cpu_milli,
                drawn.memory_mib,
                drawn.phase,
            )
        )
        demand += drawn.cards
    rng.shuffle(workload)
    return workload


@dataclass
class PaperPoint:
    """One policy's state when the arrived demand first reaches a mark of the capacity."""

    unallocated: float
    fragmented: float


def paper_run(
    nodes: tuple[Node, ...], workload: list[Task], mix: TaskMix, policy: PlacementPolicy
) -> dict[float, PaperPoint]:
    pool = Pool.of(nodes)
    arrived = 0.0
    points: dict[float, PaperPoint] = {}
    for number, task in enumerate(workload, start=1):
        pool.place(task, policy, mix)
        arrived += task.cards
        last = number == len(workload)
        for mark in ARRIVED_MARKS:
            if mark not in points and (arrived >= mark * pool.cards - 1e-9 or last):
                points[mark] = PaperPoint(
                    pool.cards - pool.allocated_cards(), pool.unallocatable_cards(mix)
                )
    return points


def paper_table(
    nodes: tuple[Node, ...], tasks: tuple[Task, ...], mix: TaskMix, seeds: tuple[int, ...]
) -> tuple[str, dict[str, dict[str, float]]]:
    """Median unallocated and fragmented GPUs per policy at each arrived mark."""
    cards = sum(node.gpus for node in nodes)
    runs: dict[PlacementPolicy, list[dict[float, PaperPoint]]] = {p: [] for p in POLICIES}
    for seed in seeds:
        workload = inflated(tasks, cards, seed)
        for policy in POLICIES:
            runs[policy].append(paper_run(nodes, workload, mix, policy))
    medians: dict[str, dict[str, float]] = {}
    for policy, points in runs.items():
        for mark in ARRIVED_MARKS:
            key = f"{round(100 * mark)}"
            medians.setdefault(policy, {})[f"unallocated_{key}"] = statistics.median(
                p[mark].unallocated for p in points
            )
            medians[policy][f"fragmented_{key}"] = statistics.median(
                p[mark].fragmented for p in points
            )
    head = (
        "| policy | unallocated at arrived 100% | at 130% | fragmented (FGD's measure)"
        " at arrived 100% | at 130% |\n|---|---:|---:|---:|---:|\n"
    )
    rows = [
        f"| {p} | {m['unallocated_100']:.1f} ({100 * m['unallocated_100'] / cards:.2f}%)"
        f" | {m['unallocated_130']:.1f} ({100 * m['unallocated_130'] / cards:.2f}%)"
        f" | {m['fragmented_100']:.1f} | {m['fragmented_130']:.1f} |"
        for p, m in medians.items()
    ]
    return head + "\n".join(rows) + "\n", medians


def paper_notes(medians: dict[str, dict[str, float]], seeds: tuple[int, ...]) -> str:
    fgd, binpack = medians["fgd"], medians["binpack"]
    said = [
        f"{name.replace('_', ' at arrived ')}%: {100 * (1 - fgd[name] / binpack[name]):.1f}% below"
        for name in ("unallocated_100", "unallocated_130", "fragmented_100", "fragmented_130")
        if binpack[name] > 0
    ]
    return (
        f"The paper's measurement (pod list inflated to {100 * INFLATION:.0f}% of the GPUs"
        f" with random copies, shuffled, seeds {', '.join(map(str, seeds))}, median):"
        " FGD vs binpack " + "; ".join(said) + ". Unallocated = GPUs less allocated cards."
    )


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def cell(value: float | None, digits: int = 1) -> str:
    return "not reached" if value is None else f"{value:.{digits}f}"


def table(runs: list[Run]) -> str:
    head = (
        "| policy | placed | failed | first failure: task, allocated | unallocatable: mean"
        " | at 80% | at 90% | at end | allocated at end | ms/place mean | p99 |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for r in runs:
        first = (
            "none"
            if r.first_failure is None
            else (f"#{r.first_failure[0]} ({r.first_failure[2]}), {100 * r.first_failure[1]:.1f}%")
        )
        p99 = statistics.quantiles(r.place_ms, n=100)[98]
        rows.append(
            f"| {r.policy} | {r.placed} | {r.failed} | {first} | {r.mean_unallocatable:.1f}"
            f" | {cell(r.at_mark[0.8])} | {cell(r.at_mark[0.9])} | {r.unallocatable[-1]:.1f}"
            f" | {r.allocated:.1f} ({100 * r.allocated / r.cards:.1f}%)"
            f" | {statistics.fmean(r.place_ms):.3f} | {p99:.3f} |"
        )
    return head + "\n".join(rows) + "\n"


def ratios(runs: dict[PlacementPolicy, Run]) -> dict[str, float | None]:
    """FGD's unallocatable over binpack's at each point (None where one did not reach it)."""
    fgd, binpack = runs["fgd"], runs["binpack"]
    points: dict[str, tuple[float | None, float | None]] = {
        "mean": (fgd.mean_unallocatable, binpack.mean_unallocatable),
        "at_80": (fgd.at_mark[0.8], binpack.at_mark[0.8]),
        "at_90": (fgd.at_mark[0.9], binpack.at_mark[0.9]),
        "at_end": (fgd.unallocatable[-1], binpack.unallocatable[-1]),
    }
    return {
        name: None if a is None or b is None or b == 0 else a / b for name, (a, b) in points.items()
    }


def notes(runs: dict[PlacementPolicy, Run], ratio: dict[str, float | None], floor: float) -> str:
    said = []
    for name, value in ratio.items():
        if value is None:
            said.append(f"{name}: not comparable")
        else:
            verdict = "met" if 1 - value >= GOAL else "MISSED"
            said.append(f"{name} {100 * (1 - value):.1f}% below ({verdict})")
    end_gap = runs["binpack"].allocated - runs["fgd"].allocated
    return (
        "Unallocatable = FGD's fragmented GPUs (cards) against the pod list's top-20 task"
        f" shapes; {floor:.1f} of them on the empty pool already (nodes too small or of"
        " the wrong model for a class count all their free GPUs for its share). FGD vs"
        f" binpack (goal: {100 * GOAL:.0f}% below): " + "; ".join(said) + "."
        f" At the end FGD has {-end_gap:.1f} more GPUs allocated than binpack."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=Path, default=TRACES / "openb_node_list_gpu_node.csv")
    parser.add_argument("--tasks", type=Path, default=TRACES / "openb_pod_list_default.csv")
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="paper runs (42...)")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    started = time.perf_counter()
    runs = {p: run(args.nodes, args.tasks, args.fraction, p) for p in POLICIES}
    tasks = read_tasks(args.tasks, args.fraction)
    floor = Pool.of(read_nodes(args.nodes, args.fraction)).unallocatable_cards(TaskMix.of(tasks))
    text = table(list(runs.values()))
    ratio = ratios(runs)
    said = notes(runs, ratio, floor)
    seeds = tuple(range(SEEDS[0], SEEDS[0] + args.seeds))
    nodes = read_nodes(args.nodes, args.fraction)
    paper_text, paper = paper_table(nodes, tasks, TaskMix.of(tasks), seeds)
    paper_said = paper_notes(paper, seeds)
    text += "\n" + paper_text
    said += "\n\n" + paper_said
    print(text)
    print(said)
    if not args.no_append:
        title = (
            f"Placement on the Alibaba GPU trace: {args.tasks.name} ({len(tasks)} tasks) onto"
            f" {args.nodes.name} at fraction {args.fraction} (bench/pool_placement.py)"
        )
        append(title, text, said + f" Wall time {time.perf_counter() - started:.0f} s.")
    summary = {
        "bench": "pool_placement",
        "tasks": args.tasks.name,
        "fraction": args.fraction,
        "empty_pool_unallocatable": round(floor, 2),
        "fgd_over_binpack": {k: None if v is None else round(v, 3) for k, v in ratio.items()},
        "paper_fgd_over_binpack": {
            k: round(paper["fgd"][k] / paper["binpack"][k], 3)
            for k in paper["fgd"]
            if paper["binpack"][k] > 0
        },
        "paper_medians": {p: {k: round(v, 2) for k, v in m.items()} for p, m in paper.items()},
        "policies": {
            p: {
                "placed": r.placed,
                "failed": r.failed,
                "first_failure_allocated": None
                if r.first_failure is None
                else round(r.first_failure[1], 4),
                "unallocatable_mean": round(r.mean_unallocatable, 2),
                "unallocatable_at_80": rounded(r.at_mark[0.8]),
                "unallocatable_at_90": rounded(r.at_mark[0.9]),
                "unallocatable_at_end": round(r.unallocatable[-1], 2),
                "allocated_at_end": round(r.allocated, 2),
                "place_ms_mean": round(statistics.fmean(r.place_ms), 4),
            }
            for p, r in runs.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
