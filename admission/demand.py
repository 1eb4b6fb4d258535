"""What inference needs of a pool, asked of the scaler (``unitscale.v1.CapacityService``).

A thin client. ``fetch_demand`` never raises for a scaler that cannot answer: an
unreachable address, a call past its timeout, ``UNAVAILABLE``, a pool the scaler knows no
ScaledObject of (``NOT_FOUND``) or a figure the scaler left unknown all come back as an
error string, and the caller decides (``inferenceHeadroom.whenUnavailable``). A missing
figure is never read as 0: a 0 would say inference needs nothing and hand its
accelerators to a training gang. Nor is an impossible one: a figure that is NaN,
infinite, negative or beyond ``MAX_ACCELERATORS`` leaves its pool unknown, with the
field named (a negative ``needed`` read as 0 would admit).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from admission.cluster import Ask, PoolDemand
from foundation.errors import quote
from foundation.timestamps import to_duration
from protos.unitscale.v1 import capacity_pb2, capacity_pb2_grpc

MAX_HORIZON_SECONDS = 366 * 86_400.0
"""A horizon beyond a year is a mistake, not a plan (and past what a Duration carries)."""
MAX_ACCELERATORS = 1_000_000.0
"""The most accelerators a figure may name: no pool holds a million, and a figure beyond
(1e300, say) would overflow the plan's arithmetic (``ceil(needed * (1 + headroom))``)."""
MAX_ERROR_LENGTH = 1024
"""Characters of the scaler's message an error keeps (it is logged and put in statuses)."""
MAX_ANSWER_BYTES = 1 << 20
"""The largest answer read (gRPC's default is 4 MiB). Asked for one pool the scaler answers
that pool alone, well under 2 KiB; every pool is about 60 bytes a pool, so this holds
15,000 of them. The answer is parsed on the controller's event loop: 4 MiB of pools took
0.04 s to parse and 0.06 s to look through for the one asked."""


@dataclass(frozen=True)
class DemandResult:
    """The pools the scaler answered with both figures known, or why not.

    ``demand`` is None when nothing usable came back (the scaler could not be asked, or
    the one pool asked for is unknown); asking for every pool, it holds the known pools
    and ``error`` names the others. A pool absent from ``demand`` is unknown, never 0.
    """

    demand: Mapping[str, PoolDemand] | None
    error: str = ""


async def fetch_demand(
    address: str,
    pool: str,
    horizon_seconds: float,
    *,
    timeout: float,  # noqa: ASYNC109 - the call's gRPC deadline, not a wait of ours
) -> DemandResult:
    """Ask the scaler at ``address`` (``host:port``) for ``pool`` ("" = every pool).

    The call fails fast on a refused connection (no wait for the channel to become ready)
    and gives up after ``timeout`` seconds.
    """
    if not math.isfinite(horizon_seconds) or abs(horizon_seconds) > MAX_HORIZON_SECONDS:
        return DemandResult(None, f"horizon {horizon_seconds!r}s: not a usable horizon")
    request = capacity_pb2.GetInferenceDemandRequest(
        pool=pool, horizon=to_duration(horizon_seconds)
    )
    try:
        options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = capacity_pb2_grpc.CapacityServiceStub(channel)
            response = await stub.GetInferenceDemand(request, timeout=timeout)
    except grpc.RpcError as err:
        return DemandResult(None, f"scaler {quote(address)}: {_describe(err)}")
    except Exception as err:  # this ask's own failure, never the pass's (an address gRPC
        # cannot encode raised UnicodeEncodeError and failed every check's pass: pass 4, H5)
        return DemandResult(None, f"scaler {quote(address)}: {type(err).__name__}")
    return _result(response, pool)


def merge_demand(
    answers: Sequence[tuple[Ask, DemandResult]],
) -> tuple[dict[Ask, PoolDemand], list[str]]:
    """Each ask's figures from its ``((scaler, pool, horizon), answer)``, and the errors.

    Only the pool asked is taken from an answer, and it is that ask's alone: each check
    reads its own ask (``decide.Cluster.asked``). A scaler's answer may list other pools
    (another check's scaler listed ours with held 0, needed 0, and the last answer read
    won: pass 4, M3); two asks of one pool at two horizons rightly differ, and another
    check's ask that disagreed made the pool unknown for both (pass 5, M3).
    """
    known: dict[Ask, PoolDemand] = {}
    errors: list[str] = []
    for ask, result in answers:
        if result.error:
            errors.append(result.error)
        figures = (result.demand or {}).get(ask[1])
        if figures is not None:
            known[ask] = figures
    return known, errors


def _describe(err: grpc.RpcError) -> str:
    code = err.code() if isinstance(err, grpc.aio.AioRpcError) else None
    details = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
    name = str(code.name) if code is not None else "error"
    return f"{name}: {str(details or '')[:MAX_ERROR_LENGTH]}"


def _result(response: capacity_pb2.GetInferenceDemandResponse, asked: str) -> DemandResult:
    # Asked for one pool, only its entries are read (the scaler answers that pool alone):
    # a scaler listing 380,000 other pools without figures (4 MiB, gRPC's bound) held the
    # controller's event loop 1.5 s an answer, a problem written for each (pass 8, AZ-1).
    entries = [m for m in response.pools if m.pool == asked] if asked else response.pools
    known: dict[str, PoolDemand] = {}
    problems: list[str] = []
    named = Counter(str(message.pool) for message in entries)
    # Which entry of a pool named twice is right is unknown: none is used (the last won).
    problems.extend(
        f"pool {quote(name)}: named {times} times in the answer: not used"
        for name, times in named.items()
        if times > 1
    )
    for message in entries:
        name = str(message.pool)
        if named[name] > 1:
            continue
        if message.HasField("accelerators_held") and message.HasField("accelerators_needed"):
            held, needed = float(message.accelerators_held), float(message.accelerators_needed)
            wrong = _impossible(held=held, needed=needed)
            if wrong:
                problems.append(f"pool {quote(name)}: {wrong}: not used")
            else:
                known[name] = PoolDemand(name, held, needed)
        else:
            problems.append(f"pool {quote(name)}: {_unknown(message)}")
    if asked and asked not in known:
        problems = problems or [f"pool {quote(asked)}: not in the scaler's answer"]
        return DemandResult(None, "; ".join(problems)[:MAX_ERROR_LENGTH])
    return DemandResult(known, "; ".join(problems)[:MAX_ERROR_LENGTH])


def _impossible(**figures: float) -> str:
    """What is wrong with the figures (``""``: nothing), naming each field."""
    wrong = [
        f"accelerators_{field} is {value!r}"
        for field, value in figures.items()
        if not (math.isfinite(value) and 0.0 <= value <= MAX_ACCELERATORS)
    ]
    if not wrong:
        return ""
    return f"{', '.join(wrong)} (must be finite, 0 to {MAX_ACCELERATORS:g})"


def _unknown(message: capacity_pb2.PoolDemand) -> str:
    missing = [
        field.removeprefix("accelerators_")
        for field in ("accelerators_held", "accelerators_needed")
        if not message.HasField(field)
    ]
    why = str(message.unknown_reason) or "no reason given"
    return f"accelerators {' and '.join(missing)} unknown ({why})"
