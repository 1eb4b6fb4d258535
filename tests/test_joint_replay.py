"""The joint replay (issue #19): one pool, training under Kueue, inference under the scaler.

Tiny pools (two 4-GPU nodes) and short synthetic traces, so every run takes seconds:
the behaviours of each baseline, conservation of every task and request, and that the
replay's inference figures and reclaims come from the code serving them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import admission.pool
import admission.reclaim
import replay.policies
import replay.pool.joint as joint
import scaler.demand
from admission.pool import ManagerPolicy
from foundation.replica_model import LLAMA3_8B_H200
from replay.policies import Scheduled
from replay.pool.cluster import Node, Task
from replay.pool.joint import (
    Inference,
    InferencePeaks,
    JointConfig,
    JointOptions,
    JointResult,
    arrival_share,
    arrival_window,
    inference_peaks,
    joint_mix,
    prepare_tasks,
    priority_of,
    run_all,
    run_joint,
)
from replay.pool.kueue import ClusterQueue, Workload
from replay.pool.placement import TaskMix, TaskShape
from replay.pool.report import goals, ratios, write_report
from replay.simulate import SimConfig, Simulation
from replay.trace import Trace

CONFIG = SimConfig(LLAMA3_8B_H200.for_itl_slo(0.1), dt=0.5, max_replicas=8, tail=30.0)
NODES = (Node("n0", "A", 4, 64_000, 262_144), Node("n1", "A", 4, 64_000, 262_144))
YOUNG = ManagerPolicy(min_run_seconds=120.0)
"""Training admitted at 0 is old enough to reclaim when inference rises at 240 s."""


def steady(rate: float, seconds: float, start: float = 0.0) -> Trace:
    n = int(rate * seconds)
    arrival = start + np.arange(n) / rate
    return Trace("steady", arrival, np.full(n, 2048, np.int64), np.full(n, 128, np.int64))


def rising(high: float = 26.0) -> Trace:
    """1 request/s for 4 minutes, then ``high`` for 4 more (the scaler peaks at 7 at 17)."""
    low, burst = steady(1, 240), steady(high, 240, start=240.0)
    return Trace(
        "rising",
        np.r_[low.arrival, burst.arrival],
        np.r_[low.prompt, burst.prompt],
        np.r_[low.output, burst.output],
    )


def task(
    name: str,
    qos: str = "BE",
    arrival: float = 0.0,
    duration: float = 3000.0,
    gpus: int = 1,
    milli: int = 1000,
) -> Task:
    return Task(name, arrival, duration, gpus, milli, (), qos, 4000, 16_384)


TASKS = {
    "six BE": tuple(task(f"be{i}") for i in range(6)),
    "six LS": tuple(task(f"ls{i}", "LS") for i in range(6)),
    "one BE": (task("be0"),),
    "a mix": tuple(
        task(
            f"mix{i}",
            ("BE", "LS", "Burstable")[i % 3],
            arrival=20.0 * i,
            duration=60.0 + 37.0 * (i % 5),
            gpus=(1, 1, 2)[i % 3],
            milli=(500, 1000, 1000)[i % 3],
        )
        for i in range(24)
    ),
}
DEPLOYMENT = Inference("llm", rising(), CONFIG, target_concurrency=32.0, max_replicas=7)


@functools.cache
def peaks() -> tuple[int, ...]:
    return inference_peaks([DEPLOYMENT]).peaks


@functools.cache
def run(
    tasks: str, baseline: str, placement: str = "binpack", manager: ManagerPolicy = YOUNG
) -> JointResult:
    reserved = peaks() if baseline == "static" else ()
    config = JointConfig(baseline, placement, manager=manager, reserved=reserved)  # type: ignore[arg-type]
    return run_joint(NODES, TASKS[tasks], [DEPLOYMENT], config)


@pytest.mark.parametrize(
    ("tasks", "baseline", "manager", "expect"),
    [
        pytest.param(
            "six BE",
            "manager",
            YOUNG,
            # The step asks for its replicas at once, so as many wait Pending at that
            # instant under both; the manager's reclaim ends their wait sooner.
            lambda m, kueue: (
                m["preemptions"] > 0 and m["slo_attainment"] > kueue["slo_attainment"] + 0.2
            ),
            id="inference need rising preempts BE training under the manager, and it serves better",
        ),
        pytest.param(
            "six BE",
            "kueue",
            YOUNG,
            lambda m, kueue: m["preemptions"] == 0 and m["max_inference_pending"] > 0,
            id="under Kueue alone nothing is preempted: inference replicas wait Pending",
        ),
        pytest.param(
            "six BE",
            "static",
            YOUNG,
            lambda m, kueue: m["preemptions"] == 0 and m["max_inference_pending"] == 0,
            id="the static partition never preempts and inference never waits for a card",
        ),
        pytest.param(
            "six LS",
            "manager",
            YOUNG,
            lambda m, kueue: m["preemptions"] == 0 and m["max_inference_pending"] > 0,
            id="LS training is not preemptible: the manager takes nothing back from it",
        ),
        pytest.param(
            "one BE",
            "manager",
            YOUNG,
            lambda m, kueue: m["preemptions"] == 0,
            id="a rise inside the free cards preempts nothing",
        ),
        pytest.param(
            "six BE",
            "manager",
            ManagerPolicy(min_run_seconds=10_000.0),
            lambda m, kueue: m["preemptions"] == 0,
            id="training younger than the minimum run time is spared",
        ),
        pytest.param(
            "six BE",
            "manager",
            ManagerPolicy(reclaim=False),
            lambda m, kueue: m["preemptions"] == 0,
            id="reclaim turned off publishes the allowance only",
        ),
    ],
)
def test_baseline_behaviour(tasks, baseline, manager, expect):
    result = run(tasks, baseline, manager=manager)
    kueue = run(tasks, "kueue").metrics
    assert expect(result.metrics, kueue), result.metrics


def test_a_preempted_task_restarts_from_scratch_and_its_work_is_counted_lost():
    result = run("six BE", "manager")
    hit = [o for o in result.tasks if o.preemptions]
    assert hit and all(o.lost_card_hours > 0 for o in hit)
    assert math.isclose(
        result.metrics["lost_card_hours"], sum(o.lost_card_hours for o in result.tasks)
    )
    # queued again at its original arrival (not started again while inference needs it)
    assert all(o.waited > 0 for o in hit if o.state == "queued")


RUNS = [
    pytest.param(tasks, baseline, placement, id=f"{tasks}, {baseline}, {placement}")
    for tasks in ("six BE", "a mix")
    for baseline in ("static", "kueue", "manager")
    for placement in ("binpack", "spread", "fgd")
    if placement == "binpack" or (baseline == "manager" and tasks == "a mix")
]


@pytest.mark.parametrize(("tasks", "baseline", "placement"), RUNS)
def test_every_task_and_request_is_accounted_for_once(tasks, baseline, placement):
    result = run(tasks, baseline, placement)
    names = [o.task.name for o in result.tasks]
    assert sorted(names) == sorted(t.name for t in TASKS[tasks])
    states = [o.state for o in result.tasks]
    m = result.metrics
    assert m["completed"] + m["running_at_end"] + m["queued_at_end"] == len(TASKS[tasks])
    assert states.count("arriving") == 0
    assert m["preemptions"] == sum(o.preemptions for o in result.tasks)
    for inference in result.inference:
        served = len(inference.ttft)
        assert served + inference.metrics["dropped"] == inference.metrics["requests"]
        assert inference.metrics["requests"] == len(DEPLOYMENT.trace)
    series = result.series
    assert max(series["allocated_cards"]) <= result.cards + 1e-9
    held = np.add(series["training_held"], series["inference_held"])
    assert held.max() <= result.cards + 1e-9


def test_the_mix_completes_tasks_and_fragments_less_under_our_placement():
    results = {p: run("a mix", "manager", p) for p in ("binpack", "spread", "fgd")}
    assert all(r.metrics["completed"] > 0 for r in results.values())
    assert all(r.metrics["unallocatable_cards"] >= 0 for r in results.values())


def test_the_replay_runs_the_served_demand_and_the_capacity_managers_plan(monkeypatch):
    served = vars(joint)
    assert served["pool_demand"] is scaler.demand.pool_demand
    assert served["plan_pool"] is admission.pool.plan_pool
    assert served["within_allowance"] is admission.pool.within_allowance
    assert served["others_cards"] is admission.reclaim.others_cards
    calls: dict[str, list[object]] = {
        "declared": [],
        "demand": [],
        "plan": [],
        "allow": [],
        "inventory": [],
    }

    def spy(name, real):
        def wrapped(*args, **kwargs):
            answer = real(*args, **kwargs)
            calls[name].append(answer)
            return answer

        return wrapped

    monkeypatch.setattr(replay.policies, "declared", spy("declared", scaler.demand.declared))
    monkeypatch.setattr(joint, "pool_demand", spy("demand", scaler.demand.pool_demand))
    monkeypatch.setattr(joint, "plan_pool", spy("plan", admission.pool.plan_pool))
    monkeypatch.setattr(joint, "within_allowance", spy("allow", admission.pool.within_allowance))
    monkeypatch.setattr(joint, "others_cards", spy("inventory", admission.reclaim.others_cards))
    config = JointConfig("manager", manager=YOUNG)
    result = run_joint(NODES, TASKS["six BE"], [DEPLOYMENT], config)
    ticks = len(result.series["t"])
    assert len(calls["declared"]) == len(calls["demand"]) == len(calls["plan"]) == ticks
    # the inventory's count of inference's cards is the served check's: the replicas placed
    assert len(calls["inventory"]) == ticks
    inventory = [c for c in calls["inventory"] if isinstance(c, float)]
    assert len(inventory) == ticks
    assert max(inventory) >= max(result.series["inference_held"]) >= 4
    assert calls["allow"], "the admission check was never asked"
    reclaimed = [r.key for plan in calls["plan"] for r in plan.reclaim]  # type: ignore[attr-defined]
    assert len(reclaimed) == result.metrics["preemptions"] > 0
    needed = [d[joint.POOL].accelerators_needed for d in calls["demand"]]  # type: ignore[index]
    assert max(n for n in needed if n is not None) >= 4


STEADY = Inference("llm", steady(3, 480), CONFIG, target_concurrency=32.0, max_replicas=8)
"""One replica's worth all along: the forecast stays at 1 card."""


