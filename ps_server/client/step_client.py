"""StepClient: a trainer's step data plane, Lookup and clocked Update (see the .proto).

One Lookup and one Update per shard per step carry every table (in exact
mode a later step's lookup may ride on an update instead, see
:meth:`StepClient.update_and_read`): ids are routed to their shards, each
shard's part encoded by the zero-copy step codec, and replies scattered back
into the caller's order as they arrive.
With a :class:`StepJob`, updates carry the rank's step clock and go to every
shard, even one that gets no rows this step, so that every shard's clock
advances; lookups may name the clock they need.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from ember.kernels.optim import state_width
from ember.ps_server.client.joined_ids import JoinedIds
from ember.ps_server.client.joined_lookup import JoinedLookup
from ember.ps_server.client.joined_state import JoinedState
from ember.ps_server.client.joined_update import JoinedUpdate
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.errors import InvalidArgumentError, PSClientError, Status
from ember.ps_server.id_arrays import as_id_array
from ember.ps_server.wire.frames import NO_CLOCK, frame_dtype
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import rows_from_wire
from ember.ps_server.wire.step_codec import (
    LookupResponseView,
    StepClockView,
    UpdateResponseView,
    encode_lookup_request,
    encode_update_request,
)


class UpdateAnswer(NamedTuple):
    """What :meth:`StepClient.update_and_read` returns, all in the caller's order.

    Attributes:
        refreshed: ``{table: (positions, rows)}``: the positions into ``refresh[table]`` of
            the rows the clock changed, with their rows once it is applied.
        watermark: the lowest watermark the shards answered with.
        rows: ``{table: rows [len(ids), dim]}`` of ``read``, as :meth:`StepClient.lookup`
            gives them.
        states: ``{table: (versions [n], state [n, width])}`` of ``read_state`` (none when
            a shard answered no state: one that predates ``read_state``).
    """

    refreshed: dict[str, tuple[torch.Tensor, torch.Tensor]]
    watermark: int
    rows: dict[str, torch.Tensor]
    states: dict[str, tuple[torch.Tensor, torch.Tensor]]


class StepClient:
    """Lookups and updates of whole steps, over the channels of ``client``.

    Args:
        client: a connected PSClient whose tables exist.
        job: this rank's job (None: lookups without clocks, no updates).
        wire_dtypes: per table (each must exist), how its rows and gradients travel:
            ``float32`` (the default for tables not named), ``float16`` or ``bfloat16``.
            The shards keep float32 rows and optimizer state; a narrow type halves the
            bytes of rows and gradients and rounds them to nearest even on the way.
            bfloat16 has float32's exponent range (to about 3.39e38) and 8 bits of
            mantissa: the safe choice for gradients. float16 has 11 bits but holds
            magnitudes only up to 65504, keeps fewer bits below 6.1e-5 (subnormals) and
            flushes values below about 6e-8 to zero. A value beyond the type is refused
            (OutOfRangeError in :meth:`update`, OUT_OF_RANGE from :meth:`lookup`).

    Example:
        >>> steps = StepClient(client, StepJob("run-7f3a", world=2, rank=0))  # doctest: +SKIP
        >>> rows, _ = steps.lookup({"user": ids}, clock=4)    # every rank's clock 4 applied
        >>> steps.update({"user": (ids, grads)}, clock=5)     # returns once clock 5 is applied
    """

    def __init__(
        self,
        client: PSClient,
        job: StepJob | None = None,
        wire_dtypes: Mapping[str, RowDtype | str] | None = None,
    ) -> None:
        if job is not None:
            job.validate()
        self.client, self.job = client, job
        self.wire_dtypes = {
            table: dtype if isinstance(dtype, RowDtype) else RowDtype.parse(dtype)
            for table, dtype in (wire_dtypes or {}).items()
        }
        for table in self.wire_dtypes:
            client.dim(table)  # a misspelt table fails here, not silently as float32
        self._wire_bytes, self._wire_lock = 0, threading.Lock()
        # A checkpoint waiting for this replica job's write-back, as the replies of the
        # newest clock answered so far said ("" when none), and that clock.
        self.flush_request, self._flush_clock, self._flush_lock = "", -1, threading.Lock()
        client.ensure_topology()

    @property
    def wire_bytes(self) -> int:
        """Bytes of every step message sent and received so far (requests and replies)."""
        return self._wire_bytes

    def _count_wire(self, size: int) -> None:
        with self._wire_lock:
            self._wire_bytes += size

    def lookup(
        self, requests: Mapping[str, Any], clock: int | None = None
    ) -> tuple[dict[str, torch.Tensor], int]:
        """Rows of each table's ids, in the caller's order (duplicates allowed), read once every
        rank's updates up to ``clock`` are applied (needs a job; None: at once). Tables of one
        row width come as slices of one tensor (see :meth:`JoinedLookup.rows`).

        Returns:
            ``({table: rows [len(ids), dim]}, the lowest watermark the shards answered
            with)``: without a clock, -1 (or ``clock`` when no shard was asked).

        Raises:
            ValueError: bad ids, or a clock without a job.
            PSClientError: a shard refused, failed or timed out waiting for other ranks
                (DEADLINE_EXCEEDED, naming them); OUT_OF_RANGE: a row beyond its table's
                wire dtype.
        """
        clock_view = self._clock(clock) if clock is not None else None
        batch = JoinedLookup(self._joined(requests))
        calls, shards = [], []
        wait_s, frame_clock = self._wait_s(clock_view), NO_CLOCK if clock is None else clock
        for shard in range(self.client.num_shards):
            entries = batch.ids.entries(shard)
            if not entries:
                continue
            request = encode_lookup_request(entries, clock_view, self._trailer, joined_rows=True)
            dtypes = [dtype for _, _, dtype in entries]
            calls.append(
                ShardCall(
                    shard, "Lookup", request, wait_s, len(entries), frame_clock,
                    frame_dtype(dtypes),
                )
            )  # fmt: skip
            shards.append(shard)

        self._count_wire(sum(len(call.request) for call in calls))
        watermarks = []

        def place(index: int, reply: LookupResponseView) -> None:
            self._count_wire(reply.size)
            watermarks.append(reply.watermark)
            shard = shards[index]
            try:
                if reply.values:  # a shard that predates joined rows
                    batch.place_values(shard, reply.values)
                else:
                    batch.place(shard, reply.rows)
            except InvalidArgumentError as error:
                raise PSClientError(
                    self.client.endpoints[shard], Status.INTERNAL, str(error)
                ) from None

        self.client.shard_rpc.run(calls, on_reply=place)
        return batch.rows(), min(watermarks, default=-1 if clock is None else clock)

    def update(
        self,
        updates: Mapping[str, tuple[Any, Any]],
        clock: int,
        refresh: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
        """Send this rank's step ``clock``: ``{table: (ids, grads)}`` to every shard (duplicate
        ids summed); returns when every shard applied the clock (in exact mode, once every
        rank's update is in).

        Args:
            updates: each table's ids and gradients [len(ids), dim].
            clock: the step, 0, 1, 2, ... (each exactly once; a repeat is a no-op).
            refresh: rows already read for the next step, ``{table: distinct ids}``.

        Returns:
            ``({table: (positions, rows)}, watermark)``: the positions into
            ``refresh[table]`` of the rows this clock changed, with their rows once it is
            applied; and the lowest watermark the shards answered with.

        Raises:
            ValueError: bad ids or gradients, or no job (nothing sent); OutOfRangeError (a
                ValueError): a gradient beyond its table's wire dtype (nothing sent).
            PSClientError: a shard refused or failed, or timed out waiting for other
                ranks (DEADLINE_EXCEEDED, naming them).
        """
        answer = self.update_and_read(updates, clock, refresh)
        return answer.refreshed, answer.watermark

    def update_and_read(
        self,
        updates: Mapping[str, tuple[Any, Any]],
        clock: int,
        refresh: Mapping[str, Any] | None = None,
        read: Mapping[str, Any] | None = None,
        read_state: Mapping[str, Any] | None = None,
    ) -> UpdateAnswer:
        """:meth:`update`, with a later step's lookup riding on it (exact mode only): one
        call per shard instead of two.

        Args:
            read: ``{table: ids}`` (ids may repeat), read once every rank's clock ``clock``
                is applied: the rows of a lookup naming that clock, or later ones.
            read_state: ``{table: distinct ids}`` whose versions and optimizer state to
                read as ``read`` is.

        Raises:
            As :meth:`update`; ValueError: reads in async mode (nothing sent);
            PSClientError OUT_OF_RANGE: a read row beyond its table's wire dtype (the clock
            is applied).
        """
        clock_view = self._clock(clock)
        if (read or read_state) and self.job.mode != "exact":
            raise ValueError("an update carries reads in exact mode only; use lookup()")
        tables = list(updates)
        batch = JoinedUpdate(
            tables, [as_id_array(ids) for ids, _ in updates.values()],
            [grads for _, grads in updates.values()], *self._layout(tables),
            self.client.num_shards,
        )  # fmt: skip
        refresh_tables = list(refresh or {})
        asked = self._joined(refresh or {})
        reads = JoinedLookup(self._joined(read or {}))
        states = JoinedState(
            self._joined(read_state or {}),
            {t: state_width(self.client.spec(t).optimizer.kind, self.client.dim(t))
             for t in read_state or {}},
        )  # fmt: skip
        calls = []
        for shard in range(self.client.num_shards):  # every entry packed before any is sent
            entries, refresh_entries = batch.grad_entries(shard), asked.entries(shard)
            read_entries, state_entries = reads.ids.entries(shard), states.ids.entries(shard)
            request = encode_update_request(
                entries, clock_view, refresh_entries, replica=self.job.replica,
                trailer=self._trailer, read=read_entries, read_state=state_entries,
            )  # fmt: skip
            dtypes = [e[-1] for e in (*entries, *refresh_entries, *read_entries, *state_entries)]
            calls.append(
                ShardCall(
                    shard, "Update", request, self._wait_s(clock_view), len(entries), clock,
                    frame_dtype(dtypes),
                )
            )  # fmt: skip

        self._count_wire(sum(len(call.request) for call in calls))
        watermarks, flush_requests, stateless = [], [], []
        refreshed: dict[str, tuple[list, list]] = {table: ([], []) for table in refresh_tables}

        def collect(index: int, reply: UpdateResponseView) -> None:
            self._count_wire(reply.size)
            watermarks.append(reply.watermark)
            flush_requests.append(reply.flush)
            shard = calls[index].shard
            part, parts = asked.shards[shard], asked.parts(shard)
            if len(reply.refreshed) != len(parts):  # the clock is applied: not a ValueError
                raise PSClientError(
                    self.client.endpoints[shard], Status.INTERNAL,
                    f"an update's answer must refresh {len(parts)} tables, got "
                    f"{len(reply.refreshed)}",
                )  # fmt: skip
            for (t, lo, hi), (found, values, dtype) in zip(parts, reply.refreshed):
                table = asked.tables[t]
                where = np.frombuffer(found, dtype="<i8")
                if len(where) and (where.min() < 0 or where.max() >= hi - lo):
                    raise PSClientError(
                        self.client.endpoints[shard], Status.INTERNAL,
                        f"refresh of table {table!r} named positions outside its "
                        f"{hi - lo} ids",
                    )  # fmt: skip
                if dtype not in (RowDtype.FLOAT32, asked.dtypes[t]):
                    raise PSClientError(
                        self.client.endpoints[shard], Status.INTERNAL,
                        f"refresh of table {table!r} came as row dtype {dtype}, asked for "
                        f"{asked.dtypes[t].name.lower()} (or float32)",
                    )  # fmt: skip
                rows = self._refreshed_rows(shard, table, values, len(where), dtype)
                refreshed[table][0].append(part.positions[lo:hi][where] - asked.starts[t])
                refreshed[table][1].append(np.array(rows))
            if read:
                try:
                    reads.place(shard, reply.rows)
                except InvalidArgumentError as error:
                    older = "" if len(reply.rows) else "; a shard older than reads answers none"
                    raise PSClientError(
                        self.client.endpoints[shard],
                        Status.INTERNAL,
                        f"{error} (an update's read, its clock applied{older})",
                    ) from None
            elif len(reply.rows):
                raise PSClientError(
                    self.client.endpoints[shard], Status.INTERNAL,
                    f"an update's answer holds {len(reply.rows)} bytes of rows nobody asked for",
                )  # fmt: skip
            if not len(reply.state) and states.ids.entries(shard):
                stateless.append(shard)  # a shard that predates read_state
                return
            try:
                states.place(shard, reply.state)  # none asked: must be empty
            except InvalidArgumentError as error:
                raise PSClientError(
                    self.client.endpoints[shard],
                    Status.INTERNAL,
                    f"{error} (an update's read_state, its clock applied)",
                ) from None

        self.client.shard_rpc.run(calls, on_reply=collect)
        with self._flush_lock:  # answers come in any order; a request missed comes again
            if clock >= self._flush_clock:
                self._flush_clock = clock
                self.flush_request = max(flush_requests)  # a shard that asks, if any does
        result = {
            table: (
                torch.from_numpy(np.concatenate(found or [np.empty(0, np.int64)])),
                torch.from_numpy(np.concatenate(rows))
                if rows
                else torch.empty(0, self.client.dim(table), dtype=torch.float32),
            )
            for table, (found, rows) in refreshed.items()
        }
        return UpdateAnswer(
            result, min(watermarks), reads.rows(), {} if stateless else states.states()
        )

    def replicas_flushed(self, flush_id: str, clock: int, release: bool = False) -> bool:
        """Tell every shard this job wrote its hot-row replicas back after ``clock``, for
        ``flush_id`` (a checkpoint's request, "" for none); ``release``: the job holds none
        from now on.

        For a checkpoint the shards hold the call until it has paused writes (up to the
        job's ``wait_s``), so the job takes no step in between. Returns whether every
        shard saw the pause.
        """
        job = self.job
        if job is None:
            raise ValueError("reporting replicas needs a StepJob")
        request = pb.ReplicasFlushedRequest(
            job=job.name, flush_id=flush_id, clock=clock, release=release,
            wait_ms=job.wait_ms,
        )  # fmt: skip
        calls = [
            ShardCall(k, "ReplicasFlushed", request, job.wait_s)
            for k in range(self.client.num_shards)
        ]
        return all(reply.paused for reply in self.client.shard_rpc.run(calls))

    def _joined(self, requests: Mapping[str, Any]) -> JoinedIds:
        """``{table: ids}`` checked, joined and routed."""
        tables = list(requests)
        return JoinedIds(
            tables, [as_id_array(ids) for ids in requests.values()], *self._layout(tables),
            self.client.num_shards,
        )  # fmt: skip

    def _layout(self, tables: list[str]) -> tuple[list[int], list[RowDtype]]:
        """Each table's row width and how its rows travel."""
        return [self.client.dim(t) for t in tables], [self.wire_dtype(t) for t in tables]

    def wire_dtype(self, table: str) -> RowDtype:
        """How ``table``'s rows and gradients travel."""
        return self.wire_dtypes.get(table, RowDtype.FLOAT32)

    def _refreshed_rows(
        self, shard: int, table: str, values: memoryview, num_rows: int, dtype: int
    ) -> np.ndarray:
        """An update reply's float32 refresh rows of ``table`` (a view of the reply when they
        came as float32), in ``dtype`` (the .proto's number).

        Raises:
            PSClientError: INTERNAL, an unknown dtype or another number of bytes.
        """
        try:
            return rows_from_wire(
                values, RowDtype.from_wire(dtype), num_rows, self.client.dim(table),
                f"refresh of table {table!r}",
            )  # fmt: skip
        except InvalidArgumentError as error:
            raise PSClientError(self.client.endpoints[shard], Status.INTERNAL, str(error)) from None

    @property
    def _trailer(self) -> bytes:
        return self.client.shard_rpc.data_plane.trailer

    def _clock(self, step: int) -> StepClockView:
        if self.job is None:
            raise ValueError("a clocked lookup or an update needs a StepJob")
        return self.job.clock(step)

    def _wait_s(self, clock: StepClockView | None) -> float:
        return 0.0 if clock is None else clock.wait_ms / 1000.0
