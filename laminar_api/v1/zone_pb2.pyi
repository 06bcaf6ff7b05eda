from laminar_api.v1 import common_pb2 as _common_pb2
from laminar_api.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    PENDING: _ClassVar[JobState]
    QUEUED: _ClassVar[JobState]
    WAITING: _ClassVar[JobState]
    JOB_RUNNING: _ClassVar[JobState]
    JOB_SUCCEEDED: _ClassVar[JobState]
    JOB_FAILED: _ClassVar[JobState]
    JOB_CANCELLED: _ClassVar[JobState]
    FORWARDED: _ClassVar[JobState]
    JOB_SUSPENDED: _ClassVar[JobState]

class ReasonCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_NONE: _ClassVar[ReasonCode]
    REASON_PLACING: _ClassVar[ReasonCode]
    REASON_RESOURCES: _ClassVar[ReasonCode]
    REASON_NO_MATCHING_HOST: _ClassVar[ReasonCode]
    REASON_TOO_LARGE: _ClassVar[ReasonCode]
    REASON_PRIORITY: _ClassVar[ReasonCode]
    REASON_DEPENDENCY: _ClassVar[ReasonCode]
    REASON_QUOTA: _ClassVar[ReasonCode]
    REASON_ARRAY_LIMIT: _ClassVar[ReasonCode]
    REASON_WINDOW: _ClassVar[ReasonCode]
    REASON_PREVIOUS_COPY: _ClassVar[ReasonCode]
    REASON_RETRYING: _ClassVar[ReasonCode]
    REASON_SUSPENDED: _ClassVar[ReasonCode]
    REASON_SUBJOB_FAILED: _ClassVar[ReasonCode]
    REASON_REFUSED: _ClassVar[ReasonCode]
    REASON_CANCELLED: _ClassVar[ReasonCode]
    REASON_DEPENDENCY_FAILED: _ClassVar[ReasonCode]
    REASON_ARRAY: _ClassVar[ReasonCode]
    REASON_TIME_LIMIT: _ClassVar[ReasonCode]

class AgentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_STATE_UNSPECIFIED: _ClassVar[AgentState]
    AGENT_READY: _ClassVar[AgentState]
    AGENT_STALE: _ClassVar[AgentState]
    AGENT_DRAINING: _ClassVar[AgentState]
JOB_STATE_UNSPECIFIED: JobState
PENDING: JobState
QUEUED: JobState
WAITING: JobState
JOB_RUNNING: JobState
JOB_SUCCEEDED: JobState
JOB_FAILED: JobState
JOB_CANCELLED: JobState
FORWARDED: JobState
JOB_SUSPENDED: JobState
REASON_NONE: ReasonCode
REASON_PLACING: ReasonCode
REASON_RESOURCES: ReasonCode
REASON_NO_MATCHING_HOST: ReasonCode
REASON_TOO_LARGE: ReasonCode
REASON_PRIORITY: ReasonCode
REASON_DEPENDENCY: ReasonCode
REASON_QUOTA: ReasonCode
REASON_ARRAY_LIMIT: ReasonCode
REASON_WINDOW: ReasonCode
REASON_PREVIOUS_COPY: ReasonCode
REASON_RETRYING: ReasonCode
REASON_SUSPENDED: ReasonCode
REASON_SUBJOB_FAILED: ReasonCode
REASON_REFUSED: ReasonCode
REASON_CANCELLED: ReasonCode
REASON_DEPENDENCY_FAILED: ReasonCode
REASON_ARRAY: ReasonCode
REASON_TIME_LIMIT: ReasonCode
AGENT_STATE_UNSPECIFIED: AgentState
AGENT_READY: AgentState
AGENT_STALE: AgentState
AGENT_DRAINING: AgentState