@pytest.mark.parametrize(
    ("fraction", "training_max"),
    [
        pytest.param(0.0, 7, id="without headroom training takes every card inference leaves"),
        pytest.param(1.0, 6, id="headroom 100% of a 1-card forecast keeps 1 card free"),
        pytest.param(2.0, 5, id="headroom 200% keeps 2 cards free"),
    ],
)
def test_the_headroom_keeps_whole_cards_free_for_bursts(fraction, training_max):
    eight = tuple(task(f"be{i}") for i in range(8))
    config = JointConfig("manager", manager=ManagerPolicy(headroom_fraction=fraction))
    result = run_joint(NODES, eight, [STEADY], config)
    assert max(result.series["inference_held"]) == 1
    assert max(result.series["training_held"]) == training_max
    assert result.series["allocated_cards"][-1] == training_max + 1
    assert result.metrics["preemptions"] == 0  # the headroom is never reclaimed for


def test_a_headroom_sweep_runs_the_manager_with_each_per_placement():
    options = JointOptions(placements=("binpack", "fgd"), headrooms=(0.0, 0.25))
    names = [c.name for c in options.configs((3,), 0.1)]
    assert names == [
        "static/binpack",
        "kueue/binpack",
        "manager/binpack",
        "manager/binpack h=25%",
        "manager/fgd",
        "manager/fgd h=25%",
    ]
    assert {c.inference_share for c in options.configs((3,), 0.1)} == {0.1}
    training_only = JointOptions(mix="training").configs((3,), 0.1)
    assert {c.inference_share for c in training_only} == {0.0}


