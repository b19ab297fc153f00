"""Waits on one shard's clocks, in process: requests that give up, callers that go away,
retries that take an update over, checkpoints that hold a clock's write, and a clock too
large to log."""

import numpy as np
import pytest
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import (
    CallEndedError,
    ClockTimeoutError,
    ClockTooLargeError,
    Status,
    SupersededError,
    status_for,
)
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import pb

from tests.support.steps_in_process import (
    ADAM,
    clock,
    in_thread,
    lookup,
    reference_rows,
    shard,
    update,
)  # fmt: skip


def test_an_update_that_gave_up_waiting_is_withdrawn_and_never_applied():
    server = shard()
    with pytest.raises(ClockTimeoutError):
        update(server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=50)
    late, result = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=1, wait_ms=300)
    late.join(30)
    assert isinstance(result.get("error"), ClockTimeoutError)  # rank 0's update is gone
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [0]
    assert server.steps.clocks.job(clock(0)).pending == {}


def test_an_update_whose_caller_is_gone_stops_waiting_at_once_and_is_withdrawn():
    server = shard()
    call = CallWatch()
    waiting = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0, call=call)
    job = server.steps.clocks.job(clock(0))
    assert job.await_waiters(1, 30)
    call.end()
    waiting[0].join(10)
    error = waiting[1].get("error")
    assert isinstance(error, CallEndedError) and status_for(error) == Status.CANCELLED
    assert job.pending == {} and job.waiters == 0
    assert job.slots.taken == 0
    with pytest.raises(CallEndedError):  # gone before it arrived: nothing is buffered
        update(server, 0, [4], np.ones((1, 3)), rank=0, call=call)
    assert job.pending == {}


def test_a_caller_gone_while_its_clock_is_written_stops_waiting_and_the_clock_applies():
    """Clock 0 is complete, its write held by a checkpoint's pause: rank 0's caller going
    away ends its wait (no spin until the pause ends), and the clock is still applied."""
    server = shard()
    server.gate.pause("c1", 60)
    call = CallWatch()
    try:
        gone = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0, call=call)
        assert server.steps.clocks.job(clock(0)).await_waiters(1, 30)
        completing = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=1)
        assert server.gate.await_held(1, 30)
        call.end()
        gone[0].join(10)
        assert not gone[0].is_alive() and isinstance(gone[1].get("error"), CallEndedError)
    finally:
        server.gate.resume("c1")
    completing[0].join(30)
    assert completing[1]["value"][0] is False
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [1]


def test_a_retry_takes_the_update_over_from_the_attempt_still_waiting():
    """The client retried rank 0's update while the first attempt still waited on the shard
    (its connection broke): the first attempt stops waiting, the retry holds the buffered
    update, and rank 1's update completes the clock, applied once."""
    server = shard()
    first = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=30_000)
    job = server.steps.clocks.job(clock(0))
    assert job.await_waiters(1, 30)
    retry = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=30_000)
    first[0].join(10)
    error = first[1].get("error")
    assert isinstance(error, SupersededError) and status_for(error) == Status.ABORTED
    assert job.await_waiters(1, 30) and retry[0].is_alive()
    assert update(server, 0, [4], np.ones((1, 3)), rank=1, wait_ms=2_000)[0] is False
    retry[0].join(30)
    assert retry[1]["value"][0] is False  # applied, the retry told so
    rows, _ = lookup(server, [4])
    np.testing.assert_allclose(rows, reference_rows([4], [np.full((1, 3), 2.0)]), rtol=1e-5)


def test_a_retry_that_gives_up_withdraws_the_update_the_first_attempt_waited_with():
    """One wait slot, held by the first attempt: the retry still waits (the first leaves and
    gives its slot back), and when the retry times out the update is withdrawn, as it was
    told: rank 1's update of the clock then waits for rank 0 in vain."""
    server = ParameterServer(0, 1, max_waiting=1)
    server.create_table(ADAM)
    first = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=30_000)
    job = server.steps.clocks.job(clock(0))
    assert job.await_waiters(1, 30)
    with pytest.raises(ClockTimeoutError):
        update(server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=200)
    first[0].join(10)
    assert isinstance(first[1].get("error"), SupersededError)
    assert job.pending == {} and job.owners == {} and job.slots.taken == 0
    with pytest.raises(ClockTimeoutError, match="rank"):
        update(server, 0, [4], np.ones((1, 3)), rank=1, wait_ms=200)
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [0]


def test_lookups_go_on_while_a_checkpoint_holds_a_clock_being_applied():
    server = shard()
    server.gate.pause("c1", 60)
    ranks = [in_thread(update, server, 0, [4], np.ones((1, 3)), rank=r) for r in (0, 1)]
    try:
        assert server.gate.await_held(1, 30)  # the clock's write waits for the checkpoint
        reader, looked = in_thread(lookup, server, [4], step=-1)  # the same job
        reader.join(30)
        assert "value" in looked, "a lookup was blocked behind a write held by a checkpoint"
        rows, watermark = looked["value"]
        assert watermark == -1
        np.testing.assert_array_equal(rows, initial_rows(ADAM, np.array([4])).numpy())
    finally:
        server.gate.resume("c1")
    for thread, result in ranks:
        thread.join(30)
        assert result["value"][0] is False
    assert lookup(server, [4], step=0)[1] == 0


