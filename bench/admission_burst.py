"""A burst of Jobs through a ClusterQueue guarded by our check: passes, writes, wall time.

A fresh control plane with Kueue (the k8s test binaries, ``make k8s-bins``), our CRD, a
ClusterQueue whose admissionChecksStrategy names one of our AdmissionChecks, and the
controller in this process. ``--jobs`` Jobs are created as fast as the API takes them;
the controller's decision is scripted (every pending check Ready) unless
``--real-decide``, so what is measured is the controller's shell: how many passes the
burst costs, how many status writes land or conflict, and how long until every
Workload is Admitted.

    python bench/admission_burst.py [--jobs 300] [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from admission.cluster import Decision
from admission.config import AdmissionConfig
from admission.controller import Controller
from admission.decide import decide_all
from admission.workload import actionable
from bench.results import append
from foundation.kube import KubeAccess
from tests.k8s import versions
from tests.k8s.control_plane import ControlPlane, Kueue, binaries, module_dir

ROOT = Path(__file__).resolve().parent.parent
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
V1BETA2 = "kueue.x-k8s.io/v1beta2"


def ready_for_all(pending: Any, cluster: Any, now: float) -> list[Any]:
    return [
        Decision(
            p.workload["metadata"]["namespace"],
            p.workload["metadata"]["name"],
            p.check,
            "Ready",
            "fits",
        )
        for p in pending
    ]


def set_up(plane: ControlPlane, jobs: int, with_check: bool = True) -> tuple[str, str, str]:
    suffix = secrets.token_hex(3)
    check, namespace, name = f"capacity-{suffix}", f"burst-{suffix}", f"bench.unitscale.io/{suffix}"
    plane.create_namespace(namespace)
    plane.ensure(
        "/apis/unitscale.io/v1alpha1/capacitycheckparameters",
        {
            "apiVersion": "unitscale.io/v1alpha1",
            "kind": "CapacityCheckParameters",
            "metadata": {"name": suffix},
        },
    )
    plane.ensure(
        f"{KUEUE}/admissionchecks",
        {
            "apiVersion": V1BETA2,
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {
                "controllerName": name,
                "parameters": {
                    "apiGroup": "unitscale.io",
                    "kind": "CapacityCheckParameters",
                    "name": suffix,
                },
            },
        },
    )
    plane.ensure(
        f"{KUEUE}/resourceflavors",
        {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": "f"}},
    )
    quota = [{"name": "cpu", "nominalQuota": str(jobs)}]
    plane.ensure(
        f"{KUEUE}/clusterqueues",
        {
            "apiVersion": V1BETA2,
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{suffix}"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {"coveredResources": ["cpu"], "flavors": [{"name": "f", "resources": quota}]}
                ],
                **(
                    {"admissionChecksStrategy": {"admissionChecks": [{"name": check}]}}
                    if with_check
                    else {}
                ),
            },
        },
    )
    plane.ensure(
        f"{KUEUE}/namespaces/{namespace}/localqueues",
        {
            "apiVersion": V1BETA2,
            "kind": "LocalQueue",
            "metadata": {"name": "team"},
            "spec": {"clusterQueue": f"cq-{suffix}"},
        },
    )
    return check, namespace, name


def phases(workloads: list[dict[str, Any]], check: str) -> dict[str, float]:
    """Seconds (API timestamps, 1 s resolution): creation to quota, quota to our Ready."""
    from admission.workload import parse_time

    to_quota, to_ready, quota_times = [], [], []
    for w in workloads:
        created = parse_time(w["metadata"]["creationTimestamp"]) or 0.0
        conditions = {c["type"]: c for c in w["status"].get("conditions") or []}
        quota = parse_time(conditions["QuotaReserved"]["lastTransitionTime"]) or 0.0
        entry = next(e for e in w["status"]["admissionChecks"] if e["name"] == check)
        ready = parse_time(entry["lastTransitionTime"]) or 0.0
        to_quota.append(quota - created)
        to_ready.append(ready - quota)
        quota_times.append(quota)
    to_quota.sort()
    to_ready.sort()
    return {
        "quota_p50_s": to_quota[len(to_quota) // 2],
        "quota_max_s": to_quota[-1],
        "quota_spread_s": max(quota_times) - min(quota_times),
        "ready_after_quota_p50_s": to_ready[len(to_ready) // 2],
        "ready_after_quota_max_s": to_ready[-1],
    }


def job(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"j{i}", "labels": {"kueue.x-k8s.io/queue-name": "team"}},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/x:1",
                            "resources": {"requests": {"cpu": "1"}},
                        }
                    ],
                }
            },
        },
    }


class Timed(Controller):
    """Notes when each Workload's check first became actionable in the view, and written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, float] = {}
        self.written: dict[str, float] = {}

    def _changed(self, name: str, objects: dict[str, Any]) -> None:
        if name == "workloads":
            now = time.perf_counter()
            ours = {c["metadata"]["name"] for c in self.watched["admissionchecks"].objects.values()}
            for key, workload in objects.items():
                if key not in self.seen and actionable(workload, ours):
                    self.seen[key] = now
        super()._changed(name, objects)

    async def _write(self, api: Any, decision: Any, *args: Any) -> None:
        await super()._write(api, decision, *args)
        self.written.setdefault(f"{decision.namespace}/{decision.workload}", time.perf_counter())