REPLICA = task("replica", "Guaranteed")
MIXED = (task("a", gpus=2), task("b", gpus=2), task("c", milli=500))


@pytest.mark.parametrize(
    ("tasks", "share", "want"),
    [
        pytest.param(
            MIXED, 0.0, TaskMix.of(MIXED).classes,
            id="share 0 is the training tasks' mix alone",
        ),
        pytest.param(
            MIXED, 0.25,
            ((TaskShape(2, 1000, (), 4000, 16_384), 0.5),
             (TaskShape(1, 500, (), 4000, 16_384), 0.25),
             (TaskShape(1, 1000, (), 4000, 16_384), 0.25)),
            id="the replica takes its share, training's classes the rest in their proportions",
        ),
        pytest.param(
            (task("cpu", gpus=0, milli=0),), 0.5, ((TaskShape(1, 1000, (), 4000, 16_384), 1.0),),
            id="no GPU task leaves the replica's shape as the whole mix",
        ),
        pytest.param(
            (), 0.0, ((TaskShape(1, 1000, (), 4000, 16_384), 1.0),),
            id="no GPU task and no share counted: still the replica's shape, not an error",
        ),
    ],
)  # fmt: skip
def test_joint_mix(tasks, share, want):
    got = joint_mix(tasks, REPLICA, share).classes
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [w for _, w in got] == pytest.approx([w for _, w in want])


