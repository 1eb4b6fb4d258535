"""GetMetrics and IsActive throughput and latency against a scaler holding 10,000 ScaledObjects.

The scaler runs as its own process (``unitscale scaler``) with the built-in demo
source publishing signals for every deployment, as an exporter would. This process
is the load generator: it first registers every ScaledObject (GetMetricSpec), then
keeps ``--concurrency`` calls in flight against random ScaledObjects for
``--duration`` seconds per RPC, timing each call end to end (client side).

Requests are serialized once up front and sent as bytes, so the generator's CPU goes
to gRPC, not to protobuf; on 2 cores the two processes still share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import spawn_unitscale
from bench.results import append
from foundation.net import free_port
from protos.externalscaler import externalscaler_pb2 as keda

METRIC = "unitscale-desired-replicas"


def start_scaler(
    objects: int, port: int, workdir: Path, interval: float
) -> subprocess.Popen[bytes]:
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "demo-source": {
                    "namespace": "bench",
                    "deployments": [f"model-{i:05d}" for i in range(objects)],
                    "interval": interval,
                    "period": "60s",
                },
                "max-signal-age": "60s",
            }
        )
    )
    return spawn_unitscale(
        "scaler",
        "--listen",
        f"127.0.0.1:{port}",
        "--config",
        str(config),
        "--metrics-listen",
        "127.0.0.1:0",
    )


def start_echo(port: int) -> subprocess.Popen[bytes]:
    """The same process setup serving a constant answer: gRPC's own ceiling here."""
    return subprocess.Popen([sys.executable, __file__, "--echo-server", str(port)])


def serve_echo(port: int) -> None:
    import uvloop

    answer = keda.GetMetricsResponse(
        metricValues=[keda.MetricValue(metricName=METRIC, metricValue=1, metricValueFloat=1.0)]
    ).SerializeToString()

    async def constant(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "externalscaler.ExternalScaler",
            {"GetMetrics": grpc.unary_unary_rpc_method_handler(constant)},
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


async def echo_ceiling(args: argparse.Namespace, port: int, metrics: list[bytes]) -> tuple:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        call = channel.unary_unary("/externalscaler.ExternalScaler/GetMetrics")
        await drive(call, metrics, args.concurrency, args.warmup)
        count, ms, errors = await drive(call, metrics, args.concurrency, args.duration)
    p50, p99 = np.percentile(ms, [50, 99])
    return (
        "GetMetrics, constant answer (gRPC ceiling)",
        args.concurrency,
        count / args.duration,
        p50,
        p99,
        errors,
    )


def requests(objects: int) -> tuple[list[bytes], list[bytes]]:
    refs = [
        keda.ScaledObjectRef(
            name=f"model-{i:05d}",
            namespace="bench",
            scalerMetadata={"scalerAddress": "bench:9090", "deployment": f"model-{i:05d}"},
        )
        for i in range(objects)
    ]
    metrics = [
        keda.GetMetricsRequest(scaledObjectRef=r, metricName=f"s0-{METRIC}").SerializeToString()
        for r in refs
    ]
    return [r.SerializeToString() for r in refs], metrics


async def drive(
    call: grpc.aio.UnaryUnaryMultiCallable, bodies: list[bytes], concurrency: int, seconds: float
) -> tuple[int, np.ndarray, int]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(seed: int) -> None:
        nonlocal errors
        pick = random.Random(seed).choice
        while (start := time.perf_counter()) < deadline:
            try:
                await call(pick(bodies), timeout=3)
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - began
    return len(latencies), np.array(latencies) * 1000, errors if elapsed else 0


async def run(
    args: argparse.Namespace, port: int
) -> tuple[list[tuple], dict[str, float], list[bytes]]:
    refs, metrics = requests(args.objects)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        base = "/externalscaler.ExternalScaler/"
        spec = channel.unary_unary(base + "GetMetricSpec")
        get_metrics = channel.unary_unary(base + "GetMetrics")
        is_active = channel.unary_unary(base + "IsActive")
        for start in range(0, len(refs), 500):  # register every ScaledObject, as KEDA would
            await asyncio.gather(*(spec(body, timeout=10) for body in refs[start : start + 500]))
        # One full demo-source interval, so that every object has signals.
        await asyncio.sleep(args.signal_interval + 1)
        await drive(get_metrics, metrics, args.concurrency, args.warmup)

        rows = []
        results: dict[str, float] = {}
        for name, call, bodies in (
            ("GetMetrics", get_metrics, metrics),
            ("IsActive", is_active, refs),
        ):
            for concurrency in args.concurrency_levels:
                count, ms, errors = await drive(call, bodies, concurrency, args.duration)
                rps = count / args.duration
                p50, p99 = np.percentile(ms, [50, 99]) if count else (float("nan"),) * 2
                rows.append((name, concurrency, rps, p50, p99, errors))
                if concurrency == args.concurrency:
                    key = name.lower()
                    results |= {f"{key}_rps": rps, f"{key}_p50_ms": p50, f"{key}_p99_ms": p99}
    return rows, results, metrics


def _report(args: argparse.Namespace, rows: list[tuple], results: dict[str, float]) -> dict:
    header = (
        "| RPC | in flight | calls/s | p50 ms | p99 ms | errors |\n|---|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {name} | {conc} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {errors} |"
        for name, conc, rps, p50, p99, errors in rows
    ]
    table = header + "\n" + "\n".join(lines)
    ceiling = rows[-1][2]
    results["grpc_ceiling_rps"] = ceiling
    goal = results["getmetrics_rps"] >= 5000 and results["getmetrics_p99_ms"] <= 5
    notes = (
        f"{args.objects:,} ScaledObjects registered; {args.duration:g}s per row; goal"
        f" >= 5,000 GetMetrics/s with p99 <= 5 ms at {args.concurrency} in flight:"
        f" {'met' if goal else 'MISSED'}. The last row is a handler that returns a"
        f" constant, in the same setup: the most this machine's gRPC Python gives;"
        f" unitscale's GetMetrics reaches {results['getmetrics_rps'] / ceiling:.0%} of it."
    )
    print(f"scaler RPC benchmark ({args.objects:,} ScaledObjects)\n{table}\n{notes}")
    if args.record:
        append("Scaler RPC throughput and latency (bench/scaler_rpc.py)", table, notes)
    return {"objects": args.objects, "concurrency": args.concurrency, **results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per row")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=8, help="in flight for the headline")
    parser.add_argument("--concurrency-levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--signal-interval",
        type=float,
        default=5.0,
        help="seconds between signal snapshots per deployment (an exporter's scrape interval)",
    )
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        serve_echo(args.echo_server)
        return 0
    if args.concurrency not in args.concurrency_levels:
        args.concurrency_levels.append(args.concurrency)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        scaler = start_scaler(args.objects, port, Path(tmp), args.signal_interval)
        try:
            rows, results, metrics = asyncio.run(run(args, port))
        finally:
            scaler.terminate()
            scaler.wait(timeout=30)
    echo_port = free_port()
    echo = start_echo(echo_port)
    try:
        rows.append(asyncio.run(echo_ceiling(args, echo_port, metrics)))
    finally:
        echo.terminate()
        echo.wait(timeout=30)
    results = _report(args, rows, results)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
