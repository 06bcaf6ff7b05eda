from laminar_api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubjobSignal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBJOB_SIGNAL_UNSPECIFIED: _ClassVar[SubjobSignal]
    SUSPEND: _ClassVar[SubjobSignal]
    RESUME: _ClassVar[SubjobSignal]
    TERMINATE: _ClassVar[SubjobSignal]
    RELEASE_MEMORY: _ClassVar[SubjobSignal]
SUBJOB_SIGNAL_UNSPECIFIED: SubjobSignal
SUSPEND: SubjobSignal
RESUME: SubjobSignal
TERMINATE: SubjobSignal
RELEASE_MEMORY: SubjobSignal

class ProbeRequest(_message.Message):
    __slots__ = ("probe_id", "job_id", "member", "resources", "priority", "value", "lease_ttl_seconds", "commit_if_fits", "spec", "dry_run", "allow_preemption", "slice_id", "tenant")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_IF_FITS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    job_id: str
    member: int
    resources: _common_pb2.Resources
    priority: _common_pb2.PriorityClass
    value: float
    lease_ttl_seconds: float
    commit_if_fits: bool
    spec: _common_pb2.SubjobSpec
    dry_run: bool
    allow_preemption: bool
    slice_id: str
    tenant: str
    def __init__(self, probe_id: _Optional[str] = ..., job_id: _Optional[str] = ..., member: _Optional[int] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., priority: _Optional[_Union[_common_pb2.PriorityClass, str]] = ..., value: _Optional[float] = ..., lease_ttl_seconds: _Optional[float] = ..., commit_if_fits: _Optional[bool] = ..., spec: _Optional[_Union[_common_pb2.SubjobSpec, _Mapping]] = ..., dry_run: _Optional[bool] = ..., allow_preemption: _Optional[bool] = ..., slice_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "agent_id", "slice_ids", "score", "expires_unix", "job_id", "member", "device_uuids")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SLICE_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUIDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    agent_id: str
    slice_ids: _containers.RepeatedScalarFieldContainer[str]
    score: float
    expires_unix: float
    job_id: str
    member: int
    device_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., slice_ids: _Optional[_Iterable[str]] = ..., score: _Optional[float] = ..., expires_unix: _Optional[float] = ..., job_id: _Optional[str] = ..., member: _Optional[int] = ..., device_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class Bounce(_message.Message):
    __slots__ = ("reason", "retryable")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    retryable: bool
    def __init__(self, reason: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("lease", "bounce", "summary", "subjob", "would_fit", "score", "preempted_subjob_ids", "error")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    BOUNCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_FIELD_NUMBER: _ClassVar[int]
    WOULD_FIT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_SUBJOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    bounce: Bounce
    summary: _common_pb2.AgentSummary
    subjob: _common_pb2.Subjob
    would_fit: bool
    score: float
    preempted_subjob_ids: _containers.RepeatedScalarFieldContainer[str]
    error: ProbeError
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., bounce: _Optional[_Union[Bounce, _Mapping]] = ..., summary: _Optional[_Union[_common_pb2.AgentSummary, _Mapping]] = ..., subjob: _Optional[_Union[_common_pb2.Subjob, _Mapping]] = ..., would_fit: _Optional[bool] = ..., score: _Optional[float] = ..., preempted_subjob_ids: _Optional[_Iterable[str]] = ..., error: _Optional[_Union[ProbeError, _Mapping]] = ...) -> None: ...

class ProbeError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ProbeBatchRequest(_message.Message):
    __slots__ = ("probes",)
    PROBES_FIELD_NUMBER: _ClassVar[int]
    probes: _containers.RepeatedCompositeFieldContainer[ProbeRequest]
    def __init__(self, probes: _Optional[_Iterable[_Union[ProbeRequest, _Mapping]]] = ...) -> None: ...

class ProbeBatchReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[ProbeReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[ProbeReply, _Mapping]]] = ...) -> None: ...