@pytest.mark.parametrize("share", [-0.1, 1.5, math.nan])
def test_joint_mix_refuses_a_share_that_is_no_share(share):
    with pytest.raises(ValueError, match="inference share"):
        joint_mix(MIXED, REPLICA, share)


def test_inference_alone_counts_its_replica_starts_and_its_own_slo():
    alone = inference_peaks([DEPLOYMENT])
    assert alone.replica_starts == alone.peaks[0] == 7  # the rising trace only scales up
    assert 0 < alone.slo_attainment <= 1
    assert arrival_share(alone, TASKS["six BE"]) == pytest.approx(7 / 13)
    assert arrival_share(InferencePeaks((0,), 0.0), ()) == 0.0


def test_a_warm_started_deployment_holds_its_first_fleet_from_the_first_tick():
    warm = Inference("llm", steady(3, 480), CONFIG, max_replicas=8, initial_replicas=3)
    config = JointConfig("manager", manager=YOUNG)
    result = run_joint(NODES, (), [warm], config)
    assert result.series["inference_held"][0] == 3
    assert inference_peaks([warm]).replica_starts >= 3


def test_a_fleet_whose_traffic_ended_scales_down_in_the_tail_and_frees_its_cards():
    # the rising trace ends at 480 s with 7 replicas; the tail runs 600 s more
    d = Inference("llm", rising(), dataclasses.replace(CONFIG, tail=600.0), max_replicas=7)
    late = (task("late", arrival=500.0, duration=100.0, gpus=4),)
    result = run_joint(NODES, late, [d], JointConfig("kueue"))
    held, t = result.series["inference_held"], result.series["t"]
    assert held[t.index(480.0)] == 7 and held[-1] == 0  # not frozen at its last size
    assert result.metrics["completed"] == 1  # the freed cards went to training


