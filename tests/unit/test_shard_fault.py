"""The shard's fail-closed latch: which faults a supervised shard answers as a restart."""

import types

import pytest
from ember.ps_server.durability.journal import WriteJournal
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import (
    ShardFailedError,
    ShardRestartingError,
    Status,
    StoreCorruptError,
    StoreWriteUnknownError,
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


def test_a_fault_that_needs_an_operator_after_one_a_restart_repairs_keeps_the_shard_up():
    """A failed fsync as the log closes for the restart: the disk needs checking first."""
    fault = ShardFault()
    fault.supervise()
    fault.trip("redis restarted", restartable=True)
    assert fault.restarting
    fault.trip("fsync failed")
    refusal = _refusal(fault)
    assert type(refusal) is ShardFailedError and not fault.restarting
    assert "redis restarted" in fault.reason and "fsync failed" in fault.reason
    with pytest.raises(ValueError, match="after the fault tripped"):
        fault.supervise()


@pytest.mark.parametrize(
    "error, restarts",
    [(StoreWriteUnknownError("EXEC's reply was lost"), True),
     (StoreCorruptError("a row of the wrong size"), False)],
    ids=["outcome-unknown", "corrupt"],
)  # fmt: skip
def test_a_logged_write_the_store_failed_is_repaired_by_a_restart_only_if_not_corrupt(
    error, restarts
):
    """A write of unknown outcome is in the log: the restart rebuilds the rows with it once.
    A corrupt store is for an operator to look at first (a restart would wipe it)."""
    fault = ShardFault()
    fault.supervise()
    journal = WriteJournal()
    journal.log = types.SimpleNamespace(fault=fault, append=lambda parts: 1, sync=None)
    with pytest.raises(type(error)), journal.record(lambda: [b"record"]):
        raise error
    assert fault.restarting == restarts
    assert str(error) in fault.reason
