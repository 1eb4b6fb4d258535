"""The scaler's standby plan for the gateway's workload: ``GetStandbyPlan`` over gRPC.

The scaler decides how many replicas run and how many sleep beside them
(``scaler.core.standby``); the gateway only asks. Anything short of exactly one plan with
both counts (the scaler unreachable, no ScaledObject with ``standby: true``, two of them,
no decision yet) is a reason to hold: nothing is put to sleep on a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import grpc

from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc


@dataclass(frozen=True, slots=True)
class Plan:
    """The replicas to run, and to hold asleep beside them."""

    running: int
    sleeping: int
    reason: str


class PlanSource(Protocol):
    """Where a standby round gets the plan from (the scaler, or a test's stand-in)."""

    async def plan(
        self, address: str, namespace: str, deployment: str, rpc_seconds: float
    ) -> Plan | str:
        """The workload's plan, or why there is none to act on."""
        ...


class StandbyClient:
    """One channel to the scaler, made anew when its address changes (a reload)."""

    def __init__(self) -> None:
        self._address: str | None = None
        self._channel: grpc.aio.Channel | None = None

    async def plan(
        self, address: str, namespace: str, deployment: str, rpc_seconds: float
    ) -> Plan | str:
        """The workload's plan, or why there is none to act on (an answer within seconds)."""
        stub = capacity_pb2_grpc.CapacityServiceStub(await self._connect(address))
        request = capacity_pb2.GetStandbyPlanRequest(namespace=namespace, deployment=deployment)
        try:
            plans = (await stub.GetStandbyPlan(request, timeout=rpc_seconds)).plans
        except grpc.aio.AioRpcError as err:
            return f"the scaler at {address} answered {err.code().name}: {err.details()}"
        if len(plans) != 1:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in plans)
            where = f"{namespace}/{deployment}"
            return f"{len(plans)} ScaledObjects scale {where} with standby: {names}"
        (plan,) = plans
        if not plan.HasField("running") or not plan.HasField("sleeping"):
            return f"no standby plan yet from {plan.namespace}/{plan.name}: {plan.reason}"
        return Plan(plan.running, plan.sleeping, plan.reason)

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
