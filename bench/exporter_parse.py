"""Exporter speed: parsing real vLLM /metrics, and scrape cycles over 200 and 1,000 replicas.

1. Parse throughput of ``exporter.parse.parse_samples`` (wanted families only, as the
   exporter runs it) against ``prometheus_client``'s parser on the same captures, in
   the same run; the ratio is the headline.
2. Full exporter cycles (discover, fetch, parse in the worker threads, window math,
   derive) over 200 replicas (one deployment, as before) and over 1,000 (ten
   deployments of 100). The replicas are real aiohttp servers on 127.0.0.1 in separate
   processes, a few ports each with one path per replica, answering with the real vLLM
   0.32 captures (after/idle alternately). Where the machine has more than one core,
   the exporter's process is pinned to core 0 and the servers to the rest, so the
   exporter runs on one core; its CPU seconds per cycle are reported beside the wall
   time, and so is the worst event-loop lag seen during the cycles (how late a 10 ms
   timer fired: what /healthz and gRPC callers would wait at most).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append
from exporter.config import ExporterConfig
from exporter.engines import WANTED_ANY
from exporter.parse import parse_samples
from exporter.runtime import Exporter
from foundation.net import free_port

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "vllm"
PREVIOUS_200 = 0.317
"""The 200-replica median recorded before parsing moved off the event loop (2026-11-30,
same machine; bench/RESULTS.md)."""


def captures() -> list[Path]:
    real = sorted(GOLDEN.glob("0.32*/*.txt"))
    return real or sorted(GOLDEN.glob("*.txt"))


def time_parse(texts: list[str], parse, seconds: float) -> float:
    """Megabytes per second parsed over ``seconds`` of repeated parsing."""
    size = sum(len(t) for t in texts)
    rounds = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for text in texts:
            parse(text)
        rounds += 1
    return rounds * size / elapsed / 1e6


def prometheus_client_parse(text: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for _ in family.samples:
            pass


def serve(ports: list[int], body_files: list[str]) -> None:
    """The replica side: one process answering /rN/metrics on each of ``ports``."""
    from aiohttp import web

    bodies = [Path(f).read_bytes() for f in body_files]

    async def metrics(request: web.Request) -> web.Response:
        body = bodies[int(request.match_info["index"]) % len(bodies)]
        return web.Response(body=body, content_type="text/plain")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/r{index}/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


class Servers:
    """Replica server processes, ``ports_each`` ports apiece; targets spread over all ports."""

    def __init__(self, processes: int, ports_each: int, bodies: list[Path]) -> None:
        self.ports = [free_port() for _ in range(processes * ports_each)]
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.pinned = len(cpus) > 1
        self.children = []
        for i in range(processes):
            ports = self.ports[i * ports_each : (i + 1) * ports_each]
            command = [sys.executable, __file__, "--serve", ",".join(map(str, ports))]
            command += [str(b) for b in bodies]
            child = subprocess.Popen(command)
            if self.pinned:
                os.sched_setaffinity(child.pid, set(cpus[1:]))
            self.children.append(child)
        if self.pinned:
            pin({cpus[0]})

    def targets(self, count: int) -> list[str]:
        return [
            f"http://127.0.0.1:{self.ports[i % len(self.ports)]}/r{i}/metrics" for i in range(count)
        ]

    def stop(self) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            child.wait(timeout=30)


async def wait_ready(session: aiohttp.ClientSession, urls: list[str]) -> None:
    async with asyncio.timeout(60):
        for url in urls:
            while True:
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.2)


async def time_cycles(targets: list[str], deployments: int, cycles: int) -> dict[str, float]:
    per = len(targets) // deployments
    config = ExporterConfig.model_validate(
        {
            "timeout": "4s",
            "deployments": [
                {
                    "namespace": "bench",
                    "deployment": f"llama-{d}",
                    "targets": targets[d * per : (d + 1) * per],
                }
                for d in range(deployments)
            ],
        }
    )
    exporter = Exporter(config)
    lag = 0.0
    ticking = True

    async def ticker() -> None:
        nonlocal lag
        loop = asyncio.get_running_loop()
        while ticking:
            before = loop.time()
            await asyncio.sleep(0.01)
            lag = max(lag, loop.time() - before - 0.01)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, targets[:16])  # one per port
        await exporter.cycle(session)  # warm connections
        tick = asyncio.create_task(ticker())
        durations, cpu = [], []
        for _ in range(cycles):
            cpu_before = time.process_time()
            await exporter.cycle(session)
            cpu.append(time.process_time() - cpu_before)
            assert exporter.last_cycle_seconds is not None
            durations.append(exporter.last_cycle_seconds)
        ticking = False
        await tick
    exporter.close()
    failed = sum(
        1 for state in exporter.deployments for status in state.status.values() if not status.up
    )
    return {
        "median": statistics.median(durations),
        "worst": max(durations),
        "cpu": statistics.median(cpu),
        "lag": lag,
        "failed": failed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per parser")
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--fleet", type=int, default=1000, help="replicas in the fleet cycle")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--server-processes", type=int, default=2)
    parser.add_argument("--ports-per-server", type=int, default=4)
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("bodies", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve([int(p) for p in args.serve.split(",")], args.bodies)
        return 0

    files = captures()
    texts = [f.read_text() for f in files]
    ours = time_parse(texts, lambda t: parse_samples(t, WANTED_ANY), args.seconds)
    theirs = time_parse(texts, prometheus_client_parse, args.seconds)

    servers = Servers(args.server_processes, args.ports_per_server, files)
    try:
        small = asyncio.run(time_cycles(servers.targets(args.replicas), 1, args.cycles))
        fleet = asyncio.run(time_cycles(servers.targets(args.fleet), 10, args.cycles))
    finally:
        servers.stop()
    speedup = ours / theirs
    core = "one core (pinned)" if servers.pinned else "one core (not pinned: a single CPU)"

    def rows(label: str, result: dict[str, float]) -> list[str]:
        return [
            f"| cycle, {label}, median of {args.cycles} | {result['median']:.3f} s |",
            f"| cycle, {label}, worst | {result['worst']:.3f} s |",
            f"| cycle, {label}, exporter CPU per cycle (median) | {result['cpu']:.3f} s |",
            f"| cycle, {label}, worst event-loop lag | {result['lag'] * 1000:.0f} ms |",
            f"| cycle, {label}, replicas not up after the last cycle | {result['failed']:.0f} |",
        ]

    table = "\n".join(
        [
            "| measure | value |",
            "|---|---:|",
            f"| captures | {', '.join(f'{f.parent.name}/{f.name}' for f in files)} |",
            f"| unitscale parser (wanted families) | {ours:.1f} MB/s |",
            f"| prometheus_client parser (all families) | {theirs:.1f} MB/s |",
            f"| speedup | {speedup:.1f}x |",
            f"| cycle, {args.replicas} replicas, before (parse on the event loop) "
            f"| {PREVIOUS_200:.3f} s |",
            *rows(f"{args.replicas} replicas, 1 deployment", small),
            *rows(f"{args.fleet} replicas, 10 deployments", fleet),
        ]
    )
    fleet_met = fleet["median"] <= 2.5 and fleet["failed"] == 0
    notes = (
        f"Goals: parse speedup >= 10x ({'met' if speedup >= 10 else 'MISSED'}); cycle over "
        f"{args.replicas} replicas <= 1 s ({'met' if small['median'] <= 1 else 'MISSED'}); "
        f"cycle over {args.fleet} replicas <= 2.5 s with every scrape up "
        f"({'met' if fleet_met else 'MISSED'}). Exporter on {core}; replicas served by "
        f"{args.server_processes} processes x {args.ports_per_server} ports on the other "
        f"cores; bodies {', '.join(f'{f.stat().st_size:,}' for f in files)} bytes; parsing in "
        "the exporter's worker threads (CPU seconds include them)."
    )
    print(table)
    print(notes)
    if args.record:
        append("Exporter parse and scrape cycle (bench/exporter_parse.py)", table, notes)
    print(
        json.dumps(
            {
                "parse_speedup_vs_prometheus_client": round(speedup, 2),
                "parse_mb_per_s": round(ours, 2),
                "prometheus_client_mb_per_s": round(theirs, 2),
                f"cycle_{args.replicas}_replicas_s": round(small["median"], 4),
                f"cycle_{args.replicas}_replicas_before_s": PREVIOUS_200,
                f"cycle_{args.fleet}_replicas_s": round(fleet["median"], 4),
                f"cycle_{args.fleet}_replicas_worst_s": round(fleet["worst"], 4),
                f"cycle_{args.fleet}_replicas_cpu_s": round(fleet["cpu"], 4),
                f"cycle_{args.fleet}_loop_lag_ms": round(fleet["lag"] * 1000, 1),
                f"cycle_{args.fleet}_replicas_not_up": fleet["failed"],
                "cycle_worst_s": round(small["worst"], 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
