"""PipelinedRowSource: rows over the step data plane, fetched while the previous step computes.

Per step t (see the RowSource protocol): ``rows`` serves step t's rows from
the lookup started before; ``prefetch`` announces a later step's ids as soon
as they are known; ``apply_gradients`` sends step t's update (clock t) in the
background. The lookup of step u needs clock c = u-1-max(s, 1). In EXACT
mode with ``s <= 1`` it rides on the update of clock c, u-2, when its ids
are announced before that update leaves (HET's piggyback; :attr:`lookahead`
steps ahead): the shards answer it with that update, once every rank's
clock c is applied, so a step costs one call per shard instead of two.
Otherwise (ids announced later, ASYNC mode, or ``s >= 2``, whose rows would
then be read as stale as the bound allows, s steps early, rather than at
the step before) a lookup naming clock c starts at once. With staleness
``s``:

* ``s = 0``: step t+1's rows, read at clock t-1, miss only clock t, so the
  update of clock t carries those ids as ``refresh``: the shards answer it
  once every rank's clock t is applied, with the rows it changed (the
  collision rows), and ``rows`` of step t+1 patches them in. Every value
  step t+1 uses then includes every rank's steps <= t: the serial result,
  exactly, and with several ranks in EXACT mode the result of one process on
  the union of their batches. With one rank, float32 rows on the wire and
  the read riding on an update, clock t is this rank's own update: the read
  also brings the optimizer state of the rows step t+1 shares with step t,
  and ``apply_gradients`` of step t steps them in step t+1's copy as the
  shard will (:mod:`ember.trainer.shared_rows`, which says when that holds),
  so step t+1's rows wait for nothing of step t.
* ``s >= 1``: nothing is patched; at most s+1 updates are in flight
  (``apply_gradients`` of step t first waits for clock t-1-s's answer).

Time spent blocked on the shards is the exposed wait; the lookups' and
updates' own durations are the PS time, most of it overlapped with compute.

On a CUDA trainer with ``s >= 1`` the prefetched rows move to the device on
the thread that received them, on a stream of their own
(:mod:`ember.trainer.device_staging`); with ``s = 0`` they are patched or
stepped on the host first, and move when the collection takes them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any

import torch
from ember.ps_server.client.shard_rpc import CONCURRENT_FAN_OUTS
from ember.ps_server.client.step_client import StepClient, UpdateAnswer
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.wire.row_dtype import RowDtype
from ember.trainer.device_staging import DeviceStaging, StagedRows
from ember.trainer.pipeline_timing import PipelineTiming
from ember.trainer.shared_rows import SharedRows, steps_like_the_shards
from ember.trainer.traffic import TrafficStats

# Each step in flight holds a thread here and a request on the shards; with the next
# step's lookup and one more caller, every fan-out of the client can run at once.
MAX_STALENESS = CONCURRENT_FAN_OUTS - 3
ASYNC_NEEDS_STALENESS = (
    "update mode async needs staleness >= 1: staleness 0 patches the next step's rows with "
    "every rank's update of this step, which only exact mode applies as one clock"
)


@dataclasses.dataclass
class _Prefetch:
    requests: dict[str, torch.Tensor]
    future: concurrent.futures.Future | None
    rides: bool = False  # ``future`` is an update's, whose answer carries these rows
    # Rows shared with the step before, whose state the answer carries (set by the update's
    # thread before it sends; read once ``future`` is done).
    shared: SharedRows | None = None
    stepped: bool = False  # they are stepped here: the rows hold the step before's clock
    staged: StagedRows | None = None  # a ride's rows, set by the update's thread


class PipelinedRowSource:
    """A RowSource over ``steps`` (a StepClient with this rank's job) with staleness ``s``.

    Args:
        steps: the step data plane, with a job.
        staleness: ``s >= 0``: step t reads every rank's updates of steps <= t-1-s.
        device: the trainer's device, where ``s >= 1`` stages prefetched rows.

    Raises:
        ValueError: ``staleness < 0`` or a client without a job.
    """

    def __init__(
        self, steps: StepClient, staleness: int, device: str | torch.device = "cpu"
    ) -> None:
        if not 0 <= staleness <= MAX_STALENESS:
            raise ValueError(f"staleness must be in 0..{MAX_STALENESS}, got {staleness}")
        if steps.job is None:
            raise ValueError("a pipelined row source needs a StepClient with a job")
        if steps.job.mode == "async" and staleness == 0:
            raise ValueError(ASYNC_NEEDS_STALENESS)
        self.steps, self.staleness = steps, staleness
        # With s = 0 the rows are patched or stepped on the host after they arrive.
        self._staging = DeviceStaging(device if staleness >= 1 else "cpu")
        self._payload = TrafficStats()
        self.timing = PipelineTiming()
        # Lookups have their own thread: up to s+1 updates may each hold one while the shards
        # wait for other ranks, and the next step's lookup must not queue behind them.
        self._lookups = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ember-lookup")
        self._updates_pool = concurrent.futures.ThreadPoolExecutor(
            staleness + 1, thread_name_prefix="ember-update"
        )
        self._stats_lock = threading.Lock()
        self._step = 0  # the step whose rows rows() serves next
        self._announced = 0  # the last step whose ids prefetch() was given
        self._rows_served_at: float | None = None  # when rows() last returned
        self._prefetched: dict[int, _Prefetch] = {}
        self._updates: dict[int, concurrent.futures.Future] = {}
        # Lookups waiting for the update they ride on: its clock -> their prefetch's step, ids
        # and the ids of the step before (None: their shared rows are not stepped here).
        self._riders: dict[int, tuple[int, dict[str, torch.Tensor], dict | None]] = {}
        self._rides = steps.job.mode == "exact" and staleness <= 1
        self._steps_shared_rows = (
            self._rides and staleness == 0 and steps.job.world == 1 and steps_like_the_shards()
        )
        self._last_announced: dict[str, torch.Tensor] = {}  # the ids prefetch() last had

    @property
    def lookahead(self) -> int:
        """How many steps past the current one :meth:`prefetch` takes ids for: 2 where a
        step's lookup rides on the update two steps before it, whose ids must be announced
        before that update leaves (see the module docstring); else 1."""
        return 2 if self._rides else 1

    @property
    def traffic(self) -> TrafficStats:
        """Rows and bytes moved; control bytes are the step messages' bytes beyond the ids,
        rows and gradients (clocks, table names, positions, framing)."""
        payload = self._payload
        control = self.steps.wire_bytes - payload.bytes_pulled - payload.bytes_pushed
        return dataclasses.replace(payload, bytes_control=max(0, control))

    @property
    def blocked_s(self) -> float:
        """Seconds the calling thread waited for lookups and updates (see RowSource)."""
        return self.timing.exposed_wait

    @property
    def last_clock(self) -> int:
        """The clock of the last update sent (-1 before the first)."""
        return self._step - 1

    def prefetch(self, requests: dict[str, torch.Tensor]) -> None:
        """Announce the ids (distinct per table) of the next step not announced yet, after the
        current step's :meth:`rows`: its lookup rides on the update that carries it, when
        that has not left yet, or starts now."""
        step = max(self._step, self._announced) + 1
        earlier, self._last_announced = self._last_announced, requests
        stepped_here = (
            self._announced == step - 1
            and self._steps_shared_rows
            and all(self.steps.wire_dtype(table) is RowDtype.FLOAT32 for table in requests)
        )
        self._announced = step
        needed = step - 1 - max(self.staleness, 1)  # s = 0: one clock short, then patched
        if self._rides and needed >= self._step:  # that clock's update has not left
            self._riders[needed] = (step, requests, earlier if stepped_here else None)
            return
        self._prefetched[step] = _Prefetch(
            requests, self._submit(self._lookups, self._lookup, requests, needed)
        )

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Step t's rows: the prefetched ones patched with clock t-1 (s = 0), or, for rows
        no prefetch asked for, a lookup now of the clock step t needs."""
        step = self._step
        prefetched = self._prefetched.pop(step, None)
        planned = prefetched is not None and same_requests(prefetched.requests, requests)
        previous = None
        stepped = planned and prefetched.stepped
        if self.staleness == 0 and not stepped:
            previous = self._updates.pop(step - 1, None)
        if stepped:  # read at clock step-2, then stepped to step-1's: see apply_gradients
            update = self._updates.get(step - 1)
            if update is not None and update.done() and update.exception() is not None:
                raise update.exception()  # the rows were stepped for an update that failed
            rows, read_at = self._prefetched_rows(prefetched)
            if read_at < step - 2:
                raise RuntimeError(
                    f"step {step}'s rows were read at clock {read_at}, before the clock "
                    f"{step - 2} they rode on (a protocol error)"
                )
            watermark = step - 1
        elif planned:
            rows, watermark = self._prefetched_rows(prefetched)
            if previous is not None:
                answer = self._wait(previous)
                watermark = answer.watermark
                for table, (positions, patch) in answer.refreshed.items():
                    if len(positions):
                        rows[table][positions] = patch
        else:  # unplanned: the previous update's refresh answers another request
            if previous is not None:
                self._wait(previous)
            needed = step - 1 - self.staleness
            lookup = self._submit(self._lookups, self._lookup, requests, needed)
            staged, watermark = self._wait(lookup)
            rows = self._staging.take(staged)
        lag = max(0, (step - 1) - watermark)
        if lag > self.staleness:
            raise RuntimeError(
                f"step {step} was served clock {watermark}, {lag} behind: more than the "
                f"staleness bound {self.staleness} (a protocol error)"
            )
        self.timing.lags.append(lag)
        self.timing.max_lag = max(self.timing.max_lag, lag)
        self._rows_served_at = time.perf_counter()
        return rows

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Send step t's update (clock t) in the background; first wait until at most ``s``
        others are in flight."""
        step = self._step
        if self._rows_served_at is not None:
            self.timing.rows_to_update += time.perf_counter() - self._rows_served_at
            self.timing.rows_to_update_steps += 1
            self._rows_served_at = None
        for old in sorted(self._updates):
            if old <= step - 1 - self.staleness:
                self._wait(self._updates.pop(old))
        refresh = {}
        upcoming = self._prefetched.get(step + 1)
        if (
            self.staleness == 0
            and upcoming is not None
            and not self._step_shared_rows(upcoming, updates)
        ):
            refresh = upcoming.requests
        rider, read, earlier = self._riders.pop(step, (None, {}, None))
        prefetch = _Prefetch(read, None, rides=True) if rider is not None else None
        update = self._submit(
            self._updates_pool, self._update, updates, step, refresh, read, earlier, prefetch
        )
        self._updates[step] = update
        if prefetch is not None:
            prefetch.future = update
            self._prefetched[rider] = prefetch
        self._step += 1

    def _step_shared_rows(
        self, upcoming: _Prefetch, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> bool:
        """Step the rows ``upcoming`` (the next step's prefetch) shares with this step with
        this step's ``updates``, where its read brought their state (its update, the one
        before this step's, has answered: staleness 0 waits for it first); whether it did.
        (On this thread: on a thread of its own it would contend with the step's compute.)"""
        if not upcoming.rides:
            return False
        answer = self._wait(upcoming.future)
        shared = upcoming.shared
        if shared is None or not shared.by_table.keys() <= answer.states.keys():
            return False  # no state asked for, or a shard that predates it answered none
        if not shared.steppable(updates):
            return False
        optimizers = {t: self.steps.client.spec(t).optimizer for t in shared.by_table}
        # The rows the next step will be served (with s = 0, staged on the host: kept as is).
        shared.step(upcoming.staged.rows, answer.states, updates, optimizers)
        upcoming.stepped = True
        return True

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rows for evaluation, as the shards hold them now (call :meth:`flush` first)."""
        return self.steps.lookup(requests)[0]

    def flush(self) -> None:
        """Wait until every update sent is applied. Their answers stay for the next step's
        rows (with staleness 0 they carry its collision rows), so training may go on."""
        for step in sorted(self._updates):
            self._wait(self._updates[step])

    def close(self) -> None:
        """Stop the background threads (after :meth:`flush`)."""
        self._lookups.shutdown(wait=True)
        self._updates_pool.shutdown(wait=True)

    def _lookup(self, requests: dict[str, torch.Tensor], needed: int) -> tuple[StagedRows, int]:
        rows, watermark = self.steps.lookup(requests, clock=max(-1, needed))
        with self._stats_lock:
            self._count_pulled(requests)
        return self._stage(rows, f"a lookup of clock {needed}"), watermark

    def _stage(self, rows: dict[str, torch.Tensor], what: str) -> StagedRows:
        """``rows`` staged for the device; a failure names ``what`` read them (the shards
        answered: it is this process's copy that failed)."""
        try:
            return self._staging.stage(rows)
        except Exception as error:
            error.add_note(f"(moving the rows of {what})")
            raise

    def _count_pulled(self, requests: dict[str, torch.Tensor]) -> None:
        """Count the ids and rows of ``requests`` as pulled (the caller holds the lock)."""
        for table, ids in requests.items():
            self._payload.rows_pulled += len(ids)
            self._payload.bytes_pulled += len(ids) * (8 + self._row_bytes(table))

    def _prefetched_rows(self, prefetched: _Prefetch) -> tuple[dict[str, torch.Tensor], int]:
        """A prefetch's rows and the watermark they were read at, once its call answered."""
        answer = self._wait(prefetched.future)
        if prefetched.rides:
            return self._staging.take(prefetched.staged), answer.watermark
        staged, watermark = answer
        return self._staging.take(staged), watermark

    def _update(
        self,
        updates,
        step: int,
        refresh: dict[str, torch.Tensor],
        read: dict[str, torch.Tensor],
        earlier: dict[str, torch.Tensor] | None,
        prefetch: _Prefetch | None,
    ) -> UpdateAnswer:
        """Send the update of ``step``; ``read`` rides on it for ``prefetch``, with the state
        of the rows it shares with ``earlier`` (the step before's ids) when given."""
        try:
            read_state = {}
            if earlier is not None:
                prefetch.shared = SharedRows.between(earlier, read)
                read_state = prefetch.shared.ids
            try:
                answer = self.steps.update_and_read(updates, step, refresh, read, read_state)
            except PSClientError as error:
                if not read or error.code != Status.RESOURCE_EXHAUSTED:
                    raise
                # The answer with the read would pass a shard's message limit (the rows
                # with their state, or the state alone), or a shard had no wait slot:
                # refused before anything was applied there. The update alone again (a duplicate where it was applied),
                # then the read as a lookup of the clock (with no state, nothing is stepped
                # here).
                refreshed, watermark = self.steps.update(updates, step, refresh)
                answer = UpdateAnswer(
                    refreshed, watermark, self.steps.lookup(read, clock=step)[0], {}
                )
        except Exception as error:
            error.add_note(f"(the update of step {step}, sent in the background)")
            raise
        if prefetch is not None:
            prefetch.staged = self._stage(answer.rows, f"the read with the update of step {step}")
        with self._stats_lock:
            for table, (ids, _) in updates.items():
                self._payload.rows_pushed += len(ids)
                self._payload.bytes_pushed += len(ids) * (8 + self._row_bytes(table))
            for table, (_, patch) in answer.refreshed.items():  # ids, positions: control
                self._payload.rows_pulled += len(patch)
                self._payload.bytes_pulled += len(patch) * self._row_bytes(table)
            self._count_pulled(read)
            for versions, state in answer.states.values():  # the rows' own state
                self._payload.bytes_pulled += versions.nbytes + state.nbytes
        return answer

    def _row_bytes(self, table: str) -> int:
        """Bytes of one of ``table``'s rows (or gradient rows) on the wire."""
        return self.steps.wire_dtype(table).itemsize * self.steps.client.dim(table)

    def _submit(
        self, pool: concurrent.futures.ThreadPoolExecutor, work, *args: Any
    ) -> concurrent.futures.Future:
        started = time.perf_counter()

        def timed():
            try:
                return work(*args)
            finally:
                with self._stats_lock:
                    self.timing.ps_time += time.perf_counter() - started

        return pool.submit(timed)

    def _wait(self, future: concurrent.futures.Future):
        """``future``'s result; but an update in flight that fails first raises at once,
        rather than after a lookup that can no longer be answered times out."""
        started = time.perf_counter()
        try:
            watched = {future, *self._updates.values()}
            while not future.done():
                done, watched = concurrent.futures.wait(
                    watched, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for update in done:
                    if update is not future and update.exception() is not None:
                        raise update.exception()
            return future.result()
        finally:
            self.timing.exposed_wait += time.perf_counter() - started


def same_requests(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    """Whether two ``{table: ids}`` requests ask for the same ids."""
    return left.keys() == right.keys() and all(
        left[t] is right[t] or torch.equal(left[t], right[t]) for t in left
    )
