"""HAMi's node and pod annotations read into a GPU inventory (admission.hami).

The register and allocation values in tests/golden/hami/ are written the way HAMi's
encoders write them (its README says which); the tables around them say what the
admission check makes of each node state HAMi can leave behind.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from admission import annotations as names
from admission.hami import (
    Device,
    DeviceTake,
    DeviceUse,
    HamiFormatError,
    Inventory,
    PodPlacement,
    _handshake_time,
    inventory,
    parse_devices_allocated,
    parse_node_register,
    parse_quantity,
)

GOLDEN = Path(__file__).parent / "golden" / "hami"
H200_JSON = (GOLDEN / "register-8x-h200-v2.8.json").read_text().strip()
MIXED_TEXT = (GOLDEN / "register-mixed-v2.7.txt").read_text().strip()
T4_TEXT = (GOLDEN / "register-t4-v2.4.txt").read_text().strip()
TWO_CONTAINERS = (GOLDEN / "devices-allocated-two-containers.txt").read_text().strip()

H200 = [d["id"] for d in json.loads(H200_JSON)]
H200_MIB = 143771
NOW = 1_767_000_000.0  # 2025-12-29 09:20:00 UTC


def stamp(seconds_ago: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime(fmt)


def requesting(seconds_ago: float) -> str:
    """What HAMi's scheduler writes when it asks the device plugin to report."""
    return "Requesting_" + stamp(seconds_ago)


def node(
    name: str,
    register: str | None = H200_JSON,
    *,
    handshake: str | None = None,
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
    cordon: str | None = None,
    allocatable_gpu: str | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if register is not None:
        annotations[names.HAMI_NODE_REGISTER] = register
    annotations[names.HAMI_NODE_HANDSHAKE] = requesting(5) if handshake is None else handshake
    if cordon is not None:
        annotations[names.HAMI_DEVICE_CORDON] = cordon
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {},
    }
    if allocatable_gpu is not None:
        obj["status"]["allocatable"] = {names.GPU: allocatable_gpu}
    return obj


