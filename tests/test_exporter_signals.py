"""Windows over scrapes: rates and quantiles from increases, restarts, cost, unknowns."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.engines import EngineStats, Histogram
from exporter.signals import Accelerator, ReplicaHistory, bucket_quantile, derive, majority_floor

INF = math.inf
BOUNDS = (0.1, 0.5, 1.0, INF)


def scrape(
    prompt,
    generation,
    requests,
    ttft=(0, 0, 0, 0),
    created=1.0,
    waiting=0.0,
    running=0.0,
    lengths=None,
):
    """``lengths``: (finished requests, their prompt tokens, their output tokens) so far."""
    histograms = {"ttft": Histogram(BOUNDS, tuple(map(float, ttft)), float(ttft[-1]), 0.0)}
    if lengths is not None:
        count, prompt_sum, output_sum = lengths
        for concept, total in (("prompt_length", prompt_sum), ("output_length", output_sum)):
            histograms[concept] = Histogram((100.0, INF), (0.0, count), count, total)
    return EngineStats(
        "vllm",
        "m",
        gauges={"running": running, "waiting": waiting, "kv_usage": 0.5},
        counters={
            "prompt_tokens": prompt,
            "generation_tokens": generation,
            "requests": requests,
            "preemptions": 0.0,
        },
        histograms=histograms,
        created=created,
    )


def history_of(*scrapes, horizon=120.0):
    history = ReplicaHistory(horizon)
    for time, stats in scrapes:
        history.add(time, stats)
    return history


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        pytest.param(0.5, (2, 6, 6, 6), 0.2, id="interpolates-inside-the-bucket"),
        pytest.param(0.25, (2, 6, 6, 6), 0.075, id="first-bucket-starts-at-zero"),
        pytest.param(0.99, (0, 0, 1, 10), 1.0, id="rank-in-inf-bucket-gives-largest-finite-bound"),
        pytest.param(0.5, (0, 0, 0, 0), None, id="no-observations-is-unknown-not-zero"),
        pytest.param(0.8, (3, 2, 4, 4), 0.6, id="non-monotone-scrape-is-made-monotone"),
    ],
)
def test_bucket_quantile(q, counts, expected):
    got = bucket_quantile(q, BOUNDS, np.array(counts, dtype=float))
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_rates_come_from_increases_inside_the_window_not_lifetime_totals():
    history = history_of(
        (0.0, scrape(10_000, 5_000, 900, ttft=(900, 900, 900, 900))),  # lifetime history
        (10.0, scrape(10_100, 5_050, 905, ttft=(900, 903, 905, 905))),
        (20.0, scrape(10_300, 5_150, 915, ttft=(902, 908, 915, 915))),
    )
    window = history.window(20.0, 10.0)
    assert window is not None
    assert window.duration == 10.0
    assert window.rate("prompt_tokens") == pytest.approx(20.0)
    assert window.rate("requests") == pytest.approx(1.0)
    _bounds, counts = window.buckets("ttft")
    assert list(counts) == [2, 5, 10, 10]  # the window's 10 requests, not 915


def test_a_restart_never_gives_a_negative_rate():
    history = history_of(
        (0.0, scrape(5_000, 800, 40, created=1.0)),
        (10.0, scrape(5_200, 850, 45, created=1.0)),
        (20.0, scrape(30, 10, 2, created=2.0)),  # process restarted: counters from 0
    )
    window = history.window(20.0, 20.0)
    assert window.rate("prompt_tokens") == pytest.approx((200 + 30) / 20)
    assert window.rate("requests") == pytest.approx((5 + 2) / 20)


def test_a_counter_going_down_is_a_restart_even_without_created():
    history = history_of(
        (0.0, scrape(1_000, 100, 10, created=None)),
        (10.0, scrape(40, 4, 1, created=None)),
    )
    assert history.window(10.0, 10.0).rate("generation_tokens") == pytest.approx(0.4)


def two_engines_in_turn(scrapes: int, start_a: float, start_b: float, every: float = 5.0):
    """One address answering for two engines in turn (a Service), each 10 requests a second."""
    for i in range(scrapes):
        lifetime = (start_a if i % 2 == 0 else start_b) + 10 * every * i
        yield i * every, scrape(100 * lifetime, 10 * lifetime, lifetime)


@pytest.mark.parametrize(
    ("scrapes", "known"),
    [
        pytest.param(
            list(two_engines_in_turn(14, 2e6, 1e6)),
            False,
            id="counters falling every other scrape (two engines behind one address) are unknown",
        ),
        pytest.param(
            list(two_engines_in_turn(14, 50_000, 20_000)),
            False,
            id="an honest Service URL over two pods is unknown, not thousands a second",
        ),
        pytest.param(
            [(0.0, scrape(5_000, 800, 40)), (10.0, scrape(5_200, 850, 45)),
             (20.0, scrape(30, 10, 2)), (30.0, scrape(230, 60, 7))],
            True,
            id="one restart in the history is a restart, counted",
        ),
        pytest.param(
            [(0.0, scrape(5_000, 800, 40)), (10.0, scrape(30, 10, 2)),
             *((10.0 * i, scrape(30 + 200 * i, 10 + 50 * i, 2 + 5 * i)) for i in range(2, 14)),
             (140.0, scrape(40, 20, 3)), (150.0, scrape(240, 70, 8))],
            True,
            id="two restarts further apart than the history are each counted",
        ),
    ],
)  # fmt: skip
def test_restarts_in_a_row_leave_the_counters_unknown(scrapes, known):
    """Each fall read as a restart made 20 requests/s 3,888 (hostile pass 62)."""
    history = history_of(*scrapes, horizon=70.0)
    now = scrapes[-1][0]
    window = history.window(now, 60.0)
    rate = window.rate("requests")
    assert (rate is not None) is known
    if known:
        assert rate < 1.0
    signals = derive(now, 1, [scrapes[-1][1]], [history], 10.0, 60.0, Accelerator(1.0, 1.0))
    assert (signals.stable.request_rate is not None) is known
    # Partly known, said so: the scaler read what was in flight as the load, 10 -> 1 (pass 65).
    assert signals.partial is not known


@pytest.mark.parametrize(
    "dip",
    [
        pytest.param(lambda i: {"ttft": (90_000 - i % 2, 90_000, 100_000, 100_000)},
                     id="one bucket one count back every other scrape"),
        pytest.param(lambda i: {"prompt": 10_000_000 + 5_000 * (i - i % 2) - i % 2},
                     id="one token counter one count back every other scrape"),
        pytest.param(lambda i: {"prompt": 10_000_000 + 5_000 * (i - i % 2) - i % 2,
                                "generation": 1_000_000 + 500 * (i - i % 2) - i % 2,
                                "requests": 100_000 + 50 * (i - i % 2) - i % 2},
                     id="all three core counters one count back every other scrape"),
        pytest.param(lambda i: {"created": 1.0 + i,
                                "prompt": 10_000_000 + 5_000 * (i - i % 2),
                                "generation": 1_000_000 + 500 * (i - i % 2),
                                "requests": 100_000 + 50 * (i - i % 2)},
                     id="a _created moving while the counters stand still every other scrape"),
    ],
)  # fmt: skip
def test_a_column_falling_alone_is_no_restart_and_adds_nothing(dip):
    """Read as a restart, every lifetime total was that step's increase: 100,045
    requests/s for 10, and the scaler held the fleet at its maximum (issue 27,
    hostile pass 30)."""
    history = ReplicaHistory(120.0)
    for i in range(13):  # 5 s scrapes on lifetime totals: 10 requests/s, 1,000 tokens/s
        honest = {
            "prompt": 10_000_000 + 5_000 * i,
            "generation": 1_000_000 + 500 * i,
            "requests": 100_000 + 50 * i,
            "ttft": (90_000, 90_000, 100_000, 100_000),
        }
        history.add(1000.0 + 5 * i, scrape(**(honest | dip(i))))
    window = history.window(1060.0, 60.0)
    assert window is not None
    assert window.rate("requests") == pytest.approx(10.0, rel=0.02)  # a count a dip at most
    assert window.rate("prompt_tokens") == pytest.approx(1_000.0, rel=0.02)


def test_one_scrape_is_not_enough_for_a_rate():
    assert history_of((0.0, scrape(10, 1, 1))).window(0.0, 10.0) is None


def test_old_scrapes_leave_the_horizon():
    history = history_of(*[(float(t), scrape(t, t, t)) for t in range(0, 200, 10)], horizon=30.0)
    assert history.times[0] >= 190 - 40


def test_changed_buckets_keep_the_counters_and_leave_the_buckets_unknown():
    # Hostile pass 7, XS-H2: the history had restarted whole (tests/test_exporter_hostile7.py).
    history = history_of((0.0, scrape(10, 1, 1)))
    other = scrape(20, 2, 2)
    other.histograms["ttft"] = Histogram((1.0, INF), (0.0, 0.0), 0.0, 0.0)
    history.add(10.0, other)
    window = history.window(10.0, 10.0)
    assert window is not None
    assert window.rate("requests") == pytest.approx(0.1)
    assert window.buckets("ttft") is None


def replica_on(bounds, per_window):
    """A replica whose TTFT histogram, in ``bounds``, grew by ``per_window`` in 60 s."""
    before, after = scrape(0, 0, 0), scrape(600, 60, 6)
    before.histograms["ttft"] = Histogram(bounds, (0.0,) * len(bounds), 0.0, 0.0)
    after.histograms["ttft"] = Histogram(bounds, tuple(map(float, per_window)), per_window[-1], 0.0)
    return history_of((0.0, before), (60.0, after)), after


HONEST = (BOUNDS, (0, 0, 60, 60))  # every first token between 0.5 and 1 s
OTHER = ((0.001, 0.002, INF), (10**6, 10**6, 10**6))  # bounds of its own, a million claimed


@pytest.mark.parametrize(
    ("replicas", "p95"),
    [
        pytest.param(
            [HONEST, HONEST, OTHER],
            0.975,
            id="one replica with bounds of its own and a million observations decides nothing",
        ),
        pytest.param([HONEST, OTHER], None, id="two replicas on two layouts are no quantile"),
        pytest.param(
            [OTHER, OTHER, HONEST], 0.00095, id="the layout most replicas share gives the quantile"
        ),
        pytest.param([HONEST], 0.975, id="one replica gives its own"),
    ],
)
def test_the_layout_most_replicas_share_gives_the_quantiles(replicas, p95):
    made = [replica_on(bounds, counts) for bounds, counts in replicas]
    signals = derive(60.0, len(made), [m[1] for m in made], [m[0] for m in made], 10.0, 60.0, PRICE)
    assert signals.stable.ttft.p95 == (pytest.approx(p95) if p95 is not None else None)


CLAIMING = (BOUNDS, (10**6, 10**6, 10**6, 10**6))  # vLLM's own bounds, a million under 0.1 s


@pytest.mark.parametrize(
    ("replicas", "p95"),
    [
        pytest.param(
            [HONEST] * 9 + [CLAIMING],
            0.975,
            id="one replica of ten claiming a million fast first tokens leaves the p95 alone",
        ),
        pytest.param(
            [HONEST] * 5 + [CLAIMING] * 4,
            0.975,
            id="four of nine claiming leave the p95 to the five that do not",
        ),
        pytest.param(
            [HONEST, CLAIMING],
            0.095,
            id="one of two is half the deployment and pools as before",
        ),
    ],
)
def test_replicas_claiming_most_observations_never_lower_the_p95_below_the_lower_half(
    replicas, p95
):
    made = [replica_on(bounds, counts) for bounds, counts in replicas]
    signals = derive(60.0, len(made), [m[1] for m in made], [m[0] for m in made], 10.0, 60.0, PRICE)
    assert signals.stable.ttft.p95 == pytest.approx(p95, rel=1e-3)


PRICE = Accelerator(price_per_hour=3.6, fraction=0.5)


def test_deployment_signals_sum_replicas_and_price_tokens():
    a = history_of((0.0, scrape(0, 0, 0)), (60.0, scrape(36_000, 3_600, 60, waiting=2, running=3)))
    b = history_of((0.0, scrape(0, 0, 0)), (60.0, scrape(0, 3_600, 60, waiting=1, running=1)))
    latest = [
        a_stats := scrape(36_000, 3_600, 60, waiting=2, running=3),
        scrape(0, 3_600, 60, waiting=1, running=1),
    ]
    assert a_stats.gauges["waiting"] == 2
    signals = derive(60.0, 2, latest, [a, b], 10.0, 60.0, PRICE)
    assert (signals.queue_depth, signals.running, signals.kv_usage) == (3.0, 4.0, 0.5)
    assert signals.stable.request_rate == pytest.approx(2.0)
    assert signals.stable.prompt_token_rate == pytest.approx(600.0)
    assert signals.stable.generation_token_rate == pytest.approx(120.0)
    # 2 replicas x 0.5 card x $3.6/h = $3.6/h; 720 tok/s = 2.592M tok/h -> $1.389 per 1M
    assert signals.cost_per_million_tokens == pytest.approx(3.6 / (720 * 3600) * 1e6)
    assert signals.cost_per_million_output_tokens == pytest.approx(3.6 / (120 * 3600) * 1e6)
    assert not signals.partial


def test_a_down_replica_still_costs_and_marks_the_signal_partial():
    a = history_of((0.0, scrape(0, 0, 0)), (60.0, scrape(0, 360, 6)))
    signals = derive(60.0, 2, [scrape(0, 360, 6)], [a], 10.0, 60.0, PRICE)
    assert signals.partial and signals.replicas_up == 1
    assert signals.cost_per_million_output_tokens == pytest.approx(3.6 / (6 * 3600) * 1e6)


def test_replicas_that_answer_nothing_are_unknown_not_zero():
    signals = derive(60.0, 2, [], [ReplicaHistory(120.0), ReplicaHistory(120.0)], 10.0, 60.0, PRICE)
    assert signals.queue_depth is None and signals.running is None
    assert signals.stable.request_rate is None
    assert signals.cost_per_million_tokens is None


def test_no_replicas_at_all_is_a_known_zero_load():
    signals = derive(60.0, 0, [], [], 10.0, 60.0, PRICE)
    assert (signals.queue_depth, signals.running, signals.stable.request_rate) == (0.0, 0.0, 0.0)
    assert signals.cost_per_million_tokens is None  # no spend, no tokens: no price


def test_replicas_serving_nothing_cost_infinitely_per_token():
    a = history_of((0.0, scrape(5, 5, 5)), (60.0, scrape(5, 5, 5)))
    signals = derive(60.0, 1, [scrape(5, 5, 5)], [a], 10.0, 60.0, PRICE)
    assert signals.cost_per_million_tokens == INF


def mix_of(replicas, now=60.0, window=60.0):
    """Each replica: its scrapes as (time, lengths) or (time, lengths, created)."""
    histories, latest = [], []
    for scrapes in replicas:
        stats = [
            (t, scrape(0, 0, 0, lengths=ls, created=(c[0] if c else 1.0))) for t, ls, *c in scrapes
        ]
        histories.append(history_of(*stats))
        latest.append(stats[-1][1])
    signals = derive(now, len(replicas), latest, histories, 10.0, window, PRICE)
    return signals.stable.mean_prompt_tokens, signals.stable.mean_output_tokens


LIFETIME = (100, 50_000, 1_000)  # a lifetime mean of 500 prompt and 10 output tokens


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param(
            [[(0.0, LIFETIME), (60.0, (110, 52_000, 1_400))]],
            (200.0, 40.0),
            id="the-mean-of-the-requests-finished-in-the-window-not-the-lifetime-mean",
        ),
        pytest.param(
            [[(0.0, LIFETIME), (30.0, LIFETIME), (60.0, LIFETIME)]],
            (None, None),
            id="no-request-finished-in-the-window-is-unknown-never-zero",
        ),
        pytest.param(
            [[(0.0, LIFETIME, 1.0), (60.0, (4, 800, 160), 2.0)]],
            (200.0, 40.0),
            id="a-restart-counts-the-requests-since-it",
        ),
        pytest.param(
            [[(0.0, LIFETIME, None), (60.0, (4, 800, 160), None)]],
            (200.0, 40.0),
            id="a-count-going-down-is-a-restart-even-without-created",
        ),
        pytest.param(
            [
                [(0.0, (0, 0, 0)), (60.0, (10, 1_000, 100))],
                [(0.0, (0, 0, 0)), (60.0, (30, 9_000, 900))],
            ],
            (250.0, 25.0),
            id="replicas-are-weighted-by-their-finished-requests-not-averaged",
        ),
        pytest.param(
            [[(0.0, (0, 0, 0)), (60.0, (10, 2_000, 400))], [(0.0, None), (60.0, None)]],
            (200.0, 40.0),
            id="a-replica-without-the-histograms-is-left-out-like-for-latencies",
        ),
        pytest.param(
            [[(0.0, (0, 0, 0)), (60.0, (60, 60_000, 30_000))]] * 9
            + [[(0.0, (0, 0, 0)), (60.0, (6_000_000, 6_000_000, 6_000_000))]],
            (1_000.0, 500.0),
            id="one-replica-of-ten-claiming-a-million-one-token-requests-never-sets-the-mix",
        ),
        pytest.param(
            [[(0.0, (0, 0, 0)), (60.0, (10, 1_000, 100))]] * 2
            + [[(0.0, (0, 0, 0)), (60.0, (100, 3_000, 300))]],
            (100.0, 10.0),
            id="a-busy-replica-of-short-requests-pulls-the-pool-no-lower-than-the-lower-half",
        ),
        pytest.param(
            [[(0.0, None), (60.0, None)]],
            (None, None),
            id="an-engine-without-the-histograms-is-unknown",
        ),
        pytest.param(
            [[(0.0, (0, math.nan, math.nan)), (60.0, (10, math.nan, math.nan))]],
            (None, None),
            id="a-histogram-without-its-sum-is-unknown",
        ),
    ],
)
def test_the_request_mix_is_the_window_mean_of_finished_requests(replicas, expected):
    assert mix_of(replicas) == (
        tuple(pytest.approx(v) if v is not None else None for v in expected)
    )


def test_the_panic_window_has_its_own_mix():
    history = history_of(
        (0.0, scrape(0, 0, 0, lengths=(0, 0, 0))),
        (50.0, scrape(0, 0, 0, lengths=(10, 1_000, 100))),
        (60.0, scrape(0, 0, 0, lengths=(20, 21_000, 1_100))),
    )
    signals = derive(
        60.0, 1, [scrape(0, 0, 0, lengths=(20, 21_000, 1_100))], [history], 10.0, 60.0, PRICE
    )
    assert (signals.panic.mean_prompt_tokens, signals.panic.mean_output_tokens) == (2_000, 100)
    assert (signals.stable.mean_prompt_tokens, signals.stable.mean_output_tokens) == (1_050, 55)


def test_no_replicas_at_all_have_no_mix():
    signals = derive(60.0, 0, [], [], 10.0, 60.0, PRICE)
    assert signals.stable.mean_prompt_tokens is None and signals.stable.mean_output_tokens is None


def asleep(sleeping):
    stats = scrape(0, 0, 0)
    return EngineStats(
        stats.engine, stats.model, stats.gauges, stats.counters, stats.histograms, 1.0,
        sleeping=sleeping, sleep_level=1 if sleeping else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("known", "states", "expected"),
    [
        pytest.param(3, [True, False, False], 1, id="answering-replicas-asleep-are-counted"),
        pytest.param(2, [False, False], 0, id="every-one-awake-is-a-known-zero"),
        pytest.param(2, [True, None], None, id="one-without-a-sleep-state-makes-it-unknown"),
        pytest.param(2, [], None, id="none-answering-is-unknown-not-zero"),
        pytest.param(0, [], 0, id="no-replica-at-all-is-a-known-zero"),
    ],
)
def test_replicas_asleep(known, states, expected):
    latest = [asleep(s) for s in states]
    histories = [ReplicaHistory(120.0) for _ in range(known)]
    assert derive(60.0, known, latest, histories, 10.0, 60.0, PRICE).replicas_sleeping == expected


def test_replicas_asleep_travel_on_the_wire_and_unknown_stays_unknown():
    from foundation.signals import EngineSignals, Snapshot
    from foundation.signals_wire import decode, encode

    for value in (None, 0, 2):
        signals = derive(60.0, 0, [], [], 10.0, 60.0, PRICE)
        signals = type(signals)(**{**_fields(signals), "replicas_sleeping": value})
        back = decode(encode(Snapshot(("n", "d", ""), signals))).signals
        assert isinstance(back, EngineSignals) and back.replicas_sleeping == value


def _fields(signals):
    return {name: getattr(signals, name) for name in signals.__dataclass_fields__}


# --- issue 27, hostile pass M4: _created never turns totals into rates -------------------


def exposition(total: float, tokens: float, created: str) -> bytes:
    return (
        "vllm:num_requests_running 2\nvllm:num_requests_waiting 0\n"
        f"vllm:request_success_total {total}\nvllm:request_success_created {created}\n"
        f"vllm:generation_tokens_total {tokens}\nvllm:generation_tokens_created {created}\n"
        f"vllm:prompt_tokens_total {tokens}\nvllm:prompt_tokens_created {created}\n"
    ).encode()


@pytest.mark.parametrize(
    ("created", "rejected"),
    [
        pytest.param(lambda i: "1700000000", {}, id="a constant _created gives the true rates"),
        pytest.param(lambda i: "NaN", {"created": "not-finite"},
                     id="a NaN _created is rejected and the true rates stand"),
        pytest.param(lambda i: "+Inf", {"created": "not-finite"},
                     id="an infinite _created is rejected and the true rates stand"),
        pytest.param(lambda i: str(1700000000 + i), {},
                     id="a _created changing every scrape while counters rise is no restart"),
    ],
)  # fmt: skip
def test_a_hostile_created_never_turns_lifetime_totals_into_rates(created, rejected):
    from exporter.engines import read_exposition
    from exporter.parse import DEFAULT_LIMITS

    history = ReplicaHistory(120.0)
    for i in range(13):  # 5 s scrapes: +1 request/s, +100 tokens/s on totals of 1e9, 1e11
        body = exposition(1e9 + 5 * i, 1e11 + 500 * i, created(i))
        stats = read_exposition(body, "vllm", DEFAULT_LIMITS)
        history.add(1000.0 + 5 * i, stats)
    window = history.window(1060.0, 60.0)
    assert window is not None
    assert window.rate("requests") == pytest.approx(1.0)
    assert window.rate("generation_tokens") == pytest.approx(100.0)
    assert stats.rejected == rejected


def test_a_new_created_with_counters_from_zero_is_still_a_restart():
    from exporter.engines import read_exposition
    from exporter.parse import DEFAULT_LIMITS

    history = ReplicaHistory(120.0)
    for at, total, created in ((0.0, 0.0, "1"), (10.0, 0.0, "1"), (20.0, 0.0, "2")):
        history.add(at, read_exposition(exposition(total, total, created), "vllm", DEFAULT_LIMITS))
    window = history.window(20.0, 30.0)
    assert window is not None and window.rate("requests") == 0.0


@given(
    honest=st.lists(st.floats(1.0, 1e5), min_size=1, max_size=12),
    lying=st.lists(st.floats(0.0, 1e5), max_size=11),
    pooled=st.floats(0.0, 1e5),
)
def test_fewer_than_half_lying_never_pull_the_floor_below_every_honest_replica(
    honest, lying, pooled
):
    lying = lying[: max(0, (len(honest) - 1))]  # strictly fewer than the honest ones
    got = majority_floor(pooled, [*honest, *lying])
    assert got >= pooled and got >= min(honest)
    assert majority_floor(None, honest) is None and majority_floor(pooled, [None]) == pooled


def lengths_body(requests: int, prompt_sum: float, output_sum: float) -> str:
    """One vLLM replica's counters and length histograms: 500-token prompts, 200 out."""
    m = '{model_name="m"}'
    return f"""vllm:num_requests_running{m} 10
vllm:num_requests_waiting{m} 0
vllm:prompt_tokens_total{m} {requests * 500}
vllm:generation_tokens_total{m} {requests * 200}
vllm:request_success_total{{model_name="m",finished_reason="stop"}} {requests}
vllm:num_preemptions_total{m} 0
vllm:request_prompt_tokens_bucket{{model_name="m",le="1000.0"}} {requests}
vllm:request_prompt_tokens_bucket{{model_name="m",le="+Inf"}} {requests}
vllm:request_prompt_tokens_count{m} {requests}
vllm:request_prompt_tokens_sum{m} {prompt_sum}
vllm:request_generation_tokens_bucket{{model_name="m",le="1000.0"}} {requests}
vllm:request_generation_tokens_bucket{{model_name="m",le="+Inf"}} {requests}
vllm:request_generation_tokens_count{m} {requests}
vllm:request_generation_tokens_sum{m} {output_sum}
"""


