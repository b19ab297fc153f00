"""--exit-on-fault's decisions: whether a faulted shard exits for its supervisor, and with
what status."""

import argparse
import types

import pytest
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import ShardRestartingError
from ember.ps_server.shard import shard_server
from ember.ps_server.shard.config import EXIT_ON_FAULT, ShardConfig

from ember.cli import ps_cmd


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    """The flags alone decide (EMBER_* variables would give settings too)."""
    for name in ("EMBER_WAL", "EMBER_EXIT_ON_FAULT"):
        monkeypatch.delenv(name, raising=False)


class Journal:
    """A journal whose close may fail its fsync, as WriteLog.close reports one: by tripping
    the fault with a reason a restart does not repair."""

    def __init__(self, fault: ShardFault, fsync_fails: bool) -> None:
        self.fault, self.fsync_fails, self.closed = fault, fsync_fails, False

    def close(self) -> None:
        self.closed = True
        if self.fsync_fails:
            self.fault.trip("fsync of the write-ahead log failed")


def _faulted_shard(fsync_fails: bool = False) -> types.SimpleNamespace:
    fault = ShardFault()
    fault.supervise()
    fault.trip("redis restarted", restartable=True)
    logic = types.SimpleNamespace(fault=fault, journal=Journal(fault, fsync_fails))
    return types.SimpleNamespace(logic=logic)


def test_a_shard_exits_for_a_restart_once_its_log_is_durable(tmp_path):
    shard = _faulted_shard()
    assert shard_server._exits_for_restart(shard, ShardConfig(wal=str(tmp_path)))
    assert shard.logic.journal.closed and shard.logic.fault.restarting


def test_a_failed_fsync_as_the_log_closes_keeps_the_shard_up_for_an_operator(tmp_path):
    shard = _faulted_shard(fsync_fails=True)
    assert not shard_server._exits_for_restart(shard, ShardConfig(wal=str(tmp_path)))
    assert not shard.logic.fault.restarting
    assert "fsync" in shard.logic.fault.reason


def test_a_shard_past_its_budget_of_fault_exits_stays_up(tmp_path):
    config = ShardConfig(wal=str(tmp_path))
    decisions = [shard_server._exits_for_restart(_faulted_shard(), config) for _ in range(4)]
    assert decisions == [True, True, True, False]  # MAX_FAULT_EXITS of them, then no more


def test_a_fault_a_restart_repairs_during_startup_exits_with_its_status(monkeypatch, capsys):
    def fail(config, ready_file):
        raise ShardRestartingError("this shard is restarting to rebuild its rows: redis went")

    monkeypatch.setattr(shard_server, "serve_until_signalled", fail)
    assert ps_cmd.run(_parsed(["--wal", "/tmp/w", "--exit-on-fault"])) == EXIT_ON_FAULT
    assert "redis went" in capsys.readouterr().err


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ps_cmd.register(parser.add_subparsers())
    return parser.parse_args(["ps", *argv])
