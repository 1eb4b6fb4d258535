"""KEDA's ``externalscaler.ExternalScaler`` and our ``unitscale.v1.CapacityService``.

The one place where errors become gRPC status codes:

=====================  ==================  ========================================
error                  status              why
=====================  ==================  ========================================
MetadataError          INVALID_ARGUMENT    the ScaledObject's trigger is misconfigured
unknown metric name    NOT_FOUND           KEDA asked for a metric we never specified
NoDataError            UNAVAILABLE         lets KEDA's fallback act; never a fake 0
unknown pool           NOT_FOUND           no ScaledObject declares it (not "needs 0")
no standby workload    NOT_FOUND           GetStandbyPlan: none scales it with standby
negative horizon       INVALID_ARGUMENT    GetInferenceDemand's horizon
RegistryFullError      RESOURCE_EXHAUSTED  a new ScaledObject past the registry's bound
=====================  ==================  ========================================

The answers come from ``scaler.registry`` (grpc-free, shared with the replay) and, for
inference demand, ``scaler.demand`` (pure) over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import grpc

from foundation.errors import MetadataError, NoDataError, quote
from foundation.loop_share import LoopShare
from foundation.timestamps import from_duration, to_duration, to_timestamp
from protos.externalscaler import externalscaler_pb2 as pb
from protos.externalscaler import externalscaler_pb2_grpc as pb_grpc
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc
from scaler.confirm import Confirmer, Standing, standing
from scaler.core import Decision
from scaler.demand import InferenceDemand, declared, pool_demand
from scaler.metadata import describe_object
from scaler.registry import (
    METRIC_NAME,
    TARGET_VALUE,
    ObjectKey,
    RegistryFullError,
    ScaledObject,
    ScaledObjectRegistry,
    metric_value,
)

log = logging.getLogger(__name__)

# KEDA names the HPA metric "s<trigger index>-<name>" and strips that prefix before
# GetMetrics; accept it anyway, for older KEDA versions and hand-made calls.
_KEDA_INDEX_PREFIX = re.compile(r"^s\d+-")

_METRIC_SPEC = pb.GetMetricSpecResponse(
    metricSpecs=[
        pb.MetricSpec(
            metricName=METRIC_NAME, targetSize=int(TARGET_VALUE), targetSizeFloat=TARGET_VALUE
        )
    ]
)
_ACTIVE = pb.IsActiveResponse(result=True)
_INACTIVE = pb.IsActiveResponse(result=False)


MAX_STREAMS = 20_480
"""Streams (``StreamIsActive``, ``StreamMetricSpec``) held open at once: two for each of
the registry's 10,000 ScaledObjects, and some spare. Each holds a call slot for as long as
its client keeps it open, so without their own bound one client's idle streams took every
slot of the server's (``scaler.server.MAX_CONCURRENT_RPCS``) and KEDA's short calls were
refused (issue 27, hostile pass 11); past it a stream is RESOURCE_EXHAUSTED and counted
(``unitscale_scaler_registry_errors{reason="streams"}``)."""
ROOM_HELD_SECONDS = 60.0
ROOM_BAR_SECONDS = (10.0, 600.0)
"""A stream a place was made for (another host's stream given up) that ends within
``ROOM_HELD_SECONDS`` bars its host from making room again: 10 s, doubling to 10 min,
until one it made room for holds its place that long. Opening and closing a stream in a
loop otherwise ended one of KEDA's streams a cycle: 1,000 in 0.07 s (hostile pass 15)."""
MAX_BARRED_HOSTS = 4096
"""Hosts whose bar is kept at most (the oldest let go first)."""
GIVE_UP_RATE = 2.0
GIVE_UP_BURST = 100.0
"""Streams given up for other hosts, from all hosts together: 100 at once, then 2 a
second. The bars are per host: 4,097 hosts taking turns (or one holding each stream a
minute) ended KEDA's streams without end (hostile pass 16). A host kept waiting still
has IsActive and GetMetrics, KEDA's polling; a place only pushes sooner."""
MAX_STREAMS_PER_OBJECT = 4
"""Streams of one kind held open for one ScaledObject by one peer host: KEDA holds one
(two across an operator's restart or a leader change). By peer: any client holding four
with KEDA's own ref refused KEDA's stream for that ScaledObject (hostile pass 12)."""


def peer_host(peer: str) -> str:
    """The host of a gRPC peer (``ipv4:10.0.0.7:4711`` -> ``ipv4:10.0.0.7``).

    The port changes with every connection a client opens; the host is the pod.
    Example: ``ipv6:[::1]:80`` -> ``ipv6:[::1]``; ``unix:/run/s.sock`` stays as it is.
    """
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and address.rpartition(":")[0]:
        return f"{kind}:{address.rpartition(':')[0]}"
    return peer


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    """The five RPCs KEDA calls, answered from the registry."""

    def __init__(
        self, registry: ScaledObjectRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._barred: dict[str, tuple[float, float]] = {}
        """Hosts barred from making room: until when, and the next bar's length."""
        self._give_ups = (GIVE_UP_BURST, clock())
        """Streams that may be given up now (``GIVE_UP_RATE``), and when that was."""
        self._streams: Counter[tuple[str, ObjectKey, str]] = Counter()
        """Streams open by kind, ScaledObject and peer host."""
        self._by_peer: Counter[str] = Counter()
        """Streams open by peer host."""
        self._held: dict[str, dict[int, Callable[[], None]]] = {}
        """Each host's streams, oldest first: what ends each (``_make_room``)."""
        self.streams = 0
        """Streams open now."""
        self._next = 0

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        kind: str,
        scaled: ScaledObject,
        context: grpc.aio.ServicerContext,
        wake: Callable[[], None] = lambda: None,
    ) -> AsyncIterator[asyncio.Event]:
        """Hold a stream's place for its life, or refuse it (RESOURCE_EXHAUSTED).

        Refused past ``MAX_STREAMS_PER_OBJECT`` of this kind for this ScaledObject from
        the caller's host. Past ``MAX_STREAMS`` in all, the host holding the most gives its
        oldest stream up for a host holding fewer (``_make_room``), else the new one is
        refused: one host may hold every place while no other wants one (a KEDA operator
        holds two for each of 10,000 ScaledObjects), and shares them when one does. Room
        is made last, for a stream nothing else refuses: a refused stream that made room
        first ended one of KEDA's at each attempt (hostile pass 14). Yields the event set
        when this stream gives its place up (``wake`` is called then too): the stream
        then ends RESOURCE_EXHAUSTED.
        """
        host = peer_host(context.peer() or "")
        place = (kind, scaled.key, host)
        made_room = False
        if self._streams[place] < MAX_STREAMS_PER_OBJECT and self.streams >= MAX_STREAMS:
            made_room = self._make_room(host)
        if self._streams[place] >= MAX_STREAMS_PER_OBJECT or (
            self.streams >= MAX_STREAMS and not made_room
        ):
            self._registry.errors["streams"] += 1
            where = describe_object(scaled.key[0], scaled.key[1])
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{kind} for {where}: at most {MAX_STREAMS_PER_OBJECT} a ScaledObject from"
                f" one host and {MAX_STREAMS} from all, shared between hosts, are held open",
            )
        self.streams += 1
        self._streams[place] += 1
        self._by_peer[host] += 1
        gone = asyncio.Event()
        me, self._next = self._next, self._next + 1

        def give_up() -> None:
            gone.set()
            wake()

        self._held.setdefault(host, {})[me] = give_up
        opened = self._clock()
        try:
            yield gone
        finally:
            if made_room:
                self._judge_room(host, self._clock() - opened)
            held = self._held.get(host, {})
            held.pop(me, None)
            if not held:
                self._held.pop(host, None)
            self.streams -= 1
            self._streams[place] -= 1
            if not self._streams[place]:
                del self._streams[place]
            self._by_peer[host] -= 1
            if not self._by_peer[host]:
                del self._by_peer[host]

    def _make_room(self, host: str) -> bool:
        """End the oldest stream of the host holding the most, if ``host`` holds fewer.

        Without it two hosts holding half the places each refused every stream from a
        third, KEDA's own (hostile pass 13); one host can take no more than its share
        from the others. The stream given up leaves at once, its place freed as it ends.
        """
        if not self._by_peer:
            return False
        now = self._clock()
        bar = self._barred.get(host)
        if bar is not None and now < bar[0]:
            return False
        tokens, then = self._give_ups
        tokens = min(GIVE_UP_BURST, tokens + GIVE_UP_RATE * max(0.0, now - then))
        self._give_ups = (tokens, now)
        if tokens < 1:
            return False
        most = max(self._by_peer, key=lambda h: self._by_peer[h])
        if self._by_peer[host] + 1 >= self._by_peer[most] or not self._held.get(most):
            return False
        self._give_ups = (tokens - 1, now)
        held = self._held[most]
        oldest = next(iter(held))
        held.pop(oldest)()
        self._registry.errors["streams_given_up"] += 1
        return True

    def _judge_room(self, host: str, held: float) -> None:
        """A stream room was made for ended after ``held`` s: bar its host, or clear it."""
        if held >= ROOM_HELD_SECONDS:
            self._barred.pop(host, None)
            return
        length = self._barred.get(host, (0.0, ROOM_BAR_SECONDS[0]))[1]
        if host not in self._barred and len(self._barred) >= MAX_BARRED_HOSTS:
            del self._barred[next(iter(self._barred))]
        self._barred.pop(host, None)  # kept last: the oldest bar goes first
        self._barred[host] = (self._clock() + length, min(2 * length, ROOM_BAR_SECONDS[1]))
        self._registry.errors["streams_barred"] += 1

    async def IsActive(  # noqa: N802 - name fixed by KEDA
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        """Whether the ScaledObject should have replicas (KEDA's 0 <-> 1)."""
        decision = await self._decision(request, context)
        return _ACTIVE if decision.active else _INACTIVE

    async def StreamIsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """Push ``true`` on every inactive-to-active transition, and nothing else.

        Each ``true`` activates at once and resets KEDA's cooldown, so repeating it
        would delay scale-to-zero; ``false`` is ignored by KEDA >= 2.18. The stream
        opens as "inactive", so a target already active gets one ``true`` first.
        """
        scaled = await self._resolve(request, context)
        event = asyncio.Event()
        async with self._stream("StreamIsActive", scaled, context, event.set) as gone:
            self._registry.add_activation_listener(scaled, event.set)
            try:
                try:
                    if self._registry.current(scaled).active:
                        event.set()
                except NoDataError:
                    pass  # no data is not activity; wait for signals
                while True:
                    await event.wait()
                    event.clear()
                    if gone.is_set():
                        await _given_up(context)
                    yield _ACTIVE
            finally:
                self._registry.remove_activation_listener(scaled, event.set)

    async def GetMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        """The one metric and its target; validates the metadata on the way."""
        await self._resolve(request, context)
        return _METRIC_SPEC

    async def GetMetrics(  # noqa: N802
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        """The desired replica count as the metric value (both int and float fields)."""
        name = request.metricName
        if _KEDA_INDEX_PREFIX.sub("", name, count=1) != METRIC_NAME:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown metric {quote(name)}: this scaler serves {METRIC_NAME!r}"
                f" (optionally with KEDA's 'sN-' prefix)",
            )
        decision = await self._decision(request.scaledObjectRef, context)
        value = metric_value(decision)
        return pb.GetMetricsResponse(
            metricValues=[
                # int field for KEDA < 2.17: ceil keeps the HPA's result the same
                pb.MetricValue(
                    metricName=name, metricValue=math.ceil(value), metricValueFloat=value
                )
            ]
        )

    async def StreamMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """The spec at once, then nothing: our target never changes (KEDA >= 2.21)."""
        scaled = await self._resolve(request, context)
        async with self._stream("StreamMetricSpec", scaled, context) as gone:
            yield _METRIC_SPEC
            await gone.wait()  # held open until KEDA closes it, or its place is given up
            await _given_up(context)

    async def _resolve(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> ScaledObject:
        try:
            return self._registry.resolve(ref.name, ref.namespace, ref.scalerMetadata)
        except MetadataError as err:
            where = describe_object(ref.namespace, ref.name)  # a huge name is cut
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ScaledObject {where}: {err}")
            raise  # unreachable: abort raises
        except RegistryFullError as err:
            where = describe_object(ref.namespace, ref.name)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"ScaledObject {where}: {err}")
            raise  # unreachable: abort raises

    async def _decision(
        self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> Decision:
        scaled = await self._resolve(ref, context)
        try:
            return self._registry.current(scaled)
        except NoDataError as err:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"ScaledObject {ref.namespace}/{ref.name}: {err}"
            )
            raise  # unreachable: abort raises


class CapacityService(capacity_pb2_grpc.CapacityServiceServicer):
    """Inference demand per pool and standby plans, from the registry's latest decisions.

    With ``confirm`` (the API server's ScaledObjects), a pool counts a ScaledObject only
    as the API server has it (``scaler.confirm``): one the API server does not have is
    left out (counted, logged once), one whose trigger differs or that cannot be checked
    yet leaves the pool's figures unknown. Without it (no API server: tests, the demo)
    every caller is believed.
    """

    def __init__(self, registry: ScaledObjectRegistry, confirm: Confirmer | None = None) -> None:
        self._registry = registry
        self._confirm = confirm
        self._left_out: set[ObjectKey] = set()
        """ScaledObjects left out of their pool as the API server has none (logged once)."""
        self._pool_problems: dict[str, str] = {}
        self._pools = LoopShare(self._all_pools)

    async def GetInferenceDemand(  # noqa: N802 - name fixed by the proto
        self, request: capacity_pb2.GetInferenceDemandRequest, context: grpc.aio.ServicerContext
    ) -> capacity_pb2.GetInferenceDemandResponse:
        """Each pool's held and needed accelerators; an unknown figure is left unset."""
        horizon = from_duration(request.horizon)
        if horizon < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"horizon {horizon:g}s: must not be negative"
            )
        pools = every = self._pools.get()
        if request.pool:
            pools = {request.pool: every[request.pool]} if request.pool in every else {}
            if not pools:
                known = sorted(every)
                listed = ", ".join(known[:20]) + (
                    f" and {len(known) - 20} more" if len(known) > 20 else ""
                )
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"no ScaledObject the scaler knows of declares pool {quote(request.pool)}"
                    f" (pools: {listed or 'none'})",
                )
        return capacity_pb2.GetInferenceDemandResponse(pools=list(pools.values()))

    def _all_pools(self) -> dict[str, capacity_pb2.PoolDemand]:
        """Every pool's message, by name, sorted: what ``GetInferenceDemand`` answers from.

        Made at most a tenth of the time (``self._pools``): at 10,000 ScaledObjects in
        pools one answer took 0.28 s of the event loop, and anyone who can reach the port
        may ask back to back (issue 27, hostile pass 7); a pool asked for is picked out of
        it, so a name that is no pool costs no new answer either.
        """
        entries = []
        left_out: set[ObjectKey] = set()
        for scaled in self._registry.objects():
            if scaled.metadata.pool is None:
                continue
            unconfirmed = self._unconfirmed(scaled)
            if unconfirmed is None:
                left_out.add(scaled.key)
                continue
            # Refresh as a KEDA call would: a decision past its signals' age is unknown.
            with contextlib.suppress(NoDataError):
                self._registry.current(scaled)
            entry = declared(scaled, unconfirmed)
            if entry is not None:
                entries.append(entry)
        self._left_out = left_out
        return {name: self._pool_message(p) for name, p in pool_demand(entries).items()}

    def _unconfirmed(self, scaled: ScaledObject) -> str | None:
        """Why the API server does not vouch for ``scaled``, or None to leave it out.

        "" when it vouches, or nothing is checked; None when it has no such ScaledObject.
        """
        if self._confirm is None:
            return ""
        found = standing(self._confirm.listed, scaled.key, scaled.raw_metadata)
        if found is Standing.ABSENT:
            if scaled.key not in self._left_out:
                self._registry.errors["unconfirmed"] += 1
                log.warning(
                    "ScaledObject %s/%s declares pool %s, but the API server has no such"
                    " ScaledObject: left out of the pool's inference demand (a call that is"
                    " not KEDA's?)",
                    *scaled.key,
                    quote(scaled.metadata.pool),
                )
            return None
        if found is Standing.DIFFERS:
            return (
                "its trigger's metadata is not the API server's ScaledObject's (an edit"
                " not seen yet, or a call that is not KEDA's)"
            )
        if found is Standing.UNLISTED:
            problem = self._confirm.problem or "the watch has not listed them yet"
            return f"the API server's ScaledObjects are not listed ({problem})"
        return ""

    def _pool_message(self, demand: InferenceDemand) -> capacity_pb2.PoolDemand:
        """The pool's message; one whose figures do not encode is unknown alone.

        The figures rest on sources' counts; whatever slips past their bounds must make
        this pool unknown (counted, logged once a change), never fail the call for every
        pool the admission controller asks about.
        """
        try:
            message = _pool_message(demand)
        except Exception as err:
            self._registry.errors["pool-demand"] += 1
            problem = f"its figures do not encode: {type(err).__name__}"
            if self._pool_problems.get(demand.pool) != problem:
                log.warning("inference demand of pool %s: %s (%s)", demand.pool, problem, err)
            self._pool_problems[demand.pool] = problem
            return capacity_pb2.PoolDemand(pool=demand.pool, unknown_reason=problem)
        if self._pool_problems.pop(demand.pool, None) is not None:
            log.info("inference demand of pool %s encodes again", demand.pool)
        return message

    async def GetStandbyPlan(  # noqa: N802 - name fixed by the proto
        self, request: capacity_pb2.GetStandbyPlanRequest, context: grpc.aio.ServicerContext
    ) -> capacity_pb2.GetStandbyPlanResponse:
        """Each standby ScaledObject of the workload: running and sleeping, or unset."""
        workload = (request.namespace, request.deployment)
        plans = []
        for scaled in self._registry.naming(*workload):
            if scaled.standby is None:
                continue
            with contextlib.suppress(NoDataError):
                self._registry.current(scaled)  # refreshed as a KEDA call would be
            plans.append(_standby_message(scaled))
        if not plans:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no ScaledObject the scaler knows of scales {quote(request.namespace)}/"
                f"{quote(request.deployment)} with standby: true",
            )
        return capacity_pb2.GetStandbyPlanResponse(plans=plans)


