from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PriorityClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_CLASS_UNSPECIFIED: _ClassVar[PriorityClass]
    CRITICAL: _ClassVar[PriorityClass]
    PRODUCTION: _ClassVar[PriorityClass]
    BATCH: _ClassVar[PriorityClass]
    OPPORTUNISTIC: _ClassVar[PriorityClass]

class LifecycleClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIFECYCLE_CLASS_UNSPECIFIED: _ClassVar[LifecycleClass]
    RESIDENT: _ClassVar[LifecycleClass]
    LONG: _ClassVar[LifecycleClass]
    TRANSIENT: _ClassVar[LifecycleClass]

class SliceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SLICE_KIND_UNSPECIFIED: _ClassVar[SliceKind]
    WHOLE_GPU: _ClassVar[SliceKind]
    MIG: _ClassVar[SliceKind]
    SHARED_GPU: _ClassVar[SliceKind]

class PressureLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRESSURE_LEVEL_UNSPECIFIED: _ClassVar[PressureLevel]
    NORMAL: _ClassVar[PressureLevel]
    ELEVATED: _ClassVar[PressureLevel]
    CRITICAL_PRESSURE: _ClassVar[PressureLevel]

class SubjobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBJOB_STATE_UNSPECIFIED: _ClassVar[SubjobState]
    STARTING: _ClassVar[SubjobState]
    RUNNING: _ClassVar[SubjobState]
    SUSPENDED: _ClassVar[SubjobState]
    SUCCEEDED: _ClassVar[SubjobState]
    FAILED: _ClassVar[SubjobState]
    KILLED: _ClassVar[SubjobState]
    LOST: _ClassVar[SubjobState]

class EndCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_CAUSE_UNSPECIFIED: _ClassVar[EndCause]
    END_CAUSE_EXITED: _ClassVar[EndCause]
    END_CAUSE_LAUNCH_FAILED: _ClassVar[EndCause]
    END_CAUSE_CANCELLED: _ClassVar[EndCause]
    END_CAUSE_PREEMPTED: _ClassVar[EndCause]
    END_CAUSE_RECLAIMED: _ClassVar[EndCause]
    END_CAUSE_READDRESSED: _ClassVar[EndCause]
    END_CAUSE_SUPERSEDED: _ClassVar[EndCause]
    END_CAUSE_GANG_STOPPED: _ClassVar[EndCause]
    END_CAUSE_COMMIT_FAILED: _ClassVar[EndCause]
    END_CAUSE_COMMIT_UNCONFIRMED: _ClassVar[EndCause]
    END_CAUSE_OVERRAN: _ClassVar[EndCause]
    END_CAUSE_FENCED: _ClassVar[EndCause]
    END_CAUSE_LOST: _ClassVar[EndCause]
    END_CAUSE_TERMINATED: _ClassVar[EndCause]
    END_CAUSE_GPU_FAILED: _ClassVar[EndCause]
    END_CAUSE_TIME_LIMIT: _ClassVar[EndCause]
PRIORITY_CLASS_UNSPECIFIED: PriorityClass
CRITICAL: PriorityClass
PRODUCTION: PriorityClass
BATCH: PriorityClass
OPPORTUNISTIC: PriorityClass
LIFECYCLE_CLASS_UNSPECIFIED: LifecycleClass
RESIDENT: LifecycleClass
LONG: LifecycleClass
TRANSIENT: LifecycleClass
SLICE_KIND_UNSPECIFIED: SliceKind
WHOLE_GPU: SliceKind
MIG: SliceKind
SHARED_GPU: SliceKind
PRESSURE_LEVEL_UNSPECIFIED: PressureLevel
NORMAL: PressureLevel
ELEVATED: PressureLevel
CRITICAL_PRESSURE: PressureLevel
SUBJOB_STATE_UNSPECIFIED: SubjobState
STARTING: SubjobState
RUNNING: SubjobState
SUSPENDED: SubjobState
SUCCEEDED: SubjobState
FAILED: SubjobState
KILLED: SubjobState
LOST: SubjobState
END_CAUSE_UNSPECIFIED: EndCause
END_CAUSE_EXITED: EndCause
END_CAUSE_LAUNCH_FAILED: EndCause
END_CAUSE_CANCELLED: EndCause
END_CAUSE_PREEMPTED: EndCause
END_CAUSE_RECLAIMED: EndCause
END_CAUSE_READDRESSED: EndCause
END_CAUSE_SUPERSEDED: EndCause
END_CAUSE_GANG_STOPPED: EndCause
END_CAUSE_COMMIT_FAILED: EndCause
END_CAUSE_COMMIT_UNCONFIRMED: EndCause
END_CAUSE_OVERRAN: EndCause
END_CAUSE_FENCED: EndCause
END_CAUSE_LOST: EndCause
END_CAUSE_TERMINATED: EndCause
END_CAUSE_GPU_FAILED: EndCause
END_CAUSE_TIME_LIMIT: EndCause

