"""Exporter speed: parsing real vLLM /metrics, and one scrape cycle over 200 replicas.

1. Parse throughput of ``exporter.parse.parse_samples`` (wanted families only, as the
   exporter runs it) against ``prometheus_client``'s parser on the same captures, in
   the same run; the ratio is the headline.
2. A full exporter cycle (discover, fetch, parse, window math, derive) over 200
   replicas served by a separate process that replays the real captures over HTTP on
   127.0.0.1, so the exporter's own process (one core) is what is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def serve(port: int, body_file: str) -> None:
    """The replica side: one aiohttp process answering /rN/metrics with a capture."""
    from aiohttp import web

    body = Path(body_file).read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/r{index}/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def time_cycles(port: int, replicas: int, cycles: int) -> list[float]:
    config = ExporterConfig.model_validate(
        {
            "timeout": "4s",
            "deployments": [
                {
                    "namespace": "bench",
                    "deployment": "llama",
                    "targets": [f"http://127.0.0.1:{port}/r{i}/metrics" for i in range(replicas)],
                }
            ],
        }
    )
    exporter = Exporter(config)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with asyncio.timeout(60):
            while True:  # wait for the replica server
                try:
                    async with session.get(config.deployments[0].targets[0]) as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.2)
        await exporter.cycle(session)  # warm connections
        durations = []
        for _ in range(cycles):
            await exporter.cycle(session)
            assert exporter.last_cycle_seconds is not None
            durations.append(exporter.last_cycle_seconds)
        state = exporter.deployments[0]
        assert state.signals is not None and state.signals.replicas_up == replicas, "scrapes failed"
    return durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per parser")
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0

    files = captures()
    texts = [f.read_text() for f in files]
    ours = time_parse(texts, lambda t: parse_samples(t, WANTED_ANY), args.seconds)
    theirs = time_parse(texts, prometheus_client_parse, args.seconds)

    port = free_port()
    biggest = max(files, key=lambda f: f.stat().st_size)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(biggest)])
    try:
        durations = asyncio.run(time_cycles(port, args.replicas, args.cycles))
    finally:
        server.terminate()
        server.wait(timeout=30)
    median, worst = statistics.median(durations), max(durations)
    speedup = ours / theirs
    table = "\n".join(
        [
            "| measure | value |",
            "|---|---:|",
            f"| captures | {', '.join(f'{f.parent.name}/{f.name}' for f in files)} |",
            f"| unitscale parser (wanted families) | {ours:.1f} MB/s |",
            f"| prometheus_client parser (all families) | {theirs:.1f} MB/s |",
            f"| speedup | {speedup:.1f}x |",
            f"| scrape cycle, {args.replicas} replicas, median of {args.cycles} | {median:.3f} s |",
            f"| scrape cycle, worst | {worst:.3f} s |",
        ]
    )
    notes = (
        f"Goals: parse speedup >= 10x ({'met' if speedup >= 10 else 'MISSED'}); cycle over "
        f"{args.replicas} replicas <= 1 s on one core ({'met' if median <= 1 else 'MISSED'}). "
        f"Cycle body: {biggest.stat().st_size:,} bytes per replica."
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
                "cycle_200_replicas_s": round(median, 4),
                "cycle_worst_s": round(worst, 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
