"""Shards over a real Redis: recovery deletes exactly its own rows, writes are conditional on
the shard's marker, and a Redis of another shard count is refused (a Redis that restarts or
is emptied: test_redis_restarts). Each test has its own redis-server."""

import subprocess

import numpy as np
import pytest
import redis
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import ClusterError, LocalCluster
from ember.ps_server.errors import PSClientError, ShardFailedError, ShardRestartingError
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

SPEC = TableSpec("rows", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))
FAST = ClientConfig(max_attempts=2, initial_backoff_s=0.01)


def ids_holding(pattern: bytes, at: int, owner: int, count: int, seed: int) -> np.ndarray:
    """Ids of ``owner`` (of 2 shards) whose 8 little-endian bytes hold ``pattern`` at ``at``."""
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        raw = bytearray(rng.integers(0, 256, 8, dtype=np.uint8).tobytes())
        raw[at : at + len(pattern)] = pattern
        raw[7] &= 0x7F  # non-negative
        value = int.from_bytes(raw, "little")
        if shard_of(SPEC.name, np.array([value]), 2)[0] == owner and value not in found:
            found.append(value)
    return np.array(found, dtype=np.int64)


def test_recovery_deletes_only_its_own_rows_whatever_bytes_other_shards_ids_hold(
    own_redis, tmp_path
):
    """Shard 1's ids whose bytes hold ``:s0:``, or begin with ``s0:``, are what a glob over
    ``ember:*:s0:*`` also deletes: recovery of shard 0 must leave them alone."""
    tricky = np.concatenate(
        [ids_holding(b":s0:", at, owner=1, count=2, seed=at) for at in range(5)]
        + [ids_holding(b"s0:", 0, owner=1, count=3, seed=9)]
    )
    ordinary = np.arange(0, 400, dtype=np.int64)
    ids = torch.from_numpy(np.concatenate([tricky, ordinary]))
    extra = ["--store", own_redis.url, "--wal", str(tmp_path / "wal")]
    with LocalCluster(2, extra_args=extra) as cluster, PSClient(cluster.endpoints) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, ids, torch.ones(len(ids), SPEC.dim))
        before, versions = client.pull_with_versions(SPEC.name, ids)
        assert versions.eq(1).all()
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # deletes shard 0's rows from Redis, rebuilds them from its log
        after, versions_after = client.pull_with_versions(SPEC.name, ids)
    assert torch.equal(versions_after, versions), "a row came back re-initialised"
    assert torch.equal(after, before)


def test_recovery_checks_the_checkpoint_before_it_deletes_anything(own_redis, tmp_path):
    extra = [
        "--store", own_redis.url, "--wal", str(tmp_path / "wal"),
        "--checkpoint-root", str(tmp_path),
    ]  # fmt: skip
    raw = redis.Redis.from_url(own_redis.url)
    with LocalCluster(1, extra_args=extra) as cluster, PSClient(cluster.endpoints) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(50), torch.ones(50, SPEC.dim))
        directory = client.checkpoint(tmp_path / "ckpt")
        client.push(SPEC.name, torch.arange(50, 80), torch.ones(30, SPEC.dim))
        cluster.kill_shard(0)
        keys_before = sorted(raw.keys(b"ember:*"))
        row_file = next(directory.glob("*.rows"))
        row_file.write_bytes(row_file.read_bytes()[:-3])
        with pytest.raises(ClusterError, match=rf"{row_file.name}.*truncated"):
            cluster.restart_shard(0)
    assert len(keys_before) == 80 and sorted(raw.keys(b"ember:*")) == keys_before