def pod(
    name: str,
    on: str | None,
    allocated: str | None,
    *,
    phase: str = "Running",
    node_name: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if on is not None:
        annotations[names.HAMI_VGPU_NODE] = on
    if allocated is not None:
        annotations[names.HAMI_DEVICES_ALLOCATED] = allocated
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": "train",
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def take(uuid: str, memory_mib: int, cores: int) -> str:
    """One device of a container, as EncodeContainerDevices writes it."""
    return f"{uuid},NVIDIA,{memory_mib},{cores}:"


def build(nodes: list[dict[str, Any]], pods: list[dict[str, Any]] = (), **kw: Any) -> Inventory:  # type: ignore[assignment]
    return inventory(nodes, list(pods), now=NOW, **kw)


# --- the register annotation ---------------------------------------------------------


def test_the_json_register_of_an_8x_h200_node_reads_as_eight_whole_cards():
    devices = parse_node_register(H200_JSON)
    assert [d.index for d in devices] == list(range(8))
    assert [d.numa for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert devices[0] == Device(
        uuid=H200[0],
        index=0,
        type="NVIDIA-NVIDIA H200",
        split_count=10,
        memory_mib=H200_MIB,
        cores=100,
        numa=0,
        healthy=True,
        mode="hami-core",
    )


def test_the_nine_field_text_register_of_a_mixed_node_keeps_each_card_as_written():
    a100, broken, a10 = parse_node_register(MIXED_TEXT)
    assert (a100.type, a100.memory_mib, a100.split_count, a100.healthy) == (
        "NVIDIA-NVIDIA A100-SXM4-80GB",
        81920,
        10,
        True,
    )
    assert (broken.index, broken.healthy) == (1, False)
    assert (a10.type, a10.memory_mib, a10.split_count, a10.numa, a10.index, a10.mode) == (
        "NVIDIA-NVIDIA A10",
        23028,
        4,
        1,
        2,
        "hami-core",
    )


def test_the_seven_field_text_register_of_old_hami_defaults_index_and_mode():
    (t4,) = parse_node_register(T4_TEXT)
    assert (t4.uuid, t4.index, t4.mode, t4.memory_mib, t4.healthy) == (
        "GPU-9d8c7b6a-5f4e-3d2c-1b0a-998877665544",
        0,
        "hami-core",
        15360,
        True,
    )


def test_json_fields_left_out_by_omitempty_read_as_go_zero_values():
    (card,) = parse_node_register('[{"id":"GPU-a","count":10,"devmem":1024,"devcore":100}]')
    assert (card.index, card.numa, card.healthy, card.mode, card.type) == (0, 0, False, "", "")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("", "is empty", id="an-empty-value-is-refused"),
        pytest.param("GPU-a,10,1024", "no ':'", id="text-without-a-device-separator"),
        pytest.param("[not json", "not valid JSON", id="a-broken-json-array"),
        pytest.param('{"id":"GPU-a"}', "a JSON array", id="json-that-is-not-an-array"),
        pytest.param(
            '["GPU-a"]', "device 0: not a JSON object", id="an-array-item-that-is-no-object"
        ),
        pytest.param(
            '[{"count":10}]', "device 0: field 'id' is missing", id="a-json-device-without-id"
        ),
        pytest.param(
            '[{"id":"GPU-a","count":"10"}]',
            "device 0 (GPU-a): field 'count' is '10', not an integer",
            id="a-json-count-written-as-a-string",
        ),
        pytest.param(
            '[{"id":"GPU-a","health":"true"}]',
            "device 0 (GPU-a): field 'health' is 'true', not a boolean",
            id="a-json-health-written-as-a-string",
        ),
        pytest.param(
            '[{"id":"GPU-a","devmem":-5}]',
            "device 0 (GPU-a): field 'devmem' is -5, negative",
            id="a-negative-json-memory",
        ),
        pytest.param(
            "GPU-a,10,1024,100,NVIDIA-X,0,true,0:",
            "device 0 (GPU-a): 8 fields, not 7 or 9",
            id="text-with-eight-fields",
        ),
        pytest.param(
            "GPU-a,10,1024,100,NVIDIA-X,0,true:GPU-b,10,lots,100,NVIDIA-X,0,true:",
            "device 1 (GPU-b): field 'devmem' is 'lots', not an integer",
            id="the-second-text-device-has-a-word-for-memory",
        ),
        pytest.param(
            "GPU-a,10,1024,100,NVIDIA-X,0,yes:",
            "device 0 (GPU-a): field 'health' is 'yes', not a boolean",
            id="text-health-that-go-parsebool-refuses",
        ),
        pytest.param(
            json.dumps([{"id": "GPU-a", "type": "NVIDIA-" + "H" * 200_000}]),
            "device 0 (GPU-a): field 'type' is 200007 characters, more than 128",
            id="a json card type of 200 KB is refused: every node key holding it is cached",
        ),
        pytest.param(
            json.dumps([{"id": "GPU-a", "mode": "m" * 129}]),
            "device 0 (GPU-a): field 'mode' is 129 characters",
            id="a json card mode over 128 characters is refused",
        ),
        pytest.param(
            f"GPU-a,10,1024,100,{'H' * 200_000},0,true:",
            "device 0 (GPU-a): field 'type' is 200000 characters",
            id="a text card type of 200 KB is refused",
        ),
        pytest.param(
            f"GPU-a,10,1024,100,NVIDIA-X,0,true,0,{'m' * 129}:",
            "device 0 (GPU-a): field 'mode' is 129 characters",
            id="a text card mode over 128 characters is refused",
        ),
    ],
)
def test_a_malformed_register_names_the_device_and_the_field(value, message):
    with pytest.raises(HamiFormatError) as caught:
        parse_node_register(value)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("word", "healthy"),
    [
        pytest.param(w, h, id=f"text-health-{w}")
        for w, h in [("1", True), ("t", True), ("TRUE", True), ("0", False), ("F", False)]
    ],
)
def test_text_health_takes_every_spelling_go_parsebool_takes(word, healthy):
    (card,) = parse_node_register(f"GPU-a,10,1024,100,NVIDIA-X,0,{word}:")
    assert card.healthy is healthy


