"""Replica discovery from EndpointSlices: a thin watch around ``endpoints.slice_targets``."""

from __future__ import annotations

import logging

from exporter.config import EndpointSlicesConfig
from exporter.endpoints import SERVICE_NAME_LABEL, slice_targets
from unitscale.kube import KubeAccess, RawObject, Selection, watch_objects

log = logging.getLogger(__name__)


class EndpointSliceWatch:
    """The ready replicas of one Service, kept current by a list-then-watch.

    Attributes:
        targets: replica URLs; ``None`` until the first list succeeded (then the last
            known list stays while the API server is unreachable).
        updates: how many times the slices changed (for tests and logs).
    """

    def __init__(self, namespace: str, config: EndpointSlicesConfig) -> None:
        self.namespace = namespace
        self.config = config
        self.targets: list[str] | None = None
        self.updates = 0

    def _changed(self, slices: dict[str, RawObject]) -> None:
        targets = slice_targets(
            slices.values(), self.config.port, scheme=self.config.scheme, path=self.config.path
        )
        if targets != self.targets:
            log.info(
                "service %s/%s: %d ready replicas",
                self.namespace,
                self.config.service,
                len(targets),
            )
        self.targets = targets
        self.updates += 1

    async def run(self, access: KubeAccess, resync: float = 300.0) -> None:
        """Watch forever (cancel to stop)."""
        selection = Selection(
            "endpointslices",
            self.namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={self.config.service}",
        )
        await watch_objects(access, selection, self._changed, resync=resync)
