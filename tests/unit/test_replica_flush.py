"""ReplicaFlushes: what a checkpoint waits for from replica jobs, and what they wait for."""

import threading
import time

import pytest
from ember.ps_server.errors import ClockTimeoutError, InvalidArgumentError, TooManyJobsError
from ember.ps_server.replica_flush import MAX_REPLICA_JOBS, ReplicaFlushes


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
    reporter, outcome = in_thread(lambda: flushes.flushed("a", "f1", 7, False, 30_000))
    spin_until(lambda: flushes.asked("a") == "")
    assert waiter.is_alive()  # b has not reported
    assert flushes.flushed("b", "", 3, True, 0) is False  # b ends: released, not waited for
    waiter.join(30)
    assert result == [{"a": 7}]
    assert flushes.at_pause("f1") == {"a": 7}
    assert reporter.is_alive()  # a's report is held: the checkpoint has not paused
    flushes.settle("f1", paused=True)
    reporter.join(30)
    assert outcome == [True]  # held until the pause, then told it happened
    assert flushes.at_pause("f1") == {"a": None}  # settled: its reports are dropped


def test_a_checkpoint_names_the_job_that_did_not_report_in_time():
    flushes = ReplicaFlushes()
    flushes.holds_replica("silent")
    flushes.holds_replica("quick")
    reporter, _ = in_thread(lambda: flushes.flushed("quick", "f1", 0, False, 30_000))
    started = time.monotonic()
    with pytest.raises(ClockTimeoutError, match=r"job\(s\) silent did not write") as error:
        flushes.request("f1", 200)
    assert "quick" not in str(error.value) and "--release-job" in str(error.value)
    assert time.monotonic() - started >= 0.2
    assert flushes.asked("silent") == ""  # the request is withdrawn
    assert flushes.at_pause("f1") == {"silent": None, "quick": 0}
    flushes.settle("f1", paused=False)  # the coordinator gives up: ResumeWrites
    reporter.join(30)


def test_a_report_that_comes_before_the_shards_request_counts():
    flushes = ReplicaFlushes()
    flushes.holds_replica("j")
    reporter, outcome = in_thread(lambda: flushes.flushed("j", "f1", 5, False, 30_000))
    spin_until(lambda: flushes.at_pause("f1") == {"j": 5})
    assert flushes.request("f1", 1) == {"j": 5}  # no wait: the report is in
    flushes.settle("f1", paused=True)
    reporter.join(30)
    assert outcome == [True]


def test_a_report_is_held_until_its_checkpoint_pauses_or_gives_up_or_its_wait_ends():
    flushes = ReplicaFlushes()
    flushes.settle("paused", paused=True)
    flushes.settle("abandoned", paused=False)
    assert flushes.flushed("j", "paused", 1, False, 30_000) is True
    assert flushes.flushed("j", "abandoned", 1, False, 30_000) is False
    started = time.monotonic()
    assert flushes.flushed("j", "never", 1, False, 200) is False  # the coordinator died
    assert time.monotonic() - started >= 0.2
    assert flushes.flushed("j", "", 1, False, 0) is False  # no checkpoint: not held
    assert flushes.flushed("j", "never", 1, True, 0) is False  # released: not held
    assert flushes.jobs() == []


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
        lambda: flushes.flushed("", "f1", 0, False, 1000),
        lambda: flushes.flushed("j", "f\n1", 0, False, 1000),
        lambda: flushes.flushed("j", "f1", -2, False, 1000),
        lambda: flushes.flushed("j", "f1", 0, False, 0),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert flushes.jobs() == []
    flushes.settle("x" * 200, paused=True)  # an unsound id is not remembered
    assert flushes.flushed("j", "", 0, False, 0) is False
    for k in range(MAX_REPLICA_JOBS):
        flushes.holds_replica(f"job-{k}")
    with pytest.raises(TooManyJobsError, match="release-job"):
        flushes.holds_replica("one-too-many")
    flushes.flushed("job-0", "", 0, True, 0)
    flushes.holds_replica("one-too-many")  # a released job's place is free
