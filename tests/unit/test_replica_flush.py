"""ReplicaFlushes: what a checkpoint waits for from replica jobs, and what they wait for."""

import threading
import time

import pytest
from ember.ps_server.errors import (
    CallEndedError,
    ClockTimeoutError,
    InvalidArgumentError,
    ReplicaReleasedError,
    TooManyJobsError,
    TooManyWaitingError,
)
from ember.ps_server.shard.call_watch import CallWatch
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.replica_flush import MAX_ASKING, MAX_REPLICA_JOBS, ReplicaFlushes
from ember.ps_server.shard.server import parameter_server_for
from ember.ps_server.shard.waits import WaitSlots


def spin_until(ready) -> None:
    """Until ``ready()`` (state another thread sets), for at most 30 s."""
    deadline = time.monotonic() + 30
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0)  # let the other thread run


def in_thread(call) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def test_a_checkpoint_waits_for_every_replica_job_and_their_reports_wait_for_the_pause():
    flushes = ReplicaFlushes()
    flushes.holds_replica("a")
    flushes.holds_replica("b")
    waiter, result = in_thread(lambda: flushes.request("f1", 30_000))
    # Each job learns of the request from its next update's answer, until it reports.
    spin_until(lambda: flushes.asked("a") == "f1")
    assert flushes.asked("b") == "f1"
    reporter, outcome = in_thread(lambda: flushes.flushed("a", "f1", 7, 30_000))
    spin_until(lambda: flushes.asked("a") == "")
    assert waiter.is_alive()  # b has not reported
    flushes.release("b")  # b ends: released, not waited for
    waiter.join(30)
    assert result == [{"a": 7}]
    assert flushes.unflushed("f1", {"a": [7, 7]}) == []
    assert reporter.is_alive()  # a's report is held: the checkpoint has not paused
    flushes.settle("f1", paused=True)
    reporter.join(30)
    assert outcome == [True]  # held until the pause, then told it happened
    assert flushes.unflushed("f1", {"a": [7, 7]}) != []  # settled: its reports are dropped


def test_a_checkpoint_names_the_job_that_did_not_report_in_time():
    flushes = ReplicaFlushes()
    flushes.holds_replica("silent")
    flushes.holds_replica("quick")
    reporter, _ = in_thread(lambda: flushes.flushed("quick", "f1", 0, 30_000))
    started = time.monotonic()
    with pytest.raises(ClockTimeoutError, match=r"job\(s\) silent did not report") as error:
        flushes.request("f1", 200)
    assert "quick" not in str(error.value) and "--release-job" in str(error.value)
    assert time.monotonic() - started >= 0.2
    assert flushes.asked("silent") == ""  # the request is withdrawn
    assert flushes.unflushed("f1", {"silent": [-1], "quick": [0]}) == []  # silent applied none
    flushes.settle("f1", paused=False)  # the coordinator gives up: ResumeWrites
    reporter.join(30)


def test_a_report_that_comes_before_the_shards_request_counts():
    flushes = ReplicaFlushes()
    flushes.holds_replica("j")
    reporter, outcome = in_thread(lambda: flushes.flushed("j", "f1", 5, 30_000))
    spin_until(lambda: flushes.unflushed("f1", {"j": [5]}) == [])
    assert flushes.request("f1", 1) == {"j": 5}  # no wait: the report is in
    flushes.settle("f1", paused=True)
    reporter.join(30)
    assert outcome == [True]


def test_a_report_is_held_until_its_checkpoint_pauses_or_gives_up_or_its_wait_ends():
    flushes = ReplicaFlushes()
    flushes.settle("paused", paused=True)
    flushes.settle("abandoned", paused=False)
    assert flushes.flushed("j", "paused", 1, 30_000) is True
    assert flushes.flushed("j", "abandoned", 1, 30_000) is False
    started = time.monotonic()
    assert flushes.flushed("j", "never", 1, 200) is False  # the coordinator died
    assert time.monotonic() - started >= 0.2
    assert flushes.flushed("j", "", 1, 0) is False  # no checkpoint: not held
    assert flushes.jobs() == ["j"]  # its reports counted it


def test_a_flush_id_is_used_once():
    flushes = ReplicaFlushes()
    assert flushes.request("f1", 1000) == {}
    flushes.settle("f1", paused=True)
    with pytest.raises(InvalidArgumentError, match="was used before"):
        flushes.request("f1", 1000)