@pytest.mark.parametrize(
    ("liar_prompt_sum", "liar_output_sum"),
    [
        pytest.param(5e8, None, id="a prompt _sum jumping alone leaves the prompt mix"),
        pytest.param(None, 9.9e8, id="an output _sum jumping alone leaves the output mix"),
        pytest.param(math.inf, None, id="an infinite prompt _sum leaves the prompt mix"),
        pytest.param(0.0, None, id="a prompt _sum falling to 0 alone leaves the prompt mix"),
    ],
)
def test_one_replicas_length_sum_alone_never_sets_the_deployments_mix(
    liar_prompt_sum, liar_output_sum
):
    """Ten replicas at 10 requests/s of 500 prompt and 200 output tokens; the first one's
    ``_sum`` jumps while its counters stay honest. The pooled mean had read 83,700
    prompt tokens, and the planner sized every replica for it (issue 27, pass 32)."""
    from exporter.engines import read_exposition
    from exporter.parse import DEFAULT_LIMITS

    histories = [ReplicaHistory(120.0) for _ in range(10)]
    for at in (0.0, 30.0, 60.0):
        latest = []
        for i, history in enumerate(histories):
            n = 1000 + int(at) * 10
            prompt, output = n * 500, n * 200
            if i == 0 and at == 60.0:
                prompt = prompt if liar_prompt_sum is None else liar_prompt_sum
                output = output if liar_output_sum is None else liar_output_sum
            stats = read_exposition(lengths_body(n, prompt, output), "vllm", DEFAULT_LIMITS)
            history.add(at, stats)
            latest.append(stats)
    signals = derive(60.0, 10, latest, histories, 10.0, 60.0, Accelerator(1.0, 1.0), at=60.0)
    assert signals.stable.mean_prompt_tokens == pytest.approx(500.0)
    assert signals.stable.mean_output_tokens == pytest.approx(200.0)