class JobSpec(_message.Message):
    __slots__ = ("name", "command", "env", "workdir", "resources", "priority", "lifecycle", "tenant", "gang_size", "after", "max_retries", "value", "restartable", "atomization", "supports_release_signal", "expected_seconds", "grace_seconds", "run_through_partitions", "array", "time_limit_seconds")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GANG_SIZE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RESTARTABLE_FIELD_NUMBER: _ClassVar[int]
    ATOMIZATION_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_RELEASE_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_THROUGH_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workdir: str
    resources: _common_pb2.Resources
    priority: _common_pb2.PriorityClass
    lifecycle: _common_pb2.LifecycleClass
    tenant: str
    gang_size: int
    after: _containers.RepeatedScalarFieldContainer[str]
    max_retries: int
    value: float
    restartable: bool
    atomization: _common_pb2.AtomizationContract
    supports_release_signal: bool
    expected_seconds: float
    grace_seconds: float
    run_through_partitions: bool
    array: str
    time_limit_seconds: float
    def __init__(self, name: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., priority: _Optional[_Union[_common_pb2.PriorityClass, str]] = ..., lifecycle: _Optional[_Union[_common_pb2.LifecycleClass, str]] = ..., tenant: _Optional[str] = ..., gang_size: _Optional[int] = ..., after: _Optional[_Iterable[str]] = ..., max_retries: _Optional[int] = ..., value: _Optional[float] = ..., restartable: _Optional[bool] = ..., atomization: _Optional[_Union[_common_pb2.AtomizationContract, _Mapping]] = ..., supports_release_signal: _Optional[bool] = ..., expected_seconds: _Optional[float] = ..., grace_seconds: _Optional[float] = ..., run_through_partitions: _Optional[bool] = ..., array: _Optional[str] = ..., time_limit_seconds: _Optional[float] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("subjob_id", "agent_id", "agent_address", "slice_ids", "member", "state", "reason", "exit_code", "started_unix", "ended_unix", "unit_start", "unit_count", "attempt", "peak_gpu_memory_bytes", "run_seconds", "units_done", "window_end_unix", "resources", "end_cause", "suspended_seconds")
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLICE_IDS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    UNIT_START_FIELD_NUMBER: _ClassVar[int]
    UNIT_COUNT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_UNIX_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    subjob_id: str
    agent_id: str
    agent_address: str
    slice_ids: _containers.RepeatedScalarFieldContainer[str]
    member: int
    state: _common_pb2.SubjobState
    reason: str
    exit_code: int
    started_unix: float
    ended_unix: float
    unit_start: int
    unit_count: int
    attempt: int
    peak_gpu_memory_bytes: int
    run_seconds: float
    units_done: int
    window_end_unix: float
    resources: _common_pb2.Resources
    end_cause: _common_pb2.EndCause
    suspended_seconds: float
    def __init__(self, subjob_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., agent_address: _Optional[str] = ..., slice_ids: _Optional[_Iterable[str]] = ..., member: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.SubjobState, str]] = ..., reason: _Optional[str] = ..., exit_code: _Optional[int] = ..., started_unix: _Optional[float] = ..., ended_unix: _Optional[float] = ..., unit_start: _Optional[int] = ..., unit_count: _Optional[int] = ..., attempt: _Optional[int] = ..., peak_gpu_memory_bytes: _Optional[int] = ..., run_seconds: _Optional[float] = ..., units_done: _Optional[int] = ..., window_end_unix: _Optional[float] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., end_cause: _Optional[_Union[_common_pb2.EndCause, str]] = ..., suspended_seconds: _Optional[float] = ...) -> None: ...

class AtomizationProgress(_message.Message):
    __slots__ = ("units_done", "units_total", "seconds_per_unit", "peak_memory_bytes", "violation_rate", "subjobs", "last_losing_score")
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    UNITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_RATE_FIELD_NUMBER: _ClassVar[int]
    SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSING_SCORE_FIELD_NUMBER: _ClassVar[int]
    units_done: int
    units_total: int
    seconds_per_unit: _containers.RepeatedCompositeFieldContainer[_common_pb2.Quantile]
    peak_memory_bytes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Quantile]
    violation_rate: float
    subjobs: int
    last_losing_score: float
    def __init__(self, units_done: _Optional[int] = ..., units_total: _Optional[int] = ..., seconds_per_unit: _Optional[_Iterable[_Union[_common_pb2.Quantile, _Mapping]]] = ..., peak_memory_bytes: _Optional[_Iterable[_Union[_common_pb2.Quantile, _Mapping]]] = ..., violation_rate: _Optional[float] = ..., subjobs: _Optional[int] = ..., last_losing_score: _Optional[float] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "state", "reason", "submitted_unix", "started_unix", "ended_unix", "placements", "attempts", "retries_used", "queue_position", "expected_start_unix", "zone", "forwarded_to", "atomization", "client_request_id", "probes", "bounces", "array_id", "array_index", "array", "reason_code")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_START_UNIX_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_TO_FIELD_NUMBER: _ClassVar[int]
    ATOMIZATION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    BOUNCES_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    state: JobState
    reason: str
    submitted_unix: float
    started_unix: float
    ended_unix: float
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    attempts: int
    retries_used: int
    queue_position: int
    expected_start_unix: float
    zone: str
    forwarded_to: str
    atomization: AtomizationProgress
    client_request_id: str
    probes: int
    bounces: int
    array_id: str
    array_index: int
    array: ArrayStatus
    reason_code: ReasonCode
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., submitted_unix: _Optional[float] = ..., started_unix: _Optional[float] = ..., ended_unix: _Optional[float] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., attempts: _Optional[int] = ..., retries_used: _Optional[int] = ..., queue_position: _Optional[int] = ..., expected_start_unix: _Optional[float] = ..., zone: _Optional[str] = ..., forwarded_to: _Optional[str] = ..., atomization: _Optional[_Union[AtomizationProgress, _Mapping]] = ..., client_request_id: _Optional[str] = ..., probes: _Optional[int] = ..., bounces: _Optional[int] = ..., array_id: _Optional[str] = ..., array_index: _Optional[int] = ..., array: _Optional[_Union[ArrayStatus, _Mapping]] = ..., reason_code: _Optional[_Union[ReasonCode, str]] = ...) -> None: ...

