"""Fetch one replica's ``/metrics`` and turn it into ``EngineStats``, or say why not.

One deadline (the scrape timeout) covers the whole scrape: connecting, reading at most
``Limits.max_bytes`` of body, and parsing it. Parsing runs in a worker thread
(``engines.read_exposition`` is pure), never on the event loop, so a large body cannot
stall the exporter's HTTP and gRPC servers or the other scrapes; a parse still running at
the deadline is abandoned (its result dropped) and the target counts as timed out.

Nothing a target sends escapes as an exception: every failure is a ``ScrapeResult`` with
one of ``REASONS`` and a bounded ``detail``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from exporter.engines import EngineStats, NoEngineMetricsError, read_exposition
from exporter.parse import (
    DEFAULT_LIMITS,
    EXCERPT,
    ExpositionError,
    Limits,
    TooLargeError,
    TooManySeriesError,
)
from exporter.parse_pool import ParsePool
from foundation.dns import resolve_addresses

# Bounded error reasons: they become a Prometheus label.
REASONS = (
    "timeout",
    "connect",
    "http",
    "too-large",
    "parse",
    "too-many-series",
    "no-engine-metrics",
    "internal",
)
"""Why a scrape failed; ``internal`` is a bug of the exporter's, met on this target."""

DETAIL = 300
"""Characters of a failure's detail kept (it is logged and shown)."""


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one scrape of one target gave."""

    target: str
    seconds: float
    stats: EngineStats | None = None
    error: str | None = None
    """One of ``REASONS`` when ``stats`` is None."""
    detail: str = ""
    exception: BaseException | None = field(default=None, compare=False)
    """The exception behind an ``internal`` failure, for its traceback."""


async def scrape(
    session: aiohttp.ClientSession,
    target: str,
    limit: float,
    engine: str = "auto",
    limits: Limits = DEFAULT_LIMITS,
    parser: ParsePool | None = None,
) -> ScrapeResult:
    """Scrape ``target`` within ``limit`` seconds; never raises for a bad replica.

    ``parser`` holds the threads that parse, the smallest body first (None: the event
    loop's default executor).
    """
    start = time.perf_counter()
    phase = "connect"

    def failed(reason: str, detail: str, exception: BaseException | None = None) -> ScrapeResult:
        if len(detail) > DETAIL:
            detail = detail[:DETAIL] + "..."
        return ScrapeResult(
            target, time.perf_counter() - start, error=reason, detail=detail, exception=exception
        )

    try:
        async with asyncio.timeout(limit):
            url, hops = URL(target), 0
            while True:
                async with session.get(url, allow_redirects=False) as response:
                    moved = _same_origin_redirect(url, response)
                    if moved is not None and hops < MAX_REDIRECTS:
                        url, hops = moved, hops + 1
                        continue
                    if response.status != 200:
                        return failed("http", _status_detail(response, moved))
                    phase = "read"
                    body = await _read_capped(response, limits.max_bytes)
                    break
            phase = "parse"
            if parser is None:
                loop = asyncio.get_running_loop()
                stats = await loop.run_in_executor(None, read_exposition, body, engine, limits)
            else:
                stats = await parser.run(len(body), read_exposition, body, engine, limits)
    except TimeoutError:
        return failed("timeout", f"{phase} not done within {limit:g}s")
    except TooLargeError as err:
        return failed("too-large", str(err))
    except TooManySeriesError as err:
        return failed("too-many-series", str(err))
    except ExpositionError as err:
        return failed("parse", str(err))
    except NoEngineMetricsError as err:
        return failed("no-engine-metrics", str(err))
    except (aiohttp.ClientError, OSError) as err:
        return failed("connect", str(err) or type(err).__name__)
    except Exception as err:  # a bug met on this target must not stop the others
        return failed("internal", f"{type(err).__name__}: {str(err)[:EXCERPT]}", err)
    return ScrapeResult(target, time.perf_counter() - start, stats=stats)


MAX_REDIRECTS = 2
"""Redirects a scrape follows, each within the replica's own scheme, host and port (a
``/metrics`` mounted as ``/metrics/`` answers 307)."""


def _same_origin_redirect(url: URL, response: aiohttp.ClientResponse) -> URL | None:
    """Where a redirect within the replica points; None for any other answer.

    aiohttp followed any redirect: a replica answering ``302`` to another host had the
    exporter fetch it (a cloud metadata URL, an internal service), and the first line of
    that answer was quoted in the exporter's log as a parse error (issue 27, hostile pass
    7, XS-M4). A redirect off the replica's own origin is not followed.
    """
    if response.status not in (301, 302, 303, 307, 308):
        return None
    location = response.headers.get("Location")
    if not location:
        return None
    try:
        moved = url.join(URL(location))
    except ValueError:
        return None
    same = (moved.scheme, moved.host, moved.port) == (url.scheme, url.host, url.port)
    return moved if same else None


def _status_detail(response: aiohttp.ClientResponse, moved: URL | None) -> str:
    if response.status in (301, 302, 303, 307, 308):
        where = "again" if moved is not None else "off the replica (not followed)"
        return f"HTTP {response.status}: redirected {where}"
    return f"HTTP {response.status}"


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body, or ``TooLargeError`` as soon as it is known to be over ``cap`` bytes."""
    declared = response.content_length
    if declared is not None and declared > cap:
        raise TooLargeError(f"Content-Length {declared:,} bytes is over {cap:,}")
    chunks = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > cap:
            raise TooLargeError(f"body over {cap:,} bytes (stopped reading at {size:,})")
        chunks.append(chunk)
    return b"".join(chunks)


async def resolve_replicas(host_port: str) -> list[str]:
    """Every A record of a headless Service as a ``/metrics`` URL, sorted.

    Raises:
        OSError: the name does not resolve.
    """
    addresses, port = await resolve_addresses(host_port)
    return [f"http://{address}:{port}/metrics" for address in addresses]