def test_without_token_histograms_one_replica_claiming_light_requests_sets_no_mix():
    """One of ten claiming 10,000 one-token requests a second, the counters pooled alone
    set the mix, and a loaded deployment asked for one replica (hostile pass 63)."""
    histories, latest = [], []
    for replica in range(10):
        liar = replica == 0
        rate = 10_000.0 if liar else 2.0  # requests a second
        prompt, output = (1.3, 1.2) if liar else (500.0, 200.0)
        history = ReplicaHistory(70.0)
        for i in range(13):
            done = rate * 5 * i
            stats = scrape(prompt * done, output * done, done)  # no per-request histograms
            history.add(1000.0 + 5 * i, stats)
        histories.append(history)
        latest.append(stats)
    signals = derive(1060.0, 10, latest, histories, 10.0, 60.0, Accelerator(1.0, 1.0))
    assert signals.stable.mean_prompt_tokens == pytest.approx(500.0)
    assert signals.stable.mean_output_tokens == pytest.approx(200.0)


def fleet_without_counters(unknown: int, replicas: int = 10, generating=None, running=None):
    """``replicas`` replicas at 100 prompt and 20 generated tokens a second for 60 s (or
    ``generating[i]``, running ``running[i]``), the first ``unknown`` of them without a
    generation counter."""
    histories, latest = [], []
    for i in range(replicas):
        rate = 20.0 if generating is None else generating[i]
        now = 0.0 if running is None else running[i]
        scrapes = [(t, scrape(100.0 * t, rate * t, t, running=now)) for t in (0.0, 30.0, 60.0)]
        if i < unknown:
            scrapes = [
                (t, dataclasses.replace(s, counters={**s.counters, "generation_tokens": math.nan}))
                for t, s in scrapes
            ]
        histories.append(history_of(*scrapes))
        latest.append(scrapes[-1][1])
    return derive(60.0, replicas, latest, histories, 10.0, 60.0, Accelerator(1.0, 1.0))