# --- the allocation annotation -------------------------------------------------------


def test_the_allocation_of_a_three_container_pod_keeps_each_container_index():
    assert parse_devices_allocated(TWO_CONTAINERS) == (
        DeviceUse(container=0, uuid=H200[0], memory_mib=40960, cores=30),
        DeviceUse(container=0, uuid=H200[1], memory_mib=40960, cores=30),
        DeviceUse(container=2, uuid=H200[2], memory_mib=H200_MIB, cores=100),
    )


def test_a_mig_instance_counts_against_its_physical_card():
    (use,) = parse_devices_allocated("GPU-a[1-2],NVIDIA,10240,0:;")
    assert use.uuid == "GPU-a"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            "GPU-a,NVIDIA,40960:;",
            "container 0, device 0: 3 fields, not 4",
            id="a-device-without-its-cores",
        ),
        pytest.param(
            "GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,lots,0:;",
            "container 1, device 0 (GPU-b): field 'usedmem' is 'lots', not an integer",
            id="a-word-for-memory-in-the-second-container",
        ),
        pytest.param(",NVIDIA,1,0:;", "container 0, device 0: no UUID", id="a-device-without-uuid"),
        pytest.param(
            "GPU-a,NVIDIA,1,-3:;",
            "container 0, device 0 (GPU-a): field 'usedcores' is '-3', negative",
            id="negative-cores",
        ),
        pytest.param("GPU-a:;", "container 0, device 0: no ','", id="a-bare-uuid"),
    ],
)
def test_a_malformed_allocation_names_the_container_device_and_field(value, message):
    with pytest.raises(HamiFormatError) as caught:
        parse_devices_allocated(value)
    assert message in str(caught.value)


# --- quantities ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(2, 2, id="a-json-number"),
        pytest.param("40960", 40960, id="a-plain-string"),
        pytest.param("1k", 1000, id="a-decimal-suffix"),
        pytest.param("1Ki", 1024, id="a-binary-suffix"),
        pytest.param("2e3", 2000, id="an-exponent"),
        pytest.param("500m", None, id="a-fraction-is-no-integer-as-asint64-says"),
        pytest.param("1.5", None, id="a-decimal-fraction-is-no-integer"),
        pytest.param("lots", None, id="a-word-is-no-quantity"),
        pytest.param(True, None, id="a-boolean-is-no-quantity"),
    ],
)
def test_quantities_read_as_kubernetes_asint64_reads_them(value, expected):
    assert parse_quantity(value) == expected


# --- the inventory -------------------------------------------------------------------


def test_allocations_of_running_pods_are_subtracted_device_by_device():
    inv = build([node("gpu-1")], [pod("trainer", "gpu-1", TWO_CONTAINERS)])
    gpu = inv.node("gpu-1")
    assert gpu is not None
    shared, exclusive, untouched = (gpu.device(u) for u in (H200[0], H200[2], H200[3]))
    assert shared is not None and exclusive is not None and untouched is not None
    assert (shared.free_slots, shared.free_memory_mib, shared.free_cores) == (
        9,
        H200_MIB - 40960,
        70,
    )
    assert (exclusive.free_slots, exclusive.free_memory_mib, exclusive.free_cores) == (9, 0, 0)
    assert (untouched.free_slots, untouched.free_memory_mib, untouched.untouched) == (
        10,
        H200_MIB,
        True,
    )
    assert not shared.untouched
    assert inv.problems == ()