class AgentCall(_message.Message):
    __slots__ = ("call_id", "probes", "release")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    probes: ProbeBatchRequest
    release: ReleaseRequest
    def __init__(self, call_id: _Optional[int] = ..., probes: _Optional[_Union[ProbeBatchRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ...) -> None: ...

class AgentCallReply(_message.Message):
    __slots__ = ("call_id", "probes", "release", "error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    probes: ProbeBatchReply
    release: ReleaseReply
    error: ProbeError
    def __init__(self, call_id: _Optional[int] = ..., probes: _Optional[_Union[ProbeBatchReply, _Mapping]] = ..., release: _Optional[_Union[ReleaseReply, _Mapping]] = ..., error: _Optional[_Union[ProbeError, _Mapping]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("lease_id", "spec")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    spec: _common_pb2.SubjobSpec
    def __init__(self, lease_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.SubjobSpec, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("released", "summary")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    released: int
    summary: _common_pb2.AgentSummary
    def __init__(self, released: _Optional[int] = ..., summary: _Optional[_Union[_common_pb2.AgentSummary, _Mapping]] = ...) -> None: ...

class MigInstance(_message.Message):
    __slots__ = ("uuid", "profile", "memory_total_bytes", "memory_used_bytes", "start", "size")
    UUID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    profile: str
    memory_total_bytes: int
    memory_used_bytes: int
    start: int
    size: int
    def __init__(self, uuid: _Optional[str] = ..., profile: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., start: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_total_bytes", "memory_used_bytes", "mig_enabled", "mig_instances", "shared")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MIG_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_used_bytes: int
    mig_enabled: bool
    mig_instances: _containers.RepeatedCompositeFieldContainer[MigInstance]
    shared: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., mig_enabled: _Optional[bool] = ..., mig_instances: _Optional[_Iterable[_Union[MigInstance, _Mapping]]] = ..., shared: _Optional[bool] = ...) -> None: ...

class SliceStatus(_message.Message):
    __slots__ = ("slice_id", "kind", "gpu_index", "device_uuid", "mig_profile", "gpu_model", "memory_total_bytes", "memory_used_bytes", "capacity_milli", "committed_milli", "leased_milli", "committed_memory_bytes", "leased_memory_bytes", "pressure", "subjob_ids")
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_MILLI_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MILLI_FIELD_NUMBER: _ClassVar[int]
    LEASED_MILLI_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_IDS_FIELD_NUMBER: _ClassVar[int]
    slice_id: str
    kind: _common_pb2.SliceKind
    gpu_index: int
    device_uuid: str
    mig_profile: str
    gpu_model: str
    memory_total_bytes: int
    memory_used_bytes: int
    capacity_milli: int
    committed_milli: int
    leased_milli: int
    committed_memory_bytes: int
    leased_memory_bytes: int
    pressure: _common_pb2.PressureLevel
    subjob_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, slice_id: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.SliceKind, str]] = ..., gpu_index: _Optional[int] = ..., device_uuid: _Optional[str] = ..., mig_profile: _Optional[str] = ..., gpu_model: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., capacity_milli: _Optional[int] = ..., committed_milli: _Optional[int] = ..., leased_milli: _Optional[int] = ..., committed_memory_bytes: _Optional[int] = ..., leased_memory_bytes: _Optional[int] = ..., pressure: _Optional[_Union[_common_pb2.PressureLevel, str]] = ..., subjob_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("agent_id", "hostname", "backend", "gpus", "slices", "host_memory_total_bytes", "host_memory_available_bytes", "driver_version", "draining", "version", "degraded_gpus", "cuda_checkpoint_available", "cuda_checkpoint_detail")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_GPUS_FIELD_NUMBER: _ClassVar[int]
    CUDA_CHECKPOINT_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CUDA_CHECKPOINT_DETAIL_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    hostname: str
    backend: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    slices: _containers.RepeatedCompositeFieldContainer[SliceStatus]
    host_memory_total_bytes: int
    host_memory_available_bytes: int
    driver_version: str
    draining: bool
    version: str
    degraded_gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.DegradedGpu]
    cuda_checkpoint_available: bool
    cuda_checkpoint_detail: str
    def __init__(self, agent_id: _Optional[str] = ..., hostname: _Optional[str] = ..., backend: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., slices: _Optional[_Iterable[_Union[SliceStatus, _Mapping]]] = ..., host_memory_total_bytes: _Optional[int] = ..., host_memory_available_bytes: _Optional[int] = ..., driver_version: _Optional[str] = ..., draining: _Optional[bool] = ..., version: _Optional[str] = ..., degraded_gpus: _Optional[_Iterable[_Union[_common_pb2.DegradedGpu, _Mapping]]] = ..., cuda_checkpoint_available: _Optional[bool] = ..., cuda_checkpoint_detail: _Optional[str] = ...) -> None: ...

class GetInventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSummaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubjobsRequest(_message.Message):
    __slots__ = ("job_id", "states", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.SubjobState]
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.SubjobState, str]]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListSubjobsReply(_message.Message):
    __slots__ = ("subjobs",)
    SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    subjobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Subjob]
    def __init__(self, subjobs: _Optional[_Iterable[_Union[_common_pb2.Subjob, _Mapping]]] = ...) -> None: ...

class GetSubjobRequest(_message.Message):
    __slots__ = ("subjob_id",)
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    subjob_id: str
    def __init__(self, subjob_id: _Optional[str] = ...) -> None: ...