class Resources(_message.Message):
    __slots__ = ("gpus", "mig_profile", "gpu_milli", "gpu_memory_bytes", "gpu_model", "cpu_milli", "host_memory_bytes")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    mig_profile: str
    gpu_milli: int
    gpu_memory_bytes: int
    gpu_model: str
    cpu_milli: int
    host_memory_bytes: int
    def __init__(self, gpus: _Optional[int] = ..., mig_profile: _Optional[str] = ..., gpu_milli: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., gpu_model: _Optional[str] = ..., cpu_milli: _Optional[int] = ..., host_memory_bytes: _Optional[int] = ...) -> None: ...

class Quantile(_message.Message):
    __slots__ = ("q", "value")
    Q_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    q: float
    value: float
    def __init__(self, q: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class ResourcePhase(_message.Message):
    __slots__ = ("name", "units", "seconds_per_unit", "peak_memory_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    units: int
    seconds_per_unit: _containers.RepeatedCompositeFieldContainer[Quantile]
    peak_memory_bytes: _containers.RepeatedCompositeFieldContainer[Quantile]
    def __init__(self, name: _Optional[str] = ..., units: _Optional[int] = ..., seconds_per_unit: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ..., peak_memory_bytes: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ...) -> None: ...

class AtomizationContract(_message.Message):
    __slots__ = ("total_units", "seconds_per_unit", "peak_memory_bytes", "phases", "checkpoint_overhead_seconds", "min_units", "max_units", "epsilon", "checkpoint_dir")
    TOTAL_UNITS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_OVERHEAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_UNITS_FIELD_NUMBER: _ClassVar[int]
    MAX_UNITS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    total_units: int
    seconds_per_unit: _containers.RepeatedCompositeFieldContainer[Quantile]
    peak_memory_bytes: _containers.RepeatedCompositeFieldContainer[Quantile]
    phases: _containers.RepeatedCompositeFieldContainer[ResourcePhase]
    checkpoint_overhead_seconds: float
    min_units: int
    max_units: int
    epsilon: float
    checkpoint_dir: str
    def __init__(self, total_units: _Optional[int] = ..., seconds_per_unit: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ..., peak_memory_bytes: _Optional[_Iterable[_Union[Quantile, _Mapping]]] = ..., phases: _Optional[_Iterable[_Union[ResourcePhase, _Mapping]]] = ..., checkpoint_overhead_seconds: _Optional[float] = ..., min_units: _Optional[int] = ..., max_units: _Optional[int] = ..., epsilon: _Optional[float] = ..., checkpoint_dir: _Optional[str] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("agent_id", "slice_id", "kind", "mig_profile", "gpu_milli", "memory_bytes", "start_unix", "end_unix", "gpu_model")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SLICE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    slice_id: str
    kind: SliceKind
    mig_profile: str
    gpu_milli: int
    memory_bytes: int
    start_unix: float
    end_unix: float
    gpu_model: str
    def __init__(self, agent_id: _Optional[str] = ..., slice_id: _Optional[str] = ..., kind: _Optional[_Union[SliceKind, str]] = ..., mig_profile: _Optional[str] = ..., gpu_milli: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., start_unix: _Optional[float] = ..., end_unix: _Optional[float] = ..., gpu_model: _Optional[str] = ...) -> None: ...

class ShapeCapacity(_message.Message):
    __slots__ = ("shape", "free", "total", "max_free_milli", "max_free_memory_bytes")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_FREE_MILLI_FIELD_NUMBER: _ClassVar[int]
    MAX_FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    shape: str
    free: int
    total: int
    max_free_milli: int
    max_free_memory_bytes: int
    def __init__(self, shape: _Optional[str] = ..., free: _Optional[int] = ..., total: _Optional[int] = ..., max_free_milli: _Optional[int] = ..., max_free_memory_bytes: _Optional[int] = ...) -> None: ...

class AgentSummary(_message.Message):
    __slots__ = ("agent_id", "address", "shapes", "pending_probes", "active_leases", "pressure", "draining", "running_subjobs", "suspended_subjobs", "windows", "generated_unix", "generation", "total_gpus", "hostname", "cpu_free_milli", "cpu_total_milli", "memory_free_bytes", "memory_total_bytes", "gpu_free_milli", "degraded_gpus")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    PENDING_PROBES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_SUBJOBS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CPU_FREE_MILLI_FIELD_NUMBER: _ClassVar[int]
    CPU_TOTAL_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_FREE_MILLI_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_GPUS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    address: str
    shapes: _containers.RepeatedCompositeFieldContainer[ShapeCapacity]
    pending_probes: int
    active_leases: int
    pressure: PressureLevel
    draining: bool
    running_subjobs: int
    suspended_subjobs: int
    windows: _containers.RepeatedCompositeFieldContainer[Window]
    generated_unix: float
    generation: int
    total_gpus: int
    hostname: str
    cpu_free_milli: int
    cpu_total_milli: int
    memory_free_bytes: int
    memory_total_bytes: int
    gpu_free_milli: _containers.RepeatedScalarFieldContainer[int]
    degraded_gpus: _containers.RepeatedCompositeFieldContainer[DegradedGpu]
    def __init__(self, agent_id: _Optional[str] = ..., address: _Optional[str] = ..., shapes: _Optional[_Iterable[_Union[ShapeCapacity, _Mapping]]] = ..., pending_probes: _Optional[int] = ..., active_leases: _Optional[int] = ..., pressure: _Optional[_Union[PressureLevel, str]] = ..., draining: _Optional[bool] = ..., running_subjobs: _Optional[int] = ..., suspended_subjobs: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., generated_unix: _Optional[float] = ..., generation: _Optional[int] = ..., total_gpus: _Optional[int] = ..., hostname: _Optional[str] = ..., cpu_free_milli: _Optional[int] = ..., cpu_total_milli: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., gpu_free_milli: _Optional[_Iterable[int]] = ..., degraded_gpus: _Optional[_Iterable[_Union[DegradedGpu, _Mapping]]] = ...) -> None: ...

class DegradedGpu(_message.Message):
    __slots__ = ("index", "uuid", "reason", "failed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    reason: str
    failed: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., reason: _Optional[str] = ..., failed: _Optional[bool] = ...) -> None: ...

class SubjobSpec(_message.Message):
    __slots__ = ("subjob_id", "job_id", "tenant", "command", "env", "workdir", "priority", "lifecycle", "resources", "unit_start", "unit_count", "checkpoint_dir", "grace_seconds", "supports_release_signal", "restartable", "value", "expected_seconds", "run_through_partitions", "array_job_id", "array_index")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUBJOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    UNIT_START_FIELD_NUMBER: _ClassVar[int]
    UNIT_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_RELEASE_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    RESTARTABLE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_THROUGH_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    subjob_id: str
    job_id: str
    tenant: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workdir: str
    priority: PriorityClass
    lifecycle: LifecycleClass
    resources: Resources
    unit_start: int
    unit_count: int
    checkpoint_dir: str
    grace_seconds: float
    supports_release_signal: bool
    restartable: bool
    value: float
    expected_seconds: float
    run_through_partitions: bool
    array_job_id: str
    array_index: int
    def __init__(self, subjob_id: _Optional[str] = ..., job_id: _Optional[str] = ..., tenant: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., priority: _Optional[_Union[PriorityClass, str]] = ..., lifecycle: _Optional[_Union[LifecycleClass, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., unit_start: _Optional[int] = ..., unit_count: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., grace_seconds: _Optional[float] = ..., supports_release_signal: _Optional[bool] = ..., restartable: _Optional[bool] = ..., value: _Optional[float] = ..., expected_seconds: _Optional[float] = ..., run_through_partitions: _Optional[bool] = ..., array_job_id: _Optional[str] = ..., array_index: _Optional[int] = ...) -> None: ...

class Subjob(_message.Message):
    __slots__ = ("spec", "agent_id", "slice_ids", "device_uuids", "state", "reason", "exit_code", "signal", "created_unix", "started_unix", "ended_unix", "run_seconds", "peak_rss_bytes", "peak_gpu_memory_bytes", "pid", "stdout_path", "stderr_path", "gpu_memory_used_bytes", "suspended_seconds", "lease_id", "units_done", "end_cause")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SLICE_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUIDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    RUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STDOUT_PATH_FIELD_NUMBER: _ClassVar[int]
    STDERR_PATH_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    spec: SubjobSpec
    agent_id: str
    slice_ids: _containers.RepeatedScalarFieldContainer[str]
    device_uuids: _containers.RepeatedScalarFieldContainer[str]
    state: SubjobState
    reason: str
    exit_code: int
    signal: int
    created_unix: float
    started_unix: float
    ended_unix: float
    run_seconds: float
    peak_rss_bytes: int
    peak_gpu_memory_bytes: int
    pid: int
    stdout_path: str
    stderr_path: str
    gpu_memory_used_bytes: int
    suspended_seconds: float
    lease_id: str
    units_done: int
    end_cause: EndCause
    def __init__(self, spec: _Optional[_Union[SubjobSpec, _Mapping]] = ..., agent_id: _Optional[str] = ..., slice_ids: _Optional[_Iterable[str]] = ..., device_uuids: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[SubjobState, str]] = ..., reason: _Optional[str] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., created_unix: _Optional[float] = ..., started_unix: _Optional[float] = ..., ended_unix: _Optional[float] = ..., run_seconds: _Optional[float] = ..., peak_rss_bytes: _Optional[int] = ..., peak_gpu_memory_bytes: _Optional[int] = ..., pid: _Optional[int] = ..., stdout_path: _Optional[str] = ..., stderr_path: _Optional[str] = ..., gpu_memory_used_bytes: _Optional[int] = ..., suspended_seconds: _Optional[float] = ..., lease_id: _Optional[str] = ..., units_done: _Optional[int] = ..., end_cause: _Optional[_Union[EndCause, str]] = ...) -> None: ...

class SubjobEvent(_message.Message):
    __slots__ = ("seq", "subjob", "at_unix")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SUBJOB_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    seq: int
    subjob: Subjob
    at_unix: float
    def __init__(self, seq: _Optional[int] = ..., subjob: _Optional[_Union[Subjob, _Mapping]] = ..., at_unix: _Optional[float] = ...) -> None: ...
