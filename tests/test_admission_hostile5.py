"""Admission under the fifth hostile pass (issue 27): checks of the wrong shape, long
warnings, and asks that are each check's own.

One AdmissionCheck of the wrong JSON shape is left out of the view alone (its gangs still
hold their cards); a warning names a few things and counts the rest.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from admission.cluster import PoolDemand
from admission.config import parse_config
from admission.demand import DemandResult
from admission.parameters import Headroom, Parameters
from admission.workload import NAMED_TIMES, times_before_creation
from foundation.errors import ConfigError
from foundation.timestamps import format_time
from tests.test_admission_controller import NO_API, Writing
from tests.test_admission_decide import CHECK, NOW, node, workload
from tests.test_cli_flags import unitscale, write

_STANDARD_WATCHES = ("parameters", "pods", "datasets", "dataloads")


def _controller(checks: dict[str, Any], workloads: dict[str, Any], **kw: Any) -> Writing:
    controller = Writing(**kw)
    for name in _STANDARD_WATCHES:
        controller._changed(name, {})
    controller._changed("admissionchecks", checks)
    controller._changed("workloads", workloads)
    controller._changed("nodes", {"gpu-1": node("gpu-1")})
    return controller


def _pending(name: str, gpus: int) -> dict[str, Any]:
    w = workload(name, gpus=gpus)
    a_minute_ago = format_time(NOW - 60)
    w["metadata"]["creationTimestamp"] = a_minute_ago
    w["status"]["admissionChecks"][0]["lastTransitionTime"] = a_minute_ago
    return w


OURS = "OURS"
"""Stands for the controller's own name in a check's spec."""


def _ours(check: dict[str, Any], name: str) -> dict[str, Any]:
    spec = check.get("spec") if isinstance(check, dict) else None
    if isinstance(spec, dict) and spec.get("controllerName") == OURS:
        spec["controllerName"] = name
    return check


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"metadata": {"name": "zz"}, "spec": "x"}, id="a check whose spec is text"),
        pytest.param({"metadata": {"name": "zz"}, "spec": [1]}, id="a check whose spec is a list"),
        pytest.param({"metadata": {"name": "zz"}, "spec": 7}, id="a check whose spec is a number"),
        pytest.param([1, 2], id="a check that is a list"),
        pytest.param("x", id="a check that is text"),
        pytest.param(
            {"metadata": {"name": "zz"}, "spec": {"controllerName": OURS}, "status": "x"},
            id="a check of ours whose status is text",
        ),
        pytest.param(
            {"metadata": {"name": "zz"}, "spec": {"controllerName": OURS},
             "status": {"conditions": 5}},
            id="a check of ours whose conditions are a number",
        ),
        pytest.param(
            {"metadata": "x", "spec": {"controllerName": OURS}},
            id="a check of ours whose metadata is text",
        ),
        pytest.param(
            {"metadata": {"name": ["zz"]}, "spec": {"controllerName": OURS}},
            id="a check of ours whose name is a list",
        ),
    ],
)  # fmt: skip
async def test_one_check_of_the_wrong_shape_never_stops_the_others_workloads(bad, caplog):
    """Its spec, status or metadata raised in the pass's own code: no workload of any
    check was decided while it stood (issue 27, hostile pass 5, H2)."""
    writing = Writing()
    good = {"metadata": {"name": CHECK}, "spec": {"controllerName": writing.name}}
    controller = _controller({CHECK: good, "zz": _ours(bad, writing.name)}, {})
    controller._changed("workloads", {"train/a": _pending("a", 1)})
    with caplog.at_level(logging.WARNING):
        await controller.reconcile(api=NO_API)
        await controller.reconcile(api=NO_API)
    assert controller.written["train/a"]["state"] == "Ready"
    left_out = [r for r in caplog.records if "of the wrong shape" in r.getMessage()]
    assert len(left_out) == 1, "warned of once while it stands"
    assert "admissioncheck/" in left_out[0].getMessage()
    counted = controller.metrics.unreadable.labels("admissioncheck")._value.get()
    assert counted == 1


async def test_a_gang_admitted_through_our_check_of_the_wrong_shape_still_holds_its_cards():
    """Left out of the view, the check is still ours: its Ready gang without pods holds the
    node's 8 cards, and a second 8-card gang is not admitted onto them."""
    writing = Writing()
    broken = {"metadata": {"name": "ours-too"}, "spec": {"controllerName": writing.name},
              "status": "x"}  # fmt: skip
    good = {"metadata": {"name": CHECK}, "spec": {"controllerName": writing.name}}
    ghost = workload("ghost", gpus=8, state="Ready", created=format_time(NOW - 90))
    ghost["status"]["admissionChecks"][0].update(
        name="ours-too", lastTransitionTime=format_time(NOW - 60)
    )
    controller = _controller(
        {CHECK: good, "ours-too": broken},
        {"train/ghost": ghost, "train/new": _pending("new", 8)},
    )
    await controller.reconcile(api=NO_API)
    assert controller.written["train/new"]["state"] == "Retry"


