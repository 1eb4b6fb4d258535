"""Replica discovery from EndpointSlices: a thin watch around ``endpoints.slice_targets``."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from foundation.configfile import DNS_NAME, KEBAB_CASE
from foundation.endpoint_slices import SERVICE_NAME_LABEL, slice_targets
from foundation.kube import KubeAccess, Selection, watch_objects
from foundation.objects import RawObject

log = logging.getLogger(__name__)


class EndpointSlicesConfig(BaseModel):
    """Replicas from a Service's EndpointSlices (``discovery.k8s.io/v1``), watched.

    Every ready endpoint of the slices labelled ``kubernetes.io/service-name=<service>``
    in the deployment's namespace is a replica. Needs RBAC ``list`` and ``watch`` on
    ``endpointslices`` there.
    """

    model_config = KEBAB_CASE

    service: Annotated[str, Field(pattern=DNS_NAME, max_length=63)]
    """The Service whose slices list the replicas (need not be headless)."""
    port: int | Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    """The scrape port: a number as is, or the name of a port of the Service."""
    scheme: Literal["http", "https"] = "http"
    path: Annotated[str, Field(pattern=r"^/")] = "/metrics"

    @field_validator("port")
    @classmethod
    def _port_range(cls, port: int | str) -> int | str:
        if isinstance(port, str) and port.isdigit():  # "8000" from YAML is a number
            port = int(port)
        if isinstance(port, int) and not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1-65535")
        return port


class EndpointSliceWatch:
    """The ready replicas of one Service, kept current by a list-then-watch.

    Attributes:
        targets: replica URLs; ``None`` until the first list succeeded (then the last
            known list stays while the API server is unreachable). A malformed slice or
            endpoint is skipped alone (``skipped`` counts them, logged once a change);
            a change whose every endpoint named is malformed keeps the list too.
    """

    def __init__(self, namespace: str, config: EndpointSlicesConfig) -> None:
        self.namespace = namespace
        self.config = config
        self.targets: list[str] | None = None
        self.skipped = 0
        """Malformed slices or endpoints skipped, summed over every change seen."""
        self._last_skipped = ""

    def _changed(self, slices: dict[str, RawObject]) -> None:
        skipped: list[str] = []
        targets = slice_targets(
            slices.values(),
            self.config.port,
            scheme=self.config.scheme,
            path=self.config.path,
            skipped=skipped,
        )
        self.skipped += len(skipped)
        problem = "; ".join(skipped[:3])[:500]
        if problem != self._last_skipped and problem:  # once per change, bounded
            log.warning(
                "service %s/%s: %d malformed slices or endpoints skipped: %s",
                self.namespace,
                self.config.service,
                len(skipped),
                problem,
            )
        self._last_skipped = problem
        if skipped and not targets:
            # Slices naming endpoints, none usable: no answer, not a fleet of none (read
            # as one, the exporter published a busy fleet's load as 0, hostile pass 53).
            return
        if targets != self.targets:
            log.info(
                "service %s/%s: %d ready replicas",
                self.namespace,
                self.config.service,
                len(targets),
            )
        self.targets = targets

    async def run(self, access: KubeAccess, resync: float = 300.0) -> None:
        """Watch forever (cancel to stop)."""
        selection = Selection(
            "endpointslices",
            self.namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={self.config.service}",
        )
        await watch_objects(access, selection, self._changed, resync=resync)
