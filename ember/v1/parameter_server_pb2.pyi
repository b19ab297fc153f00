from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_MODE_UNSPECIFIED: _ClassVar[UpdateMode]
    EXACT: _ClassVar[UpdateMode]
    ASYNC: _ClassVar[UpdateMode]

class RowDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLOAT32: _ClassVar[RowDtype]
    FLOAT16: _ClassVar[RowDtype]
    BFLOAT16: _ClassVar[RowDtype]
UPDATE_MODE_UNSPECIFIED: UpdateMode
EXACT: UpdateMode
ASYNC: UpdateMode
FLOAT32: RowDtype
FLOAT16: RowDtype
BFLOAT16: RowDtype

class Initializer(_message.Message):
    __slots__ = ("kind", "scale", "seed")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Initializer.Kind]
        UNIFORM: _ClassVar[Initializer.Kind]
        NORMAL: _ClassVar[Initializer.Kind]
        ZEROS: _ClassVar[Initializer.Kind]
    KIND_UNSPECIFIED: Initializer.Kind
    UNIFORM: Initializer.Kind
    NORMAL: Initializer.Kind
    ZEROS: Initializer.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    kind: Initializer.Kind
    scale: float
    seed: int
    def __init__(self, kind: _Optional[_Union[Initializer.Kind, str]] = ..., scale: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class Optimizer(_message.Message):
    __slots__ = ("kind", "lr", "eps", "beta1", "beta2", "weight_decay")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Optimizer.Kind]
        SGD: _ClassVar[Optimizer.Kind]
        ADAGRAD: _ClassVar[Optimizer.Kind]
        ROWWISE_ADAGRAD: _ClassVar[Optimizer.Kind]
        ADAM: _ClassVar[Optimizer.Kind]
    KIND_UNSPECIFIED: Optimizer.Kind
    SGD: Optimizer.Kind
    ADAGRAD: Optimizer.Kind
    ROWWISE_ADAGRAD: Optimizer.Kind
    ADAM: Optimizer.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    kind: Optimizer.Kind
    lr: float
    eps: float
    beta1: float
    beta2: float
    weight_decay: float
    def __init__(self, kind: _Optional[_Union[Optimizer.Kind, str]] = ..., lr: _Optional[float] = ..., eps: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., weight_decay: _Optional[float] = ...) -> None: ...

class TableSpec(_message.Message):
    __slots__ = ("name", "dim", "initializer", "optimizer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    initializer: Initializer
    optimizer: Optimizer
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., initializer: _Optional[_Union[Initializer, _Mapping]] = ..., optimizer: _Optional[_Union[Optimizer, _Mapping]] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ...) -> None: ...

class CreateTableResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("table", "ids", "with_state")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    WITH_STATE_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    with_state: bool
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., with_state: _Optional[bool] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("values", "versions", "dim", "state")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    versions: bytes
    dim: int
    state: bytes
    def __init__(self, values: _Optional[bytes] = ..., versions: _Optional[bytes] = ..., dim: _Optional[int] = ..., state: _Optional[bytes] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("table", "ids", "grads", "request_id")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    grads: bytes
    request_id: str
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., request_id: _Optional[str] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("duplicate", "rows_updated")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    rows_updated: int
    def __init__(self, duplicate: _Optional[bool] = ..., rows_updated: _Optional[int] = ...) -> None: ...

class PullStaleRequest(_message.Message):
    __slots__ = ("table", "ids", "held_versions", "bound")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    held_versions: bytes
    bound: int
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., held_versions: _Optional[bytes] = ..., bound: _Optional[int] = ...) -> None: ...

class PullStaleResponse(_message.Message):
    __slots__ = ("positions", "values", "versions", "dim")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    positions: bytes
    values: bytes
    versions: bytes
    dim: int
    def __init__(self, positions: _Optional[bytes] = ..., values: _Optional[bytes] = ..., versions: _Optional[bytes] = ..., dim: _Optional[int] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("table", "ids", "values", "state", "request_id", "versions")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    values: bytes
    state: bytes
    request_id: str
    versions: bytes
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., values: _Optional[bytes] = ..., state: _Optional[bytes] = ..., request_id: _Optional[str] = ..., versions: _Optional[bytes] = ...) -> None: ...

class AssignResponse(_message.Message):
    __slots__ = ("duplicate",)
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    def __init__(self, duplicate: _Optional[bool] = ...) -> None: ...

class PullBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PullRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[PullRequest, _Mapping]]] = ...) -> None: ...

class PullBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[PullResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[PullResponse, _Mapping]]] = ...) -> None: ...

class PushBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PushRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[PushRequest, _Mapping]]] = ...) -> None: ...

class PushBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[PushResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[PushResponse, _Mapping]]] = ...) -> None: ...

class PullStaleBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PullStaleRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[PullStaleRequest, _Mapping]]] = ...) -> None: ...

class PullStaleBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[PullStaleResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[PullStaleResponse, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("without_sizes",)
    WITHOUT_SIZES_FIELD_NUMBER: _ClassVar[int]
    without_sizes: bool
    def __init__(self, without_sizes: _Optional[bool] = ...) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("name", "dim", "rows", "bytes", "pull_requests", "push_requests", "rows_pulled", "rows_pushed", "duplicate_pushes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PULL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PUSH_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PULLED_FIELD_NUMBER: _ClassVar[int]
    ROWS_PUSHED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_PUSHES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    rows: int
    bytes: int
    pull_requests: int
    push_requests: int
    rows_pulled: int
    rows_pushed: int
    duplicate_pushes: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., pull_requests: _Optional[int] = ..., push_requests: _Optional[int] = ..., rows_pulled: _Optional[int] = ..., rows_pushed: _Optional[int] = ..., duplicate_pushes: _Optional[int] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("transport", "host", "port", "max_message_bytes")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    transport: str
    host: str
    port: int
    max_message_bytes: int
    def __init__(self, transport: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("shard", "num_shards", "tables", "data_planes")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANES_FIELD_NUMBER: _ClassVar[int]
    shard: int
    num_shards: int
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    data_planes: _containers.RepeatedCompositeFieldContainer[DataPlane]
    def __init__(self, shard: _Optional[int] = ..., num_shards: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ..., data_planes: _Optional[_Iterable[_Union[DataPlane, _Mapping]]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ...) -> None: ...

class PauseWritesRequest(_message.Message):
    __slots__ = ("checkpoint_id", "lease_s", "flush_id")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    lease_s: float
    flush_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., lease_s: _Optional[float] = ..., flush_id: _Optional[str] = ...) -> None: ...

class JobClocks(_message.Message):
    __slots__ = ("job", "applied")
    JOB_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    job: str
    applied: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job: _Optional[str] = ..., applied: _Optional[_Iterable[int]] = ...) -> None: ...

class PauseWritesResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobClocks]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobClocks, _Mapping]]] = ...) -> None: ...

class ResumeWritesRequest(_message.Message):
    __slots__ = ("checkpoint_id", "flush_id")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    flush_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., flush_id: _Optional[str] = ...) -> None: ...