def _standby_message(scaled: ScaledObject) -> capacity_pb2.StandbyPlan:
    namespace, name = scaled.key
    message = capacity_pb2.StandbyPlan(namespace=namespace, name=name, model=scaled.target[2])
    decision = scaled.decision
    if decision is None:
        message.reason = str(scaled.error) if scaled.error is not None else "no decision yet"
        return message
    message.running = decision.desired_replicas
    message.sleeping = decision.sleeping_replicas
    message.reason = decision.reason
    if scaled.decided_at is not None:
        message.decided_time.CopyFrom(to_timestamp(scaled.decided_at))
    return message


def _pool_message(demand: InferenceDemand) -> capacity_pb2.PoolDemand:
    message = capacity_pb2.PoolDemand(pool=demand.pool, unknown_reason=demand.unknown)
    if demand.accelerators_held is not None:
        message.accelerators_held = demand.accelerators_held
    if demand.accelerators_needed is not None:
        message.accelerators_needed = demand.accelerators_needed
    if demand.decided_at is not None:
        message.decided_time.CopyFrom(to_timestamp(demand.decided_at))
    for part in demand.deployments:
        entry = message.deployments.add(
            namespace=part.namespace,
            name=part.name,
            deployment=part.deployment,
            accelerators_per_replica=part.accelerators_per_replica,
            reason=part.reason,
            forecast_horizon=to_duration(part.forecast_horizon_seconds),
        )
        if part.replicas_now is not None:
            entry.replicas_now = part.replicas_now
        if part.replicas_needed is not None:
            entry.replicas_forecast = part.replicas_needed
        if part.decided_at is not None:
            entry.decided_time.CopyFrom(to_timestamp(part.decided_at))
    return message


async def _given_up(context: grpc.aio.ServicerContext) -> None:
    await context.abort(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "this stream gave its place to one from a host holding fewer; open it again later",
    )
