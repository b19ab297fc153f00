"""Trainer ranks as real processes on the step pipeline: bounded staleness with a slow
rank, and a killed rank (see tests/support/step_rank.py for what a rank does)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.routing import shard_of

from tests.support.step_rank import IDS

STEPS, SLOW_S = 12, 0.15


def start_rank(cluster, tmp_path, job: str, rank: int, *, staleness: int, sleep_s: float,
               wait_s: float, table: str, steps: int = STEPS) -> subprocess.Popen:  # fmt: skip
    argv = [
        sys.executable, "-m", "tests.support.step_rank", ",".join(cluster.endpoints), job, "2",
        str(rank), str(steps), str(staleness), str(sleep_s), str(wait_s), table,
        str(tmp_path / f"rank{rank}.json"),
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("staleness", [1, 2])  # lookups riding on updates, and lookups
def test_a_fast_rank_reads_at_most_staleness_clocks_behind_and_waits_for_the_slow_one(
    cluster, tmp_path, table_name, staleness
):
    job = f"stale-{uuid.uuid4().hex}"
    s = staleness
    fast, slow = (
        start_rank(cluster, tmp_path, job, rank, staleness=s, sleep_s=sleep, wait_s=60,
                   table=table_name)
        for rank, sleep in ((0, 0.0), (1, SLOW_S))
    )  # fmt: skip
    for process in (fast, slow):
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        lags, seen = report["lags"], report["seen"]
        assert max(lags) <= s
        assert report["lookups"] == (2 if s <= 1 else STEPS)  # s = 1: steps 0 and 1's only
        # Independent of the reported lag: step t read every clock <= t-1-s of both ranks
        # (each adds 1 per rank to every row); a shard may have applied more by then.
        for t, (value, lag) in enumerate(zip(seen, lags)):
            assert value >= 2.0 * (t - lag) >= 2.0 * (t - s), (t, value, lag)
    fast_report = reports[0]
    # The fast rank ran ahead as far as the bound allows: some step read clock t-1-s at most.
    assert any(v == 2.0 * (t - s) for t, v in enumerate(fast_report["seen"]) if t >= s)
    assert max(fast_report["lags"]) == s
    # ... and no further: it waited for the slow rank for most of the slow rank's compute.
    assert fast_report["exposed_wait_s"] > 0.6 * (STEPS - 1 - s) * SLOW_S
    assert fast_report["wall_s"] > (STEPS - 1 - s) * SLOW_S
    # The compute from rows to update counts the compute only, not the waits around it.
    assert reports[1]["rows_to_update_s"] >= SLOW_S
    assert fast_report["rows_to_update_s"] < SLOW_S / 3
    with PSClient(cluster.endpoints) as client:  # every clock of both ranks, exactly once
        np.testing.assert_array_equal(client.pull(table_name, IDS).numpy(), 2.0 * STEPS)


def test_a_killed_rank_makes_the_other_fail_within_the_wait_naming_it_and_no_clock_is_partial(
    cluster, tmp_path, table_name
):
    job, wait_s = f"kill-{uuid.uuid4().hex}", 3.0
    survivor, victim = (
        start_rank(cluster, tmp_path, job, rank, staleness=0, sleep_s=0.02, wait_s=wait_s,
                   table=table_name, steps=1000)
        for rank in (0, 1)
    )  # fmt: skip
    try:
        for line in (
            victim.stdout
        ):  # mid-run: the victim has read step 4's rows, so clocks 0..3 are applied
            if line.strip() == "step 4":
                break
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        failed_after = time.monotonic() - killed_at
    finally:
        for process in (survivor, victim):
            process.kill()
            process.wait()
    assert survivor.returncode != 0
    assert "DEADLINE_EXCEEDED" in err and "rank(s) 1 have not delivered clock" in err, err
    assert failed_after < wait_s + 10  # the wait, the rank's own RPC deadline and start-up
    with PSClient(cluster.endpoints) as client:
        values = client.pull(table_name, IDS).numpy()
    # Each applied clock adds 2 (one per rank) to every row: a partial clock (one rank's
    # half) would leave an odd value. Rows of one shard saw the same clocks; the shards may
    # differ by the one clock the victim was sending when it died (to one shard, not both).
    assert (values % 2 == 0).all() and values.min() >= 2 * 4
    owner = shard_of(table_name, IDS.numpy(), 2)
    for shard in (0, 1):
        mine = values[owner == shard]
        assert mine.min() == mine.max()
    assert values.max() - values.min() <= 2
