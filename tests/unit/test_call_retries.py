"""CallRetries: UNAVAILABLE answers that do not say the shard restarts count against
max_attempts over the whole call; a shard that says it is restarting is waited for up to
restart_patience_s from its first such answer."""

import doctest

from ember.ps_server.client import retries
from ember.ps_server.client.retries import CallRetries
from ember.ps_server.client.transport import TransportError
from ember.ps_server.errors import Status

from tests.support.manual_clock import ManualClock

UNREACHED = TransportError(Status.UNAVAILABLE, "connection refused")
RESTARTING = TransportError(Status.UNAVAILABLE, "recovering", restarting=True)


def test_the_example_holds():
    assert doctest.testmod(retries).failed == 0


def test_tries_that_reach_no_shard_stop_at_max_attempts():
    call = CallRetries(max_attempts=3, restart_patience_s=60)
    assert [call.retry(UNREACHED) for _ in range(3)] == [True, True, False]
    assert call.gave_up(UNREACHED) == "gave up after 3 attempts (max_attempts)"


def test_only_unavailable_is_retried():
    call = CallRetries(max_attempts=5, restart_patience_s=60)
    refused = TransportError(Status.FAILED_PRECONDITION, "the shard failed")
    assert not call.retry(refused)
    assert call.gave_up(refused) == ""


def test_a_restarting_shard_is_waited_for_until_the_patience_runs_out():
    clock = ManualClock()
    call = CallRetries(max_attempts=1, restart_patience_s=60, clock=clock)
    for _ in range(50):  # far more than max_attempts
        assert call.retry(RESTARTING) and call.restarting
        clock.now += 1.0
    clock.now += 9.999  # 59.999 s after the first restarting answer
    assert call.retry(RESTARTING)
    clock.now += 0.001
    assert not call.retry(RESTARTING)
    assert call.gave_up(RESTARTING) == (
        "still restarting after restart_patience_s = 60 s; 52 attempts"
    )


def test_a_shard_that_fails_at_every_start_runs_out_of_max_attempts():
    """Its restarting answers do not give the tries that reach nothing a new budget, and the
    patience runs from the first restarting answer, not the last."""
    clock = ManualClock()
    call = CallRetries(max_attempts=3, restart_patience_s=60, clock=clock)
    assert call.retry(UNREACHED) and not call.restarting
    assert call.retry(RESTARTING) and call.restarting
    assert call.retry(UNREACHED) and not call.restarting
    clock.now += 30
    assert call.retry(RESTARTING)
    assert not call.retry(UNREACHED)  # the third, over the whole call
    assert call.gave_up(UNREACHED) == (
        "gave up after 3 attempts (max_attempts), 5 with those of a restarting shard"
    )
    later = CallRetries(max_attempts=3, restart_patience_s=60, clock=clock)
    assert later.retry(RESTARTING)
    clock.now += 30
    assert later.retry(RESTARTING)
    clock.now += 31
    assert not later.retry(RESTARTING)


def test_no_patience_gives_up_at_the_first_restarting_answer():
    call = CallRetries(max_attempts=5, restart_patience_s=0)
    assert not call.retry(RESTARTING)
    assert call.gave_up(RESTARTING) == (
        "still restarting after restart_patience_s = 0 s; 1 attempt"
    )
