"""The gateway's cost: added latency (p50, p99) and peak requests/s, against going direct.

Real processes on 127.0.0.1: one simulated replica (its engine sped up 1000x so that
the proxy, not the model, is what is measured) and the gateway in front of it. This
process sends the same non-streaming completions, at a fixed concurrency, once straight
to the replica and once through the gateway, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import spawn_unitscale
from bench.results import append
from foundation.net import free_port

BODY = {"model": "sim-llama", "prompt": "hello world", "max_tokens": 4}


async def wait_up(client: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                async with client.post(url, json=BODY) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)


async def drive(
    client: aiohttp.ClientSession, url: str, concurrency: int, seconds: float
) -> tuple[float, np.ndarray]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while (start := time.perf_counter()) < deadline:
            async with client.post(url, json=BODY) as response:
                await response.read()
                assert response.status == 200
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies) / (time.perf_counter() - began), np.array(latencies) * 1000


async def run(
    direct: str, proxied: str, concurrency: int, seconds: float
) -> dict[str, tuple[float, float, float]]:
    out = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        await wait_up(client, direct)
        await wait_up(client, proxied)
        for name, url in (("direct", direct), ("through gateway", proxied)):
            await drive(client, url, concurrency, 1.0)  # warm-up
            rps, ms = await drive(client, url, concurrency, seconds)
            out[name] = (rps, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--no-record", dest="record", action="store_false")
    args = parser.parse_args()
    replica_port, gateway_port = free_port(), free_port()
    replica = spawn_unitscale(
        "sim-replica", "--listen", f"127.0.0.1:{replica_port}", "--speedup", "1000"
    )
    gateway = spawn_unitscale(
        "gateway",
        "--listen",
        f"127.0.0.1:{gateway_port}",
        "--grpc-listen",
        f"127.0.0.1:{free_port()}",
        "--replica",
        f"http://127.0.0.1:{replica_port}",
    )
    try:
        results = asyncio.run(
            run(
                f"http://127.0.0.1:{replica_port}/v1/completions",
                f"http://127.0.0.1:{gateway_port}/v1/completions",
                args.concurrency,
                args.seconds,
            )
        )
    finally:
        for process in (replica, gateway):
            process.terminate()
            process.wait(timeout=30)
    d, g = results["direct"], results["through gateway"]
    table = "\n".join(
        [
            f"| path ({args.concurrency} in flight) | requests/s | p50 ms | p99 ms |",
            "|---|---:|---:|---:|",
            *(
                f"| {name} | {rps:,.0f} | {p50:.2f} | {p99:.2f} |"
                for name, (rps, p50, p99) in results.items()
            ),
            f"| added by the gateway | {g[0] - d[0]:+,.0f} | {g[1] - d[1]:+.2f}"
            f" | {g[2] - d[2]:+.2f} |",
        ]
    )
    notes = (
        "One simulated replica (engine 1000x faster than an H200) and the gateway, each its own"
        " process, on 2 cores shared with the load generator: the proxy's cost, not the model's."
    )
    print(table)
    print(notes)
    if args.record:
        append("Gateway overhead (bench/gateway.py)", table, notes)
    print(
        json.dumps(
            {
                "gateway_added_p50_ms": round(g[1] - d[1], 3),
                "gateway_added_p99_ms": round(g[2] - d[2], 3),
                "gateway_peak_rps": round(g[0], 1),
                "direct_peak_rps": round(d[0], 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