def test_bad_requests_are_refused_before_anything_is_recorded():
    flushes = ReplicaFlushes()
    for call in (
        lambda: flushes.request("", 1000),
        lambda: flushes.request("f1", 0),
        lambda: flushes.request("f1", 3_600_001),
        lambda: flushes.flushed("", "f1", 0, 1000),
        lambda: flushes.flushed("j", "f\n1", 0, 1000),
        lambda: flushes.flushed("j", "f1", -2, 1000),
        lambda: flushes.flushed("j", "f1", 0, 0),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert flushes.jobs() == []
    flushes.settle("x" * 200, paused=True)  # an unsound id is not remembered
    assert flushes.flushed("j", "", 0, 0) is False
    for k in range(MAX_REPLICA_JOBS):
        flushes.holds_replica(f"job-{k}")
    with pytest.raises(TooManyJobsError, match="release-job"):
        flushes.holds_replica("one-too-many")
    flushes.release("job-0")
    flushes.holds_replica("one-too-many")  # a released job's place is free


def test_at_the_pause_every_replica_job_that_applied_a_clock_must_be_at_its_report():
    flushes = ReplicaFlushes()
    for job in ("at-flush", "went-on", "late", "idle"):
        flushes.holds_replica(job)
    for job, clock in (("at-flush", 4), ("went-on", 4)):
        in_thread(lambda job=job, clock=clock: flushes.flushed(job, "f1", clock, 1))[0].join(30)
    problems = flushes.unflushed(
        "f1", {"at-flush": [4, 4], "went-on": [5, 4], "late": [0], "idle": [-1, -1]}
    )
    assert len(problems) == 2
    assert "'went-on' wrote its hot-row replicas back after clock 4" in problems[0]
    assert "'late' holds hot-row replicas" in problems[1] and "did not write" in problems[1]


def test_a_released_job_cannot_hold_replicas_again_and_a_snapshot_keeps_that():
    flushes = ReplicaFlushes()
    flushes.holds_replica("done")
    flushes.holds_replica("live")
    flushes.release("done")
    with pytest.raises(ReplicaReleasedError, match="new job name"):
        flushes.holds_replica("done")
    with pytest.raises(ReplicaReleasedError):
        flushes.flushed("done", "f1", 0, 1000)
    restored = ReplicaFlushes()
    restored.restore(flushes.snapshot())
    assert restored.jobs() == ["live"]
    with pytest.raises(ReplicaReleasedError):
        restored.holds_replica("done")
    restored.holds_replica("done", replaying=True)  # a logged Update from before the release


def _raised(call) -> Exception | None:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - handed to the test
        return error
    return None


def test_a_checkpoint_or_report_whose_caller_went_away_stops_waiting_and_frees_its_slot():
    slots = WaitSlots(4)
    flushes = ReplicaFlushes(slots)
    flushes.holds_replica("a")
    asking, report = CallWatch(), CallWatch()
    waiter, error = in_thread(lambda: _raised(lambda: flushes.request("f1", 600_000, asking)))
    spin_until(lambda: flushes.asked("a") == "f1")
    asking.end()  # the checkpoint's coordinator died
    waiter.join(30)
    assert isinstance(error[0], CallEndedError)
    assert flushes.asked("a") == ""  # the job is no longer asked
    reporter, paused = in_thread(
        lambda: _raised(lambda: flushes.flushed("a", "f2", 3, 600_000, report))
    )
    spin_until(lambda: slots.taken == 1)  # the report is held, in a wait slot
    report.end()  # the job's trainer died while its report was held
    reporter.join(30)
    assert isinstance(paused[0], CallEndedError) and slots.taken == 0


def test_a_held_report_takes_a_wait_slot_and_the_checkpoint_asking_for_it_none():
    """Each held report holds a worker thread, so it waits in one of the shard's wait slots;
    the checkpoint that asks does not, so a shard with one slot still completes a flush. A
    report with no slot free is recorded but not held (the job goes on, and the checkpoint
    then refuses its clocks)."""
    slots = WaitSlots(1)
    flushes = ReplicaFlushes(slots)
    flushes.holds_replica("a")
    waiter, result = in_thread(lambda: flushes.request("f1", 600_000))
    spin_until(lambda: flushes.asked("a") == "f1")
    reporter, paused = in_thread(lambda: flushes.flushed("a", "f1", 3, 600_000))
    waiter.join(30)
    assert result == [{"a": 3}]
    spin_until(lambda: slots.taken == 1)
    flushes.settle("f1", paused=True)
    reporter.join(30)
    assert paused == [True] and slots.taken == 0
    slots.take("a clock")  # every slot is taken
    assert flushes.flushed("a", "f2", 4, 600_000) is False  # at once: not held
    assert flushes.unflushed("f2", {"a": [4]}) == []  # but recorded
    slots.give()


@pytest.mark.parametrize("max_asking", [1, MAX_ASKING])
def test_at_most_a_few_checkpoints_ask_for_write_backs_at_once(max_asking):
    flushes = ReplicaFlushes(WaitSlots(1), max_asking)
    flushes.holds_replica("a")
    calls = [CallWatch() for _ in range(max_asking)]
    waiters = [
        in_thread(lambda n=n: _raised(lambda: flushes.request(f"f{n}", 600_000, calls[n])))
        for n in range(max_asking)
    ]
    try:
        spin_until(lambda: len(flushes.asking()) == max_asking)
        with pytest.raises(TooManyWaitingError, match=f"{max_asking} checkpoint.s. already wait"):
            flushes.request("one-more", 50)  # refused, not timed out
        assert len(flushes.asking()) == max_asking  # the refused one asked nothing
    finally:
        for call in calls:
            call.end()
    for thread, raised in waiters:
        thread.join(30)
        assert isinstance(raised[0], CallEndedError)
    assert flushes.asking() == []
    reporter = in_thread(lambda: flushes.flushed("a", "fresh", 3, 30_000))
    assert flushes.request("fresh", 30_000) == {"a": 3}  # room again
    flushes.settle("fresh", paused=False)
    reporter[0].join(30)
    assert reporter[1] == [False]


def test_a_shard_process_sizes_its_waits_from_its_workers():
    server = parameter_server_for(ShardConfig(workers=8))
    assert server.steps.clocks.slots.limit == 5
    flushes = server.steps.replicas
    flushes.holds_replica("a")
    call = CallWatch()
    asking = in_thread(lambda: _raised(lambda: flushes.request("f1", 600_000, call)))
    try:
        spin_until(lambda: flushes.asking() == ["f1"])
        with pytest.raises(TooManyWaitingError, match="1 checkpoint.s. already wait"):
            flushes.request("f2", 50)
    finally:
        call.end()
    asking[0].join(30)
    assert isinstance(asking[1][0], CallEndedError)
