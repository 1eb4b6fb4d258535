"""Fetch one replica's ``/metrics`` and turn it into ``EngineStats``, or say why not."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from exporter.engines import EngineStats, NoEngineMetricsError, read_exposition
from exporter.parse import ExpositionError
from foundation.dns import resolve_addresses

# Bounded error reasons: they become a Prometheus label.
REASONS = ("timeout", "connect", "http", "parse", "no-engine-metrics")


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one scrape of one target gave."""

    target: str
    seconds: float
    stats: EngineStats | None = None
    error: str | None = None
    """One of ``REASONS`` when ``stats`` is None."""
    detail: str = ""


async def scrape(
    session: aiohttp.ClientSession, target: str, limit: float, engine: str = "auto"
) -> ScrapeResult:
    """Scrape ``target`` within ``limit`` seconds; never raises for a bad replica."""
    start = time.perf_counter()

    def failed(reason: str, detail: str) -> ScrapeResult:
        return ScrapeResult(target, time.perf_counter() - start, error=reason, detail=detail)

    try:
        async with asyncio.timeout(limit):
            async with session.get(target) as response:
                if response.status != 200:
                    return failed("http", f"HTTP {response.status}")
                text = await response.text()
    except TimeoutError:
        return failed("timeout", f"no answer within {limit:g}s")
    except (aiohttp.ClientError, OSError) as err:
        return failed("connect", str(err) or type(err).__name__)
    try:
        stats = read_exposition(text, engine)
    except ExpositionError as err:
        return failed("parse", str(err))
    except NoEngineMetricsError as err:
        return failed("no-engine-metrics", str(err))
    return ScrapeResult(target, time.perf_counter() - start, stats=stats)


async def resolve_replicas(host_port: str) -> list[str]:
    """Every A record of a headless Service as a ``/metrics`` URL, sorted.

    Raises:
        OSError: the name does not resolve.
    """
    addresses, port = await resolve_addresses(host_port)
    return [f"http://{address}:{port}/metrics" for address in addresses]
