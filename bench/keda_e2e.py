"""From a decision change in the scaler to ``spec.replicas`` on the Deployment, with the
real KEDA.

A fresh test control plane (``make k8s-bins``) with KEDA v2.21's operator and metrics
server and kube-controller-manager's HPA controller, a ``unitscale scaler`` process fed
by a test signal source (``tests/k8s/keda.py``). Each trial changes the load the source
reports (the scaler decides on arrival) and times, by a watch on the Deployment, when
``spec.replicas`` shows the new decision:

- **pull 0 -> 1**: the shipped ``external`` ScaledObject; KEDA's poll activates
  (expected: up to ``pollingInterval``, half of it on average);
- **push 0 -> 1**: the shipped ``external-push`` ScaledObject over mutual TLS; the
  scaler's ``StreamIsActive`` activates on the first buffered arrival;
- **HPA 2 <-> 4**: the HPA reads the new metric through KEDA's metrics server (expected:
  up to one ``--horizontal-pod-autoscaler-sync-period``).

Each trial starts at a random phase of KEDA's and the HPA's loops.

    python bench/keda_e2e.py [--trials 20] [--polling 2] [--hpa-sync 1] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from tests.k8s import versions
from tests.k8s.control_plane import ControlPlane, Keda, binaries, module_dir
from tests.k8s.keda import (
    Load,
    ReplicaWatch,
    Scaler,
    ScalerTls,
    SignalSource,
    create,
    deployment,
    scaled_object,
)

NAME = "llama-chat"
LIMIT = 120.0
"""Seconds one trial may take before it counts as a miss."""


def start_stack(workdir: Path, hpa_sync: float) -> tuple[ControlPlane, Keda]:
    plane = ControlPlane(binaries(versions.BINARIES), workdir / "k8s")
    plane.start()
    module, version = versions.MODULES["keda"]
    plane.apply_crds(sorted((module_dir(module, version) / "config/crd/bases").glob("*.yaml")))
    keda = Keda(plane, workdir / "keda", hpa_sync=f"{hpa_sync:g}s")
    keda.start()
    return plane, keda


def trials(
    count: int, change: Callable[[], None], settle: Callable[[], None], wait: Callable[[], float]
) -> tuple[list[float], int]:
    """``count`` timings of ``change()`` -> ``wait()``; ``settle()`` resets between."""
    seconds, misses = [], 0
    for _ in range(count):
        settle()
        started = time.monotonic()
        change()
        try:
            seconds.append(wait() - started)
        except TimeoutError:
            misses += 1
    return seconds, misses


def activation(
    plane: ControlPlane,
    source: SignalSource,
    namespace: str,
    active: Load,
    phase: float,
    count: int,
) -> tuple[list[float], int]:
    """0 -> 1 timings: ``active`` load, then idle until KEDA scales back to zero."""
    watch = ReplicaWatch(plane, namespace, NAME)

    def settle() -> None:
        source.set(namespace, NAME, Load(running=0, buffered=0 if active.buffered else None))
        watch.wait_for(0, LIMIT)
        time.sleep(random.uniform(0, phase))  # a random phase of KEDA's poll, not a wait

    try:
        return trials(
            count,
            lambda: source.set(namespace, NAME, active),
            settle,
            lambda: watch.wait_for(1, LIMIT),
        )
    finally:
        watch.stop()


def hpa_steps(
    plane: ControlPlane, source: SignalSource, namespace: str, phase: float, count: int
) -> tuple[list[float], int]:
    """2 <-> 4 timings, alternating up and down."""
    watch = ReplicaWatch(plane, namespace, NAME)
    levels = iter([4, 2] * count)
    wanted: list[int] = []

    def change() -> None:
        wanted.append(next(levels))
        source.set(namespace, NAME, Load(running=16.0 * wanted[-1]))

    def settle() -> None:
        time.sleep(random.uniform(0, phase))  # a random phase of the HPA's sync

    try:
        source.set(namespace, NAME, Load(running=32))
        watch.wait_for(2, LIMIT)
        return trials(count, change, settle, lambda: watch.wait_for(wanted[-1], LIMIT))
    finally:
        watch.stop()


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plane, keda = start_stack(workdir, args.hpa_sync)
    source = SignalSource().start()
    plain = Scaler(source, workdir / "scaler").start()
    tls = ScalerTls(workdir / "tls")
    secure = Scaler(source, workdir / "scaler-tls", tls=tls).start()
    results: dict[str, Any] = {}
    try:
        for path, trigger, scaler, active in (
            ("pull 0 -> 1", "external", plain, Load(running=16)),
            ("push 0 -> 1", "external-push", secure, Load(running=0, buffered=1)),
        ):
            namespace = f"bench-{trigger}"
            plane.create_namespace(namespace)
            create(plane, namespace, deployment(NAME))
            if trigger == "external-push":
                secret = {"apiVersion": "v1", "kind": "Secret", "stringData": tls.secret_data()}
                secret["metadata"] = {"name": "unitscale-scaler-client"}
                create(plane, namespace, secret)
            docs = scaled_object(trigger, namespace, scaler.address, polling=args.polling)
            for doc in docs:
                create(plane, namespace, doc)
            results[path] = activation(plane, source, namespace, active, args.polling, args.trials)
        results["HPA 2 <-> 4"] = hpa_steps(
            plane, source, "bench-external", args.hpa_sync, args.trials
        )
    finally:
        for stop in (secure.stop, plain.stop, source.close, keda.stop, plane.stop):
            stop()
    return results


def report(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    rows = [
        "| path | KEDA/HPA interval | trials | p50 | p99 | max | misses |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    summary: dict[str, Any] = {}
    for path, (seconds, misses) in results.items():
        interval = (
            f"HPA sync {args.hpa_sync:g} s"
            if path.startswith("HPA")
            else f"pollingInterval {args.polling:g} s"
        )
        p50, p99, worst = (float(np.percentile(seconds, q)) for q in (50, 99, 100))
        rows.append(
            f"| {path} | {interval} | {len(seconds) + misses} | {p50:.2f} s | {p99:.2f} s"
            f" | {worst:.2f} s | {misses} |"
        )
        summary[path] = {"p50": round(p50, 3), "p99": round(p99, 3), "misses": misses}
    table = "\n".join(rows)
    print(table)
    if not args.no_record:
        append(
            "KEDA end to end: decision to spec.replicas (bench/keda_e2e.py)",
            table,
            _notes(args),
        )
    return summary


def _notes(args: argparse.Namespace) -> str:
    return (
        f"Real KEDA {versions.KEDA} (operator + metrics server) and kube-controller-manager"
        f" {versions.KUBERNETES} (HPA, `--horizontal-pod-autoscaler-sync-period="
        f"{args.hpa_sync:g}s`; the default is 15 s) on a test control plane, a `unitscale"
        " scaler` process and a test signal source, all on this machine; times from the"
        " source's change to the Deployment watch showing the new `spec.replicas`, each"
        " trial at a random phase. Pull waits for KEDA's poll (expected mean about half"
        " the pollingInterval); push does not. Under a shared machine (other engineers'"
        " builds and tests): the tails include their load."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--polling", type=int, default=2, help="pollingInterval (s)")
    parser.add_argument("--hpa-sync", type=float, default=1.0, help="HPA sync period (s)")
    parser.add_argument("--no-record", action="store_true", help="do not append RESULTS.md")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so every process this run started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="keda-e2e-") as tmp:
        results = run(args, Path(tmp))
    print(json.dumps(report(args, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
