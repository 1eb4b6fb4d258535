"""EndpointSlices to replica URLs: the pure function, table-tested."""

from __future__ import annotations

import pytest

from foundation.discovery import EndpointSlicesConfig
from foundation.endpoint_slices import slice_targets
from foundation.errors import ConfigError


def eps(*endpoints, ports=(("metrics", 8000),), address_type="IPv4"):
    return {
        "addressType": address_type,
        "ports": [{"name": name, "port": port, "protocol": "TCP"} for name, port in ports],
        "endpoints": list(endpoints),
    }


def ep(address, ready=True, *more):
    endpoint: dict[str, object] = {"addresses": [address, *more]}
    if ready is not None:
        endpoint["conditions"] = {"ready": ready}
    return endpoint


@pytest.mark.parametrize(
    ("slices", "port", "expected"),
    [
        pytest.param([], "metrics", [], id="no-slices-no-replicas"),
        pytest.param(
            [eps(ep("10.0.0.2"), ep("10.0.0.1"))],
            "metrics",
            ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"],
            id="every-ready-endpoint-is-a-replica-sorted",
        ),
        pytest.param(
            [eps(ep("10.0.0.1"), ep("10.0.0.2", False))],
            "metrics",
            ["http://10.0.0.1:8000/metrics"],
            id="an-endpoint-that-is-not-ready-is-left-out",
        ),
        pytest.param(
            [eps(ep("10.0.0.1", None))],
            "metrics",
            ["http://10.0.0.1:8000/metrics"],
            id="a-missing-ready-condition-counts-as-ready-as-the-api-says",
        ),
        pytest.param(
            [eps(ep("10.0.0.1", True, "10.0.0.9"))],
            "metrics",
            ["http://10.0.0.1:8000/metrics"],
            id="only-an-endpoints-first-address-is-used",
        ),
        pytest.param(
            [eps(ep("10.0.0.1")), eps(ep("10.0.0.1"))],
            "metrics",
            ["http://10.0.0.1:8000/metrics"],
            id="an-endpoint-in-two-slices-during-a-move-counts-once",
        ),
        pytest.param(
            [eps(ep("10.0.0.1"), ports=(("http", 80),))],
            "metrics",
            [],
            id="a-slice-without-the-named-port-gives-nothing",
        ),
        pytest.param(
            [eps(ep("10.0.0.1"), ports=(("metrics", 9000),)), eps(ep("10.0.0.2"))],
            "metrics",
            ["http://10.0.0.1:9000/metrics", "http://10.0.0.2:8000/metrics"],
            id="a-port-name-is-resolved-per-slice",
        ),
        pytest.param(
            [eps(ep("10.0.0.1"), ports=())],
            9100,
            ["http://10.0.0.1:9100/metrics"],
            id="a-port-number-is-used-as-is",
        ),
        pytest.param(
            [eps(ep("fd00::0001"), address_type="IPv6")],
            "metrics",
            ["http://[fd00::1]:8000/metrics"],
            id="ipv6-addresses-are-bracketed",
        ),
        pytest.param(
            [eps(ep("llama-0.llama.serving.svc"), address_type="FQDN")],
            "metrics",
            ["http://llama-0.llama.serving.svc:8000/metrics"],
            id="fqdn-addresses-are-hosts",
        ),
        pytest.param(
            [{"addressType": "IPv4", "ports": None, "endpoints": None}],
            "metrics",
            [],
            id="null-lists-from-the-api-are-empty",
        ),
    ],
)
def test_slice_targets(slices, port, expected):
    assert slice_targets(slices, port) == expected


def test_scheme_and_path_are_configurable():
    urls = slice_targets([eps(ep("10.0.0.1"))], "metrics", scheme="https", path="/stats")
    assert urls == ["https://10.0.0.1:8000/stats"]


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        pytest.param({"service": "llama", "port": 0}, "port", id="port-zero-is-refused"),
        pytest.param(
            {"service": "llama", "port": "Metrics"}, "port", id="port-names-are-lowercase"
        ),
        pytest.param({"port": "metrics"}, "service", id="service-is-required"),
        pytest.param({"service": "llama"}, "port", id="port-is-required"),
        pytest.param(
            {"service": "llama", "port": 80, "path": "metrics"}, "path", id="path-starts-with-slash"
        ),
    ],
)
def test_bad_endpoint_slices_config_names_the_key(entry, fragment):
    from exporter.config import parse_config

    text = (
        "deployments:\n  - deployment: llama\n    endpoint-slices: "
        + repr(entry).replace("'", '"')
        + "\n"
    )
    with pytest.raises(ConfigError, match=f"endpoint-slices.*{fragment}"):
        parse_config(text)


def test_a_numeric_port_string_is_a_number():
    assert EndpointSlicesConfig.model_validate({"service": "a", "port": "8000"}).port == 8000