def test_shards_of_another_count_refuse_a_redis_and_the_named_way_to_reshard_works(
    own_redis, tmp_path
):
    ids = torch.arange(1000)
    old = ["--store", own_redis.url, "--checkpoint-root", str(tmp_path)]
    with LocalCluster(1, extra_args=old) as cluster, PSClient(cluster.endpoints) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, ids, torch.randn(1000, SPEC.dim))
        trained, versions = client.pull_with_versions(SPEC.name, ids)
        checkpoint = client.checkpoint(tmp_path / "ckpt")
    with (
        pytest.raises(ClusterError, match="rows of a 1-shard cluster.*shard 0 of 2.*--restore D"),
        LocalCluster(2, extra_args=["--store", own_redis.url]),
    ):
        pass
    other_db = own_redis.url.rsplit("/", 1)[0] + "/1"
    new = ["--store", other_db, "--restore", str(checkpoint)]
    with LocalCluster(2, extra_args=new) as cluster, PSClient(cluster.endpoints) as client:
        rows, restored_versions = client.pull_with_versions(SPEC.name, ids)
    assert torch.equal(rows, trained) and torch.equal(restored_versions, versions)


@pytest.mark.parametrize("exits", [False, True], ids=["plain", "exit-on-fault"])
def test_a_second_process_of_the_same_shard_on_one_redis_stops_the_first(
    own_redis, tmp_path, exits
):
    """A stale container or an overlapping rolling update: the newer process takes the
    marker over, and the older one stops instead of writing beside it. With
    --exit-on-fault too it stays up, refusing: a restart would take the shard back from the
    newer process, whose own restart would take it again."""
    extra = ["--store", own_redis.url]
    first_extra = extra + (["--wal", str(tmp_path / "wal"), "--exit-on-fault"] if exits else [])
    with (
        LocalCluster(1, extra_args=first_extra) as first,
        PSClient(first.endpoints, FAST) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(4), torch.ones(4, SPEC.dim))
        with LocalCluster(1, extra_args=extra) as second, PSClient(second.endpoints) as newer:
            newer.create_table(SPEC)
            assert newer.pull_with_versions(SPEC.name, torch.arange(4))[1].eq(1).all()
            for _ in range(2):  # refused, and still there to refuse again
                with pytest.raises(PSClientError, match="FAILED_PRECONDITION.*rewritten by"):
                    client.pull(SPEC.name, torch.arange(4))
            if exits:  # the decision is logged as the fault trips, before the refusal
                assert "stays up, refusing" in (first.workdir / "shard-0.log").read_text()
                with pytest.raises(subprocess.TimeoutExpired):  # its loop looks every 0.5 s
                    first.processes[0].wait(timeout=1.5)


def test_a_write_is_conditional_on_the_marker_it_read(own_redis):
    """Another process takes the shard over between a push's read and its write: Redis aborts
    the write (WATCH), and the shard stops instead of overwriting the new owner's rows."""
    from ember.kernels.optim import state_width
    from ember.ps_server.durability.shard_fault import ShardFault
    from ember.ps_server.stores import RowBatch, open_marker, open_store

    fault = ShardFault()
    marker = open_marker(own_redis.url, 0, 1, fault)
    marker.start_serving()
    width = state_width(SPEC.optimizer.kind, SPEC.dim)
    store = open_store(own_redis.url, SPEC.name, 0, SPEC.dim, width, marker=marker)

    def create_while_another_process_starts(ids):
        open_marker(own_redis.url, 0, 1, ShardFault()).start_serving()
        return RowBatch(torch.zeros(len(ids), SPEC.dim), torch.zeros(len(ids), width),
                        torch.zeros(len(ids), dtype=torch.int64))  # fmt: skip

    ids = np.arange(5, dtype=np.int64)
    with pytest.raises(ShardFailedError, match="rewritten by another process"):
        store.update(
            ids, torch.ones(5, SPEC.dim), SPEC.optimizer, create_while_another_process_starts
        )
    assert redis.Redis.from_url(own_redis.url).keys(b"ember:*") == []  # nothing written
    assert fault.reason is not None