@pytest.mark.parametrize(
    ("unknown", "generated", "partial"),
    [
        pytest.param(0, 200.0, False, id="every replica's counter known is the sum, whole"),
        pytest.param(
            1, 200.0, True, id="one counter of ten unknown for good is the others' mean each"
        ),
        pytest.param(4, 200.0, True, id="four of ten are still estimated from six"),
        pytest.param(5, None, True, id="half of them unknown leaves the rate unknown"),
    ],
)
def test_a_rate_unknown_on_fewer_than_half_the_replicas_is_estimated_and_partial(
    unknown: int, generated: float | None, partial: bool
) -> None:
    """Unknown on one replica of ten for good, the deployment's rate was, and the scaler
    held the count at its peak for as long (hostile pass 65)."""
    signals = fleet_without_counters(unknown)
    assert signals.stable.generation_token_rate == pytest.approx(generated)
    assert signals.stable.prompt_token_rate == pytest.approx(1000.0)
    assert signals.partial is partial


@pytest.mark.parametrize(
    ("unknown", "generating", "running", "estimate"),
    [
        pytest.param(
            4,
            [45.0] * 4 + [5.0] * 6,
            [9.0] * 4 + [1.0] * 6,
            70.0,
            id="four busy replicas unknown count twice the mean each at most: 70 of 210, not 50",
        ),
        pytest.param(
            1,
            [20.0] * 10,
            [256.0] + [1.0] * 9,
            220.0,
            id="one claiming 256 running beside its counters unknown is twice the mean, not 26x",
        ),
        pytest.param(
            2,
            [20.0, 20.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0, 20.0],
            [4.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 4.0],
            80.0,
            id="two awake replicas unknown beside sleepers: the mean of the awake",
        ),
        pytest.param(
            1,
            [20.0, 0.0, 0.0, 0.0],
            [3.0, 0.0, 0.0, 0.0],
            None,
            id="all that runs on the unknown one is unknown load, never 0",
        ),
        pytest.param(
            1,
            [0.0, 20.0, 20.0, 20.0],
            [0.0, 4.0, 4.0, 4.0],
            80.0,
            id="an idle one unknown is the mean still, never less",
        ),
    ],
)
def test_an_estimate_weighs_the_unknown_by_the_requests_they_run(
    unknown: int, generating: list[float], running: list[float], estimate: float | None
) -> None:
    """A mean over replicas idle or asleep under-read the busy ones unknown; 0 read for a
    fleet whose load all ran on the unknown one took it to zero (hostile pass 68)."""
    signals = fleet_without_counters(unknown, len(generating), generating, running)
    assert signals.stable.generation_token_rate == pytest.approx(estimate)
    assert signals.partial


@pytest.mark.parametrize(
    ("missing", "partial"),
    [
        pytest.param(("e2e", "queue_time", "preemptions"), False, id="sglang's lacking families"),
        pytest.param(("running",), True, id="a load gauge missing is part of the load unknown"),
    ],
)
def test_only_a_load_concept_missing_makes_the_signal_partial(
    missing: tuple[str, ...], partial: bool
) -> None:
    """Partial on every SGLang scrape (no preemptions counter, no e2e histogram), the
    scaler read its load as partly unknown, and quiet never as idle."""
    scrapes = []
    for t in (0.0, 30.0, 60.0):
        stats = scrape(100.0 * t, 20.0 * t, t)
        counters = {k: v for k, v in stats.counters.items() if k not in missing}
        scrapes.append((t, dataclasses.replace(stats, counters=counters, missing=missing)))
    history = history_of(*scrapes)
    latest = scrapes[-1][1]
    signals = derive(60.0, 1, [latest], [history], 10.0, 60.0, Accelerator(1.0, 1.0))
    assert signals.partial is partial