@pytest.mark.parametrize(
    ("phase", "holds"),
    [
        pytest.param("Pending", True, id="a-pending-pod-already-bound-by-hami-holds-its-gpus"),
        pytest.param("Running", True, id="a-running-pod-holds-its-gpus"),
        pytest.param("Succeeded", False, id="a-succeeded-pod-holds-nothing"),
        pytest.param("Failed", False, id="a-failed-pod-holds-nothing"),
    ],
)
def test_only_pods_that_are_not_terminal_hold_gpus(phase, holds):
    inv = build([node("gpu-1")], [pod("p", "gpu-1", take(H200[0], 1000, 10), phase=phase)])
    device = inv.node("gpu-1").device(H200[0])  # type: ignore[union-attr]
    assert device is not None
    assert (device.free_memory_mib == H200_MIB - 1000) is holds


def test_a_pod_without_hamis_node_annotation_is_placed_by_its_spec_node_name():
    inv = build([node("gpu-1")], [pod("p", None, take(H200[0], 1000, 10), node_name="gpu-1")])
    assert inv.node("gpu-1").device(H200[0]).free_cores == 90  # type: ignore[union-attr]


def test_hamis_node_annotation_wins_over_spec_node_name():
    nodes = [node("gpu-1"), node("gpu-2")]
    inv = build(nodes, [pod("p", "gpu-2", take(H200[0], 1000, 10), node_name="gpu-1")])
    assert inv.node("gpu-1").device(H200[0]).free_cores == 100  # type: ignore[union-attr]
    assert inv.node("gpu-2").device(H200[0]).free_cores == 90  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("uid-p", id="a-pod-named-by-uid-is-ignored"),
        pytest.param("train/p", id="a-pod-named-by-namespace-and-name-is-ignored"),
    ],
)
def test_pods_already_accounted_for_are_ignored(key):
    pods = [pod("p", "gpu-1", take(H200[0], 1000, 10)), pod("q", "gpu-1", take(H200[1], 1000, 10))]
    inv = build([node("gpu-1")], pods, ignore_pods=frozenset({key}))
    gpu = inv.node("gpu-1")
    assert gpu is not None
    assert gpu.device(H200[0]).free_cores == 100  # type: ignore[union-attr]
    assert gpu.device(H200[1]).free_cores == 90  # type: ignore[union-attr]


def test_allocations_beyond_a_cards_capacity_leave_nothing_free_not_a_negative():
    allocated = take(H200[0], H200_MIB, 100) + ";" + take(H200[0], 4096, 50) + ";"
    inv = build([node("gpu-1")], [pod("p", "gpu-1", allocated)])
    device = inv.node("gpu-1").device(H200[0])  # type: ignore[union-attr]
    assert device is not None
    assert (device.free_memory_mib, device.free_cores, device.free_slots) == (0, 0, 8)


@pytest.mark.parametrize(
    ("handshake", "allocatable", "offered", "problem"),
    [
        pytest.param(requesting(30), None, True, None, id="a-fresh-handshake-offers-the-node"),
        pytest.param(
            requesting(300),
            None,
            False,
            "hami.io/node-handshake asked 300 s ago (limit 60 s)",
            id="a-node-with-a-stale-handshake-offers-nothing",
        ),
        pytest.param(
            requesting(300),
            "0",
            False,
            "hami.io/node-handshake asked 300 s ago",
            id="a-stale-handshake-and-no-allocatable-gpus-offers-nothing",
        ),
        pytest.param(
            requesting(300),
            "80",
            True,
            None,
            id="a-stale-handshake-while-the-kubelet-still-allocates-gpus-is-kept-as-hami-keeps-it",
        ),
        pytest.param(
            "Requesting_" + stamp(300, "%Y.%m.%d %H:%M:%S"),
            None,
            False,
            "asked 300 s ago",
            id="the-dotted-timestamp-older-hami-wrote-is-read-too",
        ),
        pytest.param(
            "Deleted_" + stamp(10),
            None,
            False,
            "HAMi removed its devices",
            id="a-node-hami-marked-deleted-offers-nothing",
        ),
        pytest.param(
            "Reported " + stamp(10),
            None,
            True,
            None,
            id="a-fresh-report-from-the-device-plugin-offers-the-node",
        ),
        pytest.param(
            "Requesting_yesterday",
            None,
            True,
            "unreadable time 'yesterday'",
            id="an-unreadable-handshake-time-is-taken-as-healthy-as-hami-does-and-reported",
        ),
    ],
)
def test_the_handshake_decides_whether_a_node_offers_its_gpus(
    handshake, allocatable, offered, problem
):
    inv = build([node("gpu-1", handshake=handshake, allocatable_gpu=allocatable)])
    assert (inv.node("gpu-1") is not None) is offered
    reasons = [p.reason for p in inv.problems if p.subject == "node/gpu-1"]
    if problem is None:
        assert reasons == []
    else:
        assert any(problem in r for r in reasons), reasons
    # the hardware stays in the pool either way: a node coming back is no reason to Reject
    assert [n.name for n in inv.pool] == ["gpu-1"]


