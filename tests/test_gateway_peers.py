"""A replica's quick failures weigh in routing, and it is ejected only apart from its peers.

A replica answering at once is idle again at once: least-outstanding routing sent one
answering 401 to everything 91% of the traffic, and a client's requests that make every
replica answer 500 all went to the one least loaded, ejecting three healthy replicas of
four (hostile pass 65). Each quick failure or refusal now weighs as a request outstanding
for ``FAILURE_SECONDS``, and fast failures eject a replica only when they stand out from
its peers' share. Real servers on 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web

from serving import gateway as gateway_module
from serving.gateway import EJECT_AFTER, REFUSING_AFTER, Gateway
from serving.gateway_replicas import ANSWERED, FAILED, REFUSED
from serving.gateway_settings import GatewaySettings
from serving.routing import Backoff, ReplicaView, choose
from tests.conftest import eventually
from tests.test_gateway_answers import COMPLETION, answers, fakes, post, status
from tests.test_gateway_faults import Behaviour, Fake
from tests.test_gateway_isolation import gateway_for


def weighed(url: str, outstanding: int, failures: int) -> ReplicaView:
    return ReplicaView(url, True, outstanding, frozenset({"m"}), failures=failures)


@pytest.mark.parametrize(
    ("replicas", "chosen"),
    [
        pytest.param(
            [weighed("a", 0, 1), weighed("b", 0, 0)],
            "b",
            id="one that just failed at once is passed over for an idle one",
        ),
        pytest.param(
            [weighed("a", 0, 1), weighed("b", 1, 0)],
            "a",
            id="a failure weighs as a request outstanding, ties to the first listed",
        ),
        pytest.param(
            [weighed("a", 3, 0), weighed("b", 0, 2)],
            "b",
            id="failures fewer than the others hold leave it chosen",
        ),
        pytest.param([weighed("a", 0, 50)], "a", id="the only one is chosen however it fails"),
    ],
)
def test_quick_failures_weigh_as_requests_outstanding(
    replicas: list[ReplicaView], chosen: str
) -> None:
    assert choose(replicas, "m") == chosen


def ejections(peers: list[str], answers_: str, models: str = "") -> list[int]:
    """At which of ``answers_`` (F: a fast failure, S: an answer) the first of four
    replicas is ejected, its three peers' last answers being ``peers``; ``models``: the
    model each of the four serves (none listed: empty)."""
    g = Gateway([f"http://r{i}" for i in range(4)], GatewaySettings())
    for r, model in zip(g.replicas, models, strict=False):
        r.models = frozenset({model})
    replica, *others = g.replicas
    for peer, window in zip(others, peers, strict=True):
        peer.recent.extend(FAILED if answer == "F" else ANSWERED for answer in window)
    ejected = []
    for i, answer in enumerate(answers_, start=1):
        if answer == "S":
            g._answered_well(replica)
        elif g._failed_fast(replica) is not None:
            ejected.append(i)
    return ejected


@pytest.mark.parametrize(
    ("peers", "answers_", "ejected_at"),
    [
        pytest.param(["S" * 10] * 3, "FFF", [3], id="failing beside peers that answer ejects"),
        pytest.param(["", "", ""], "FFF", [3], id="beside peers not heard from it ejects alone"),
        pytest.param(
            ["FF"] * 3, "FFFFFF", [], id="one failure ahead of peers failing alike is no sign"
        ),
        pytest.param(
            ["FFSSSSSSSS"] * 3,
            "SSFSSFSSFS",
            [],
            id="failing about as often as its peers never ejects",
        ),
        pytest.param(
            ["FSSSSSSSSS"] * 3,
            "SSSSSSSFFF",
            [10],
            id="twice its peers' share and one more ejects",
        ),
        pytest.param(
            ["FFFFFSSSSS"] * 3,
            "FFFFFFFFFS",
            [],
            id="failing nine in ten beside peers failing half is no sign either",
        ),
        pytest.param(
            ["FFFFFSSSSS"] * 3,
            "FFFFFFFFFF",
            [10],
            id="failing a whole window beside peers that answer some is one, however they fail",
        ),
        pytest.param(
            ["F" * 10] * 3,
            "F" * 20,
            [],
            id="beside peers failing every answer too the failures are the requests'",
        ),
    ],
)
def test_fast_failures_eject_only_apart_from_the_peers(
    peers: list[str], answers_: str, ejected_at: list[int]
) -> None:
    assert ejections(peers, answers_) == ejected_at


@pytest.mark.parametrize(
    ("models", "ejected_at"),
    [
        pytest.param("aabb", [], id="replicas of another model do not thin its peers' share"),
        pytest.param("abbb", [9], id="with no peer of its model it is judged alone"),
        pytest.param("", [9], id="replicas that have not listed their models are all peers"),
    ],
)
def test_its_peers_are_the_replicas_of_its_models(models: str, ejected_at: list[int]) -> None:
    peers = ["FFSSSSSSSS", "S" * 10, "S" * 10]
    assert ejections(peers, "SSFSSFSSF", models) == ejected_at


async def test_a_replica_refusing_everything_at_once_is_given_one_request_not_all() -> None:
    async with fakes(status(401), answers) as (refuses, well):
        async with gateway_for([refuses.url, well.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            for _ in range(20):
                await post(gateway, COMPLETION)
            # Before: 20 and 0 (listed first, idle again at once, each one a 401).
            assert (refuses.received, well.received) == (1, 19)


HONEST_SECONDS = 0.3
"""An honest request's time on a replica: long beside a 500 answered at once."""


