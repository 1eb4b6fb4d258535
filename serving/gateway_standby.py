"""The scaler's standby plan for the gateway's workload: ``GetStandbyPlan`` over gRPC.

The scaler decides how many replicas run and how many sleep beside them
(``scaler.core.standby``); the gateway only asks. Anything short of exactly one plan with
both counts (the scaler unreachable, no ScaledObject with ``standby: true``, two of them,
no decision yet, a decision too old or from the future) is a reason to hold: nothing is
put to sleep on a guess.

Everything the scaler answers is read here, at one boundary: its reason and names are
clipped (``REASON_LIMIT``) before they reach a log line, and its ``decided_time`` must be
within ``MAX_PLAN_AGE`` before now and ``MAX_PLAN_SKEW`` after it (``time.time``, the
clock the scaler stamps with).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from foundation.errors import quote
from foundation.timestamps import from_timestamp
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc

REASON_LIMIT = 200
"""Characters of the scaler's reason (and of each name) a log line shows."""
MAX_PLAN_AGE = 120.0
"""Seconds a decision may be old and still be held: four of KEDA's default 30 s polls
(the scaler decides as KEDA asks). An older one is the scaler's bug or a replay: held
as no plan, so no replica is put to sleep on a load that has since changed."""
MAX_PLAN_SKEW = 30.0
"""Seconds a decision may be stamped after the gateway's clock (clock skew); later is no plan."""
IGNORED_REASONS = ("undated", "stale", "future")
"""Why a plan with both counts was not acted on
(``unitscale_gateway_standby_plans_ignored_total``)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The replicas to run, and to hold asleep beside them."""

    running: int
    sleeping: int
    reason: str


@dataclass(frozen=True, slots=True)
class NoPlan:
    """Why there is no plan to act on: its ``kind`` (logged once per change), in words."""

    kind: str
    """``unreachable:<gRPC code>``, ``count``, ``no-decision``, or one of ``IGNORED_REASONS``."""
    message: str
    """Bounded: the scaler's text is clipped to ``REASON_LIMIT``."""


class PlanSource(Protocol):
    """Where a standby round gets the plan from (the scaler, or a test's stand-in)."""

    async def plan(
        self, address: str, namespace: str, deployment: str, rpc_seconds: float
    ) -> Plan | NoPlan:
        """The workload's plan, or why there is none to act on."""
        ...


class StandbyClient:
    """One channel to the scaler, made anew when its address changes (a reload).

    ``clock``: wall time (``time.time``), to judge the plan's ``decided_time`` by.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._address: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._clock = clock

    async def plan(
        self, address: str, namespace: str, deployment: str, rpc_seconds: float
    ) -> Plan | NoPlan:
        """The workload's plan, or why there is none to act on (an answer within seconds)."""
        stub = capacity_pb2_grpc.CapacityServiceStub(await self._connect(address))
        request = capacity_pb2.GetStandbyPlanRequest(namespace=namespace, deployment=deployment)
        try:
            plans = (await stub.GetStandbyPlan(request, timeout=rpc_seconds)).plans
        except grpc.aio.AioRpcError as err:
            details = _clip(err.details() or "")
            message = f"the scaler at {address} answered {err.code().name}: {details}"
            return NoPlan(f"unreachable:{err.code().name}", message)
        if len(plans) != 1:
            names = ", ".join(_name(p) for p in plans[:5])
            more = f" and {len(plans) - 5} more" if len(plans) > 5 else ""
            where = f"{namespace}/{deployment}"
            return NoPlan(
                "count", f"{len(plans)} ScaledObjects scale {where} with standby: {names}{more}"
            )
        (plan,) = plans
        if not plan.HasField("running") or not plan.HasField("sleeping"):
            reason = _clip(plan.reason)
            return NoPlan("no-decision", f"no standby plan yet from {_name(plan)}: {reason}")
        ignored = self._ignored(plan)
        if ignored is not None:
            return ignored
        return Plan(plan.running, plan.sleeping, _clip(plan.reason))

    def _ignored(self, plan: capacity_pb2.StandbyPlan) -> NoPlan | None:
        """A decision without a time, or one older or later than the bounds: no plan."""
        if not plan.HasField("decided_time"):
            return NoPlan("undated", f"the plan of {_name(plan)} has no decided_time")
        try:
            age = self._clock() - from_timestamp(plan.decided_time)
        except (ValueError, OverflowError):  # a Timestamp out of protobuf's range
            return NoPlan("undated", f"the plan of {_name(plan)} has no usable decided_time")
        if age > MAX_PLAN_AGE:
            message = (
                f"the plan of {_name(plan)} was decided {age:.0f}s ago (at most {MAX_PLAN_AGE:g}s)"
            )
            return NoPlan("stale", message)
        if -age > MAX_PLAN_SKEW:
            message = (
                f"the plan of {_name(plan)} is stamped {-age:.0f}s ahead of this clock"
                f" (at most {MAX_PLAN_SKEW:g}s)"
            )
            return NoPlan("future", message)
        return None

    async def _connect(self, address: str) -> grpc.aio.Channel:
        if self._channel is None or address != self._address:
            await self.close()
            self._address, self._channel = address, grpc.aio.insecure_channel(address)
        return self._channel

    async def close(self) -> None:
        """Close the channel, if one is open."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _clip(text: str) -> str:
    """The scaler's text as a log line may carry it: at most ``REASON_LIMIT`` characters."""
    return text if len(text) <= REASON_LIMIT else quote(text, REASON_LIMIT)


def _name(plan: capacity_pb2.StandbyPlan) -> str:
    return f"{_clip(plan.namespace)}/{_clip(plan.name)}"
