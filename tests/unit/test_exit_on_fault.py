"""--exit-on-fault's decisions: whether a faulted shard exits for its supervisor, and with
what status."""

import errno
import os
import types

import pytest
from ember.ps_server.durability import write_log
from ember.ps_server.durability.fault_exits import MAX_FAULT_EXITS
from ember.ps_server.durability.journal import WriteJournal
from ember.ps_server.errors import ShardRestartingError, WriteLogLockedError
from ember.ps_server.shard import shard_server
from ember.ps_server.shard.config import EXIT_ON_FAULT, ShardConfig

from tests.support.write_logs import open_log


def _faulted_shard(directory) -> types.SimpleNamespace:
    """A shard with its log in ``directory``, stopped on a fault a restart repairs."""
    log = open_log(directory)
    log.fault.supervise()
    log.append(b"appended before the fault, not yet synced")
    log.fault.trip("redis restarted", restartable=True)
    journal = WriteJournal()
    journal.log = log
    return types.SimpleNamespace(logic=types.SimpleNamespace(fault=log.fault, journal=journal))


def test_a_shard_past_its_budget_of_fault_exits_stays_up(tmp_path):
    config = ShardConfig(wal=str(tmp_path / "budget"))
    (tmp_path / "budget").mkdir()
    decisions = []
    for k in range(MAX_FAULT_EXITS + 1):
        shard = _faulted_shard(tmp_path / f"log-{k}")
        decisions.append(shard_server._exits_for_restart(shard, config))
        shard.logic.journal.close()
    assert decisions == [True] * MAX_FAULT_EXITS + [False]
    assert "not restarting again" in shard.logic.fault.reason and not shard.logic.fault.restarting


def test_a_fault_a_restart_repairs_as_the_shard_starts_exits_within_the_budget(
    tmp_path, monkeypatch
):
    """Recovery may meet the fault (the marker lost while it rebuilds): exit 75, but no more
    often than the budget, after which the shard waits for an operator (any exit would
    have its supervisor start it again)."""

    def start(config):
        raise ShardRestartingError("this shard is restarting to rebuild its rows: redis went")

    waited = []
    monkeypatch.setattr(shard_server.ShardServer, "start", start)
    monkeypatch.setattr(shard_server, "_on_signals", lambda stop: None)
    monkeypatch.setattr(
        shard_server, "_wait_for_an_operator", lambda stop, reason: waited.append(reason) or 1
    )
    config = ShardConfig(wal=str(tmp_path), exit_on_fault=True)
    statuses = [shard_server.serve_until_signalled(config) for _ in range(4)]
    assert statuses == [EXIT_ON_FAULT] * 3 + [1]
    assert len(waited) == 1 and "redis went" in waited[0] and "not restarting" in waited[0]


def test_the_log_closed_for_a_restart_covers_a_request_waiting_to_sync_and_stays_locked(
    tmp_path,
):
    """The main loop closes the log while request threads still run: one whose record it
    appended before the fault, now waiting to sync, hears the restart (UNAVAILABLE, retried;
    the record is durable), not an error from a closed file; the log stays locked."""
    shard = _faulted_shard(tmp_path)
    log, journal = shard.logic.journal.log, shard.logic.journal
    ticket = log._appended  # the record appended before the fault
    assert log._synced < ticket
    assert shard_server._exits_for_restart(shard, ShardConfig(wal=str(tmp_path)))
    with pytest.raises(ShardRestartingError):
        log._fsync_appended()  # as sync() does for a request that checked before the trip
    assert log._synced >= ticket
    with pytest.raises(WriteLogLockedError):
        open_log(tmp_path)
    journal.close()  # as ShardServer.stop does: now it lets go
    open_log(tmp_path).close()


def test_an_fsync_that_fails_as_the_log_closes_for_a_restart_keeps_the_shard_up(
    tmp_path, monkeypatch
):
    shard = _faulted_shard(tmp_path)
    log = shard.logic.journal.log

    def fail(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(write_log.os, "fsync", fail)
    assert not shard_server._exits_for_restart(shard, ShardConfig(wal=str(tmp_path)))
    assert not log.fault.restarting and "Input/output error" in log.fault.reason
