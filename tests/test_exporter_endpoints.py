"""EndpointSlices to replica URLs: the pure function, table-tested."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.discovery import EndpointSlicesConfig, EndpointSliceWatch
from foundation.endpoint_slices import MAX_ENDPOINTS_READ, slice_targets
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


GOOD = eps(ep("10.0.0.1"))


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        pytest.param(
            eps({"addresses": ["10.0.0.2"], "conditions": "ready"}),
            "conditions is not an object",
            id="conditions as a string skips that endpoint alone",
        ),
        pytest.param(
            eps({"addresses": ["10.0.0.2"], "conditions": {"ready": "yes"}}),
            "conditions.ready is not a boolean",
            id="a ready that is no boolean skips that endpoint alone",
        ),
        pytest.param(
            {"addressType": "IPv4", "ports": "metrics", "endpoints": [ep("10.0.0.2")]},
            "ports is not a list of objects",
            id="ports as a string skips that slice alone",
        ),
        pytest.param(
            {"addressType": "IPv4", "ports": [{"name": "metrics", "port": "x"}], "endpoints": []},
            "is not a number in 1-65535",
            id="a named port that is no number skips that slice alone",
        ),
        pytest.param(
            {"addressType": "IPv4", "ports": [{"name": "metrics", "port": 8000}], "endpoints": {}},
            "endpoints is not a list",
            id="endpoints as an object skips that slice alone",
        ),
        pytest.param(
            eps("10.0.0.2"), "an endpoint is not an object", id="an endpoint that is a string"
        ),
        pytest.param(
            eps(ep("10.0.0.2/evil?")),
            "an address is not IPv4",
            id="an address that would rewrite the url is skipped",
        ),
        pytest.param(
            eps(ep("Not_A_Host"), address_type="FQDN"),
            "not a DNS name",
            id="an fqdn that is no dns name is skipped",
        ),
        pytest.param(
            eps(ep("fe80::1%\n"), address_type="IPv6"),
            "zone id",
            id="an ipv6 address whose zone id holds a newline is skipped",
        ),
        pytest.param(["a", "list"], "a slice is not an object", id="a slice that is a list"),
        pytest.param(eps(ep("0.0.0.0")), "an address no pod has",
                     id="the unspecified address (this host) is skipped"),
        pytest.param(eps(ep("255.255.255.255")), "an address no pod has",
                     id="the broadcast address is skipped"),
        pytest.param(eps(ep("224.0.0.1")), "an address no pod has",
                     id="a multicast address is skipped"),
        pytest.param(eps(ep("::"), address_type="IPv6"), "an address no pod has",
                     id="the unspecified ipv6 address is skipped"),
        pytest.param(eps(ep("::ffff:0.0.0.0"), address_type="IPv6"), "an address no pod has",
                     id="the unspecified address mapped into ipv6 is skipped"),
        pytest.param(eps(ep("::ffff:255.255.255.255")), "an address no pod has",
                     id="the broadcast address mapped into ipv6 is skipped"),
        pytest.param(eps(ep("0x0"), address_type="FQDN"), "not a DNS name",
                     id="an fqdn a resolver reads as the unspecified address is skipped"),
        pytest.param(eps(ep("4294967295"), address_type="FQDN"), "not a DNS name",
                     id="an fqdn a resolver reads as the broadcast address is skipped"),
        pytest.param(eps(ep("llama..svc"), address_type="FQDN"), "not a DNS name",
                     id="an fqdn with an empty label is skipped"),
        pytest.param(eps(*[ep(f"10.1.{i // 250}.{i % 250}") for i in range(1001)]),
                     "more than the API's 1,000 endpoints",
                     id="a slice of more endpoints than the api allows is skipped"),
    ],
)  # fmt: skip
def test_a_malformed_slice_or_endpoint_is_skipped_alone_and_named(bad, why):
    skipped: list[str] = []
    urls = slice_targets([bad, GOOD], "metrics", skipped=skipped)
    assert urls == ["http://10.0.0.1:8000/metrics"]  # the good slice still counts
    assert len(skipped) == 1 and why in skipped[0]


@pytest.mark.parametrize(
    ("before", "change", "after"),
    [
        pytest.param([ep("10.0.0.1")], [ep("0.0.0.0")], ["http://10.0.0.1:8000/metrics"],
                     id="a change naming only an address no pod has keeps the last list"),
        pytest.param(None, [ep("224.0.0.1")], None,
                     id="a first list naming only malformed endpoints is no list yet"),
        pytest.param([ep("10.0.0.1")], [], [],
                     id="a change naming no endpoint is a fleet of none"),
        pytest.param([ep("10.0.0.1")], [ep("10.0.0.2"), ep("0.0.0.0")],
                     ["http://10.0.0.2:8000/metrics"],
                     id="a change with a usable endpoint lists it alone"),
    ],
)  # fmt: skip
def test_a_change_whose_every_endpoint_is_malformed_is_no_answer(before, change, after):
    """Read as a fleet of none, 0.0.0.0 alone made the exporter publish a busy fleet's
    load as 0 (issue 27, hostile pass 53)."""
    watch = EndpointSliceWatch("team-a", EndpointSlicesConfig(service="llama", port="metrics"))
    if before is not None:
        watch._changed({"s1": eps(*before)})
    watch._changed({"s1": eps(*change)})
    assert watch.targets == (None if after is None else sorted(after))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
slice_like = st.fixed_dictionaries(
    {},
    optional={
        "addressType": st.sampled_from(["IPv4", "IPv6", "FQDN"]) | json_values,
        "ports": json_values,
        "endpoints": st.lists(
            st.fixed_dictionaries(
                {}, optional={"addresses": json_values, "conditions": json_values}
            )
            | json_values,
            max_size=4,
        )
        | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(slice_like | json_values, max_size=4), st.sampled_from(["metrics", 8000]))
def test_any_json_slices_give_urls_never_an_exception(slices, port):
    """Whatever shape an API server (or a hostile object) sends, the good slice counts."""
    urls = slice_targets([*slices, GOOD], port, skipped=[])
    assert "http://10.0.0.1:8000/metrics" in urls
    assert all(url.startswith("http://") and url.endswith("/metrics") for url in urls)


def test_slices_past_the_endpoints_read_are_left_unread_by_name():
    """100,000 endpoints in 100 slices held the reader's event loop 0.4 s on every watch
    event (issue 27, hostile pass 34): at most ``MAX_ENDPOINTS_READ`` are read, the
    slices taken by name, and those past it named as unread; a smaller one by a later
    name still fits (pass 35: the first slice past it ended the reading)."""
    slices = []
    for n in range(12):  # 12 slices of 1,000: the 11th is past 10,000
        one = eps(*[ep(f"10.{n}.{i // 250}.{i % 250}") for i in range(1000)])
        one["metadata"] = {"name": f"s-{n:02d}"}
        slices.append(one)
    for half in (slices[0], slices[-1]):
        half["endpoints"] = half["endpoints"][:500]
    skipped: list[str] = []
    urls = slice_targets(reversed(slices), "metrics", skipped=skipped)
    assert len(urls) == MAX_ENDPOINTS_READ
    read = {u.split(".")[1] for u in urls}
    assert read == {str(n) for n in range(10)} | {"11"}  # s-00 to s-09, then s-11
    assert skipped == ["slice 's-10': past 10,000 endpoints, unread"]