def test_a_checkpoint_of_an_emptied_redis_is_refused_and_keeps_the_log(own_redis, tmp_path):
    """A scan of an emptied Redis finds no row and so reads none: the marker is checked
    around scans, so the checkpoint fails instead of committing empty files."""
    extra = [
        "--store", own_redis.url, "--wal", str(tmp_path / "wal"),
        "--checkpoint-root", str(tmp_path),
    ]  # fmt: skip
    with LocalCluster(1, extra_args=extra) as cluster, PSClient(cluster.endpoints, FAST) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(100), torch.ones(100, SPEC.dim))
        redis.Redis.from_url(own_redis.url).flushall()
        with pytest.raises(PSClientError, match="lost this shard's marker"):
            client.checkpoint(tmp_path / "ckpt")
        segments = sorted(p.name for p in (tmp_path / "wal").glob("*.wal"))
        assert segments[0].endswith("00000001.wal")  # the log that can rebuild the rows is kept
        cluster.restart_shard(0)  # with the log: Redis is rebuilt
        assert client.pull_with_versions(SPEC.name, torch.arange(100))[1].eq(1).all()


def test_an_empty_log_over_a_redis_holding_the_shards_rows_is_refused(own_redis, tmp_path):
    """An unmounted or mistyped --wal directory must not delete the rows Redis holds."""
    with (
        LocalCluster(1, extra_args=["--store", own_redis.url]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(50), torch.ones(50, SPEC.dim))
    raw = redis.Redis.from_url(own_redis.url)
    keys = sorted(raw.keys(b"ember:*"))
    extra = ["--store", own_redis.url, "--wal", str(tmp_path / "empty-wal")]
    with (
        pytest.raises(ClusterError, match="holds the rows of shard 0.*log in .* is empty"),
        LocalCluster(1, extra_args=extra),
    ):
        pass
    assert len(keys) == 50 and sorted(raw.keys(b"ember:*")) == keys


def test_a_read_checks_the_marker_after_its_rows(own_redis, monkeypatch):
    """A flush between a marker read and a row read would hand out nothing-found as fresh
    rows: the marker is read after the rows, in the same pipeline."""
    from ember.ps_server.durability.shard_fault import ShardFault
    from ember.ps_server.stores import open_marker, open_store, redis_store

    marker = open_marker(own_redis.url, 0, 1, ShardFault())
    marker.start_serving()
    store = open_store(own_redis.url, SPEC.name, 0, SPEC.dim, 0, marker=marker)
    sent = []
    real = redis_store.run_packed
    monkeypatch.setattr(
        redis_store,
        "run_packed",
        lambda client, commands: sent.append(commands) or real(client, commands),
    )
    store.fetch(np.arange(3, dtype=np.int64))
    (pipeline,) = sent
    assert pipeline[0].startswith(b"*4\r\n$4\r\nMGET") and pipeline[-1] == marker.command()


def test_a_first_start_that_dies_midway_does_not_block_the_next(own_redis, tmp_path, monkeypatch):
    """A new cluster's first start with --wal writes its marker, then dies (Redis blinked):
    the log has begun, so the next start rebuilds rather than refusing as if rows were lost."""
    from ember.ps_server.durability import recovery
    from ember.ps_server.errors import StoreUnavailableError
    from ember.ps_server.shard.config import ShardConfig
    from ember.ps_server.shard.server import ParameterServer

    config = ShardConfig(store=own_redis.url, wal=str(tmp_path / "wal"))

    def blink(url, shard, marker):
        raise StoreUnavailableError("redis blinked")

    with monkeypatch.context() as patch:
        patch.setattr(recovery, "clear_shard", blink)
        with pytest.raises(StoreUnavailableError):
            recovery.recover(ParameterServer(0, 1, store=own_redis.url), config)
    assert redis.Redis.from_url(own_redis.url).get(b"ember-shard:0") is not None
    server = ParameterServer(0, 1, store=own_redis.url)
    recovery.recover(server, config)  # not refused
    server.journal.close()


def _logged_redis_shard(own_redis, tmp_path):
    from ember.ps_server.durability import recovery
    from ember.ps_server.shard.config import ShardConfig
    from ember.ps_server.shard.server import ParameterServer

    config = ShardConfig(store=own_redis.url, wal=str(tmp_path / "wal"), wal_fsync="always")
    server = ParameterServer(0, 1, store=own_redis.url)
    recovery.recover(server, config)
    server.create_table(SPEC)
    return server, config


def _failing_redis(monkeypatch, lose_reply_of: bytes):
    """Redis runs every command, but the connection fails at the first batch that holds
    ``lose_reply_of`` (after Redis ran it: its reply is lost)."""
    from ember.ps_server.stores import redis_connection

    real_run_on, failed = redis_connection.run_on, []

    def lossy(connection, commands):
        replies = real_run_on(connection, commands)
        if not failed and any(c.split(b"\r\n", 3)[2:3] == [lose_reply_of] for c in commands):
            failed.append(commands)
            raise redis.TimeoutError("Timeout reading from socket")
        return replies

    monkeypatch.setattr(redis_connection, "run_on", lossy)


def test_a_logged_push_whose_redis_reply_is_lost_stops_the_shard_and_counts_once(
    own_redis, tmp_path, monkeypatch
):
    """Redis applied a push, but its reply was lost: the shard never recorded the request id,
    so the client's retry would apply it again. The shard stops instead; its restart rebuilds
    the rows from the log, where the push counts once."""
    from ember.ps_server.durability import recovery
    from ember.ps_server.errors import StoreWriteUnknownError
    from ember.ps_server.shard.server import ParameterServer
    from ember.ps_server.wire.messages import encode_ids

    server, config = _logged_redis_shard(own_redis, tmp_path)
    server.fault.supervise()  # as --exit-on-fault: its restart repairs this fault
    ids = encode_ids(np.arange(8, dtype=np.int64))
    grads = np.full((8, SPEC.dim), 0.25, dtype="<f4").tobytes()
    start = server.pull(SPEC.name, ids).values.copy()
    with monkeypatch.context() as patch:
        _failing_redis(patch, b"EXEC")
        with pytest.raises(StoreWriteUnknownError, match="may or may not have been applied"):
            server.push(SPEC.name, ids, grads, "push-1")
    assert "Restart the shard" in server.fault.reason and server.fault.restarting
    with pytest.raises(ShardRestartingError):  # the client's retry: refused, retryable
        server.push(SPEC.name, ids, grads, "push-1")
    server.journal.close()
    restarted = ParameterServer(0, 1, store=own_redis.url)
    recovery.recover(restarted, config)
    # The client's retry, through the restart: a duplicate of the logged push.
    assert restarted.push(SPEC.name, ids, grads, "push-1") == (True, 0)
    np.testing.assert_allclose(
        restarted.pull(SPEC.name, ids).values, start - SPEC.optimizer.lr * 0.25, rtol=1e-6
    )
    restarted.journal.close()


def test_a_logged_push_that_never_reached_redis_keeps_the_shard_serving(
    own_redis, tmp_path, monkeypatch
):
    """A connection lost while the rows are read, before any write: nothing was applied, so
    the shard goes on, and the client's retry applies the push once."""
    from ember.ps_server.errors import StoreUnavailableError, StoreWriteUnknownError
    from ember.ps_server.wire.messages import encode_ids

    server, _ = _logged_redis_shard(own_redis, tmp_path)
    ids = encode_ids(np.arange(8, dtype=np.int64))
    grads = np.full((8, SPEC.dim), 0.25, dtype="<f4").tobytes()
    start = server.pull(SPEC.name, ids).values.copy()
    with monkeypatch.context() as patch:
        _failing_redis(patch, b"WATCH")
        with pytest.raises(StoreUnavailableError) as lost:
            server.push(SPEC.name, ids, grads, "push-1")
    assert not isinstance(lost.value, StoreWriteUnknownError)
    assert server.fault.reason is None
    assert server.push(SPEC.name, ids, grads, "push-1") == (False, 8)
    np.testing.assert_allclose(
        server.pull(SPEC.name, ids).values, start - SPEC.optimizer.lr * 0.25, rtol=1e-6
    )
    server.journal.close()
