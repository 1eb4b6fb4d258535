"""Does a time-compressed simulated replica keep up with the wall clock under load?

One ``unitscale sim-replica --speedup 20`` process (llama3-8b-h200) on 127.0.0.1, driven
by this process with a fixed number of non-streaming completions in flight (512-token-id
prompts, 128 output tokens). The replica's metrics are the engine model's numbers (its
ideal clock); what the client sees is the same plus the engine's lag behind the wall
clock and the HTTP round trip. Reported: requests/s, mean e2e as the replica's metrics
say and as the client measures it (the difference is the lag the client sees), the
model's e2e in uncompressed seconds, and the replica process's CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import spawn_unitscale
from bench.results import append
from exporter.engines import VLLM, WANTED_ANY, engine_stats
from exporter.parse import parse_samples
from foundation.net import free_port


@dataclass(frozen=True)
class Scrape:
    requests: float
    e2e_sum: float
    ttft_sum: float
    queue_sum: float


async def scrape(client: aiohttp.ClientSession, base: str) -> Scrape:
    async with client.get(f"{base}/metrics") as response:
        text = await response.text()
    samples = parse_samples(text, WANTED_ANY)
    stats = engine_stats(samples, VLLM)

    def total(name: str) -> float:
        return sum(s.value for s in samples if s.name == name)

    return Scrape(
        stats.counters["requests"],
        total("vllm:e2e_request_latency_seconds_sum"),
        total("vllm:time_to_first_token_seconds_sum"),
        total("vllm:request_queue_time_seconds_sum"),
    )


def cpu_seconds(pid: int) -> tuple[float, float]:
    """Seconds a process has run on a CPU and waited for one, so far (/proc/PID/schedstat)."""
    ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(ran) / 1e9, int(waited) / 1e9


async def wait_up(client: aiohttp.ClientSession, base: str) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                async with client.get(f"{base}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)


async def drive(
    client: aiohttp.ClientSession, url: str, body: dict[str, object], inflight: int, seconds: float
) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while (start := time.perf_counter()) < deadline:
            async with client.post(url, json=body) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(inflight)))
    return latencies


async def run(base: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    body: dict[str, object] = {
        "model": "sim-llama",
        "prompt": list(range(1000, 1000 + args.prompt_tokens)),
        "max_tokens": args.max_tokens,
    }
    url = f"{base}/v1/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        await wait_up(client, base)
        await drive(client, url, body, args.inflight, 1.0)  # warm-up: a full batch running
        before, began = await scrape(client, base), time.time()
        (ran0, waited0), own0 = cpu_seconds(pid), time.process_time()
        latencies = await drive(client, url, body, args.inflight, args.seconds)
        wall = time.time() - began
        (ran1, waited1), own1 = cpu_seconds(pid), time.process_time()
        after = await scrape(client, base)
    served = after.requests - before.requests
    # Every request measured finished between the scrapes, and nothing else did.
    assert served == len(latencies), (served, len(latencies))
    engine_e2e = (after.e2e_sum - before.e2e_sum) / served
    client_e2e = float(np.mean(latencies))
    return {
        "requests_per_s": served / wall,
        "engine_e2e_ms": engine_e2e * 1000,
        "engine_ttft_ms": (after.ttft_sum - before.ttft_sum) / served * 1000,
        "engine_queue_ms": (after.queue_sum - before.queue_sum) / served * 1000,
        "client_e2e_ms": client_e2e * 1000,
        "client_e2e_p99_ms": float(np.percentile(latencies, 99)) * 1000,
        "lag_ms": (client_e2e - engine_e2e) * 1000,
        "model_e2e_s": engine_e2e * args.speedup,
        "replica_cpu_pct": (ran1 - ran0) / wall * 100,
        "replica_runqueue_pct": (waited1 - waited0) / wall * 100,
        "client_cpu_pct": (own1 - own0) / wall * 100,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    port = free_port()
    replica = spawn_unitscale(
        "sim-replica",
        "--listen",
        f"127.0.0.1:{port}",
        "--profile",
        "llama3-8b-h200",
        "--speedup",
        f"{args.speedup:g}",
    )
    try:
        r = asyncio.run(run(f"http://127.0.0.1:{port}", replica.pid, args))
    finally:
        replica.terminate()
        replica.wait(timeout=60)
    table = "\n".join(
        [
            "| requests/s | e2e, replica's metrics | e2e, client | client minus replica"
            " | client p99 | model e2e (x speedup) | replica CPU | replica waiting for a CPU"
            " | load generator CPU |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {r['requests_per_s']:,.0f} | {r['engine_e2e_ms']:.1f} ms"
            f" | {r['client_e2e_ms']:.1f} ms | {r['lag_ms']:+.1f} ms"
            f" | {r['client_e2e_p99_ms']:.1f} ms | {r['model_e2e_s']:.2f} s"
            f" | {r['replica_cpu_pct']:.0f}% | {r['replica_runqueue_pct']:.0f}%"
            f" | {r['client_cpu_pct']:.0f}% |",
        ]
    )
    notes = (
        f"One sim replica at --speedup {args.speedup:g} (llama3-8b-h200), {args.inflight}"
        f" non-streaming requests in flight ({args.prompt_tokens}-token-id prompts,"
        f" {args.max_tokens} output tokens), {args.seconds:g} s after 1 s of warm-up; the"
        " load generator shares the machine's cores. 'client minus replica' is the engine's"
        " lag behind the wall clock plus the HTTP round trip, per request."
    )
    print(table)
    print(notes)
    if args.record:
        append("Simulated replica under load (bench/sim_replica.py)", table, notes)
    print(json.dumps({k: round(v, 3) for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
