"""Checkpoints of real shards: restore onto another shard count, incremental chains, consistency."""

import contextlib
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import ClusterError, LocalCluster
from ember.ps_server.durability.checkpoint_format import MANIFEST, Manifest
from ember.ps_server.errors import CheckpointStateError, DurableFileCorruptError, PSClientError
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.pushers import StepPusher, expected_rows, step_grads

ADAM = OptimizerSpec(OptimizerKind.ADAM, lr=0.05)
TABLES = [
    TableSpec("adam_t", dim=8, optimizer=ADAM),
    TableSpec("adagrad_t", dim=4, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.1)),
]
IDS = torch.from_numpy(np.arange(0, 6000, 7, dtype=np.int64))


@contextlib.contextmanager
def trained_cluster(
    root, rounds: int = 1, shards: int = 2
) -> Iterator[tuple[LocalCluster, PSClient]]:
    """Shards that may checkpoint under ``root``, TABLES created, ``rounds`` pushes done."""
    with (
        LocalCluster(shards, extra_args=root_flag(root)) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        for spec in TABLES:
            client.create_table(spec)
        for seed in range(rounds):
            push_round(client, seed)
        yield cluster, client


def root_flag(path) -> list[str]:
    """The flag that lets shards write checkpoints under ``path``."""
    return ["--checkpoint-root", str(path)]


def push_round(client: PSClient, seed: int, ids: torch.Tensor = IDS) -> None:
    """One push per table with duplicates (summed by the shard)."""
    generator = torch.Generator().manual_seed(seed)
    batch = ids[torch.randint(0, len(ids), (2 * len(ids),), generator=generator)]
    for spec in TABLES:
        client.push(spec.name, batch, torch.randn(len(batch), spec.dim, generator=generator))


def touch_every_row(client: PSClient) -> None:
    """Create every row of IDS (pulls store nothing): a push of zero gradients."""
    for spec in TABLES:
        client.push(spec.name, IDS, torch.zeros(len(IDS), spec.dim))


def snapshot(client: PSClient) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {spec.name: client.pull_with_versions(spec.name, IDS) for spec in TABLES}


def assert_same_state(left: PSClient, right: PSClient, seed: int) -> None:
    """Equal rows and versions now, and equal rows after one more identical push.

    The second check fails when optimizer state (Adam's m and v, Adagrad's sums) differs.
    """
    for name, (rows, versions) in snapshot(left).items():
        other_rows, other_versions = snapshot(right)[name]
        assert torch.equal(rows, other_rows) and torch.equal(versions, other_versions), name
    push_round(left, seed)
    push_round(right, seed)
    for name, (rows, _) in snapshot(left).items():
        assert torch.equal(rows, snapshot(right)[name][0]), f"{name}: optimizer state differs"


def test_checkpoint_of_two_shards_restores_onto_three(tmp_path):
    root = tmp_path / "checkpoints"
    with trained_cluster(tmp_path, rounds=3) as (_, client):
        directory = client.checkpoint(root)
        manifest = Manifest.load(directory)
        assert manifest.num_shards == 2 and {s.name for s in manifest.tables} == {
            s.name for s in TABLES
        }
        with (
            LocalCluster(3, extra_args=["--restore", str(root)]) as target,
            PSClient(target.endpoints) as restored,
        ):
            assert {s.name for s in restored.list_tables()} == {s.name for s in TABLES}
            assert_same_state(client, restored, seed=99)
            # Each of the three shards holds only rows it owns.
            stats = restored.stats()
            owned = np.bincount(shard_of("adam_t", IDS.numpy(), 3), minlength=3)
            for k, shard_stats in enumerate(stats):
                adam = next(t for t in shard_stats.tables if t.name == "adam_t")
                assert adam.rows == owned[k]


def test_incremental_chain_restores_like_a_full_checkpoint(tmp_path):
    chain_root, full_root = tmp_path / "chain", tmp_path / "full"
    with trained_cluster(tmp_path) as (_, client):
        touch_every_row(client)
        full_dir = client.checkpoint(chain_root)
        push_round(client, 1, ids=IDS[:40])  # few rows change between checkpoints
        first_dir = client.checkpoint(chain_root, incremental=True)
        push_round(client, 2, ids=IDS[100:130])
        latest_dir = client.checkpoint(chain_root, incremental=True)
        reference_dir = client.checkpoint(full_root)  # the same moment, written whole
        state = snapshot(client)

    def rows_in(directory):
        return sum(
            entry.rows for entries in Manifest.load(directory).files.values() for entry in entries
        )

    assert Manifest.load(latest_dir).base == first_dir.name
    assert Manifest.load(first_dir).base == full_dir.name
    assert rows_in(first_dir) <= 2 * 40 and rows_in(latest_dir) <= 2 * 30
    assert rows_in(full_dir) == rows_in(reference_dir) == 2 * len(IDS)
    with (
        LocalCluster(
            2, extra_args=["--restore", str(latest_dir), *root_flag(tmp_path)]
        ) as from_chain,
        LocalCluster(2, extra_args=["--restore", str(reference_dir)]) as from_full,
        PSClient(from_chain.endpoints) as chain_client,
        PSClient(from_full.endpoints) as full_client,
    ):
        for name, (rows, versions) in snapshot(chain_client).items():
            assert torch.equal(rows, state[name][0]) and torch.equal(versions, state[name][1])
        # A restored cluster continues the chain: only rows changed since the restore.
        push_round(chain_client, 8, ids=IDS[:5])
        next_dir = chain_client.checkpoint(chain_root, incremental=True)
        assert Manifest.load(next_dir).base == latest_dir.name and rows_in(next_dir) <= 2 * 5
        push_round(full_client, 8, ids=IDS[:5])
        assert_same_state(chain_client, full_client, seed=7)


def test_checkpoint_during_concurrent_pushes_is_a_prefix_on_every_shard(tmp_path):
    spec = TableSpec("consistent", dim=8, optimizer=ADAM)
    owned_ids = [np.arange(0, 64, dtype=np.int64), np.arange(10_000, 10_064, dtype=np.int64)]
    steps = 40
    with (
        LocalCluster(2, extra_args=root_flag(tmp_path)) as source,
        PSClient(source.endpoints) as client,
    ):
        client.create_table(spec)
        pushers = [
            StepPusher(source.endpoints, spec, ids, seed, steps)
            for seed, ids in enumerate(owned_ids)
        ]
        for pusher in pushers:
            pusher.start()
        assert pushers[0].reached(10).wait(60) and pushers[1].reached(10).wait(60)
        acknowledged_before = [p.acknowledged for p in pushers]
        directory = client.checkpoint(tmp_path / "ckpt")
        acknowledged_after = [p.acknowledged for p in pushers]
        for pusher in pushers:
            pusher.join(120)
            assert pusher.error is None, pusher.error
    assert any(after < steps for after in acknowledged_after), "the checkpoint missed the pushes"
    with (
        LocalCluster(2, extra_args=["--restore", str(directory)]) as target,
        PSClient(target.endpoints) as restored,
    ):
        for seed, ids in enumerate(owned_ids):
            rows, versions = restored.pull_with_versions(spec.name, torch.from_numpy(ids))
            owners = shard_of(spec.name, ids, 2)
            for shard in range(2):
                mine = owners == shard
                applied = set(versions[torch.from_numpy(mine)].tolist())
                assert len(applied) == 1, f"shard {shard} holds a torn push: {applied}"
                (prefix,) = applied
                # Every push acknowledged before the checkpoint began is in it;
                # none beyond those acknowledged by its end (plus one in flight).
                assert acknowledged_before[seed] <= prefix <= acknowledged_after[seed] + 1
                np.testing.assert_allclose(
                    rows[torch.from_numpy(mine)].numpy(),
                    expected_rows(spec, ids, seed, prefix)[mine],
                    rtol=1e-4, atol=1e-5,
                )  # fmt: skip
                # The Adam slots belong to the same step: one more step matches too.
                grads = step_grads(seed, prefix, len(ids), spec.dim)[mine]
                restored.push(spec.name, torch.from_numpy(ids[mine]), torch.from_numpy(grads))
                after = restored.pull(spec.name, torch.from_numpy(ids[mine]))
                np.testing.assert_allclose(
                    after.numpy(), expected_rows(spec, ids, seed, prefix + 1)[mine],
                    rtol=1e-4, atol=1e-5,
                )  # fmt: skip


def test_incremental_without_a_base_and_after_a_restart_is_refused(tmp_path):
    with (
        LocalCluster(1, extra_args=root_flag(tmp_path)) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(TABLES[0])
        with pytest.raises(ValueError, match="take a full one first"):
            client.checkpoint(tmp_path / "empty", incremental=True)
        client.checkpoint(tmp_path / "ckpt")
        cluster.restart_shard(0)  # forgets which rows changed since its base
        client.create_table(TABLES[0])
        with pytest.raises(PSClientError, match="FAILED_PRECONDITION.*take a full one"):
            client.checkpoint(tmp_path / "ckpt", incremental=True)
        # The refused attempt left no manifest, and writes were resumed.
        push_round_single = torch.ones(1, TABLES[0].dim)
        client.push(TABLES[0].name, torch.tensor([1]), push_round_single)
        assert [
            p.name for p in sorted((tmp_path / "ckpt").iterdir()) if (p / MANIFEST).exists()
        ] == ["ckpt-000001"]


def test_damaged_checkpoints_and_spec_clashes_are_refused(tmp_path):
    root = tmp_path / "ckpt"
    with trained_cluster(tmp_path, shards=1) as (_, client):
        directory = client.checkpoint(root)
    clashing = ParameterServer(0, 1)
    clashing.create_table(TableSpec("adam_t", dim=3))
    with pytest.raises(CheckpointStateError, match="'adam_t'.*restore refused"):
        clashing.checkpoints.restore(clashing.checkpoints.load_chain(root))
    assert [spec.name for spec in clashing.list_tables()] == ["adam_t"]  # nothing created
    row_file = next(directory.glob("*.adam_t.rows"))
    expected_sha = next(
        e.sha256 for e in Manifest.load(directory).files[0] if e.path == row_file.name
    )
    data = bytearray(row_file.read_bytes())
    data[-5] ^= 0xFF
    row_file.write_bytes(bytes(data))
    assert_restore_refused(root, f"{row_file.name}.*{expected_sha}")
    row_file.write_bytes(bytes(data[:-100]))  # truncated
    assert_restore_refused(root, f"{row_file.name}.*truncated")
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["body"]["num_shards"] = 5
    (directory / MANIFEST).write_text(json.dumps(manifest))
    assert_restore_refused(root, "manifest is corrupt")


def assert_restore_refused(root, match: str) -> None:
    """A shard restoring from ``root`` fails to start with an error matching ``match`` (and
    one that starts after all is stopped again)."""
    with (
        pytest.raises(ClusterError, match=match),
        LocalCluster(1, extra_args=["--restore", str(root)]),
    ):
        pass


def test_restore_onto_the_same_shard_count_reads_only_the_shards_own_files(tmp_path):
    with trained_cluster(tmp_path) as (_, client):
        expected = snapshot(client)
        directory = client.checkpoint(tmp_path / "ckpt")
    for other in directory.glob("shard-1-of-2.*"):
        other.unlink()  # shard 0 must not need them (nor spend time verifying them)
    server = ParameterServer(0, 2)
    rows = server.checkpoints.restore(server.checkpoints.load_chain(directory))
    mine = IDS.numpy()[shard_of("adam_t", IDS.numpy(), 2) == 0]
    assert rows > 0
    reply = server.pull("adam_t", mine.tobytes())
    position = {int(i): k for k, i in enumerate(IDS.tolist())}
    wanted = [position[int(i)] for i in mine]
    assert np.array_equal(reply.values, expected["adam_t"][0][wanted].numpy())
    assert np.array_equal(reply.versions, expected["adam_t"][1][wanted].numpy())
    with pytest.raises(DurableFileCorruptError, match="shard-1-of-2.*missing"):
        ParameterServer(0, 3).checkpoints.load_chain(directory)  # another count reads them all
