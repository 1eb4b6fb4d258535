import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Source(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOURCE_UNSPECIFIED: _ClassVar[Source]
    SOURCE_EXPORTER: _ClassVar[Source]
    SOURCE_GATEWAY: _ClassVar[Source]
SOURCE_UNSPECIFIED: Source
SOURCE_EXPORTER: Source
SOURCE_GATEWAY: Source

class Target(_message.Message):
    __slots__ = ("namespace", "deployment", "model")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    deployment: str
    model: str
    def __init__(self, namespace: _Optional[str] = ..., deployment: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class TargetSelector(_message.Message):
    __slots__ = ("namespace", "deployment", "model")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    deployment: str
    model: str
    def __init__(self, namespace: _Optional[str] = ..., deployment: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Quantiles(_message.Message):
    __slots__ = ("p50", "p90", "p95", "p99")
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P95_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p90: float
    p95: float
    p99: float
    def __init__(self, p50: _Optional[float] = ..., p90: _Optional[float] = ..., p95: _Optional[float] = ..., p99: _Optional[float] = ...) -> None: ...

class WindowSignals(_message.Message):
    __slots__ = ("window", "request_rate", "prompt_token_rate", "generation_token_rate", "preemption_rate", "ttft_seconds", "inter_token_seconds", "e2e_seconds", "queue_time_seconds", "queue_depth_mean", "requests_running_mean", "mean_prompt_tokens", "mean_output_tokens")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_RATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKEN_RATE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_RATE_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    E2E_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_MEAN_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_MEAN_FIELD_NUMBER: _ClassVar[int]
    MEAN_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    window: _duration_pb2.Duration
    request_rate: float
    prompt_token_rate: float
    generation_token_rate: float
    preemption_rate: float
    ttft_seconds: Quantiles
    inter_token_seconds: Quantiles
    e2e_seconds: Quantiles
    queue_time_seconds: Quantiles
    queue_depth_mean: float
    requests_running_mean: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    def __init__(self, window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_rate: _Optional[float] = ..., prompt_token_rate: _Optional[float] = ..., generation_token_rate: _Optional[float] = ..., preemption_rate: _Optional[float] = ..., ttft_seconds: _Optional[_Union[Quantiles, _Mapping]] = ..., inter_token_seconds: _Optional[_Union[Quantiles, _Mapping]] = ..., e2e_seconds: _Optional[_Union[Quantiles, _Mapping]] = ..., queue_time_seconds: _Optional[_Union[Quantiles, _Mapping]] = ..., queue_depth_mean: _Optional[float] = ..., requests_running_mean: _Optional[float] = ..., mean_prompt_tokens: _Optional[float] = ..., mean_output_tokens: _Optional[float] = ...) -> None: ...

class EngineSignals(_message.Message):
    __slots__ = ("replicas_up", "replicas_scraped", "queue_depth", "requests_running", "kv_cache_usage", "panic", "stable", "cost_per_million_tokens", "cost_per_million_output_tokens", "price_is_default", "replicas_sleeping")
    REPLICAS_UP_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_SCRAPED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PANIC_FIELD_NUMBER: _ClassVar[int]
    STABLE_FIELD_NUMBER: _ClassVar[int]
    COST_PER_MILLION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_PER_MILLION_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRICE_IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_SLEEPING_FIELD_NUMBER: _ClassVar[int]
    replicas_up: int
    replicas_scraped: int
    queue_depth: float
    requests_running: float
    kv_cache_usage: float
    panic: WindowSignals
    stable: WindowSignals
    cost_per_million_tokens: float
    cost_per_million_output_tokens: float
    price_is_default: bool
    replicas_sleeping: int
    def __init__(self, replicas_up: _Optional[int] = ..., replicas_scraped: _Optional[int] = ..., queue_depth: _Optional[float] = ..., requests_running: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., panic: _Optional[_Union[WindowSignals, _Mapping]] = ..., stable: _Optional[_Union[WindowSignals, _Mapping]] = ..., cost_per_million_tokens: _Optional[float] = ..., cost_per_million_output_tokens: _Optional[float] = ..., price_is_default: _Optional[bool] = ..., replicas_sleeping: _Optional[int] = ...) -> None: ...

class GatewaySignals(_message.Message):
    __slots__ = ("arrival_rate", "buffered", "in_flight", "last_arrival_time", "upstream_error_rate", "slo_within_rate", "slo_outside_rate")
    ARRIVAL_RATE_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    SLO_WITHIN_RATE_FIELD_NUMBER: _ClassVar[int]
    SLO_OUTSIDE_RATE_FIELD_NUMBER: _ClassVar[int]
    arrival_rate: float
    buffered: int
    in_flight: int
    last_arrival_time: _timestamp_pb2.Timestamp
    upstream_error_rate: float
    slo_within_rate: float
    slo_outside_rate: float
    def __init__(self, arrival_rate: _Optional[float] = ..., buffered: _Optional[int] = ..., in_flight: _Optional[int] = ..., last_arrival_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., upstream_error_rate: _Optional[float] = ..., slo_within_rate: _Optional[float] = ..., slo_outside_rate: _Optional[float] = ...) -> None: ...

class Signals(_message.Message):
    __slots__ = ("target", "source", "observed_time", "partial", "engine", "gateway")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TIME_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    target: Target
    source: Source
    observed_time: _timestamp_pb2.Timestamp
    partial: bool
    engine: EngineSignals
    gateway: GatewaySignals
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., source: _Optional[_Union[Source, str]] = ..., observed_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., partial: _Optional[bool] = ..., engine: _Optional[_Union[EngineSignals, _Mapping]] = ..., gateway: _Optional[_Union[GatewaySignals, _Mapping]] = ...) -> None: ...

class GetSignalsRequest(_message.Message):
    __slots__ = ("selector",)
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    selector: TargetSelector
    def __init__(self, selector: _Optional[_Union[TargetSelector, _Mapping]] = ...) -> None: ...

class GetSignalsResponse(_message.Message):
    __slots__ = ("signals",)
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    signals: _containers.RepeatedCompositeFieldContainer[Signals]
    def __init__(self, signals: _Optional[_Iterable[_Union[Signals, _Mapping]]] = ...) -> None: ...

class WatchSignalsRequest(_message.Message):
    __slots__ = ("selector",)
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    selector: TargetSelector
    def __init__(self, selector: _Optional[_Union[TargetSelector, _Mapping]] = ...) -> None: ...

class WatchSignalsResponse(_message.Message):
    __slots__ = ("signals",)
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    signals: Signals
    def __init__(self, signals: _Optional[_Union[Signals, _Mapping]] = ...) -> None: ...
