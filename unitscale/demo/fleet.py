"""The demo's Deployment: replica processes started and stopped as KEDA + HPA decide.

A replica is *starting* from its process start until both its ``/health`` answers and
its cold start (compressed) has passed, as a pod is unready while vLLM loads weights.
Then it is *ready*: listed in the gateway's and the exporter's config files (the
demo's EndpointSlice). Scale-down stops starting replicas first, then the newest ready
ones: each is unlisted, given a moment for the gateway to stop routing to it, then
SIGTERMed; it finishes its requests and exits. A replica is billed from its start to
its exit, as a pod holds its accelerator, except while it sleeps.

With the standby plan the gateway puts ready replicas to sleep (vLLM sleep level 1: its
weights in host memory, its accelerator free) and wakes them; ``watch_sleep`` reads each
one's ``/is_sleeping`` as the kubelet would read a probe. A sleeper is still a pod of the
Deployment (and an endpoint the gateway may wake), so it counts in ``desired``; its sleep
is billed as host memory (``sleeping_seconds``), as the replay bills its sleepers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

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
    asleep_since: float | None = None
    """When it was last seen asleep after being awake; None while awake."""
    naps: list[tuple[float, float]] = field(default_factory=list)
    """Its sleeps that ended: (fell asleep, woke), as ``watch_sleep`` saw them."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        if self.retired_at is not None:
            return "draining"
        if self.ready_at is None:
            return "starting"
        return "sleeping" if self.asleep_since is not None else "ready"

    def update_sleep(self, asleep: bool, now: float) -> bool:
        """Record what its ``/is_sleeping`` said at ``now``; whether that changed anything."""
        since = self.asleep_since
        if asleep == (since is not None):
            return False
        if since is None:
            self.asleep_since = now
        else:
            self.naps.append((since, now))
            self.asleep_since = None
        return True

    def asleep_seconds(self, until: float) -> float:
        """Wall seconds it slept up to ``until`` (and its exit)."""
        end = min(self.stopped_at if self.stopped_at is not None else until, until)
        spans = list(self.naps)
        if self.asleep_since is not None:
            spans.append((self.asleep_since, end))
        return sum(max(0.0, min(woke, end) - fell) for fell, woke in spans)


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
        standby_scaler: str | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._standby_scaler = standby_scaler
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
        """The Deployment's ``replicas``: starting, ready and sleeping."""
        return self.count("starting", "ready", "sleeping")

    @property
    def awake(self) -> int:
        """Replicas holding an accelerator for serving: starting or ready, not asleep.

        What the replay counts as its replicas (its sleepers apart).
        """
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
            # Starting ones first (newest first), then the newest ready ones: asleep or
            # not, both are running, ready pods to the ReplicaSet.
            order = [r for r in reversed(self.replicas) if r.state == "starting"] + [
                r for r in reversed(self.replicas) if r.state in ("ready", "sleeping")
            ]
            for replica in order[:surplus]:
                replica.retired_at = self._clock()
                self._spawn(self._retire(replica))
            self.publish()

    def publish(self) -> None:
        """Write the ready replicas (asleep too) into the gateway's and exporter's configs."""
        urls = [r.url for r in self.replicas if r.state in ("ready", "sleeping")]
        gateway = gateway_config(self._plan, urls, self._standby_scaler)
        write_yaml(self._gateway_file, gateway)
        write_yaml(self._exporter_file, exporter_config(self._plan, urls))

    async def watch_sleep(self, every: float) -> None:
        """Read each ready replica's ``/is_sleeping`` every ``every`` seconds (cancel to stop).

        A replica that does not answer (stopping, busy) keeps what was last seen.
        """
        timeout = aiohttp.ClientTimeout(total=max(every, 1.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                watched = [r for r in self.replicas if r.state in ("ready", "sleeping")]
                answers = await asyncio.gather(*(_is_sleeping(session, r.url) for r in watched))
                now = self._clock()
                for replica, asleep in zip(watched, answers, strict=True):
                    if asleep is not None and replica.state in ("ready", "sleeping"):
                        replica.update_sleep(asleep, now)
                await asyncio.sleep(every)

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


async def _is_sleeping(session: aiohttp.ClientSession, url: str) -> bool | None:
    """What ``url``'s ``/is_sleeping`` says; None when it does not say."""
    try:
        async with session.get(url + "/is_sleeping") as response:
            if response.status != 200:
                return None
            answer = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    asleep = answer.get("is_sleeping") if isinstance(answer, dict) else None
    return asleep if isinstance(asleep, bool) else None


def held_seconds(replicas: Sequence[Replica], until: float) -> float:
    """Wall seconds replicas held an accelerator up to ``until``.

    From process start to exit, as a pod holds its accelerator, less its sleeps.
    """
    total = 0.0
    for r in replicas:
        end = min(r.stopped_at if r.stopped_at is not None else until, until)
        total += max(0.0, end - r.started) - r.asleep_seconds(until)
    return total


def sleeping_seconds(replicas: Sequence[Replica], until: float) -> float:
    """Wall seconds replicas slept (their weights in host memory) up to ``until``."""
    return sum(r.asleep_seconds(until) for r in replicas)


def wakes(replicas: Sequence[Replica]) -> int:
    """Sleeps that ended in a wake (a sleeper stopped asleep never woke)."""
    return sum(len(r.naps) for r in replicas)
