"""Inference demand per accelerator pool, from the scaler's latest decisions (pure)."""

from __future__ import annotations

import math

import pytest

from scaler.core import Decision, DecisionState, Observation, Policy, decide
from scaler.core.window import Recent
from scaler.demand import Declared, InferenceDemand, pool_demand

T = 1_800_000_000.0


def decision(desired: int, current: int | None, *needs: int) -> Decision:
    """A decision for ``desired`` replicas with ``current`` known and ``needs`` in its window."""
    history = Recent(tuple((T - 15.0 * (len(needs) - i), n) for i, n in enumerate(needs)))
    state = DecisionState(decisions=1, desired=desired, need_history=history)
    return Decision(desired, desired > 0, state, f"-> {desired}", current_replicas=current)


def so(
    name: str,
    made: Decision | None,
    *,
    pool: str = "h200",
    per_replica: float = 1.0,
    max_replicas: int = 100,
    decided_at: float | None = T,
    unknown: str = "",
) -> Declared:
    return Declared(
        namespace="serving",
        name=name,
        deployment=name,
        pool=pool,
        accelerators_per_replica=per_replica,
        max_replicas=max_replicas,
        forecast_horizon_seconds=60.0,
        decision=made,
        decided_at=decided_at if made is not None else None,
        unknown=unknown if made is None else "",
    )


NO_SIGNALS = "no signals yet for serving/mistral"


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        pytest.param(
            [so("llama", decision(3, 3)), so("mistral", decision(2, 2))],
            {"h200": (5.0, 5.0)},
            id="two-deployments-on-one-pool-add-up",
        ),
        pytest.param(
            [so("llama", decision(3, 3)), so("mistral", None, unknown=NO_SIGNALS)],
            {"h200": (None, None)},
            id="a-deployment-with-no-decision-makes-its-pool-unknown-not-smaller",
        ),
        pytest.param(
            [so("llama", decision(3, 3)), so("mistral", decision(2, 2), pool="a100")],
            {"h200": (3.0, 3.0), "a100": (2.0, 2.0)},
            id="deployments-on-different-pools-are-counted-apart",
        ),
        pytest.param(
            [so("llama", decision(3, 2), per_replica=8)],
            {"h200": (16.0, 24.0)},
            id="eight-accelerators-per-replica-multiply-held-and-needed",
        ),
        pytest.param(
            [so("llama", decision(2, 2), per_replica=0.5)],
            {"h200": (1.0, 1.0)},
            id="a-replica-on-half-an-accelerator-counts-half",
        ),
        pytest.param(
            [so("llama", decision(4, 2, 3, 8))],
            {"h200": (2.0, 8.0)},
            id="a-scale-up-held-back-by-its-step-needs-the-window-peak",
        ),
        pytest.param(
            [so("llama", decision(4, 2, 3, 80), max_replicas=6)],
            {"h200": (2.0, 6.0)},
            id="the-window-peak-is-bounded-by-max-replicas",
        ),
        pytest.param(
            [so("llama", decision(5, 5, 2, 3))],
            {"h200": (5.0, 5.0)},
            id="a-held-scale-down-still-needs-its-desired-count",
        ),
        pytest.param(
            [so("llama", decision(2, None))],
            {"h200": (None, 2.0)},
            id="replicas-the-exporter-did-not-report-leave-held-unknown",
        ),
        pytest.param(
            [so("llama", decision(0, 0))],
            {"h200": (0.0, 0.0)},
            id="a-deployment-scaled-to-zero-holds-and-needs-a-known-zero",
        ),
    ],
)
def test_pool_demand(declared, expected):
    demand = pool_demand(declared)
    assert {pool: (d.accelerators_held, d.accelerators_needed) for pool, d in demand.items()} == (
        expected
    )


def test_an_unknown_pool_says_which_scaled_object_and_why():
    demand = pool_demand([so("llama", decision(3, 3)), so("mistral", None, unknown=NO_SIGNALS)])
    pool = demand["h200"]
    assert pool.unknown == f"serving/mistral: {NO_SIGNALS}"
    assert [(d.name, d.replicas_now, d.replicas_needed) for d in pool.deployments] == [
        ("llama", 3, 3),
        ("mistral", None, None),
    ]
    assert pool.deployments[1].reason == NO_SIGNALS


