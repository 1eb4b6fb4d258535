"""The admission process: the controller, and its ``/metrics`` and ``/healthz`` over HTTP.

``/healthz`` answers 200 while the reconcile loop runs and passes keep coming (at least
one per resync), else 503 with the problem; the body also says whether every watch has
listed and which resources the API server does not serve (Fluid not installed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from admission.config import AdmissionConfig
from admission.controller import Controller
from admission.metrics import AdmissionMetrics, MetricsServer
from foundation.heap import PassHeap
from foundation.kube import KubeAccess

log = logging.getLogger(__name__)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON."""
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(config: AdmissionConfig, *, keep_level: bool = False) -> None:
    """Apply the file's logging settings; ``keep_level``: ``--log-level`` was given, and wins."""
    root = logging.getLogger()
    if config.logging.level is not None and not keep_level:
        root.setLevel(config.logging.level.upper())
    if config.logging.format == "json":
        for handler in root.handlers:
            handler.setFormatter(JsonFormatter())


class AdmissionServer:
    """A running admission controller; ``start()`` returns the metrics port."""

    def __init__(
        self,
        config: AdmissionConfig,
        access: KubeAccess,
        controller: Controller | None = None,
    ) -> None:
        self.config = config
        self.metrics = AdmissionMetrics() if controller is None else controller.metrics
        self.controller = controller or Controller(access, config, self.metrics, heap=PassHeap())
        self.http = MetricsServer(self.metrics, config.metrics_listen, self.health)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Serve metrics and health, check API access, start the controller.

        Raises:
            ConfigError: the metrics address cannot be bound, or no usable kubeconfig.
        """
        # A bad kubeconfig is a startup error (exit 2), not a loop that retries forever.
        async with await self.controller.access.client():
            pass
        port = await self.http.start()
        self._task = asyncio.create_task(self.controller.run(), name="admission controller")
        self._task.add_done_callback(self._ended)
        log.info(
            "admission controller %s serving /metrics on port %d", self.config.controller_name, port
        )
        return port

    async def stop(self) -> None:
        """Stop the controller, then the HTTP server."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.http.stop()

    def health(self) -> tuple[bool, dict[str, object]]:
        """The controller's health (see the module docstring)."""
        healthy, details = self.controller.health()
        if self._task is not None and self._task.done():
            healthy, details = False, {**details, "problem": "controller stopped"}
        return healthy, details

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        log.critical("controller stopped: %r; health fails until a restart", error, exc_info=error)
