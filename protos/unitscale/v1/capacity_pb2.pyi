import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetInferenceDemandRequest(_message.Message):
    __slots__ = ("pool", "horizon")
    POOL_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    pool: str
    horizon: _duration_pb2.Duration
    def __init__(self, pool: _Optional[str] = ..., horizon: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GetInferenceDemandResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolDemand]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolDemand, _Mapping]]] = ...) -> None: ...

class PoolDemand(_message.Message):
    __slots__ = ("pool", "accelerators_held", "accelerators_needed", "unknown_reason", "decided_time", "deployments")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_HELD_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_TIME_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    accelerators_held: float
    accelerators_needed: float
    unknown_reason: str
    decided_time: _timestamp_pb2.Timestamp
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentDemand]
    def __init__(self, pool: _Optional[str] = ..., accelerators_held: _Optional[float] = ..., accelerators_needed: _Optional[float] = ..., unknown_reason: _Optional[str] = ..., decided_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deployments: _Optional[_Iterable[_Union[DeploymentDemand, _Mapping]]] = ...) -> None: ...

class DeploymentDemand(_message.Message):
    __slots__ = ("namespace", "name", "deployment", "replicas_now", "replicas_forecast", "accelerators_per_replica", "reason", "decided_time", "forecast_horizon")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_NOW_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FORECAST_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_TIME_FIELD_NUMBER: _ClassVar[int]
    FORECAST_HORIZON_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    deployment: str
    replicas_now: int
    replicas_forecast: int
    accelerators_per_replica: float
    reason: str
    decided_time: _timestamp_pb2.Timestamp
    forecast_horizon: _duration_pb2.Duration
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., deployment: _Optional[str] = ..., replicas_now: _Optional[int] = ..., replicas_forecast: _Optional[int] = ..., accelerators_per_replica: _Optional[float] = ..., reason: _Optional[str] = ..., decided_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., forecast_horizon: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GetStandbyPlanRequest(_message.Message):
    __slots__ = ("namespace", "deployment")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    deployment: str
    def __init__(self, namespace: _Optional[str] = ..., deployment: _Optional[str] = ...) -> None: ...

class GetStandbyPlanResponse(_message.Message):
    __slots__ = ("plans",)
    PLANS_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[StandbyPlan]
    def __init__(self, plans: _Optional[_Iterable[_Union[StandbyPlan, _Mapping]]] = ...) -> None: ...

class StandbyPlan(_message.Message):
    __slots__ = ("namespace", "name", "model", "running", "sleeping", "reason", "decided_time")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    model: str
    running: int
    sleeping: int
    reason: str
    decided_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., model: _Optional[str] = ..., running: _Optional[int] = ..., sleeping: _Optional[int] = ..., reason: _Optional[str] = ..., decided_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