def test_held_unknown_names_the_missing_replica_count():
    demand = pool_demand([so("llama", decision(2, None))])["h200"]
    assert demand.unknown == "serving/llama: replicas now unknown (no count in its signals)"


def test_a_long_list_of_unknowns_is_cut():
    declared = [so(f"d{i}", None, unknown="no signals yet") for i in range(40)]
    demand = pool_demand(declared)["h200"]
    assert demand.unknown.endswith("; and 35 more")
    assert len(demand.unknown) < 400


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        pytest.param("a100", ["a100"], id="asking-for-one-pool-answers-that-pool-only"),
        pytest.param("", ["a100", "h200"], id="asking-for-no-pool-answers-every-pool-by-name"),
        pytest.param("l4", [], id="a-pool-no-scaled-object-declares-is-absent-not-zero"),
    ],
)
def test_pool_selection(pool, expected):
    declared = [so("llama", decision(3, 3)), so("mistral", decision(2, 2), pool="a100")]
    assert list(pool_demand(declared, pool)) == expected


def test_the_figures_are_as_old_as_the_oldest_decision():
    declared = [
        so("llama", decision(3, 3), decided_at=T - 5),
        so("mistral", decision(2, 2), decided_at=T - 20),
        so("qwen", None, unknown=NO_SIGNALS),
    ]
    demand = pool_demand(declared)["h200"]
    assert demand.decided_at == T - 20
    assert [d.decided_at for d in demand.deployments] == [T - 5, T - 20, None]


def test_no_decision_at_all_has_no_decision_time():
    assert pool_demand([so("llama", None, unknown=NO_SIGNALS)])["h200"].decided_at is None


def rising(steps: int) -> Decision:
    """The real decision core fed prompt and output rates that rise every 15 s."""
    policy, state = Policy(target_utilization=1.0), DecisionState()
    made: Decision | None = None
    for step in range(steps):
        now = T + 15.0 * step
        rate = 1.0 + step  # replicas' worth of work: +1 every 15 s
        observation = Observation(
            now=now,
            signal_time=now,
            queue_depth=0.0,
            requests_running=16.0 * rate,
            prompt_token_rate=0.5 * rate * policy.prefill_tokens_per_second,
            generation_token_rate=0.5 * rate * policy.decode_tokens_per_second,
            # The short window runs ahead of the stable one on a rising load.
            prompt_token_rate_panic=0.75 * rate * policy.prefill_tokens_per_second,
            generation_token_rate_panic=0.75 * rate * policy.decode_tokens_per_second,
            replicas_known=state.desired or 1,
            replicas_up=state.desired or 1,
        )
        made = decide(observation, policy, state)
        state = made.state
    assert made is not None
    return made


def test_a_rising_load_needs_what_its_short_window_asks_for_not_only_what_is_running():
    made = rising(9)
    short = made.inputs["load_panic"]
    assert short == made.inputs["load"] == pytest.approx(1.5 * 9)
    demand = pool_demand([so("llama", made)])["h200"]
    held, needed = demand.accelerators_held, demand.accelerators_needed
    assert held is not None and needed is not None
    assert needed >= math.ceil(short - 1e-9) > held


def test_demand_is_a_plain_value():
    demand = pool_demand([so("llama", decision(1, 1))])["h200"]
    assert isinstance(demand, InferenceDemand)
    with pytest.raises(AttributeError):
        demand.pool = "other"  # type: ignore[misc]


def test_a_real_scale_to_zero_keeps_the_replicas_it_saw():
    """The idle decision still carries the exporter's count: held is known, not missing."""
    policy = Policy(idle_grace_seconds=0.0)
    idle = Observation(
        now=T, signal_time=T, queue_depth=0.0, requests_running=0.0, replicas_known=2, replicas_up=2
    )
    made = decide(idle, policy, DecisionState(desired=2, last_activity=T - 600))
    assert made.desired_replicas == 0 and "scale to zero" in made.reason
    demand = pool_demand([so("llama", made, per_replica=4)])["h200"]
    assert (demand.accelerators_held, demand.accelerators_needed) == (8.0, 0.0)