@pytest.mark.parametrize(
    "handshake",
    [
        pytest.param("Requesting_" + stamp(5) + "x" * 250_000, id="a 250 KiB handshake"),
        pytest.param("Requesting_" + stamp(5) + " " * 35, id="one character over 64"),
    ],
)
def test_a_handshake_longer_than_hami_writes_is_unreadable_and_never_cached(handshake):
    """4,096 distinct 250 KiB handshakes in the parse's cache held ~1 GiB (issue 27, H2)."""
    _handshake_time.cache_clear()
    inv = build([node("gpu-1", handshake=handshake)])
    assert _handshake_time.cache_info().currsize == 0
    assert inv.node("gpu-1") is not None  # taken as healthy, as HAMi does
    assert any("unreadable time" in p.reason for p in inv.problems), inv.problems


def test_a_node_without_a_handshake_annotation_is_offered():
    gpu = node("gpu-1")
    del gpu["metadata"]["annotations"][names.HAMI_NODE_HANDSHAKE]
    assert build([gpu]).node("gpu-1") is not None


def test_a_longer_handshake_timeout_keeps_a_slow_node():
    inv = build([node("gpu-1", handshake=requesting(300))], handshake_timeout=600.0)
    assert inv.node("gpu-1") is not None


def test_cordoned_and_unhealthy_cards_are_left_out_of_what_a_node_offers():
    inv = build(
        [node("gpu-1", cordon=f" {H200[0]}, {H200[5]} ,"), node("mixed", MIXED_TEXT)],
    )
    h200 = inv.node("gpu-1")
    mixed = inv.node("mixed")
    assert h200 is not None and mixed is not None
    assert [d.device.index for d in h200.devices] == [1, 2, 3, 4, 6, 7]
    assert [d.device.index for d in mixed.devices] == [0, 2]
    assert {n.name: len(n.devices) for n in inv.pool} == {"gpu-1": 8, "mixed": 3}


def test_an_unschedulable_node_offers_nothing_and_says_so():
    inv = build([node("gpu-1", unschedulable=True), node("gpu-2")])
    assert [n.name for n in inv.nodes] == ["gpu-2"]
    assert [(p.subject, p.reason) for p in inv.problems] == [
        ("node/gpu-1", "unschedulable (cordoned)")
    ]


def test_nodes_outside_the_pool_selector_are_left_out_of_offer_and_pool():
    pool = {"accelerator-pool": "h200"}
    nodes = [node("gpu-1", labels=pool), node("gpu-2", labels={"accelerator-pool": "a100"})]
    inv = build(nodes, node_selector=pool)
    assert [n.name for n in inv.nodes] == ["gpu-1"]
    assert [n.name for n in inv.pool] == ["gpu-1"]
    assert [(p.subject, p.reason) for p in inv.problems] == [
        ("node/gpu-2", "labels do not match the pool selector accelerator-pool=h200")
    ]


