"""The KEDA contract on the wire, checked against bytes built by hand.

The expected bytes follow the protobuf encoding spec (tag = field << 3 | wire type;
varints; little-endian fixed64 doubles; maps as repeated key=1/value=2 entries), so a
wrong field number, type or name in externalscaler.proto fails here even though the
generated code would agree with itself.
"""

from __future__ import annotations

import struct

import pytest

from protos.externalscaler import externalscaler_pb2 as keda

VARINT, FIXED64, LENGTH = 0, 1, 2


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 is ten bytes of two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def string(field: int, text: str) -> bytes:
    data = text.encode()
    return tag(field, LENGTH) + varint(len(data)) + data


def message(field: int, body: bytes) -> bytes:
    return tag(field, LENGTH) + varint(len(body)) + body


def int64(field: int, value: int) -> bytes:
    return tag(field, VARINT) + varint(value)


def double(field: int, value: float) -> bytes:
    return tag(field, FIXED64) + struct.pack("<d", value)


def map_entry(field: int, key: str, value: str) -> bytes:
    return message(field, string(1, key) + string(2, value))


REF_BYTES = (
    string(1, "llama")
    + string(2, "team-a")
    + map_entry(3, "deployment", "llama")
    + map_entry(3, "scalerAddress", "scaler:9090")
)

CASES = [
    pytest.param(
        keda.ScaledObjectRef,
        REF_BYTES,
        {
            "name": "llama",
            "namespace": "team-a",
            "scalerMetadata": {"deployment": "llama", "scalerAddress": "scaler:9090"},
        },
        id="scaled-object-ref-carries-name-namespace-and-the-metadata-map",
    ),
    pytest.param(
        keda.IsActiveResponse,
        tag(1, VARINT) + varint(1),
        {"result": True},
        id="is-active-result-is-field-1-bool",
    ),
    pytest.param(
        keda.MetricSpec,
        string(1, "unitscale-desired-replicas") + int64(2, 1) + double(3, 1.5),
        {"metricName": "unitscale-desired-replicas", "targetSize": 1, "targetSizeFloat": 1.5},
        id="metric-spec-has-int-target-2-and-float-target-3",
    ),
    pytest.param(
        keda.GetMetricSpecResponse,
        message(1, string(1, "m") + int64(2, 2) + double(3, 2.0))
        + message(1, string(1, "n") + int64(2, 3) + double(3, 3.0)),
        {
            "metricSpecs": [
                {"metricName": "m", "targetSize": 2, "targetSizeFloat": 2.0},
                {"metricName": "n", "targetSize": 3, "targetSizeFloat": 3.0},
            ]
        },
        id="metric-spec-response-repeats-field-1",
    ),
    pytest.param(
        keda.GetMetricsRequest,
        message(1, REF_BYTES) + string(2, "s0-unitscale-desired-replicas"),
        {
            "scaledObjectRef": {
                "name": "llama",
                "namespace": "team-a",
                "scalerMetadata": {"deployment": "llama", "scalerAddress": "scaler:9090"},
            },
            "metricName": "s0-unitscale-desired-replicas",
        },
        id="get-metrics-request-nests-the-ref-as-field-1-and-names-the-metric-in-2",
    ),
    pytest.param(
        keda.GetMetricsResponse,
        message(1, string(1, "m") + int64(2, 7) + double(3, 6.5)),
        {"metricValues": [{"metricName": "m", "metricValue": 7, "metricValueFloat": 6.5}]},
        id="metric-value-has-int-value-2-and-float-value-3",
    ),
    pytest.param(
        keda.MetricValue,
        string(1, "m") + int64(2, -3),
        {"metricName": "m", "metricValue": -3},
        id="int64-values-are-signed-ten-byte-varints-when-negative",
    ),
]


@pytest.mark.parametrize(("cls", "wire", "fields"), CASES)
def test_hand_built_bytes_parse_to_the_expected_fields(cls, wire, fields):
    parsed = cls.FromString(wire)
    assert _as_dict(parsed) == fields


@pytest.mark.parametrize(("cls", "wire", "fields"), CASES)
def test_generated_code_serializes_to_the_hand_built_bytes(cls, wire, fields):
    built = cls(**fields)
    # deterministic=True sorts map entries by key, as REF_BYTES lists them.
    assert built.SerializeToString(deterministic=True) == wire


def _as_dict(msg):
    out: dict[str, object] = {}
    for field, value in msg.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.is_repeated:
            out[field.name] = [_as_dict(v) for v in value]
        elif field.message_type is not None:
            out[field.name] = _as_dict(value)
        else:
            out[field.name] = value
    return out


def test_service_has_keda_wire_paths_and_streaming_shapes():
    service = keda.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert keda.DESCRIPTOR.package == "externalscaler"
    shapes = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert shapes == {
        "IsActive": ("ScaledObjectRef", "IsActiveResponse", False, False),
        "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", False, True),
        "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False, False),
        "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False, False),
        "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False, True),
    }
    assert service.full_name == "externalscaler.ExternalScaler"
