"""The wire carries the typed signals unchanged: what the exporter derives is what decide() sees."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.signals import EngineSignals, GatewaySignals, Quantiles, Snapshot, WindowSignals
from foundation.signals_wire import WireError, decode, encode
from protos.unitscale.v1 import signals_pb2 as pb

# Times on a whole microsecond: the wire keeps nanoseconds, a float keeps ~0.2 us at 1.8e9 s.
times = st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1e6)
values = st.none() | st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
costs = values | st.just(math.inf)  # paying for replicas that served nothing
counts = st.integers(0, 10_000)
names = st.text("abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=20)
quantiles = st.builds(Quantiles, values, values, values, values)
windows = st.builds(
    WindowSignals,
    st.integers(1, 3600).map(float),
    values,
    values,
    values,
    values,
    quantiles,
    quantiles,
    quantiles,
    quantiles,
    values,
    values,
    values,
    values,
)
engines = st.builds(
    EngineSignals,
    times,
    counts,
    counts,
    values,
    values,
    values,
    windows,
    windows,
    costs,
    costs,
    st.booleans(),
    st.booleans(),
    st.none() | counts,  # replicas asleep: unknown stays unknown
)
gateways = st.builds(
    GatewaySignals,
    times,
    values,
    counts,
    counts,
    st.none() | times,
    values,
    values,  # SLO within rate: unknown (a gateway that does not judge) stays unknown
    values,  # and outside
)
targets = st.tuples(names, names, st.just("") | names)


@given(targets, engines | gateways)
def test_a_snapshot_comes_back_from_the_wire_as_it_went(target, signals):
    snapshot = Snapshot(target, signals)
    assert decode(pb.Signals.FromString(encode(snapshot).SerializeToString())) == snapshot


def test_a_time_that_float_arithmetic_would_move_by_one_ulp_comes_back_exactly():
    # 163412391.148869 * 1e9 rounds in floats, and an int over 2**53 divided by 1e9 is
    # rounded twice: both once moved this time by a ulp (hypothesis found it).
    gateway = GatewaySignals(163412391148869 / 1e6, None, 0, 0)
    snapshot = Snapshot(("a", "b", ""), gateway)
    assert decode(pb.Signals.FromString(encode(snapshot).SerializeToString())) == snapshot


def test_nan_is_sent_as_unknown_never_as_a_number():
    window = WindowSignals(60.0, request_rate=math.nan, ttft=Quantiles(p95=math.nan))
    engine = EngineSignals(0.0, 1, 1, math.nan, 2.0, None, window, window, None, None, False, False)
    back = decode(encode(Snapshot(("a", "b", ""), engine))).signals
    assert isinstance(back, EngineSignals)
    assert (back.queue_depth, back.running, back.stable.request_rate, back.stable.ttft.p95) == (
        None,
        2.0,
        None,
        None,
    )


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            pb.Signals(source=pb.SOURCE_EXPORTER, engine=pb.EngineSignals()),
            id="a-message-naming-no-deployment-is-refused",
        ),
        pytest.param(
            pb.Signals(target=pb.Target(namespace="a", deployment="b")),
            id="a-message-with-no-payload-is-refused",
        ),
    ],
)
def test_messages_that_cannot_be_attributed_are_refused(message):
    with pytest.raises(WireError):
        decode(message)


def test_the_request_mix_travels_in_its_own_fields_and_unknown_stays_unset():
    window = WindowSignals(60.0, mean_prompt_tokens=812.5)
    engine = EngineSignals(0.0, 1, 1, None, None, None, window, window, None, None, False, False)
    message = encode(Snapshot(("a", "b", ""), engine))
    assert message.engine.stable.mean_prompt_tokens == 812.5
    assert not message.engine.stable.HasField("mean_output_tokens")
    back = decode(pb.Signals.FromString(message.SerializeToString())).signals
    assert isinstance(back, EngineSignals)
    assert (back.stable.mean_prompt_tokens, back.stable.mean_output_tokens) == (812.5, None)


def test_the_slo_rates_travel_in_their_own_fields_and_unknown_stays_unset():
    gateway = GatewaySignals(0.0, 3.0, 0, 1, slo_within_rate=2.5, slo_outside_rate=0.0)
    message = encode(Snapshot(("a", "b", ""), gateway))
    assert message.gateway.HasField("slo_outside_rate")  # a known 0 is sent, not dropped
    assert (message.gateway.slo_within_rate, message.gateway.slo_outside_rate) == (2.5, 0.0)
    back = decode(pb.Signals.FromString(message.SerializeToString())).signals
    assert isinstance(back, GatewaySignals)
    assert (back.slo_within_rate, back.slo_outside_rate) == (2.5, 0.0)
    unjudged = encode(Snapshot(("a", "b", ""), GatewaySignals(0.0, 3.0, 0, 1)))
    assert not unjudged.gateway.HasField("slo_within_rate")
    assert not unjudged.gateway.HasField("slo_outside_rate")
    back = decode(unjudged).signals
    assert isinstance(back, GatewaySignals)
    assert (back.slo_within_rate, back.slo_outside_rate) == (None, None)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("slo_within_rate", -1.0, id="a-negative-within-rate-is-refused"),
        pytest.param("slo_outside_rate", -0.5, id="a-negative-outside-rate-is-refused"),
        pytest.param("slo_within_rate", math.inf, id="an-infinite-within-rate-is-refused"),
        pytest.param(
            "slo_outside_rate", math.nan, id="a-nan-outside-rate-set-on-the-wire-is-refused"
        ),
        pytest.param("arrival_rate", -1.0, id="a-negative-arrival-rate-is-refused"),
        pytest.param("arrival_rate", math.inf, id="an-infinite-arrival-rate-is-refused"),
        pytest.param("arrival_rate", math.nan, id="a-nan-arrival-rate-is-refused"),
        pytest.param("upstream_error_rate", -0.5, id="a-negative-error-rate-is-refused"),
        pytest.param("upstream_error_rate", -math.inf, id="a-minus-infinite-error-rate-is-refused"),
    ],
)
def test_slo_rates_out_of_range_refuse_the_message(field, value):
    gateway = pb.GatewaySignals(**{field: value})
    message = pb.Signals(target=pb.Target(namespace="a", deployment="b"), gateway=gateway)
    with pytest.raises(WireError, match=field):
        decode(pb.Signals.FromString(message.SerializeToString()))


GATEWAY_RATES = ("arrival_rate", "upstream_error_rate", "slo_within_rate", "slo_outside_rate")


@given(field=st.sampled_from(GATEWAY_RATES), value=st.floats())
def test_any_float_in_a_gateway_rate_is_accepted_finite_and_non_negative_or_refused(field, value):
    gateway = pb.GatewaySignals(**{field: value})
    message = pb.Signals(target=pb.Target(namespace="a", deployment="b"), gateway=gateway)
    try:
        back = decode(pb.Signals.FromString(message.SerializeToString())).signals
    except WireError as err:
        assert field in str(err)
        assert not (math.isfinite(value) and value >= 0)
        return
    got = getattr(back, field)
    assert got == value and math.isfinite(got) and got >= 0
