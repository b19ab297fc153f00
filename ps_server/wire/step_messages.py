"""The step data plane's messages as the codecs (:mod:`ember.ps_server.wire.step_codec`) take
and give them: entries to encode, and decoded requests and responses whose payloads are
views into the received bytes."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ember.ps_server.wire.proto_wire import EMPTY, Buffer
from ember.ps_server.wire.row_dtype import RowDtype


@dataclasses.dataclass
class StepClockView:
    """A StepClock (see the .proto): which job, rank and clock a request belongs to."""

    job: str = ""
    world: int = 0
    rank: int = 0
    clock: int = 0
    mode: int = 0
    wait_ms: int = 0


class IdsEntry(NamedTuple):
    """One table's ids to encode; ``dtype``: the .proto ``RowDtype`` of the rows answered (a
    refresh entry's may come back as float32, see the .proto's ``RefreshedRows``)."""

    table: str
    ids: Buffer
    dtype: int = RowDtype.FLOAT32


class GradsEntry(NamedTuple):
    """One table's ids and gradients to encode; ``dtype``: the .proto ``RowDtype`` of
    ``grads``."""

    table: str
    ids: Buffer
    grads: Buffer
    dtype: int = RowDtype.FLOAT32


@dataclasses.dataclass
class TableIdsView:
    """One table's ids (a view into the received bytes) and the dtype its rows are
    answered in (the .proto's ``RowDtype`` number, unchecked)."""

    table: str
    ids: memoryview
    dtype: int = RowDtype.FLOAT32


@dataclasses.dataclass
class TableGradsView:
    """One table's ids and gradients (views into the received bytes) and the gradients'
    dtype (the .proto's ``RowDtype`` number, unchecked)."""

    table: str
    ids: memoryview
    grads: memoryview
    dtype: int = RowDtype.FLOAT32


@dataclasses.dataclass
class LookupRequestView:
    """A decoded LookupRequest; ``clock`` is None when the request carries none;
    ``joined_rows``: answer every table's rows in one payload (the .proto's ``rows``)."""

    tables: list[TableIdsView]
    clock: StepClockView | None
    joined_rows: bool = False


@dataclasses.dataclass
class UpdateRequestView:
    """A decoded UpdateRequest."""

    tables: list[TableGradsView]
    clock: StepClockView | None
    refresh: list[TableIdsView]
    replica: bool = False  # the job holds hot-row replicas
    read: list[TableIdsView] = dataclasses.field(default_factory=list)  # a later step's rows
    read_state: list[TableIdsView] = dataclasses.field(default_factory=list)  # their state


@dataclasses.dataclass
class LookupResponseView:
    """A decoded LookupResponse: each table's rows, in request order, as ``values`` or (a
    request with ``joined_rows``) back to back in ``rows``."""

    values: list[memoryview]
    watermark: int
    size: int = 0  # bytes of the serialised message
    rows: memoryview = EMPTY


@dataclasses.dataclass
class UpdateResponseView:
    """A decoded UpdateResponse: per refresh entry, ``(positions, values, dtype)`` (the
    .proto's ``RowDtype`` number of ``values``, unchecked); the read entries' rows back to
    back in ``rows``."""

    duplicate: bool
    refreshed: list[tuple[memoryview, memoryview, int]]
    watermark: int
    flush: str = ""  # the checkpoint waiting for the job's replicas to be written back
    size: int = 0  # bytes of the serialised message
    rows: memoryview = EMPTY
    state: memoryview = EMPTY  # per read_state entry: versions, then optimizer state
