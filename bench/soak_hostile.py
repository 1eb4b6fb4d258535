"""For bench/soak.py: a hostile scrape target, serving broken expositions made from a real one.

Each body starts from a real simulated replica's ``/metrics`` (so the engine's names are
there and the exporter gets past "is this vLLM?") and breaks it one way. Served on
127.0.0.1 from the bench's own process at ``/<kind>/metrics``.
"""

from __future__ import annotations

import re

from aiohttp import web

HUGE_BYTES = 8 * 1024**2
"""The huge exposition's size: far above a replica's (~13 kB), small enough for 2 cores."""


def hostile_bodies(real: bytes) -> dict[str, bytes]:
    """Kind -> the broken exposition; ``real`` is a replica's ``/metrics`` body."""
    lines = real.splitlines(keepends=True)
    # A series line cut in half and garbage after it, as a crashed writer leaves it.
    invalid = (
        b"".join(lines[: len(lines) // 2]) + b'vllm:num_requests_running{engine="0\n}}} 1 2 3\n'
    )
    # Valid, but a million-label family: the size a runaway label would make.
    filler = []
    size, i = len(real), 0
    while size < HUGE_BYTES:
        line = f'vllm:soak_filler{{engine="0",series="{i}"}} {i}.0\n'.encode()
        filler.append(line)
        size += len(line)
        i += 1
    huge = real + b"# TYPE vllm:soak_filler gauge\n" + b"".join(filler)
    # Bytes that are not UTF-8 inside a label value and a comment.
    binary = real.replace(b'model_name="', b'model_name="\xff\xfe\x80', 1) + b"# \xc3\x28\xa0\xa1\n"
    # A histogram bucket bound that is not a number.
    bad_le = re.sub(rb'le="0\.0*1"', b'le="soon"', real, count=1)
    return {"invalid": invalid, "huge": huge, "binary": binary, "bad-le": bad_le}


class HostileTarget:
    """An HTTP server on 127.0.0.1 serving ``/<kind>/metrics`` for every hostile body."""

    def __init__(self) -> None:
        self._bodies: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.scrapes: dict[str, int] = {}

    async def start(self, bodies: dict[str, bytes]) -> None:
        self._bodies = bodies
        self.scrapes = dict.fromkeys(bodies, 0)
        app = web.Application()
        app.router.add_get("/{kind}/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        body = self._bodies.get(kind)
        if body is None:
            raise web.HTTPNotFound()
        self.scrapes[kind] += 1
        # The content type a real replica sends: it claims UTF-8 whatever the bytes are.
        return web.Response(body=body, content_type="text/plain", charset="utf-8")