def poisoned(release: asyncio.Event | None = None) -> Behaviour:
    """An honest replica: a request it cannot take fails at once (vLLM's 500 for an
    input check raising), the others take their time, or end once ``release`` is set."""

    async def answer(request: web.Request, fake: Fake) -> web.StreamResponse:
        if (await request.json()).get("prompt") == "poison":
            return web.json_response({"message": "Internal Server Error"}, status=500)
        if release is None:
            await asyncio.sleep(HONEST_SECONDS)  # the replica's pace, not a synchronisation
        else:
            await release.wait()
        return web.json_response({"choices": [{"text": "ok"}]})

    return answer


async def test_a_clients_requests_failing_everywhere_eject_no_replica_under_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)
    release = asyncio.Event()
    async with fakes(*[poisoned(release)] * 4) as replicas:
        async with gateway_for([r.url for r in replicas]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "all ready")
            honest = [asyncio.create_task(post(gateway, COMPLETION)) for _ in range(8)]
            await eventually(lambda: g.stats.in_flight == 8, "the honest requests in flight")
            for _ in range(12):
                assert await post(gateway, COMPLETION | {"prompt": "poison"}) == 500
            release.set()
            assert await asyncio.gather(*honest) == [200] * 8
            # Before: the poison went to whichever was least loaded, three each to two
            # replicas, both ejected.
            assert [r.eject_backoff.failures for r in g.replicas] == [0] * 4
            assert [r.received for r in replicas] == [5] * 4  # 2 honest and 3 poison each


async def test_a_replica_failing_everything_at_once_is_still_ejected_under_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)

    async def sick(request: web.Request, fake: Fake) -> web.StreamResponse:
        return web.json_response({"message": "engine dead"}, status=500)

    async with fakes(sick, *[poisoned()] * 3) as replicas:
        async with gateway_for([r.url for r in replicas]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "all ready")
            # All 30 are routed before the first answer: a share each.
            await asyncio.gather(*(post(gateway, COMPLETION) for _ in range(30)))
            assert g.replicas[0].eject_backoff.failures >= 1
            before = replicas[0].received
            got = await asyncio.gather(*(post(gateway, COMPLETION) for _ in range(30)))
            assert (replicas[0].received - before, got) == (0, [200] * 30)


def test_a_peer_ejected_keeps_its_failures_for_the_comparison() -> None:
    """Its window cleared at its ejection, an ejected replica read as a peer answering
    well: two replicas of a model took turns being ejected by a client's requests that
    failed on both (hostile pass 68)."""
    g = Gateway(["http://r0", "http://r1"], GatewaySettings())
    first, second = g.replicas
    for replica in g.replicas:
        for _ in range(7):
            g._answered_well(replica)
    assert [g._failed_fast(first) is not None for _ in range(3)] == [False, False, True]
    assert [g._failed_fast(second) is not None for _ in range(3)] == [False, False, False]