def _ready_before_creation(entries: int) -> dict[str, Any]:
    w = workload("a", gpus=1)
    w["metadata"]["creationTimestamp"] = format_time(NOW - 60)
    w["status"]["admissionChecks"] = [
        {"name": f"c{i:06d}", "state": "Ready", "lastTransitionTime": "1970-01-01T00:00:00Z"}
        for i in range(entries)
    ]
    return w


@pytest.mark.parametrize(
    ("entries", "counted"),
    [
        pytest.param(1, "", id="one entry is named"),
        pytest.param(NAMED_TIMES, "", id="three entries are named"),
        pytest.param(4, " and 1 more", id="a fourth entry is counted"),
        pytest.param(
            20_000, " and 19,997 more", id="twenty thousand entries are three and a count"
        ),
    ],
)
def test_the_times_before_creation_name_a_few_and_count_the_rest(entries, counted):
    """Every entry was named: 20,000 Ready entries dated 1970 made one WARNING of
    980,073 characters (issue 27, hostile pass 5, M2)."""
    problem = times_before_creation(_ready_before_creation(entries))
    assert problem is not None
    assert problem.count("Ready at") == min(entries, NAMED_TIMES)
    assert f"{counted}: before its creation" in problem
    assert len(problem) < 400


async def test_the_controller_warns_of_twenty_thousand_early_entries_in_one_short_line():
    controller = _controller({}, {"train/a": _ready_before_creation(20_000)})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger("admission").addHandler(handler)
    try:
        await controller.reconcile(api=NO_API)
    finally:
        logging.getLogger("admission").removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines and max(map(len, lines)) < 400


# --- M3: each check reads its own ask ---------------------------------------------------


async def _headroom_verdict(
    monkeypatch: pytest.MonkeyPatch,
    ours: Headroom,
    other: Headroom,
    answers: dict[tuple[str, int], PoolDemand],
) -> str:
    """Our 1-GPU workload's state on an 8-card node, beside another check's ask of h200
    (made for its own pending 1-GPU workload)."""
    checks = {
        CHECK: Parameters(inference_headroom=ours),
        "other": Parameters(inference_headroom=other),
    }
    monkeypatch.setattr(
        "admission.controller.params.check_parameters",
        lambda check, objects: checks[check["metadata"]["name"]],
    )

    async def demand(scaler: str, pool: str, horizon: float, **_: Any) -> DemandResult:
        return DemandResult({pool: answers[scaler, int(horizon)]})

    theirs = _pending("b", 1)  # the other check asks only while it has one pending
    theirs["status"]["admissionChecks"][0]["name"] = "other"
    controller = _controller({}, {"train/a": _pending("a", 1), "train/b": theirs}, demand=demand)
    controller._changed(
        "admissionchecks",
        {n: {"metadata": {"name": n}, "spec": {"controllerName": controller.name}} for n in checks},
    )
    await controller.reconcile(api=NO_API)
    return str(controller.written["train/a"]["state"])


@pytest.mark.parametrize(
    ("ours", "other", "answers", "state"),
    [
        pytest.param(
            Headroom("ours:9090", "h200"), Headroom("ours:9090", "h200", horizon_seconds=60),
            {("ours:9090", 600): PoolDemand("h200", 0, 0),
             ("ours:9090", 60): PoolDemand("h200", 0, 8)},
            "Ready",
            id="another check asking our pool at another horizon does not hold our gangs",
        ),
        pytest.param(
            Headroom("ours:9090", "h200", when_unavailable="Ignore"), Headroom("zz:9090", "h200"),
            {("ours:9090", 600): PoolDemand("h200", 0, 8),
             ("zz:9090", 600): PoolDemand("h200", 0, 0)},
            "Retry",
            id="another check's scaler saying our pool needs nothing does not admit onto it",
        ),
    ],
)  # fmt: skip
async def test_each_check_reads_its_own_ask_of_a_pool_another_check_asks_too(
    monkeypatch, ours, other, answers, state
):
    """Two asks of one pool that disagreed left it unknown for both checks: ``Hold`` kept
    our gangs waiting while the other check stood, ``Ignore`` admitted past inference's
    need (issue 27, hostile pass 5, M3)."""
    assert await _headroom_verdict(monkeypatch, ours, other, answers) == state


# --- M5: a boolean where the admission config wants a count ----------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("write-concurrency: 8\n", 8, id="a count of writes is read"),
        pytest.param("write-concurrency: true\n", None, id="true is no count of writes"),
        pytest.param("write-concurrency: false\n", None, id="false is no count of writes"),
    ],
)
def test_the_admission_config_takes_no_boolean_for_a_count(text, expected):
    """pydantic read ``write-concurrency: true`` as 1 (issue 27, hostile pass 5, M5)."""
    if expected is None:
        with pytest.raises(ConfigError, match=r"'write-concurrency'.*expected a whole number"):
            parse_config(text)
    else:
        assert parse_config(text).write_concurrency == expected


def test_the_admission_command_with_a_boolean_count_is_one_line(tmp_path):
    config = write(tmp_path / "admission.yaml", b"write-concurrency: true\n")
    done = unitscale("admission", "--config", config)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "expected a whole number" in done.stderr