def test_a_wait_that_times_out_while_its_clock_is_written_keeps_waiting():
    server = shard()
    server.gate.pause("c1", 60)
    try:
        ranks = [
            in_thread(update, server, 0, [4], np.ones((1, 3)), rank=r, wait_ms=200) for r in (0, 1)
        ]
        assert server.gate.await_held(1, 30)  # clock 0 is complete; its write is held
        job = server.steps.clocks.job(clock(0, wait_ms=200))
        assert job.await_waiters(1, 30)  # the other rank waits on it, past its 200 ms
        ranks[0][0].join(0.5)
        ranks[1][0].join(0.5)
        assert all("error" not in result for _, result in ranks)  # told nothing false
    finally:
        server.gate.resume("c1")
    for thread, result in ranks:
        thread.join(30)
        assert result["value"][0] is False  # applied, and both ranks were told so
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [1]


def test_a_retry_that_finds_its_clock_being_written_waits_even_without_a_free_slot():
    """The clock is complete and its write held by a checkpoint's pause: a retry of the
    update that completed it (its connection broke during the write) must wait for the
    write (it will be applied), not be refused, even with every wait slot taken."""
    server = ParameterServer(0, 1, max_waiting=2)
    server.create_table(ADAM)
    server.gate.pause("c1", 60)
    try:
        first = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0)
        job = server.steps.clocks.job(clock(0))
        assert job.await_waiters(1, 30)
        other = in_thread(lookup, server, [4], step=0, mode=pb.ASYNC, job="job-b")
        assert server.steps.clocks.job(clock(0, mode=pb.ASYNC, job="job-b")).await_waiters(1, 30)
        completing = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=1)
        assert server.gate.await_held(1, 30)  # clock 0 is complete; its write is held
        retry = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=1)
        assert job.await_waiters(2, 30)  # the retry waits, though both slots are taken
    finally:
        server.gate.resume("c1")
    for thread, result in (first, completing, retry):
        thread.join(30)
        assert "error" not in result, result
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [1]
    for rank in (0, 1):
        update(server, 0, [4], np.ones((1, 3)), rank=rank, mode=pb.ASYNC, job="job-b")
    other[0].join(30)
    assert other[1]["value"][1] == 0


def _logged_shard(tmp_path, max_clock_bytes: int) -> tuple[ParameterServer, WriteLog]:
    server = shard()
    write_log = WriteLog(tmp_path / "wal", 0, 1, "always")
    write_log.claim()
    write_log.open()
    server.journal.log = write_log
    server.steps.max_logged_clock_bytes = max_clock_bytes
    return server, write_log


def test_a_clock_too_large_for_one_log_record_is_refused_to_every_rank_and_applies_nothing(
    tmp_path,
):
    """Under a write-ahead log an exact clock is one record; one larger than a record holds
    (protobuf's 2 GiB, shrunk here) is refused to every rank, at once and by name, and the
    job goes no further, instead of the clock staying complete and failing at every try.
    Whatever waited on it, or was buffered past it, is told and let go."""
    server, write_log = _logged_shard(tmp_path, 60)  # each rank sends 2 ids, 2 rows: 40 bytes
    try:
        ids, grads = [4, 5], np.ones((2, 3))
        job = server.steps.clocks.job(clock(0))
        waiting = [
            in_thread(update, server, 0, [6, 7], grads, rank=0),
            in_thread(update, server, 1, [6, 7], grads, rank=0),  # buffered a clock ahead
            in_thread(lookup, server, ids, step=0, rank=1),
        ]
        assert job.await_waiters(3, 30)
        with pytest.raises(ClockTooLargeError, match="clock 0 of job 'job-a' sums to 80 b") as info:
            update(server, 0, ids, grads, rank=1)
        assert status_for(info.value) == Status.RESOURCE_EXHAUSTED
        for thread, result in waiting:
            thread.join(10)
            assert isinstance(result.get("error"), ClockTooLargeError), result
        assert job.pending == {} and job.waiters == 0 and job.slots.taken == 0
        for refused in (
            lambda: update(server, 0, ids, grads, rank=1),  # a retry
            lambda: update(server, 1, ids, grads, rank=1),  # the next clock
            lambda: update(server, 2_000, ids, grads, rank=1),  # far ahead: refused all the same
            lambda: lookup(server, ids, step=0),
            lambda: lookup(server, ids, step=2_000),  # far past the watermark: refused first
        ):
            with pytest.raises(ClockTooLargeError):
                refused()
        versions = server.pull("emb", np.array([4, 5, 6, 7], "<i8").tobytes()).versions
        assert versions.tolist() == [0, 0, 0, 0]
        records = [pb.LogRecord.FromString(r) for r in write_log.replay()]
        assert [r.WhichOneof("entry") for r in records] == []
    finally:
        write_log.close()


def test_a_refused_job_forgotten_as_idle_comes_back_refused(tmp_path):
    from ember.ps_server.shard import step_clocks

    server, write_log = _logged_shard(tmp_path, 60)
    try:
        first = in_thread(update, server, 0, [6, 7], np.ones((2, 3)), rank=0)
        assert server.steps.clocks.job(clock(0)).await_waiters(1, 30)
        with pytest.raises(ClockTooLargeError):
            update(server, 0, [4, 5], np.ones((2, 3)), rank=1)
        first[0].join(10)
        for n in range(step_clocks.MAX_JOBS):  # newer jobs push it out
            server.steps.clocks.job(clock(0, world=1, job=f"other-{n}"))
        assert "job-a" not in server.steps.clocks.applied_by_job()
        with pytest.raises(ClockTooLargeError):
            update(server, 0, [4], np.ones((1, 3)), rank=1, wait_ms=2_000)  # small: refused
        assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [0]
    finally:
        write_log.close()
