"""ReplicaFlushes: what a checkpoint waits for from replica jobs, and what they wait for."""

import threading
import time

import pytest
from ember.ps_server.errors import ClockTimeoutError, InvalidArgumentError, TooManyJobsError
from ember.ps_server.replica_flush import ReplicaFlushes
from ember.ps_server.step_clocks import MAX_JOBS


def later(seconds: float) -> float:
    return time.monotonic() + seconds


def spin_until(ready) -> None:
    """Until ``ready()`` (state another thread sets), for at most 30 s."""
    deadline = later(30)
    while not ready():
        assert time.monotonic() < deadline, "timed out"


def in_thread(call) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def test_a_checkpoint_waits_for_every_replica_job_and_gets_their_clocks():
    flushes = ReplicaFlushes()
    flushes.holds_replica("a", later(1))
    flushes.holds_replica("b", later(1))
    waiter, result = in_thread(lambda: flushes.request("c1", 30_000))
    # Each job learns of the request from its next update's answer, until it reports.
    spin_until(lambda: flushes.asked("a") == "c1")
    assert flushes.asked("b") == "c1"
    reporter, outcome = in_thread(lambda: flushes.flushed("a", "c1", 7, False, 30_000))
    spin_until(lambda: flushes.asked("a") == "")
    assert flushes.flushed("b", "", 3, True, 1) is False  # b finishes: released, not waited for
    waiter.join(30)
    assert result == [{"a": 7}]
    assert reporter.is_alive()  # a's report is held: the checkpoint has not paused
    flushes.settle("c1", paused=True)
    reporter.join(30)
    assert outcome == [True]  # held until the pause, then told it happened
    assert flushes.jobs() == ["a"]


def test_a_checkpoint_names_the_jobs_that_did_not_report_in_time():
    flushes = ReplicaFlushes()
    flushes.holds_replica("silent", later(1))
    flushes.holds_replica("quick", later(1))
    flushes.flushed("quick", "c1", 0, True, 1)
    started = time.monotonic()
    with pytest.raises(ClockTimeoutError, match=r"job\(s\) silent did not write"):
        flushes.request("c1", 200)
    assert time.monotonic() - started >= 0.2
    assert flushes.asked("silent") == ""  # the request is withdrawn


def test_a_write_back_report_is_held_until_the_checkpoint_pauses_or_gives_up():
    flushes = ReplicaFlushes()
    flushes.settle("paused", paused=True)
    flushes.settle("abandoned", paused=False)
    assert flushes.flushed("j", "paused", 1, False, 30_000) is True
    assert flushes.flushed("j", "abandoned", 1, False, 30_000) is False
    started = time.monotonic()
    assert flushes.flushed("j", "never", 1, False, 200) is False  # the coordinator died
    assert time.monotonic() - started >= 0.2
    assert flushes.flushed("j", "", 1, False, 30_000) is False  # no checkpoint: not held
    assert flushes.flushed("j", "never", 1, True, 30_000) is False  # released: not held


def test_a_new_replica_job_waits_while_a_checkpoint_is_between_write_backs_and_pause():
    flushes = ReplicaFlushes()
    flushes.holds_replica("old", later(1))
    waiter, result = in_thread(lambda: flushes.request("c1", 30_000))
    spin_until(lambda: flushes.asked("old") == "c1")
    reporter, _ = in_thread(lambda: flushes.flushed("old", "c1", 4, False, 30_000))
    waiter.join(30)
    assert result == [{"old": 4}]
    flushes.holds_replica("old", later(0.001))  # known: never held
    started = time.monotonic()
    with pytest.raises(ClockTimeoutError, match="has not paused writes"):
        flushes.holds_replica("new", later(0.2))  # it was not asked to flush: no step yet
    assert time.monotonic() - started >= 0.2 and "new" not in flushes.jobs()
    flushes.settle("c1", paused=True)
    reporter.join(30)
    flushes.holds_replica("new", later(0.001))
    assert flushes.jobs() == ["new", "old"]


def test_a_window_whose_coordinator_died_closes_at_its_deadline():
    flushes = ReplicaFlushes()
    assert flushes.request("c1", 200) == {}  # no replica jobs: its window opens at once
    started = time.monotonic()
    flushes.holds_replica("new", later(30))
    assert 0.1 <= time.monotonic() - started < 10


def test_bad_requests_are_refused_before_anything_is_recorded():
    flushes = ReplicaFlushes()
    for call in (
        lambda: flushes.request("", 1000),
        lambda: flushes.request("c1", 0),
        lambda: flushes.request("c1", 3_600_001),
        lambda: flushes.flushed("", "c1", 0, False, 1000),
        lambda: flushes.flushed("j", "c\n1", 0, False, 1000),
        lambda: flushes.flushed("j", "c1", -2, False, 1000),
        lambda: flushes.flushed("j", "c1", 0, False, 0),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    assert flushes.jobs() == []
    for k in range(MAX_JOBS):
        flushes.holds_replica(f"job-{k}", later(1))
    with pytest.raises(TooManyJobsError, match="releases its place"):
        flushes.holds_replica("one-too-many", later(1))
