"""FanOut: outcomes in order, a close that ends every waiting caller, and a client pool that
runs every fan-out a trainer's pipeline may have in flight at once."""

import threading

import pytest
from ember.ps_server.client.fanout import FanOut, FanOutClosedError
from ember.ps_server.client.shard_rpc import fan_out_threads
from ember.trainer.pipeline import MAX_STALENESS


def test_outcomes_come_back_in_call_order_with_errors_handed_back():
    def fail():
        raise KeyError("no")

    with FanOut(2) as fan_out:
        outcomes = fan_out.run([lambda: 1, fail, lambda: 3])
    assert [result for result, _ in outcomes] == [1, None, 3]
    assert [type(error) for _, error in outcomes] == [type(None), KeyError, type(None)]


def test_close_ends_a_caller_whose_calls_wait_for_a_thread():
    """One thread, held by the first call: the caller waits on two queued calls. Closing
    must end it (queued calls are cancelled, and a cancelled future does not wake
    as_completed by itself), or a failed trainer never exits."""
    fan_out = FanOut(1)
    caller, outcomes, release = _caller_behind_a_held_call(fan_out, [lambda: 2, lambda: 3])
    fan_out.close()
    release.set()  # the running call finishes; the queued ones never start
    caller.join(timeout=10)
    assert not caller.is_alive(), "close left the caller waiting"
    assert outcomes[0] == ("held", None)
    assert all(isinstance(error, FanOutClosedError) for _, error in outcomes[1:])


@pytest.mark.parametrize("calls", [1, 2])
def test_calls_after_close_are_refused_with_the_closed_error(calls):
    fan_out = FanOut(2)
    fan_out.close()
    fan_out.close()  # a second close is harmless
    outcomes = fan_out.run([lambda: 1] * calls)
    assert all(isinstance(error, FanOutClosedError) for _, error in outcomes)


def test_closing_twice_while_a_caller_still_waits_is_harmless():
    fan_out = FanOut(1)
    caller, outcomes, release = _caller_behind_a_held_call(fan_out, [lambda: 2])
    fan_out.close()
    fan_out.close()
    release.set()
    caller.join(timeout=10)
    assert outcomes[0] == ("held", None) and isinstance(outcomes[1][1], FanOutClosedError)


def test_a_client_pool_runs_every_fan_out_of_a_pipeline_at_its_largest_staleness_at_once():
    """s+1 updates and a lookup in flight, each a call to every shard, and one more caller:
    all must run at once (an update parks on the shards until other ranks catch up, so a
    call queued behind it for a thread could stall every rank)."""
    shards, callers = 3, MAX_STALENESS + 3
    everyone = threading.Barrier(shards * callers, timeout=30)

    def call():
        everyone.wait()
        return True

    with FanOut(fan_out_threads(shards)) as fan_out:
        results = []
        threads = [
            threading.Thread(target=lambda: results.extend(fan_out.run([call] * shards)))
            for _ in range(callers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert results == [(True, None)] * (shards * callers)


def _caller_behind_a_held_call(fan_out: FanOut, queued: list):
    """A thread running ``fan_out.run([held, *queued])`` once ``held`` holds the pool's one
    thread: the thread, the list its outcomes go to, and the event that lets ``held`` end."""
    started, release = threading.Event(), threading.Event()
    outcomes = []

    def held():
        started.set()
        assert release.wait(timeout=30)
        return "held"

    caller = threading.Thread(target=lambda: outcomes.extend(fan_out.run([held, *queued])))
    caller.start()
    assert started.wait(timeout=10)
    return caller, outcomes, release