class ArrayStatus(_message.Message):
    __slots__ = ("total", "limit", "under_way", "held", "succeeded", "failed", "cancelled")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    UNDER_WAY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    total: int
    limit: int
    under_way: int
    held: int
    succeeded: int
    failed: int
    cancelled: int
    def __init__(self, total: _Optional[int] = ..., limit: _Optional[int] = ..., under_way: _Optional[int] = ..., held: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[SubmitRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[SubmitRequest, _Mapping]]] = ...) -> None: ...

class SubmitBatchReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job", "at_unix")
    JOB_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    job: Job
    at_unix: float
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., at_unix: _Optional[float] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec", "client_request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    client_request_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("tenant", "states", "limit", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    states: _containers.RepeatedScalarFieldContainer[JobState]
    limit: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., states: _Optional[_Iterable[_Union[JobState, str]]] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetLogsRequest(_message.Message):
    __slots__ = ("job_id", "subjob_id", "stream", "offset", "max_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    subjob_id: str
    stream: str
    offset: int
    max_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., subjob_id: _Optional[str] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetLogsReply(_message.Message):
    __slots__ = ("data", "next_offset", "eof", "subjob_id")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    next_offset: int
    eof: bool
    subjob_id: str
    def __init__(self, data: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., eof: _Optional[bool] = ..., subjob_id: _Optional[str] = ...) -> None: ...

class HostScore(_message.Message):
    __slots__ = ("agent_id", "address", "fits", "score", "reason", "lease")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    address: str
    fits: bool
    score: float
    reason: str
    lease: _agent_pb2.Lease
    def __init__(self, agent_id: _Optional[str] = ..., address: _Optional[str] = ..., fits: _Optional[bool] = ..., score: _Optional[float] = ..., reason: _Optional[str] = ..., lease: _Optional[_Union[_agent_pb2.Lease, _Mapping]] = ...) -> None: ...

class ProbeJobRequest(_message.Message):
    __slots__ = ("spec", "keep_leases", "max_hosts", "lease_ttl_seconds")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    KEEP_LEASES_FIELD_NUMBER: _ClassVar[int]
    MAX_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    keep_leases: bool
    max_hosts: int
    lease_ttl_seconds: float
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., keep_leases: _Optional[bool] = ..., max_hosts: _Optional[int] = ..., lease_ttl_seconds: _Optional[float] = ...) -> None: ...

class ProbeJobReply(_message.Message):
    __slots__ = ("hosts", "hosts_matching", "hosts_total")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_MATCHING_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostScore]
    hosts_matching: int
    hosts_total: int
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostScore, _Mapping]]] = ..., hosts_matching: _Optional[int] = ..., hosts_total: _Optional[int] = ...) -> None: ...

class ProbeJobsRequest(_message.Message):
    __slots__ = ("call_id", "probe")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    probe: ProbeJobRequest
    def __init__(self, call_id: _Optional[int] = ..., probe: _Optional[_Union[ProbeJobRequest, _Mapping]] = ...) -> None: ...

