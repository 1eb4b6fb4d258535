"""The Prometheus source's side file and error logs (issue 27, hostile pass S-H6, M5).

- The bearer token is read off the loop, only from a regular file of bounded size: a
  FIFO or ``/dev/zero`` named there fails each round with a reason, the loop goes on.
- A Prometheus error whose text varies every answer (a request id, a position) is logged
  once, not once a round.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from pathlib import Path

import pytest
from aiohttp import web

from scaler.config import PrometheusSourceConfig
from scaler.signals import SignalStore
from scaler.sources import prometheus_source
from tests.test_prometheus_source import TARGET, drain, source_config, until
from tests.test_scaler_hostile_inputs import HostilePrometheus

# --- the bearer token ------------------------------------------------------------------


class TokenPrometheus(HostilePrometheus):
    """Answers every query with no series; counts the rounds that reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    async def _query(self, request: web.Request) -> web.Response:
        self.queries += 1
        return web.json_response({"status": "success", "data": {"resultType": "vector",
                                                               "result": []}})  # fmt: skip


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "token.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        pytest.param(fifo, "not a regular file (a FIFO)",
                     id="a FIFO as bearer-token-file fails each round and never blocks"),
        pytest.param(lambda _: Path("/dev/zero"), "not a regular file (a character device)",
                     id="/dev/zero as bearer-token-file fails each round, reading nothing"),
        pytest.param(lambda p: _big(p), "is over 65,536 bytes",
                     id="a token file over 64 KiB fails each round"),
    ],
)  # fmt: skip
async def test_a_bearer_token_file_that_is_no_token_fails_the_round_not_the_loop(
    token, reason, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="scaler.sources")
    server = await TokenPrometheus().start()
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(
        source_config(server.url, interval="20ms", **{"bearer-token-file": str(token(tmp_path))})
    )
    task = asyncio.create_task(prometheus_source(config, store, lambda: [TARGET]))
    try:
        await until(lambda: store.errors[("prometheus", "query")] >= 3, "three failed rounds")
        assert not task.done() and server.queries == 0
    finally:
        await drain(task)
        await server.stop()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and reason in warnings[0], warnings


def _big(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_bytes(b"t" * (64 * 1024 + 1))
    return path


# --- M5: an upstream's varying error text is logged once --------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda n: web.Response(status=503, text=f"upstream error, request id {n}"),
                     id="a 503 carrying a new request id each time is logged once"),
        pytest.param(lambda n: web.json_response({"status": "error", "errorType": "bad_data",
                                                  "error": f"parse error at char {n}"}, status=400),
                     id="a 400 whose error names a new position each time is logged once"),
        pytest.param(lambda n: web.json_response({"status": "success", "data": {
                         "resultType": "vector",
                         "result": [{"metric": {"i": str(k)}, "value": [1.0, "1"]}
                                    for k in range(2 + n % 50)]}}),
                     id="a query answering a new number of series each time is logged once"),
    ],
)  # fmt: skip
async def test_an_error_whose_text_varies_is_logged_once_per_change(answer, caplog):
    caplog.set_level(logging.INFO, logger="scaler.sources")
    numbers = itertools.count()

    async def query(request: web.Request) -> web.Response:
        return answer(next(numbers))

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    store = SignalStore()
    config = PrometheusSourceConfig.model_validate(source_config(url, interval="20ms"))
    targets = [("team-a", f"d{n}", "") for n in range(3)]
    task = asyncio.create_task(prometheus_source(config, store, lambda: targets))
    try:
        await until(lambda: store.errors[("prometheus", "query")] >= 5 * 3, "five rounds")
    finally:
        await drain(task)
        await runner.cleanup()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, [w.getMessage() for w in warnings]  # once per target
