"""New variants of hostile fields admission reads (issue 27, the second hostile pass).

Each field is read at one boundary that checks its domain: ASCII digits where Go or
Fluid write ASCII, bounded lengths and counts, times within the clock skew, figures the
pool can hold. What fails the check is unknown (a held density, a pool on Hold, no cache
figure, no LoRA seat) or a Rejected Workload naming the field, never a fact.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission import annotations as names
from admission import density, hami
from admission.cluster import Cluster, Pending, PoolDemand
from admission.decide import decide_all, waiting_since
from admission.demand import _result
from admission.density import MAX_STEP_SECONDS, model_loads
from admission.fluid import dataload_name
from admission.hami import HamiFormatError, parse_devices_allocated, parse_node_register
from admission.lora import (
    MAX_MODEL_CHARS,
    assign_instance,
    base_model,
    base_model_problem,
    instance_slug,
)
from admission.manager import reclaim_all
from admission.metrics import MAX_MODEL_SERIES, AdmissionMetrics
from admission.parameters import DataParameters, Headroom, Parameters
from foundation.fluid import read_cached_percentage
from foundation.timestamps import format_time
from protos.unitscale.v1 import capacity_pb2
from tests.test_admission_decide import CHECK, MIB, NOW, dataset, node, running, workload
from tests.test_admission_decide import decide as decided
from tests.test_admission_density import INSTANCE, MODEL, tenant_pod
from tests.test_admission_lora import LLAMA, SLUG, tenant
from tests.test_admission_reclaim import admitted, h200, pod_of
from tests.test_admission_reclaim import cluster as reclaim_cluster

# --- M1: a LoRA instance label's number ---------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param("²", id="a superscript two is no instance number"),
        pytest.param("9" * 5000, id="five thousand digits are no instance number"),
        pytest.param("١", id="an arabic-indic one is no instance number"),
    ],
)
def test_an_odd_instance_number_never_blocks_the_other_tenants(tail):
    odd = tenant("odd", instance=f"{SLUG}-{tail}")
    holders = [odd, tenant("t1", instance=f"{SLUG}-1")]
    seat = assign_instance(tenant("new", instance=None), holders, [], tenants_per_instance=5)
    assert seat is not None and seat.instance == f"{SLUG}-1" and seat.tenants == 2


@pytest.mark.parametrize(
    "label",
    [
        pytest.param("x" * 64, id="a label longer than 63 characters is no instance"),
        pytest.param("bad label!", id="a label with spaces is no instance"),
    ],
)
def test_an_instance_label_that_is_no_label_value_holds_no_seat(label):
    holders = [tenant("odd", instance=label), tenant("odd2", template_instance=label)]
    seat = assign_instance(tenant("new", instance=None), holders, [], tenants_per_instance=5)
    assert seat is not None and seat.instance == f"{SLUG}-1" and seat.tenants == 1


# --- M2: a check's lastTransitionTime ahead of the clock ----------------------------


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        pytest.param(NOW - 7200, NOW - 7200, id="a time in the past is read"),
        pytest.param(NOW + 30, NOW + 30, id="a time within the clock skew is read"),
        pytest.param(NOW + 86_400, NOW - 3600, id="a day ahead counts from the creation"),
        pytest.param(253402300799.0, NOW - 3600, id="the year 9999 counts from the creation"),
    ],
)
def test_a_transition_time_ahead_of_the_clock_counts_from_the_creation(since, expected):
    w = workload("a", created="2025-12-29T08:20:00Z")  # NOW - 3600
    assert waiting_since(Pending(w, CHECK, Parameters(), since), NOW) == expected


def test_a_creation_ahead_of_the_clock_too_times_the_wait_out_now_not_never():
    w = workload("a", created="2026-11-30T10:00:00Z")  # eleven months after NOW
    assert waiting_since(Pending(w, CHECK, Parameters(), NOW + 86_400), NOW) == 0.0


def test_a_data_wait_dated_a_day_ahead_still_times_out():
    data = Parameters(data=DataParameters(timeout_seconds=1800))
    w = workload("a", created="2025-12-29T08:20:00Z", annotations={names.DATASET: "gone"})
    (decision,) = decide_all(
        [Pending(w, CHECK, data, NOW + 86_400)],
        Cluster([node("gpu-1")], [], [w], [], [], demand={}),
        NOW,
    )
    assert decision.state == "Retry" and "gave up" in decision.message


# --- M3, M4: the scaler's demand ---------------------------------------------------


def pools(*entries: tuple[str, float, float]) -> capacity_pb2.GetInferenceDemandResponse:
    return capacity_pb2.GetInferenceDemandResponse(
        pools=[
            capacity_pb2.PoolDemand(pool=p, accelerators_held=h, accelerators_needed=n)
            for p, h, n in entries
        ]
    )


@pytest.mark.parametrize(
    "entries",
    [
        pytest.param([("h200", 0, 16), ("h200", 0, 0)], id="a pool named twice is unknown"),
        pytest.param([("h200", 0, 0), ("h200", 0, 16)], id="in either order"),
        pytest.param([("h200", 0, 16)] * 3, id="even with the same figures thrice"),
    ],
)
def test_a_pool_named_more_than_once_is_unknown_and_the_others_used(entries):
    every = _result(pools(*entries, ("l4", 1, 2)), "")
    assert every.demand == {"l4": PoolDemand("l4", 1.0, 2.0)}
    assert "pool 'h200': named" in every.error
    one = _result(pools(*entries), "h200")
    assert one.demand is None and "times in the answer" in one.error


HOLD = Parameters(inference_headroom=Headroom("scaler:9090", "h200"))


def test_a_pool_named_twice_holds_the_gang_it_would_have_admitted():
    w = workload("a", pods=1, gpus=1)
    demand = _result(pools(("h200", 0, 16), ("h200", 0, 0)), "")
    (decision,) = decide_all(
        [Pending(w, CHECK, HOLD, NOW - 10)],
        Cluster([node("gpu-1"), node("gpu-2")], [], [w], [], [], demand=demand.demand,
                demand_error=demand.error),
        NOW,
    )  # fmt: skip
    assert decision.state == "Retry" and "named 2 times" in decision.message


@pytest.mark.parametrize(
    ("held", "state"),
    [
        pytest.param(1e6, "Retry", id="a million held on sixteen cards holds the gang"),
        pytest.param(16.5, "Retry", id="half a card more than the pool holds the gang"),
        pytest.param(16.0, "Ready", id="every card of the pool held is possible"),
    ],
)
def test_inference_holding_more_than_the_pool_registers_is_impossible(held, state):
    w = workload("a", pods=1, gpus=1)
    (decision,) = decide_all(
        [Pending(w, CHECK, HOLD, NOW - 10)],
        Cluster([node("gpu-1"), node("gpu-2")], [], [w], [], [],
                demand={"h200": PoolDemand("h200", held, 16.0)}),
        NOW,
    )  # fmt: skip
    assert decision.state == state, decision.message
    if state == "Retry":
        assert "more than the 16 GPUs HAMi registers in pool h200" in decision.message


# --- M5: Fluid's cachedPercentage ---------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1e308%", id="an exponent fluid never writes is unknown"),
        pytest.param("١٠٠%", id="arabic-indic digits are unknown"),
        pytest.param("1_00%", id="an underscore is unknown"),
        pytest.param("1000.1%", id="past a thousand percent is unknown"),
        pytest.param("1" * 400 + "%", id="four hundred digits are unknown and quoted short"),
    ],
)
def test_a_cached_percentage_fluid_never_writes_is_unknown(value):
    read = read_cached_percentage(value)
    assert read.value is None and len(read.reason) < 160


@given(st.text(max_size=12))
def test_any_cached_percentage_text_is_an_ascii_decimal_or_unknown(text):
    read = read_cached_percentage(text)
    if read.value is not None:
        plain = text.strip().removesuffix("%").strip()
        assert plain.isascii() and 0 <= read.value <= 1000


# --- M6: HAMi's annotations in ASCII digits only --------------------------------------


@pytest.mark.parametrize(
    "register",
    [
        pytest.param("GPU-u0,١٠,١٤٣٧٧١,١٠٠,NVIDIA,0,true:", id="arabic-indic register digits"),
        pytest.param("GPU-u0,１０,143771,100,NVIDIA,0,true:", id="fullwidth register digits"),
    ],
)
def test_a_register_in_digits_go_cannot_read_is_refused(register):
    with pytest.raises(HamiFormatError, match="not an integer"):
        parse_node_register(register)


@pytest.mark.parametrize("digits", ["١٠٠٠", "１００"])
def test_an_allocation_in_digits_go_cannot_read_is_refused(digits):
    with pytest.raises(HamiFormatError):
        parse_devices_allocated(f"GPU-a,NVIDIA,{digits},10:;")


@pytest.mark.parametrize("value", ["١٢", "１２", "1٢Gi", "٢e3"])
def test_a_quantity_in_digits_kubernetes_cannot_read_is_none(value):
    assert hami.parse_quantity(value) is None


# --- M7: a tenant's step seconds ----------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("1e308", id="an exponent is unknown"),
        pytest.param("1_0", id="an underscore is unknown"),
        pytest.param("١٠", id="arabic-indic digits are unknown"),
        pytest.param(str(MAX_STEP_SECONDS + 1), id="more than a day a step is unknown"),
        pytest.param("-1", id="a negative step is unknown"),
    ],
)
def test_a_step_time_no_trainer_writes_is_unknown_and_never_lowers_density(step):
    pods = [tenant_pod("a", MIB // 2, step)]
    pool = hami.inventory([node("gpu-1")], pods, now=NOW)
    (load,) = model_loads(pods, pool, {INSTANCE: MODEL}, 10.0).values()
    assert load.step_seconds is None


@given(st.text(max_size=12))
def test_any_step_text_is_plain_ascii_seconds_within_a_day_or_unknown(text):
    seconds = density._step_seconds(text)
    if seconds is not None:
        assert text.strip().isascii() and 0 <= seconds <= MAX_STEP_SECONDS


# --- M8: the base model as a metric label ------------------------------------------


@pytest.mark.parametrize(
    ("model", "words"),
    [
        pytest.param("m" * (MAX_MODEL_CHARS + 1), "more than the 253", id="a 254-character name"),
        pytest.param("m" * 200_000, "200000 characters", id="a 200 kb name is refused short"),
        pytest.param("llama\n8b", "not a model name", id="a newline is no model name"),
        pytest.param("läma", "not a model name", id="non-ascii letters are no model name"),
    ],
)
def test_a_base_model_that_is_no_model_name_is_rejected_and_seats_no_tenant(model, words):
    w = workload("a", gpus=1, annotations={names.LORA_BASE_MODEL: model})
    assert base_model(w) is None
    assert words in base_model_problem(w) and len(base_model_problem(w)) < 200
    (decision,) = decide_all(
        [Pending(w, CHECK, Parameters(), NOW - 10)],
        Cluster([node("gpu-1")], [], [w], [], [], demand={}),
        NOW,
    )
    assert decision.state == "Rejected" and names.LORA_BASE_MODEL in decision.message


@pytest.mark.parametrize(
    "model", [LLAMA, "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B-Instruct@main", "m" * 253]
)
def test_real_model_names_are_read(model):
    w = workload("a", annotations={names.LORA_BASE_MODEL: model})
    assert base_model(w) == model and base_model_problem(w) == ""
    assert instance_slug(model)


def test_the_lora_gauges_name_at_most_the_bound_of_models_and_fold_the_rest():
    metrics = AdmissionMetrics()
    many = {f"model-{i:03d}": 1 for i in range(MAX_MODEL_SERIES + 20)}
    metrics.set_lora_tenants(many)
    metrics.set_lora_density({m: 3 + (i % 2) for i, m in enumerate(many)})
    tenants = {s.labels["base_model"]: s.value for s in _samples(metrics, "lora_tenants")}
    per = {s.labels["base_model"]: s.value for s in _samples(metrics, "lora_tenants_per_instance")}
    assert len(tenants) == len(per) == MAX_MODEL_SERIES + 1
    assert tenants["other"] == 20 and per["other"] == 3


def _samples(metrics: AdmissionMetrics, name: str) -> list[Any]:
    full = f"unitscale_admission_{name}"
    return [s for family in metrics.registry.collect() for s in family.samples if s.name == full]


# --- hostile pass 3, M3-M5: other times ahead of the clock --------------------------

AN_HOUR_AGO = "2025-12-29T08:20:00Z"  # NOW - 3600
A_DAY_AHEAD = format_time(NOW + 86_400)


@pytest.mark.parametrize(
    ("ready_at", "created", "new_gang"),
    [
        pytest.param(format_time(NOW - 60), AN_HOUR_AGO, "Retry", id="a minute ago it holds"),
        pytest.param(format_time(NOW - 600), AN_HOUR_AGO, "Ready", id="ten minutes ago it let go"),
        pytest.param(A_DAY_AHEAD, AN_HOUR_AGO, "Ready", id="a day ahead counts from creation"),
        pytest.param("9999-12-31T23:59:59Z", AN_HOUR_AGO, "Ready", id="9999 counts from creation"),
        pytest.param(A_DAY_AHEAD, "9999-12-31T23:59:59Z", "Ready", id="both ahead: it lets go now"),
        pytest.param(
            format_time(NOW - 60), "9999-12-31T23:59:59Z", "Retry", id="a creation ahead alone"
        ),
    ],
)
def test_a_ready_gang_without_pods_holds_its_cards_300_s_from_a_readable_time(
    ready_at, created, new_gang
):
    """A Ready entry dated a day ahead held 8 cards until then (issue 27, pass 3, M3)."""
    ghost = workload("ghost", gpus=8, state="Ready", created=created)
    ghost["status"]["admissionChecks"][0]["lastTransitionTime"] = ready_at
    (decision,) = decided([workload("new", gpus=8)], [node("gpu-1")], others=[ghost])
    assert decision.state == new_gang


@pytest.mark.parametrize(
    ("admitted_at", "created", "reclaimed"),
    [
        pytest.param(format_time(NOW - 3600), AN_HOUR_AGO, "new", id="the newest is taken"),
        pytest.param(A_DAY_AHEAD, AN_HOUR_AGO, "new", id="a day ahead reads as its creation"),
        pytest.param(
            "2035-12-29T09:20:00Z", AN_HOUR_AGO, "new", id="ten years ahead reads as its creation"
        ),
        pytest.param(
            A_DAY_AHEAD, "9999-12-31T23:59:59Z", "old", id="creation ahead too: not preemptible"
        ),
    ],
)
def test_an_admission_ahead_of_the_clock_never_shields_its_workload(
    admitted_at, created, reclaimed
):
    """A newer workload dated ahead was never old enough; an older one went (M4)."""
    new = admitted("new", ago=3600)
    new["metadata"]["creationTimestamp"] = created
    new["status"]["conditions"][-1]["lastTransitionTime"] = admitted_at
    pods = [
        pod_of("old", range(4)),
        pod_of("new", range(4, 6)),
        running("serve", "gpu-1", range(6, 8)),
    ]
    old = admitted("old", ago=7200)
    taken = reclaim_all(reclaim_cluster([old, new], pods, demand=h200(2, 4)), NOW)
    assert [d.workload for d in taken] == [reclaimed]


@pytest.mark.parametrize(
    ("completed", "state"),
    [
        pytest.param(format_time(NOW - 600), "Retry", id="ten minutes ago: the cache was evicted"),
        pytest.param(format_time(NOW - 10), "Pending", id="ten seconds ago: figures catch up"),
        pytest.param(A_DAY_AHEAD, "Retry", id="a day ahead is long past, as the prewarm takes it"),
        pytest.param("9999-12-31T23:59:59Z", "Retry", id="9999 is long past"),
    ],
)
def test_our_dataload_finished_ahead_of_the_clock_never_waits_for_the_data_timeout(
    completed, state
):
    """Completed a day ahead held the check Pending until data.timeoutSeconds (M5)."""
    w = workload("a", annotations={names.DATASET: "ds"})
    load = {
        "apiVersion": "data.fluid.io/v1alpha1",
        "kind": "DataLoad",
        "metadata": {"name": dataload_name(w), "namespace": "train"},
        "spec": {"dataset": {"name": "ds", "namespace": "train"}},
        "status": {
            "phase": "Complete",
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": completed}],
        },
    }
    (decision,) = decided(
        [w], [node("gpu-1")], datasets=[dataset("ds", cached="50%")], dataloads=[load]
    )
    assert decision.state == state
