"""CallRetries: UNAVAILABLE answers that do not say the shard restarts count against
max_attempts; a shard that says it is restarting is waited for up to restart_patience_s,
and resets that count."""

from ember.ps_server.client.retries import CallRetries
from ember.ps_server.client.transport import TransportError
from ember.ps_server.errors import Status

UNREACHED = TransportError(Status.UNAVAILABLE, "connection refused")
RESTARTING = TransportError(Status.UNAVAILABLE, "recovering", restarting=True)


class Clock:
    """Seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tries_that_reach_no_shard_stop_at_max_attempts():
    call = CallRetries(max_attempts=3, restart_patience_s=60)
    assert [call.retry(UNREACHED) for _ in range(3)] == [True, True, False]
    assert call.gave_up(UNREACHED) == "gave up after 3 attempts"


def test_only_unavailable_is_retried():
    call = CallRetries(max_attempts=5, restart_patience_s=60)
    refused = TransportError(Status.FAILED_PRECONDITION, "the shard failed")
    assert not call.retry(refused)
    assert call.gave_up(refused) == ""


def test_a_restarting_shard_is_waited_for_until_the_patience_runs_out():
    clock = Clock()
    call = CallRetries(max_attempts=1, restart_patience_s=60, clock=clock)
    for _ in range(50):  # far more than max_attempts
        assert call.retry(RESTARTING) and call.restarting
        clock.now += 1.0
    clock.now += 9.999  # 59.999 s after the first restarting answer
    assert call.retry(RESTARTING)
    clock.now += 0.001
    assert not call.retry(RESTARTING)
    assert call.gave_up(RESTARTING) == (
        "still restarting after restart_patience_s = 60 s; gave up after 52 attempts"
    )


def test_a_shard_that_says_it_restarts_gets_max_attempts_again_to_come_back():
    """Its process is replaced between its answers: the tries that reach nothing while the
    new one starts each get the whole max_attempts, within the one patience."""
    clock = Clock()
    call = CallRetries(max_attempts=2, restart_patience_s=60, clock=clock)
    assert call.retry(UNREACHED) and not call.restarting
    assert call.retry(RESTARTING) and call.restarting  # alive: the count starts again
    assert call.retry(UNREACHED) and not call.restarting
    clock.now += 30
    assert call.retry(RESTARTING)
    assert call.retry(UNREACHED)
    assert not call.retry(UNREACHED)
    clock.now += 31  # the patience runs from the first restarting answer, not the last
    assert not call.retry(RESTARTING)


def test_no_patience_gives_up_at_the_first_restarting_answer():
    call = CallRetries(max_attempts=5, restart_patience_s=0)
    assert not call.retry(RESTARTING)
    assert call.gave_up(RESTARTING).startswith("still restarting")
    assert call.gave_up(RESTARTING).endswith("gave up after 1 attempt")