async def burst(
    plane: ControlPlane, jobs: int, real_decide: bool, with_check: bool = True
) -> dict[str, float]:
    check, namespace, name = set_up(plane, jobs, with_check)
    config = AdmissionConfig(controller_name=name)
    controller = Timed(
        KubeAccess(plane.kubeconfig), config, decide=decide_all if real_decide else ready_for_all
    )
    task = asyncio.create_task(controller.run())
    try:
        async with asyncio.timeout(60):  # the first pass: the check made Active
            while not controller.passes:  # noqa: ASYNC110 - a counter, no event to wait on
                await asyncio.sleep(0.1)
        passes_before = controller.passes
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
            await asyncio.gather(
                *(
                    asyncio.get_running_loop().run_in_executor(pool, plane.ensure, path, job(i))
                    for i in range(jobs)
                )
            )
        created = time.perf_counter() - started
        while True:
            view = [
                w
                for w in controller.snapshot().workloads.values()
                if w["metadata"]["namespace"] == namespace
            ]
            admitted = sum(
                1
                for w in view
                if any(
                    c["type"] == "Admitted" and c["status"] == "True"
                    for c in (w.get("status") or {}).get("conditions") or []
                )
            )
            if admitted == jobs:
                break
            if time.perf_counter() - started > 600:
                raise SystemExit(f"only {admitted} of {jobs} admitted after 600 s")
            await asyncio.sleep(0.2)
        elapsed = time.perf_counter() - started
        writes = controller.metrics.writes
        if not with_check:
            return {"created_s": created, "admitted_s": time.perf_counter() - started}
        spans = phases(list(controller.snapshot().workloads.values()), check)
        ours = sorted(
            controller.written[k] - controller.seen[k]
            for k in controller.written
            if k in controller.seen
        )
        return {
            **spans,
            "ours_p50_s": ours[len(ours) // 2],
            "ours_p99_s": ours[int(len(ours) * 0.99)],
            "created_s": created,
            "admitted_s": elapsed,
            "passes": controller.passes - passes_before,
            "applied": writes.labels("applied")._value.get(),
            "conflicts": writes.labels("conflict")._value.get(),
            "errors": writes.labels("error")._value.get(),
            "pass_s_sum": controller.metrics.pass_seconds._sum.get(),
        }
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--real-decide", action="store_true")
    parser.add_argument("--record", action="store_true", help="append to bench/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as tmp:
        plane = ControlPlane(binaries(), Path(tmp) / "plane")
        plane.start()
        kueue = Kueue(plane, Path(tmp) / "kueue")
        try:
            module, version = versions.MODULES["kueue"]
            plane.apply_crds(
                sorted((module_dir(module, version) / "config/components/crd/bases").glob("*.yaml"))
            )
            plane.apply_crds([ROOT / "deploy" / "admission" / "crd.yaml"])
            kueue.start()
            result = asyncio.run(burst(plane, args.jobs, args.real_decide))
            baseline = asyncio.run(burst(plane, args.jobs, args.real_decide, with_check=False))
        finally:
            kueue.stop()
            plane.stop()
    print(result, baseline)
    rows = [
        "| Jobs | created s | all Admitted s | without the check s | passes | writes "
        "| conflicts | errors | in passes s | ours p50 / p99 s | Kueue: quota to our Ready p50 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.jobs} | {result['created_s']:.1f} | {result['admitted_s']:.1f} "
        f"| {baseline['admitted_s']:.1f} | {result['passes']:.0f} | {result['applied']:.0f} "
        f"| {result['conflicts']:.0f} | {result['errors']:.0f} | {result['pass_s_sum']:.1f} "
        f"| {result['ours_p50_s']:.2f} / {result['ours_p99_s']:.2f} "
        f"| {result['ready_after_quota_p50_s']:.0f} |",
    ]
    if args.record:
        decided = "by admission.decide" if args.real_decide else "scripted (every check Ready)"
        append(
            "Admission controller: a burst of Jobs (bench/admission_burst.py)",
            "\n".join(rows),
            f"Decisions {decided}; debounce 0.5 s, 8 writes in flight. 'ours': from a "
            "Workload turning actionable in the controller's view to its status write. "
            "'without the check': the same burst through a ClusterQueue with no check "
            "(Kueue's own pace). Goal: a burst costs a few passes per second of "
            "arrivals, not one per Job.",
        )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
