"""A shard with its write-ahead log on is SIGKILLed mid-push and comes back with every push once.

With the tiered store (a 32-row memory tier over Redis) most rows live in
Redis when the shard dies: recovery deletes them and rebuilds the shard from
its checkpoint and log, so no replayed push lands on top of itself.
"""

import contextlib
import dataclasses

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.pushers import PATIENT, StepPusher, expected_rows, step_grads
from tests.support.redis_server import RedisServer, require_redis_server

SPEC = TableSpec("crash", dim=8, optimizer=OptimizerSpec(OptimizerKind.ADAM, lr=0.05))
OWNED_IDS = [np.arange(0, 48, dtype=np.int64), np.arange(50_000, 50_048, dtype=np.int64)]
STEPS = 50


@pytest.mark.parametrize(
    ("store", "fsync", "checkpoint"),
    [
        ("memory", "always", True),
        ("memory", "interval", False),
        ("tiered", "always", True),
        ("tiered", "interval", False),
    ],
)
def test_sigkill_while_pushing_loses_no_acknowledged_push_and_applies_none_twice(
    tmp_path, store, fsync, checkpoint
):
    spec = dataclasses.replace(SPEC, name=f"crash_{store}_{fsync}_{checkpoint}")
    extra = [
        "--wal",
        str(tmp_path / "wal"),
        "--wal-fsync",
        fsync,
        "--checkpoint-root",
        str(tmp_path),
    ]
    with contextlib.ExitStack() as own:
        if store == "tiered":  # a database of its own: its shards' markers are this cluster's
            require_redis_server()
            (tmp_path / "redis").mkdir()
            redis_url = own.enter_context(RedisServer(tmp_path / "redis")).url
            extra += ["--store", f"tiered+{redis_url}?capacity=32"]
        _crash_and_recover(tmp_path, spec, extra, fsync, checkpoint)


def _crash_and_recover(tmp_path, spec, extra, fsync, checkpoint) -> None:
    with (
        LocalCluster(2, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, PATIENT) as client,
    ):
        client.create_table(spec)
        pushers = [
            StepPusher(cluster.endpoints, spec, ids, seed, STEPS)
            for seed, ids in enumerate(OWNED_IDS)
        ]
        for pusher in pushers:
            pusher.start()
        assert pushers[0].reached(8).wait(60)
        if checkpoint:  # truncates the log: recovery then needs checkpoint plus log
            client.checkpoint(tmp_path / "ckpt")
        assert pushers[0].reached(20).wait(60)
        acknowledged_at_kill = [p.acknowledged for p in pushers]
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # restores the checkpoint, replays the log
        for pusher in pushers:
            pusher.join(180)
            assert not pusher.is_alive() and pusher.error is None, pusher.error
        assert min(acknowledged_at_kill) < STEPS, "the kill came after the pushes"
        for seed, ids in enumerate(OWNED_IDS):
            rows, versions = client.pull_with_versions(spec.name, torch.from_numpy(ids))
            # Each pushed step is in every row exactly once: a lost acknowledged
            # push leaves the version short, a replayed retry makes it long.
            assert versions.tolist() == [STEPS] * len(ids)
            np.testing.assert_allclose(
                rows.numpy(), expected_rows(spec, ids, seed, STEPS), rtol=1e-4, atol=1e-5
            )
            # Adam's slots came back with the weights: one more step still matches.
            grads = step_grads(seed, STEPS, len(ids), spec.dim)
            client.push(spec.name, torch.from_numpy(ids), torch.from_numpy(grads))
            np.testing.assert_allclose(
                client.pull(spec.name, torch.from_numpy(ids)).numpy(),
                expected_rows(spec, ids, seed, STEPS + 1),
                rtol=1e-4, atol=1e-5,
            )  # fmt: skip
        restarted_log = (cluster.workdir / "shard-0.log").read_text()
        assert "replayed" in restarted_log and ("restored" in restarted_log) == checkpoint