def test_a_pool_node_hami_never_registered_is_reported_and_a_cpu_node_elsewhere_is_not():
    pool = {"accelerator-pool": "h200"}
    nodes = [node("gpu-1", register=None, labels=pool), node("cpu-1", register=None)]
    assert [(p.subject, p.reason) for p in build(nodes, node_selector=pool).problems] == [
        ("node/gpu-1", "no hami.io/node-nvidia-register annotation: HAMi registered no GPU"),
        ("node/cpu-1", "labels do not match the pool selector accelerator-pool=h200"),
    ]
    assert build(nodes).problems == ()


def test_a_malformed_node_is_reported_and_never_breaks_the_others():
    inv = build([node("bad", '[{"id":"GPU-z","count":"ten"}]'), node("gpu-1")])
    assert [n.name for n in inv.nodes] == ["gpu-1"]
    ((subject, reason),) = [(p.subject, p.reason) for p in inv.problems]
    assert subject == "node/bad"
    assert "hami.io/node-nvidia-register" in reason
    assert "device 0 (GPU-z): field 'count' is 'ten'" in reason


def test_a_malformed_allocation_is_reported_and_its_node_offers_nothing_while_it_lasts():
    """HAMi counts it as nothing; the check cannot tell what the pod holds, so it offers none."""
    pods = [
        pod("bad", "gpu-1", "GPU-x,NVIDIA,lots,0:;"),
        pod("ok", "gpu-2", take(H200[1], 10, 10)),
    ]
    inv = build([node("gpu-1"), node("gpu-2")], pods)
    assert [n.name for n in inv.nodes] == ["gpu-2"]
    assert inv.node("gpu-2").device(H200[1]).free_cores == 90  # type: ignore[union-attr]
    assert [n.name for n in inv.pool] == ["gpu-1", "gpu-2"]  # its hardware is still known
    ((subject, reason),) = [(p.subject, p.reason) for p in inv.problems]
    assert subject == "pod/train/bad"
    assert "field 'usedmem' is 'lots'" in reason
    assert "node gpu-1 offers nothing while it is unreadable" in reason


def test_a_pod_holding_a_card_its_node_does_not_register_is_reported():
    inv = build([node("gpu-1")], [pod("p", "gpu-1", take("GPU-elsewhere", 10, 10))])
    assert [(p.subject, p.reason) for p in inv.problems] == [
        ("pod/train/p", "holds GPU-elsewhere, which node gpu-1 does not register")
    ]


def test_pods_on_nodes_that_offer_nothing_are_not_problems():
    inv = build([node("gpu-1", unschedulable=True)], [pod("p", "gpu-1", take(H200[0], 10, 10))])
    assert [p.subject for p in inv.problems] == ["node/gpu-1"]


def test_reserving_placements_takes_slots_memory_and_cores_in_a_new_inventory():
    inv = build([node("gpu-1")])
    placement = PodPlacement(
        pod_set="workers",
        index=0,
        node="gpu-1",
        containers=((DeviceTake(H200[0], 40960, 30), DeviceTake(H200[1], 40960, 30)),),
    )
    after = inv.reserve([placement])
    taken = after.node("gpu-1").device(H200[0])  # type: ignore[union-attr]
    assert taken is not None
    assert (taken.free_slots, taken.free_memory_mib, taken.free_cores) == (9, H200_MIB - 40960, 70)
    assert inv.node("gpu-1").device(H200[0]).untouched  # type: ignore[union-attr]
    assert after.pool == inv.pool


def test_reserving_on_a_device_the_inventory_does_not_offer_is_a_caller_error():
    placement = PodPlacement("w", 0, "gpu-9", ((DeviceTake("GPU-x", 1, 1),),))
    with pytest.raises(ValueError, match="gpu-9"):
        build([node("gpu-1")]).reserve([placement])