class WatchSubjobsRequest(_message.Message):
    __slots__ = ("after_seq", "job_id")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    job_id: str
    def __init__(self, after_seq: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class SignalSubjobRequest(_message.Message):
    __slots__ = ("subjob_id", "signal", "reason", "grace_seconds", "end_cause")
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    subjob_id: str
    signal: SubjobSignal
    reason: str
    grace_seconds: float
    end_cause: _common_pb2.EndCause
    def __init__(self, subjob_id: _Optional[str] = ..., signal: _Optional[_Union[SubjobSignal, str]] = ..., reason: _Optional[str] = ..., grace_seconds: _Optional[float] = ..., end_cause: _Optional[_Union[_common_pb2.EndCause, str]] = ...) -> None: ...

class ReadLogsRequest(_message.Message):
    __slots__ = ("subjob_id", "stream", "offset", "max_bytes")
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    subjob_id: str
    stream: str
    offset: int
    max_bytes: int
    def __init__(self, subjob_id: _Optional[str] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadLogsReply(_message.Message):
    __slots__ = ("data", "next_offset", "eof")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    next_offset: int
    eof: bool
    def __init__(self, data: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., eof: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("draining", "running_subjobs")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    running_subjobs: int
    def __init__(self, draining: _Optional[bool] = ..., running_subjobs: _Optional[int] = ...) -> None: ...

class AirlockAction(_message.Message):
    __slots__ = ("seq", "at_unix", "step", "subjob_id", "slice_id", "reason", "bytes_freed", "dry_run", "job_id", "end_cause")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at_unix: float
    step: str
    subjob_id: str
    slice_id: str
    reason: str
    bytes_freed: int
    dry_run: bool
    job_id: str
    end_cause: _common_pb2.EndCause
    def __init__(self, seq: _Optional[int] = ..., at_unix: _Optional[float] = ..., step: _Optional[str] = ..., subjob_id: _Optional[str] = ..., slice_id: _Optional[str] = ..., reason: _Optional[str] = ..., bytes_freed: _Optional[int] = ..., dry_run: _Optional[bool] = ..., job_id: _Optional[str] = ..., end_cause: _Optional[_Union[_common_pb2.EndCause, str]] = ...) -> None: ...

class SliceLevel(_message.Message):
    __slots__ = ("slice_id", "level", "used_bytes", "total_bytes")
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    slice_id: str
    level: _common_pb2.PressureLevel
    used_bytes: int
    total_bytes: int
    def __init__(self, slice_id: _Optional[str] = ..., level: _Optional[_Union[_common_pb2.PressureLevel, str]] = ..., used_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class AirlockState(_message.Message):
    __slots__ = ("host_level", "slices", "suspended", "recent_actions", "dry_run", "host_memory_used_bytes", "host_memory_total_bytes")
    HOST_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    RECENT_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    host_level: _common_pb2.PressureLevel
    slices: _containers.RepeatedCompositeFieldContainer[SliceLevel]
    suspended: _containers.RepeatedCompositeFieldContainer[_common_pb2.Subjob]
    recent_actions: _containers.RepeatedCompositeFieldContainer[AirlockAction]
    dry_run: bool
    host_memory_used_bytes: int
    host_memory_total_bytes: int
    def __init__(self, host_level: _Optional[_Union[_common_pb2.PressureLevel, str]] = ..., slices: _Optional[_Iterable[_Union[SliceLevel, _Mapping]]] = ..., suspended: _Optional[_Iterable[_Union[_common_pb2.Subjob, _Mapping]]] = ..., recent_actions: _Optional[_Iterable[_Union[AirlockAction, _Mapping]]] = ..., dry_run: _Optional[bool] = ..., host_memory_used_bytes: _Optional[int] = ..., host_memory_total_bytes: _Optional[int] = ...) -> None: ...

class GetAirlockRequest(_message.Message):
    __slots__ = ("max_actions",)
    MAX_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    max_actions: int
    def __init__(self, max_actions: _Optional[int] = ...) -> None: ...

class InjectLoadRequest(_message.Message):
    __slots__ = ("gpu_index", "slice_id", "used_bytes", "add", "duration_seconds")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    slice_id: str
    used_bytes: int
    add: bool
    duration_seconds: float
    def __init__(self, gpu_index: _Optional[int] = ..., slice_id: _Optional[str] = ..., used_bytes: _Optional[int] = ..., add: _Optional[bool] = ..., duration_seconds: _Optional[float] = ...) -> None: ...

class InjectLoadReply(_message.Message):
    __slots__ = ("injected_bytes",)
    INJECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    injected_bytes: int
    def __init__(self, injected_bytes: _Optional[int] = ...) -> None: ...
