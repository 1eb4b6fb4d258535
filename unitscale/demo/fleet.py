"""The demo's Deployment: replica processes started and stopped as KEDA + HPA decide.

A replica is *starting* from its process start until both its ``/health`` answers and
its cold start (compressed) has passed, as a pod is unready while vLLM loads weights.
Then it is *ready*: listed in the gateway's and the exporter's config files (the
demo's EndpointSlice). Scale-down stops starting replicas first, then the newest ready
ones: each is unlisted, given a moment for the gateway to stop routing to it, then
SIGTERMed; it finishes its requests and exits. A replica is billed from its start to
its exit, as a pod holds its accelerator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.net import free_port
from unitscale.demo.processes import Child, ComponentError, Supervisor
from unitscale.demo.world import Plan, exporter_config, gateway_config, write_yaml


@dataclass(eq=False)
class Replica:
    """One replica process and its life, in wall seconds since the demo's start."""

    port: int
    child: Child
    started: float
    ready_at: float | None = None
    retired_at: float | None = None
    stopped_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        if self.retired_at is not None:
            return "draining"
        return "ready" if self.ready_at is not None else "starting"


class Fleet:
    """Replicas as a Deployment with ``replicas: N`` would have them."""

    def __init__(
        self,
        supervisor: Supervisor,
        plan: Plan,
        launch: Callable[[int], list[str]],
        gateway_file: Path,
        exporter_file: Path,
        config_poll: float,
        clock: Callable[[], float],
        ready_timeout: float,
    ) -> None:
        self._supervisor = supervisor
        self._plan = plan
        self._launch = launch
        self._gateway_file = gateway_file
        self._exporter_file = exporter_file
        self._config_poll = config_poll
        self._clock = clock
        self._ready_timeout = ready_timeout
        self.replicas: list[Replica] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.publish()

    def count(self, *states: str) -> int:
        return sum(r.state in states for r in self.replicas)

    @property
    def desired(self) -> int:
        """The Deployment's ``replicas``: starting plus ready."""
        return self.count("starting", "ready")

    async def scale_to(self, n: int) -> None:
        """Start or retire replicas until ``desired == n``."""
        while self.desired < n:
            port = free_port()
            child = await self._supervisor.start(
                f"replica-{len(self.replicas)}", self._launch(port)
            )
            replica = Replica(port, child, self._clock())
            self.replicas.append(replica)
            self._spawn(self._bring_up(replica))
        surplus = self.desired - n
        if surplus > 0:
            # Starting ones first (newest first), then the newest ready ones.
            order = [r for r in reversed(self.replicas) if r.state == "starting"] + [
                r for r in reversed(self.replicas) if r.state == "ready"
            ]
            for replica in order[:surplus]:
                replica.retired_at = self._clock()
                self._spawn(self._retire(replica))
            self.publish()

    def publish(self) -> None:
        """Write the ready replicas into the gateway's and the exporter's config files."""
        urls = [r.url for r in self.replicas if r.state == "ready"]
        write_yaml(self._gateway_file, gateway_config(self._plan, urls))
        write_yaml(self._exporter_file, exporter_config(self._plan, urls))

    async def stop(self) -> None:
        """Cancel pending transitions (the supervisor stops the processes)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        now = self._clock()
        for r in self.replicas:
            if r.stopped_at is None:
                r.stopped_at = now

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bring_up(self, replica: Replica) -> None:
        try:
            await self._supervisor.wait_http(
                replica.child, replica.url + "/health", self._ready_timeout
            )
        except ComponentError as failure:
            if replica.retired_at is None:  # not stopped on purpose: the demo stops
                await self._supervisor.failure.put(failure)
            return
        # A simulated replica waits out its (compressed) cold start; a real one has had its own.
        real = self._plan.measured_cold_start is not None
        cold = 0.0 if real else self._plan.wall(self._plan.cold_start)
        await asyncio.sleep(max(0.0, replica.started + cold - self._clock()))
        if replica.retired_at is None:
            replica.ready_at = self._clock()
            self.publish()

    async def _retire(self, replica: Replica) -> None:
        if replica.ready_at is not None:
            # Endpoint removal reaches the gateway within a config poll or two.
            await asyncio.sleep(3 * self._config_poll)
        await self._supervisor.stop(replica.child, grace=max(30.0, self._plan.wall(120.0)))
        replica.stopped_at = self._clock()


def held_seconds(replicas: Sequence[Replica], until: float) -> float:
    """Wall seconds replicas were held (from process start to exit) up to ``until``."""
    total = 0.0
    for r in replicas:
        end = min(r.stopped_at if r.stopped_at is not None else until, until)
        total += max(0.0, end - r.started)
    return total