def test_a_scale_up_during_a_drain_gets_a_card_of_its_own(monkeypatch):
    # 2 replicas, 1 from 30 s to 40 s: the stopped one drains its long requests (about a
    # minute) while the scale-up at 40 s needs a third card; six of the pool's are free
    n = 240
    long = Trace("long", np.arange(n) / 2.0, np.full(n, 512, np.int64), np.full(n, 6000, np.int64))

    def scheduled(self):
        policy = Scheduled(lambda t: 1 if 30.0 <= t < 40.0 else 2)
        return Simulation(self.trace, policy, self.config, run_tail=True)

    monkeypatch.setattr(Inference, "simulation", scheduled)
    warm = Inference("llm", long, CONFIG, initial_replicas=2)
    result = run_joint(NODES, (), [warm], JointConfig("kueue"))
    pending = result.series["inference_pending"]
    assert max(pending) == 1  # the scale-up did wait for its placement...
    assert sum(1 for p in pending if p) == 1  # ...one pool tick, not until the drain ended
    assert max(result.series["inference_held"]) == 3


@pytest.mark.parametrize("baseline", ["kueue", "manager"])
def test_a_warm_fleet_larger_than_the_pool_waits_pending_for_cards(baseline):
    warm = Inference("llm", steady(3, 120), CONFIG, max_replicas=8, initial_replicas=3)
    two = (Node("n0", "A", 2, 64_000, 262_144),)
    result = run_joint(two, (), [warm], JointConfig(baseline, manager=YOUNG))
    held = result.series["inference_held"]
    assert held[0] == max(held) == 2  # warm on the cards there are, never more
    assert max(result.series["allocation"]) <= 1.0


def test_the_static_baseline_carves_out_inferences_peak():
    result = run("six BE", "static")
    assert result.config.reserved == peaks() and peaks()[0] > 1
    assert max(result.series["training_held"]) <= result.cards - peaks()[0]


# --- the ClusterQueue -----------------------------------------------------------------


def always(*_: object) -> bool:
    return True


@pytest.mark.parametrize(
    ("queued", "quota", "check", "admitted"),
    [
        pytest.param(
            [Workload("big", 0, 0.0, 6), Workload("small", 0, 1.0, 1)],
            4.0,
            always,
            ["small"],
            id="BestEffortFIFO: a head over the quota does not block a smaller one behind it",
        ),
        pytest.param(
            [
                Workload("early", 0, 0.0, 2),
                Workload("urgent", 3, 9.0, 2),
                Workload("late", 0, 5.0, 2),
            ],
            4.0,
            always,
            ["urgent", "early"],
            id="priority first, then arrival",
        ),
        pytest.param(
            [Workload("a", 1, 0.0, 1), Workload("b", 1, 1.0, 1)],
            8.0,
            lambda w, admitted: w.key != "a",
            ["b"],
            id="a workload its admission check refuses stays queued",
        ),
        pytest.param(
            [
                Workload("half", 0, 0.0, 0.5),
                Workload("half2", 0, 1.0, 0.5),
                Workload("one", 0, 2.0, 1.0),
            ],
            1.0,
            always,
            ["half", "half2"],
            id="fractional shares count their fraction of the quota",
        ),
        pytest.param(
            [Workload("nine", 0, 0.0, 9)],
            8.0,
            always,
            [],
            id="a workload over the nominal quota is queued, never admitted",
        ),
    ],
)
def test_cluster_queue(queued, quota, check, admitted):
    queue = ClusterQueue(quota)
    for workload in queued:
        queue.push(workload)
    assert [w.key for w in queue.admit(check, always)] == admitted
    assert len(queue) == len(queued) - len(admitted)
    assert queue.admitted <= quota


workloads = st.lists(
    st.builds(
        Workload,
        key=st.uuids().map(str),
        priority=st.integers(0, 3),
        created=st.floats(0, 1000),
        cards=st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 8.0]),
    ),
    max_size=30,
    unique_by=lambda w: w.key,
)


