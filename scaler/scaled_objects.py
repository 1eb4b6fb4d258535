"""The API server's ScaledObjects, watched from the first call about one.

``scaler.confirm`` judges each call against this list (the registry refuses one whose
ScaledObject or trigger the API server does not have) and each ScaledObject before its
pool's inference demand counts it. The watch (every namespace's ScaledObjects, ``list``
and ``watch`` on ``scaledobjects.keda.sh``) starts with the first ScaledObject KEDA asks
about; until it lists (or without the right), every call is believed and a pool's
figures are unknown.

Only what the check reads is kept of each ScaledObject (``scaler.confirm.projected``: its
name and a digest of each external trigger's metadata): 10,000 of them as the API server
sends them held 80 MiB less ``managedFields``, 6 MiB as kept.

Nothing from outside stops it: ``foundation.kube.watch_objects`` retries any failure at
a backoff (each counted here and kept as ``problem``); the last list stays in use while
the failures last under ``STALE_AFTER``, since the API server's ScaledObjects outlive a
broken watch; past it, the list is no longer used (every call believed, pools unknown):
a list kept for good refused every ScaledObject created after the watch broke.
A watch task that ends anyway is started again, counted and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

from foundation.kube import SCALED_OBJECTS, KubeAccess, Selection, watch_objects
from foundation.objects import RawObject
from scaler.confirm import projected
from scaler.registry import ScaledObjectRegistry

log = logging.getLogger(__name__)

CHECK_EVERY = 1.0
"""Seconds between looks for a first ScaledObject, or an ended watch."""
MAX_PROBLEM_CHARS = 300
STALE_AFTER = 60.0
"""Seconds of failed lists and watches after which the last list is no longer used."""


class ScaledObjectWatch:
    """``listed`` and ``problem`` for ``scaler.confirm``; ``run`` until cancelled."""

    def __init__(
        self,
        access: KubeAccess,
        registry: ScaledObjectRegistry,
        *,
        resync: float = 300.0,
        check_every: float = CHECK_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._access = access
        self._clock = clock
        self._failing_since: float | None = None
        self._registry = registry
        self._resync = resync
        self._check_every = check_every
        self._listed: dict[str, RawObject] | None = None
        self._problem = ""
        self._task: asyncio.Task[None] | None = None
        self.errors: Counter[str] = registry.errors
        """The registry's counter (``unitscale_scaler_registry_errors``), by reason:
        ``scaled-object-watch`` (a list or watch that failed, retried),
        ``scaled-object-watch-ended`` (the watch task ended and was started again)."""

    @property
    def listed(self) -> Mapping[str, RawObject] | None:
        """Every ScaledObject by ``namespace/name``, as ``projected`` keeps it.

        None until first listed, or while the watch has failed for over ``STALE_AFTER``.
        """
        failing = self._failing_since
        if failing is not None and self._clock() - failing > STALE_AFTER:
            return None
        return self._listed

    @property
    def problem(self) -> str:
        """The watch's last failure since its last list or event; empty when none."""
        return self._problem

    async def run(self) -> None:
        """Start the watch with the first ScaledObject asked about; keep it running."""
        try:
            while True:
                self._keep_watching()
                await asyncio.sleep(self._check_every)
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task

    def _keep_watching(self) -> None:
        running = self._task
        if running is not None and not running.done():
            return
        if running is None:
            if not len(self._registry):
                return
        else:
            error = None if running.cancelled() else running.exception()
            self.errors["scaled-object-watch-ended"] += 1
            log.error(
                "the watch on ScaledObjects ended (%s); starting it again",
                "returned" if error is None else repr(error),
            )
        self._task = asyncio.create_task(
            watch_objects(
                self._access,
                Selection(SCALED_OBJECTS, keep=projected),
                self.seen,
                resync=self._resync,
                on_error=self._failed,
            ),
            name="scaled-object-watch",
        )

    def seen(self, objects: dict[str, RawObject]) -> None:
        """Take ``objects`` (every ScaledObject by ``namespace/name``) as the list.

        What the watch calls after each list and each event, with the objects as
        ``projected`` keeps them (a test may give them whole).
        """
        self._listed = objects
        self._problem = ""
        self._failing_since = None

    def _failed(self, err: Exception) -> None:
        self.errors["scaled-object-watch"] += 1
        self._problem = f"{type(err).__name__}: {err}"[:MAX_PROBLEM_CHARS]
        if self._failing_since is None:
            self._failing_since = self._clock()
