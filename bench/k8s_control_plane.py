"""What the k8s test control plane costs: cold build (from the build log) and warm start.

Warm start: etcd + kube-apiserver from nothing to /readyz, as the session fixture does
it, then Kueue's CRDs applied and Kueue ready. Needs the binaries (`make k8s-bins`).

    python bench/k8s_control_plane.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from tests.k8s import versions
from tests.k8s.control_plane import ControlPlane, Kueue, binaries, module_dir


def one_run() -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="k8s-bench-") as tmp:
        started = time.perf_counter()
        plane = ControlPlane(binaries(), Path(tmp) / "plane")
        try:
            plane.start()
            ready = time.perf_counter() - started
            module, version = versions.MODULES["kueue"]
            crds = sorted(
                (module_dir(module, version) / "config/components/crd/bases").glob("*.yaml")
            )
            started = time.perf_counter()
            plane.apply_crds(crds)
            kueue = Kueue(plane, Path(tmp) / "kueue")
            try:
                kueue.start()
                kueue_ready = time.perf_counter() - started
            finally:
                kueue.stop()
        finally:
            plane.stop()
    return ready, kueue_ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run() for _ in range(args.runs)]
    for plane, kueue in runs:
        print(f"etcd + kube-apiserver ready {plane:.1f} s, Kueue CRDs + ready {kueue:.1f} s")
    plane_s = [r[0] for r in runs]
    kueue_s = [r[1] for r in runs]
    times_file = versions.cache_dir() / "build-times.json"
    built = json.loads(times_file.read_text()) if times_file.exists() else {}
    rows = [
        "| step | median s | max s | goal |",
        "|---|---:|---:|---|",
        f"| etcd + kube-apiserver to /readyz (warm) | {statistics.median(plane_s):.1f} "
        f"| {max(plane_s):.1f} | <= 10 s |",
        f"| Kueue CRDs Established + Kueue /readyz | {statistics.median(kueue_s):.1f} "
        f"| {max(kueue_s):.1f} | |",
    ]
    notes = (
        f"{args.runs} runs; kube-apiserver {versions.KUBERNETES}, etcd {versions.ETCD}, "
        f"Kueue {versions.KUEUE}. Last build of the cache (build-times.json, s): "
        + (", ".join(f"{k} {v:.0f}" for k, v in built.items()) or "none recorded")
        + "."
    )
    append(
        "k8s test control plane: warm start (bench/k8s_control_plane.py)", "\n".join(rows), notes
    )


if __name__ == "__main__":
    main()