@settings(max_examples=60, deadline=None)
@given(workloads, st.floats(0, 24), st.sets(st.integers(0, 29)))
def test_the_queue_admits_in_order_within_quota_and_loses_nothing(queued, quota, no_room):
    queue = ClusterQueue(quota)
    for workload in queued:
        queue.push(workload)
    order = [w.key for w in queue]
    assert order == [w.key for w in sorted(queued, key=lambda w: w.order)]
    index = {key: i for i, key in enumerate(order)}
    admitted = queue.admit(always, lambda w: index[w.key] not in no_room)
    assert [w.key for w in admitted] == [k for k in order if k in {w.key for w in admitted}]
    assert queue.admitted <= quota + 1e-9
    assert sorted([w.key for w in admitted] + [w.key for w in queue]) == sorted(order)


# --- the training side ----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 1e7), min_size=1, max_size=40),
    st.floats(0.3, 4.0),
    st.floats(10.0, 5000.0),
)
def test_prepared_tasks_arrive_within_the_span_capped_and_scaled(arrivals, multiplier, cap):
    raw = [task(f"t{i}", arrival=a, duration=1e6) for i, a in enumerate(sorted(arrivals))]
    raw.append(task("cpu-only", gpus=0, milli=0))
    out = prepare_tasks(raw, 600.0, multiplier, cap)
    assert all(0 <= t.arrival <= 600.0 and t.duration == cap and t.gpus for t in out)
    assert len({t.name for t in out}) == len(out)
    n = len(arrivals)
    assert math.floor(multiplier) * n <= len(out) <= math.ceil(multiplier) * n
    assert [t.arrival for t in out] == sorted(t.arrival for t in out)


def test_one_far_off_arrival_sets_the_window_the_report_shows():
    """One row a year on compressed every other arrival to 0, and the report said only
    the span it was compressed into (issue 27, hostile pass 27)."""
    near = [task(f"t{i}", arrival=float(i)) for i in range(99)]
    assert arrival_window(near) == pytest.approx((0.98, 97.02))
    start, window = arrival_window([*near, task("far", arrival=3e7)])
    assert window == pytest.approx(3e7 - start)
    assert arrival_window([task("cpu-only", gpus=0, milli=0)]) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("qos", "priority"),
    [
        pytest.param("Guaranteed", 3, id="Guaranteed is the highest priority"),
        pytest.param("LS", 2, id="latency-sensitive above burstable"),
        pytest.param("BE", 0, id="best effort is preemptible"),
    ],
)
def test_priority_from_qos(qos, priority):
    assert priority_of(task("t", qos)) == priority


def test_an_unknown_qos_is_refused_by_name():
    with pytest.raises(ValueError, match="task t: QoS 'Gold' is not one of Guaranteed, LS"):
        priority_of(task("t", "Gold"))


# --- the whole run, the report, the command line --------------------------------------


@pytest.fixture(scope="module")
def whole_run():
    options = JointOptions(placements=("binpack", "fgd"), manager=YOUNG)
    return run_all(NODES, TASKS["a mix"], [DEPLOYMENT], options)


