"""The shard's fail-closed latch: which faults a supervised shard answers as a restart."""

import pytest
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import (
    ShardFailedError,
    ShardRestartingError,
    Status,
    status_for,
)


def _refusal(fault: ShardFault) -> ShardFailedError:
    with pytest.raises(ShardFailedError) as refused:
        fault.check()
    return refused.value


def test_a_fault_a_restart_repairs_is_answered_as_a_restart_only_where_supervised():
    unsupervised = ShardFault()
    unsupervised.trip("redis restarted", restartable=True)
    refusal = _refusal(unsupervised)
    assert type(refusal) is ShardFailedError and not unsupervised.restarting
    assert status_for(refusal) == Status.FAILED_PRECONDITION  # nobody restarts it: refused

    supervised = ShardFault()
    supervised.supervise()
    supervised.check()  # serving: nothing raised
    assert not supervised.restarting
    supervised.trip("redis restarted", restartable=True)
    refusal = _refusal(supervised)
    assert isinstance(refusal, ShardRestartingError) and supervised.restarting
    assert status_for(refusal) == Status.UNAVAILABLE  # clients retry through the restart
    assert "redis restarted" in str(refusal)


def test_a_fault_a_restart_does_not_repair_is_refused_even_where_supervised():
    fault = ShardFault()
    fault.supervise()
    fault.trip("fsync failed")  # not restartable unless said so
    refusal = _refusal(fault)
    assert type(refusal) is ShardFailedError and not fault.restarting
    assert status_for(refusal) == Status.FAILED_PRECONDITION


def test_the_first_fault_decides_and_listeners_hear_it_once():
    heard = []
    fault = ShardFault()
    fault.supervise()
    fault.on_trip(heard.append)
    fault.trip("another process took the shard")
    fault.trip("redis restarted", restartable=True)  # later: ignored
    assert not fault.restarting and heard == ["another process took the shard"]
    fault.on_trip(heard.append)  # registered after the trip: told at once
    assert heard == ["another process took the shard"] * 2