async def test_a_replica_refusing_everything_beside_one_busy_is_ejected() -> None:
    """A 4xx is the client's, never counted: a replica answering 401 to everything kept
    69% of the traffic beside one busy with requests of 25 s (hostile pass 68)."""
    release = asyncio.Event()
    async with fakes(status(401), poisoned(release)) as (refuses, busy):
        async with gateway_for([refuses.url, busy.url]) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            sent = []
            for i in range(1, 21):
                sent.append(asyncio.create_task(post(gateway, COMPLETION)))
                await eventually(
                    lambda i=i: (
                        refuses.received + busy.received == i and g.stats.in_flight == busy.received
                    ),
                    "the request refused or held",
                )
            release.set()
            got = await asyncio.gather(*sent)
            # Before: 10 and 10, every other one refused as the refusals weighed.
            assert (refuses.received, busy.received) == (REFUSING_AFTER, 20 - REFUSING_AFTER)
            assert got.count(401) == REFUSING_AFTER
            assert g.replicas[0].eject_backoff.failures == 1


def test_the_failures_an_ejection_was_for_do_not_eject_it_again() -> None:
    """Its window kept, a replica's first failure after its ejection ejected it again,
    for twice as long, on the failures the first was for."""
    g = Gateway([f"http://r{i}" for i in range(4)], GatewaySettings())
    replica, *peers = g.replicas
    for peer in peers:
        peer.recent.extend([ANSWERED] * 10)
    assert [g._failed_fast(replica) is not None for _ in range(3)] == [False, False, True]
    replica.eject_backoff = Backoff(replica.eject_backoff.failures, -math.inf)  # over
    assert [g._failed_fast(replica) is not None for _ in range(3)] == [False, False, True]
    assert replica.eject_backoff.failures == 2


def refusals(answers_: str, peers: str = "S" * 10) -> list[int]:
    """At which of ``answers_`` (R: a refusal, S: an answer) the first of four replicas
    is ejected, its three peers' last answers being ``peers`` (R, F: a failure, S)."""
    kinds = {"R": REFUSED, "F": FAILED, "S": ANSWERED}
    g = Gateway([f"http://r{i}" for i in range(4)], GatewaySettings())
    replica, *others = g.replicas
    for peer in others:
        peer.recent.extend(kinds[a] for a in peers)
    ejected = []
    for i, answer in enumerate(answers_, start=1):
        if answer == "S":
            g._answered_well(replica)
        elif g._failed_fast(replica, REFUSED) is not None:
            ejected.append(i)
    return ejected


@pytest.mark.parametrize(
    ("answers_", "peers", "ejected_at"),
    [
        pytest.param("R" * 10, "S" * 10, [8], id="refusing everything ejects at the eighth"),
        pytest.param(
            "SSRSSSRSSSRSSSR", "S" * 10, [], id="a client's invalid requests landing on it do not"
        ),
        pytest.param("R" * 10, "R" * 10, [], id="beside peers refusing everything too, no sign"),
        pytest.param("R" * 10, "FFFFFFFFFS", [8], id="peers' failures are no refusals"),
    ],
)
def test_refusals_eject_a_replica_only_when_most_of_its_answers_are(
    answers_: str, peers: str, ejected_at: list[int]
) -> None:
    """At three refusals, 5% of invalid requests from ordinary clients ejected one of two
    healthy replicas 43% of the time (hostile pass 69)."""
    assert refusals(answers_, peers) == ejected_at


@pytest.mark.usefixtures("no_failure_weight")
async def test_a_replica_that_never_answers_is_ejected_beside_one_that_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timeouts were never counted toward ejection: a hung engine behind a live /health
    kept 27.5% of the traffic, each request a 504 after the upstream timeout (pass 69)."""
    monkeypatch.setattr(gateway_module, "EJECT_SECONDS", 3600.0)
    forever = asyncio.Event()  # never set: it accepts and never answers

    async def hung(request: web.Request, fake: Fake) -> web.StreamResponse:
        await forever.wait()
        raise AssertionError("unreachable")

    async with fakes(hung, answers) as (stuck, well):
        async with gateway_for([stuck.url, well.url], upstream_timeout=0.2) as gateway:
            g = gateway.gateway
            await eventually(lambda: all(r.routable for r in g.replicas), "both ready")
            got = [await post(gateway, COMPLETION) for _ in range(12)]
            assert g.replicas[0].eject_backoff.failures == 1
            assert got.count(504) == stuck.received == EJECT_AFTER