class ResumeWritesResponse(_message.Message):
    __slots__ = ("still_writing",)
    STILL_WRITING_FIELD_NUMBER: _ClassVar[int]
    still_writing: bool
    def __init__(self, still_writing: _Optional[bool] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id", "directory", "base_id", "cut")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    BASE_ID_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    directory: str
    base_id: str
    cut: _containers.RepeatedCompositeFieldContainer[JobClocks]
    def __init__(self, checkpoint_id: _Optional[str] = ..., directory: _Optional[str] = ..., base_id: _Optional[str] = ..., cut: _Optional[_Iterable[_Union[JobClocks, _Mapping]]] = ...) -> None: ...

class CheckpointFile(_message.Message):
    __slots__ = ("path", "table", "rows", "bytes", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    table: str
    rows: int
    bytes: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., table: _Optional[str] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("shard", "num_shards", "files", "tables")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    shard: int
    num_shards: int
    files: _containers.RepeatedCompositeFieldContainer[CheckpointFile]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    def __init__(self, shard: _Optional[int] = ..., num_shards: _Optional[int] = ..., files: _Optional[_Iterable[_Union[CheckpointFile, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ...) -> None: ...

class CommitCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class CommitCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepClock(_message.Message):
    __slots__ = ("job", "world", "rank", "clock", "mode", "wait_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    world: int
    rank: int
    clock: int
    mode: UpdateMode
    wait_ms: int
    def __init__(self, job: _Optional[str] = ..., world: _Optional[int] = ..., rank: _Optional[int] = ..., clock: _Optional[int] = ..., mode: _Optional[_Union[UpdateMode, str]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class TableIds(_message.Message):
    __slots__ = ("table", "ids", "dtype")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    dtype: RowDtype
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., dtype: _Optional[_Union[RowDtype, str]] = ...) -> None: ...

class TableGrads(_message.Message):
    __slots__ = ("table", "ids", "grads", "dtype")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    grads: bytes
    dtype: RowDtype
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., dtype: _Optional[_Union[RowDtype, str]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("tables", "clock", "joined_rows")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    JOINED_ROWS_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableIds]
    clock: StepClock
    joined_rows: bool
    def __init__(self, tables: _Optional[_Iterable[_Union[TableIds, _Mapping]]] = ..., clock: _Optional[_Union[StepClock, _Mapping]] = ..., joined_rows: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("values", "watermark", "rows")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    watermark: int
    rows: bytes
    def __init__(self, values: _Optional[_Iterable[bytes]] = ..., watermark: _Optional[int] = ..., rows: _Optional[bytes] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("tables", "clock", "refresh", "replica", "read", "read_state")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    REFRESH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    READ_STATE_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableGrads]
    clock: StepClock
    refresh: _containers.RepeatedCompositeFieldContainer[TableIds]
    replica: bool
    read: _containers.RepeatedCompositeFieldContainer[TableIds]
    read_state: _containers.RepeatedCompositeFieldContainer[TableIds]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableGrads, _Mapping]]] = ..., clock: _Optional[_Union[StepClock, _Mapping]] = ..., refresh: _Optional[_Iterable[_Union[TableIds, _Mapping]]] = ..., replica: _Optional[bool] = ..., read: _Optional[_Iterable[_Union[TableIds, _Mapping]]] = ..., read_state: _Optional[_Iterable[_Union[TableIds, _Mapping]]] = ...) -> None: ...

class RefreshedRows(_message.Message):
    __slots__ = ("positions", "values", "dtype")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    positions: bytes
    values: bytes
    dtype: RowDtype
    def __init__(self, positions: _Optional[bytes] = ..., values: _Optional[bytes] = ..., dtype: _Optional[_Union[RowDtype, str]] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("duplicate", "refreshed", "watermark", "flush", "rows", "state")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    REFRESHED_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    refreshed: _containers.RepeatedCompositeFieldContainer[RefreshedRows]
    watermark: int
    flush: str
    rows: bytes
    state: bytes
    def __init__(self, duplicate: _Optional[bool] = ..., refreshed: _Optional[_Iterable[_Union[RefreshedRows, _Mapping]]] = ..., watermark: _Optional[int] = ..., flush: _Optional[str] = ..., rows: _Optional[bytes] = ..., state: _Optional[bytes] = ...) -> None: ...

class FlushReplicasRequest(_message.Message):
    __slots__ = ("flush_id", "wait_ms")
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    flush_id: str
    wait_ms: int
    def __init__(self, flush_id: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class FlushedJob(_message.Message):
    __slots__ = ("job", "clock")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    job: str
    clock: int
    def __init__(self, job: _Optional[str] = ..., clock: _Optional[int] = ...) -> None: ...

class FlushReplicasResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[FlushedJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[FlushedJob, _Mapping]]] = ...) -> None: ...

class ReplicasFlushedRequest(_message.Message):
    __slots__ = ("job", "flush_id", "clock", "release", "wait_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FLUSH_ID_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    flush_id: str
    clock: int
    release: bool
    wait_ms: int
    def __init__(self, job: _Optional[str] = ..., flush_id: _Optional[str] = ..., clock: _Optional[int] = ..., release: _Optional[bool] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class ReplicasFlushedResponse(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class LogRecord(_message.Message):
    __slots__ = ("create_table", "push", "assign", "step", "replica_released")
    CREATE_TABLE_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLICA_RELEASED_FIELD_NUMBER: _ClassVar[int]
    create_table: CreateTableRequest
    push: PushBatchRequest
    assign: AssignRequest
    step: StepApplied
    replica_released: ReplicaReleased
    def __init__(self, create_table: _Optional[_Union[CreateTableRequest, _Mapping]] = ..., push: _Optional[_Union[PushBatchRequest, _Mapping]] = ..., assign: _Optional[_Union[AssignRequest, _Mapping]] = ..., step: _Optional[_Union[StepApplied, _Mapping]] = ..., replica_released: _Optional[_Union[ReplicaReleased, _Mapping]] = ...) -> None: ...

class ReplicaReleased(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class StepApplied(_message.Message):
    __slots__ = ("clock", "tables", "replica")
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    clock: StepClock
    tables: _containers.RepeatedCompositeFieldContainer[TableGrads]
    replica: bool
    def __init__(self, clock: _Optional[_Union[StepClock, _Mapping]] = ..., tables: _Optional[_Iterable[_Union[TableGrads, _Mapping]]] = ..., replica: _Optional[bool] = ...) -> None: ...
