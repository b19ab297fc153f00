"""RecoveryProgress: what a recovering shard says it is doing, and a long replay's log lines;
recovery tells it each stage and every record it replays."""

import doctest
import logging

import numpy as np
from ember.ps_server.durability import recovery_progress
from ember.ps_server.durability.recovery import recover
from ember.ps_server.durability.recovery_progress import (
    CLOCK_EVERY,
    LOG_EVERY_S,
    RecoveryProgress,
)
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.manual_clock import ManualClock


def test_it_says_the_stage_and_how_much_of_the_log_is_replayed():
    progress = RecoveryProgress()
    assert progress.describe() == "starting"
    progress.stage("verifying its log")
    assert progress.describe() == "verifying its log"
    progress.replayed(0, 3_000_000)
    progress.replayed(1_234_567, 3_000_000)
    assert progress.describe() == "replaying its log: 1,234,567 of 3,000,000 records (41%)"
    progress.stage("claiming its log")
    assert progress.describe() == "claiming its log"


def test_a_long_replay_says_how_far_it_is_every_ten_seconds(caplog):
    clock = ManualClock(0.0)
    progress = RecoveryProgress(clock)
    total = 100 * CLOCK_EVERY
    with caplog.at_level(logging.INFO, "ember.ps_server.durability.recovery_progress"):
        progress.replayed(0, total)
        for done in range(1, total + 1):
            clock.now += LOG_EVERY_S / 20 / CLOCK_EVERY  # all of them in 50 s
            progress.replayed(done, total)
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        f"recovery: replaying its log: {percent * CLOCK_EVERY:,} of {total:,} records ({percent}%)"
        for percent in (20, 40, 60, 80, 100)
    ]


def test_the_example_holds():
    assert doctest.testmod(recovery_progress).failed == 0


def test_recovery_tells_it_every_record_it_replays(tmp_path):
    config = ShardConfig(wal=str(tmp_path / "wal"), wal_fsync="always")
    first = ParameterServer(0, 1)
    recover(first, config)
    first.create_table(TableSpec("emb", dim=4))
    for k in range(5):
        first.push_batch(
            [("emb", encode_ids(np.arange(3)), np.ones((3, 4), "<f4").tobytes(), f"push-{k}")]
        )
    first.journal.close()

    told = []

    class Told(RecoveryProgress):
        def replayed(self, done: int, total: int) -> None:
            told.append((done, total))
            super().replayed(done, total)

    progress = Told()
    recover(ParameterServer(0, 1), config, progress)
    assert told == [(done, 6) for done in range(7)]  # the table and five pushes
    assert progress.describe() == "replaying its log: 6 of 6 records (100%)"