def test_run_all_compares_every_baseline_and_judges_every_goal(whole_run, tmp_path):
    assert [r.name for r in whole_run.results] == [
        "static/binpack",
        "kueue/binpack",
        "manager/binpack",
        "manager/fgd",
    ]
    assert whole_run.multiplier > 0
    verdicts = goals(whole_run)
    assert len(verdicts) == 4 and all(g.met is not None for g in verdicts)
    write_report(whole_run, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "manager/fgd" in report and ("MISSED" in report or "met" in report)
    assert whole_run.window == arrival_window(TASKS["a mix"])[1] > 0
    assert f"from {whole_run.window:,.0f} s of the pod list's time" in report
    assert json.loads((tmp_path / "results.json").read_text())["runs"]["kueue/binpack"]
    assert (tmp_path / "pool.png").stat().st_size > 10_000


def test_a_goal_with_nothing_measured_is_not_measured_rather_than_missed(whole_run):
    blank = {"slo_attainment", "utilization", "queue_delay_p95_seconds", "unallocatable_cards"}

    def unmeasured(r):
        metrics = {k: math.nan if k in blank else v for k, v in r.metrics.items()}
        return dataclasses.replace(r, metrics=metrics)

    run = dataclasses.replace(whole_run, results=tuple(map(unmeasured, whole_run.results)))
    assert [g.met for g in goals(run)] == [None, None, None, None]
    assert "nan" not in ratios(run)


UNITSCALE = [sys.executable, "-m", "unitscale.cli"]


def test_the_command_line_runs_the_joint_replay(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"node-{i},64000,262144,4,T4\n" for i in range(2))
    )
    pods = tmp_path / "pods.csv"
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    header += "creation_time,deletion_time,scheduled_time\n"
    rows = "".join(
        f"pod-{i},4000,16384,1,{(500, 1000)[i % 2]},,BE,Running,{t},{t + 400},{t}\n"
        for i, t in enumerate(range(0, 800, 100))
    )
    pods.write_text(header + rows)
    trace = tmp_path / "tiny.csv"
    stamps = [f"2023-11-16 18:17:{s:02d}.0000000,512,16" for s in range(0, 60, 2)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(stamps) + "\n")
    out = tmp_path / "out"
    args = ["replay", "--pool", str(nodes), "--tasks", str(pods), "--trace", str(trace)]
    args += ["--pool-fraction", "1", "--placement", "binpack", "--report", str(out)]
    args += ["--headroom", "0", "--headroom", "0.25", "--fgd-mix", "training"]
    done = subprocess.run(
        [*UNITSCALE, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Joint replay" in done.stdout and "manager/binpack h=25%" in done.stdout
    assert {p.name for p in out.iterdir()} == {"report.md", "results.json", "pool.png"}


def _tiny_inputs(tmp_path, *extra: str):
    """The joint replay's inputs as ``unitscale replay --pool`` reads them."""
    from unitscale import cli
    from unitscale.commands import replay, replay_pool

    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nnode-0,64000,262144,4,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\npod-0,4000,16384,1,500,,BE,Running,0,400,0\n"
    )
    trace = tmp_path / "tiny.csv"
    stamps = [f"2023-11-16 18:17:{s:02d}.0000000,512,16" for s in range(0, 60, 2)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(stamps) + "\n")
    args = ["replay", "--pool", str(nodes), "--tasks", str(pods), "--pool-fraction", "1"]
    args += ["--trace", str(trace), "--report", str(tmp_path / "out"), *extra]
    parsed = cli.build_parser().parse_args(args)
    return replay_pool.inputs(parsed, replay.scaler_policy(parsed))


def test_warm_start_gives_each_deployment_the_replicas_unitscale_replay_starts_with(tmp_path):
    from replay.oracle import find_instant_bound
    from replay.run import ReplayOptions, warm_replicas

    (cold,) = _tiny_inputs(tmp_path)[2]
    (warm,) = _tiny_inputs(tmp_path, "--warm-start")[2]
    _, schedule = find_instant_bound(warm.trace, warm.config)
    expected = warm_replicas(schedule, warm.config, ReplayOptions("tiny.csv", 1.0, 1.0, 0))
    assert cold.initial_replicas == 0
    assert warm.initial_replicas == expected > 0


def test_repeated_placements_and_headrooms_are_one_run_each(tmp_path):
    """200 --headroom took 44 s on two nodes (issue 27, hostile pass 3, L4)."""
    extra = ["--placement", "fgd", "--placement", "binpack", "--placement", "fgd"]
    extra += ["--headroom", "0.25", "--headroom", "0", "--headroom", "0.25"] * 100
    options = _tiny_inputs(tmp_path, *extra)[3]
    assert options.placements == ("fgd", "binpack")
    assert options.headrooms == (0.25, 0.0)


def test_more_distinct_headrooms_than_the_bound_are_refused(tmp_path):
    from foundation.errors import ConfigError
    from unitscale.commands.replay_pool import MAX_HEADROOMS

    extra = [a for i in range(MAX_HEADROOMS + 1) for a in ("--headroom", str(i / 100))]
    with pytest.raises(ConfigError, match=f"--headroom: 9 values; at most {MAX_HEADROOMS}"):
        _tiny_inputs(tmp_path, *extra)
    assert len(_tiny_inputs(tmp_path, *extra[2:])[3].headrooms) == MAX_HEADROOMS


def test_the_scaler_plans_with_the_model_the_pool_replay_simulates(tmp_path):
    (default,) = _tiny_inputs(tmp_path)[2]
    (qwen,) = _tiny_inputs(tmp_path, "--profile", "qwen2.5-32b-h200")[2]
    assert default.profile == default.config.profile.name == "llama3-8b-h200"
    assert qwen.profile == qwen.config.profile.name == "qwen2.5-32b-h200"
    assert qwen.simulation().policy.metadata["profile"] == "qwen2.5-32b-h200"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(
            ["--pool", "n.csv"],
            "--pool NODES_CSV and --tasks PODS_CSV go together",
            id="a pool without tasks is refused",
        ),
        pytest.param(
            ["--pool", "n.csv", "--tasks", "p.csv", "--pool-fraction", "0"],
            "argument --pool-fraction: '0' is not a number above 0",
            id="an empty fraction is refused",
        ),
        pytest.param(
            ["--pool", "n.csv", "--tasks", "p.csv", "--headroom", "-0.5"],
            "argument --headroom: '-0.5' is not a number from 0 to 10",
            id="a negative headroom is refused",
        ),
        pytest.param(
            ["--trace", "a.csv", "--trace", "b.csv"],
            "several only with --pool",
            id="several traces need --pool",
        ),
        pytest.param(
            ["--pool", "n.csv", "--tasks", "p.csv", "--training-load", "inf"],
            "argument --training-load: 'inf' is not a number above 0",
            id="an infinite training load is refused, not an overflow after the first run",
        ),
    ],
)
def test_the_command_line_refuses_bad_joint_flags(tmp_path, extra, message):
    done = subprocess.run(
        [*UNITSCALE, "replay", *extra, "--report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda: JointConfig("kueue", tick=0.0), "tick",
            id="a tick of 0 is refused: the run would never reach its horizon",
        ),
        pytest.param(
            lambda: JointOptions(tick=math.nan), "tick", id="a NaN tick is refused",
        ),
        pytest.param(
            lambda: inference_peaks([DEPLOYMENT], tick=-5.0), "tick",
            id="the unconstrained run refuses a negative tick",
        ),
        pytest.param(
            lambda: JointOptions(training_load=math.inf), "training_load",
            id="an infinite training load is refused",
        ),
        pytest.param(
            lambda: JointOptions(training_load=0.0), "training_load",
            id="no training load is refused (it would silently mean the trace's own)",
        ),
        pytest.param(
            lambda: JointOptions(duration_cap=math.nan), "duration_cap",
            id="a NaN duration cap is refused",
        ),
    ],
)  # fmt: skip
def test_bad_joint_knobs_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_the_benchs_mix_table_survives_binpack_leaving_nothing_unallocatable(whole_run):
    from bench.joint_pool import mix_table

    rows = [r for r in whole_run.results if r.config.baseline == "manager"]
    nothing = [
        dataclasses.replace(r, metrics={**r.metrics, "unallocatable_cards": 0.0}) for r in rows
    ]
    table_text = mix_table(nothing, rows)
    assert "| 0.00 | 0.00 | 0.00x |" in table_text


def test_sleepers_are_refused_where_the_pool_replay_does_not_model_them(tmp_path):
    from foundation.errors import ConfigError

    with pytest.raises(ConfigError, match="--pool models no sleeping replicas"):
        _tiny_inputs(tmp_path, "--standby-max-sleeping", "4")