class ProbeJobsReply(_message.Message):
    __slots__ = ("call_id", "reply", "error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    reply: ProbeJobReply
    error: _agent_pb2.ProbeError
    def __init__(self, call_id: _Optional[int] = ..., reply: _Optional[_Union[ProbeJobReply, _Mapping]] = ..., error: _Optional[_Union[_agent_pb2.ProbeError, _Mapping]] = ...) -> None: ...

class CommitJobRequest(_message.Message):
    __slots__ = ("spec", "leases", "client_request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    leases: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Lease]
    client_request_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[_agent_pb2.Lease, _Mapping]]] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("agent_id", "address", "state", "summary", "last_heartbeat_unix", "hostname")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_UNIX_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    address: str
    state: AgentState
    summary: _common_pb2.AgentSummary
    last_heartbeat_unix: float
    hostname: str
    def __init__(self, agent_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[AgentState, str]] = ..., summary: _Optional[_Union[_common_pb2.AgentSummary, _Mapping]] = ..., last_heartbeat_unix: _Optional[float] = ..., hostname: _Optional[str] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsReply(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentInfo]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentInfo, _Mapping]]] = ...) -> None: ...

class DrainAgentRequest(_message.Message):
    __slots__ = ("agent", "reason")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    agent: str
    reason: str
    def __init__(self, agent: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class GetAgentAirlockRequest(_message.Message):
    __slots__ = ("agent", "max_actions")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    max_actions: int
    def __init__(self, agent: _Optional[str] = ..., max_actions: _Optional[int] = ...) -> None: ...

class InjectPressureRequest(_message.Message):
    __slots__ = ("agent", "load")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    agent: str
    load: _agent_pb2.InjectLoadRequest
    def __init__(self, agent: _Optional[str] = ..., load: _Optional[_Union[_agent_pb2.InjectLoadRequest, _Mapping]] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("tenant", "slice_kind", "gpu_seconds", "gpu_memory_byte_seconds", "lost_gpu_seconds", "subjobs")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLICE_KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOST_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    slice_kind: str
    gpu_seconds: float
    gpu_memory_byte_seconds: float
    lost_gpu_seconds: float
    subjobs: int
    def __init__(self, tenant: _Optional[str] = ..., slice_kind: _Optional[str] = ..., gpu_seconds: _Optional[float] = ..., gpu_memory_byte_seconds: _Optional[float] = ..., lost_gpu_seconds: _Optional[float] = ..., subjobs: _Optional[int] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("tenant", "since_unix")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    since_unix: float
    def __init__(self, tenant: _Optional[str] = ..., since_unix: _Optional[float] = ...) -> None: ...

class GetUsageReply(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[UsageRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[UsageRecord, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("summary", "events", "airlock_actions", "readdress_subjob_ids", "live_subjob_ids", "has_live_subjob_ids", "summary_version", "agent_id", "workload_version")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    AIRLOCK_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    READDRESS_SUBJOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SUBJOB_IDS_FIELD_NUMBER: _ClassVar[int]
    HAS_LIVE_SUBJOB_IDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_VERSION_FIELD_NUMBER: _ClassVar[int]
    summary: _common_pb2.AgentSummary
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.SubjobEvent]
    airlock_actions: _containers.RepeatedCompositeFieldContainer[_agent_pb2.AirlockAction]
    readdress_subjob_ids: _containers.RepeatedScalarFieldContainer[str]
    live_subjob_ids: _containers.RepeatedScalarFieldContainer[str]
    has_live_subjob_ids: bool
    summary_version: int
    agent_id: str
    workload_version: int
    def __init__(self, summary: _Optional[_Union[_common_pb2.AgentSummary, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_common_pb2.SubjobEvent, _Mapping]]] = ..., airlock_actions: _Optional[_Iterable[_Union[_agent_pb2.AirlockAction, _Mapping]]] = ..., readdress_subjob_ids: _Optional[_Iterable[str]] = ..., live_subjob_ids: _Optional[_Iterable[str]] = ..., has_live_subjob_ids: _Optional[bool] = ..., summary_version: _Optional[int] = ..., agent_id: _Optional[str] = ..., workload_version: _Optional[int] = ...) -> None: ...

class WorkloadShape(_message.Message):
    __slots__ = ("cpu_milli", "num_gpu", "gpu_milli", "gpu_models", "count")
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    NUM_GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_models: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, cpu_milli: _Optional[int] = ..., num_gpu: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., gpu_models: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("acked_seq", "period_seconds", "zone", "acked_action_seq", "fence_lease_seconds", "want_live_subjobs", "summary_version", "workload_version", "workload", "liveness_seconds")
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ACKED_ACTION_SEQ_FIELD_NUMBER: _ClassVar[int]
    FENCE_LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WANT_LIVE_SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    period_seconds: float
    zone: str
    acked_action_seq: int
    fence_lease_seconds: float
    want_live_subjobs: bool
    summary_version: int
    workload_version: int
    workload: _containers.RepeatedCompositeFieldContainer[WorkloadShape]
    liveness_seconds: float
    def __init__(self, acked_seq: _Optional[int] = ..., period_seconds: _Optional[float] = ..., zone: _Optional[str] = ..., acked_action_seq: _Optional[int] = ..., fence_lease_seconds: _Optional[float] = ..., want_live_subjobs: _Optional[bool] = ..., summary_version: _Optional[int] = ..., workload_version: _Optional[int] = ..., workload: _Optional[_Iterable[_Union[WorkloadShape, _Mapping]]] = ..., liveness_seconds: _Optional[float] = ...) -> None: ...

class ZoneSummary(_message.Message):
    __slots__ = ("zone", "address", "shapes", "heat", "agents", "queued_jobs", "generated_unix", "workload")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    HEAT_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    zone: str
    address: str
    shapes: _containers.RepeatedCompositeFieldContainer[_common_pb2.ShapeCapacity]
    heat: int
    agents: int
    queued_jobs: int
    generated_unix: float
    workload: _containers.RepeatedCompositeFieldContainer[WorkloadShape]
    def __init__(self, zone: _Optional[str] = ..., address: _Optional[str] = ..., shapes: _Optional[_Iterable[_Union[_common_pb2.ShapeCapacity, _Mapping]]] = ..., heat: _Optional[int] = ..., agents: _Optional[int] = ..., queued_jobs: _Optional[int] = ..., generated_unix: _Optional[float] = ..., workload: _Optional[_Iterable[_Union[WorkloadShape, _Mapping]]] = ...) -> None: ...

class ForwardJobRequest(_message.Message):
    __slots__ = ("spec", "client_request_id", "from_zone", "origin_job_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ZONE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    client_request_id: str
    from_zone: str
    origin_job_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., client_request_id: _Optional[str] = ..., from_zone: _Optional[str] = ..., origin_job_id: _Optional[str] = ...) -> None: ...

class BidWindow(_message.Message):
    __slots__ = ("round", "window")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    round: int
    window: _common_pb2.Window
    def __init__(self, round: _Optional[int] = ..., window: _Optional[_Union[_common_pb2.Window, _Mapping]] = ...) -> None: ...

class SubjobBid(_message.Message):
    __slots__ = ("slice_id", "agent_id", "unit_start", "unit_count", "score", "feasibility", "memory_bytes", "seconds")
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_START_FIELD_NUMBER: _ClassVar[int]
    UNIT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FEASIBILITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    slice_id: str
    agent_id: str
    unit_start: int
    unit_count: int
    score: float
    feasibility: float
    memory_bytes: int
    seconds: float
    def __init__(self, slice_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., unit_start: _Optional[int] = ..., unit_count: _Optional[int] = ..., score: _Optional[float] = ..., feasibility: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class BidMessage(_message.Message):
    __slots__ = ("job_id", "round", "bids")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BIDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    bids: _containers.RepeatedCompositeFieldContainer[SubjobBid]
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., bids: _Optional[_Iterable[_Union[SubjobBid, _Mapping]]] = ...) -> None: ...

class AnnounceMessage(_message.Message):
    __slots__ = ("round", "windows", "won", "winning_score", "winning_bid", "done", "refused")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    WON_FIELD_NUMBER: _ClassVar[int]
    WINNING_SCORE_FIELD_NUMBER: _ClassVar[int]
    WINNING_BID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    round: int
    windows: _containers.RepeatedCompositeFieldContainer[_common_pb2.Window]
    won: bool
    winning_score: float
    winning_bid: SubjobBid
    done: bool
    refused: _containers.RepeatedCompositeFieldContainer[RefusedBid]
    def __init__(self, round: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[_common_pb2.Window, _Mapping]]] = ..., won: _Optional[bool] = ..., winning_score: _Optional[float] = ..., winning_bid: _Optional[_Union[SubjobBid, _Mapping]] = ..., done: _Optional[bool] = ..., refused: _Optional[_Iterable[_Union[RefusedBid, _Mapping]]] = ...) -> None: ...

class RefusedBid(_message.Message):
    __slots__ = ("field", "reason")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    field: str
    reason: str
    def __init__(self, field: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
