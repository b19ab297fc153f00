"""Shards over a Redis that restarts, is emptied or refuses a command: each stops serving
or goes on as its durability allows, and says why. Each test has its own redis-server."""

import concurrent.futures
import contextlib
import json
import threading
import time

import pytest
import redis
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import ClusterError, LocalCluster
from ember.ps_server.durability.fault_exits import MAX_FAULT_EXITS
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.shard.config import EXIT_ON_FAULT
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2

from tests.support.health import serving_status
from tests.support.redis_server import RedisServer

SPEC = TableSpec("rows", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))
FAST = ClientConfig(max_attempts=2, initial_backoff_s=0.01)
ONCE = ClientConfig(max_attempts=1, restart_patience_s=0)  # sees a restarting shard's answer
# Retries for about a minute: long enough for a shard to exit and be started again.
PATIENT = ClientConfig(max_attempts=40, initial_backoff_s=0.05, max_backoff_s=2.0)


@pytest.mark.parametrize("how", ["flushall", "restart"])
def test_a_redis_that_comes_back_empty_stops_the_shard_saying_why(own_redis, tmp_path, how):
    with (
        contextlib.ExitStack() as cleanup,
        LocalCluster(1, extra_args=["--store", own_redis.url]) as cluster,
        PSClient(cluster.endpoints, FAST) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(10), torch.ones(10, SPEC.dim))
        if how == "flushall":
            redis.Redis.from_url(own_redis.url).flushall()
        else:  # restarted without persistence, on its old port
            own_redis.stop()
            (tmp_path / "again").mkdir()
            cleanup.enter_context(RedisServer(tmp_path / "again", port=own_redis.port))
        refused = _pull_past_the_reconnect(client, torch.arange(10))
        assert isinstance(refused, PSClientError), refused
        assert refused.code == Status.FAILED_PRECONDITION
        assert "lost this shard's marker" in refused.details
        assert "--accept-empty-store" in refused.details
        with pytest.raises(PSClientError, match="stopped serving.*lost this shard's marker"):
            client.push(SPEC.name, torch.arange(3), torch.ones(3, SPEC.dim))
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert redis.Redis.from_url(own_redis.url).keys(b"ember:*") == []  # nothing written


@pytest.mark.parametrize("wal", [True, False], ids=["with-log", "without-log"])
def test_a_redis_that_comes_back_from_an_older_state_stops_a_shard_that_can_rebuild(
    own_redis, tmp_path, wal
):
    """Redis restarted from a snapshot older than an acknowledged push (its marker is in the
    snapshot). With a write-ahead log the shard must not serve the older rows: it stops, and
    its restart rebuilds them from the log, the push included. Without one there is nothing
    to rebuild from: it goes on from what Redis holds."""
    ids = torch.arange(10)
    extra = ["--store", own_redis.url] + (["--wal", str(tmp_path / "wal")] if wal else [])
    with (
        contextlib.ExitStack() as cleanup,
        LocalCluster(1, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, FAST) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, ids, torch.ones(10, SPEC.dim))
        redis.Redis.from_url(own_redis.url).save()  # the snapshot: the marker, rows at version 1
        client.push(SPEC.name, ids, torch.ones(10, SPEC.dim))  # acknowledged: version 2
        own_redis.stop()  # no save on shutdown ('save ""'): it comes back from the snapshot
        cleanup.enter_context(RedisServer(tmp_path / "redis", port=own_redis.port))
        outcome = _pull_past_the_reconnect(client, ids)
        if not wal:
            assert isinstance(outcome, torch.Tensor) and outcome.eq(1).all()  # what Redis holds
            assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.SERVING
            return
        assert isinstance(outcome, PSClientError), outcome
        assert outcome.code == Status.FAILED_PRECONDITION
        assert "restarted (server run_id" in outcome.details
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.NOT_SERVING
        cluster.kill_shard(0)
        cluster.restart_shard(0)  # with the log: Redis is rebuilt, the second push included
        assert client.pull_with_versions(SPEC.name, ids)[1].eq(2).all()


def test_a_shard_without_a_log_goes_on_when_redis_comes_back_with_an_earlier_epoch(
    own_redis, tmp_path
):
    """The snapshot Redis restarts from was taken before this shard process started: it
    holds the previous process's marker. Not another owner: the shard goes on, with a new
    epoch, from what Redis holds."""
    ids, ones = torch.arange(10), torch.ones(10, SPEC.dim)
    extra = ["--store", own_redis.url]
    with LocalCluster(1, extra_args=extra) as earlier, PSClient(earlier.endpoints) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, ids, ones)
        redis.Redis.from_url(own_redis.url).save()  # the previous process's epoch, version 1
    with (
        contextlib.ExitStack() as cleanup,
        LocalCluster(1, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, FAST) as client,
    ):
        client.create_table(SPEC)  # table specs live in the log, and there is none
        client.push(SPEC.name, ids, ones)  # version 2, under this process's epoch
        own_redis.stop()
        cleanup.enter_context(RedisServer(tmp_path / "redis", port=own_redis.port))
        outcome = _pull_past_the_reconnect(client, ids)
        assert isinstance(outcome, torch.Tensor) and outcome.eq(1).all(), outcome
        client.push(SPEC.name, ids, ones)  # goes on writing under its new epoch
        assert client.pull_with_versions(SPEC.name, ids)[1].eq(2).all()
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("how", ["flushall", "older-snapshot"])
def test_a_shard_that_exits_on_a_fault_is_retried_through_its_restart_and_rebuilds(
    own_redis, tmp_path, how
):
    """--exit-on-fault, as compose runs shards: a shard whose Redis lost its rows, or came
    back from an older state, answers UNAVAILABLE (retry) instead of refusing for good,
    exits with status 75, and, started again by its supervisor, rebuilds every acknowledged
    push from its log while a patient client's call retries through the restart."""
    ids = torch.arange(10)
    extra = ["--store", own_redis.url, "--wal", str(tmp_path / "wal"), "--exit-on-fault"]
    with (
        contextlib.ExitStack() as cleanup,
        LocalCluster(1, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, ONCE) as once,
        PSClient(cluster.endpoints, PATIENT) as patient,
    ):
        once.create_table(SPEC)
        once.push(SPEC.name, ids, torch.ones(10, SPEC.dim))
        if how == "flushall":
            redis.Redis.from_url(own_redis.url).flushall()
        else:
            redis.Redis.from_url(own_redis.url).save()  # the snapshot: rows at version 1
            once.push(SPEC.name, ids, torch.ones(10, SPEC.dim))  # acknowledged: version 2
            own_redis.stop()  # no save on shutdown: it comes back from the snapshot
            cleanup.enter_context(RedisServer(tmp_path / "redis", port=own_redis.port))
        refused = _pull_past_the_reconnect(once, ids)
        assert isinstance(refused, PSClientError), refused
        assert refused.code == Status.UNAVAILABLE, refused  # retryable, not FAILED_PRECONDITION
        assert "restarting to rebuild its rows" in refused.details
        assert "still restarting after restart_patience_s = 0 s" in refused.details  # marked
        assert cluster.processes[0].wait(timeout=60) == EXIT_ON_FAULT
        assert f"exits with status {EXIT_ON_FAULT}" in (cluster.workdir / "shard-0.log").read_text()
        pushes = 1 if how == "flushall" else 2
        with concurrent.futures.ThreadPoolExecutor(1) as trainer:
            pushed = trainer.submit(patient.push, SPEC.name, ids, torch.ones(10, SPEC.dim))
            cluster.restart_shard(0)  # as compose's restart policy does
            pushed.result(timeout=120)  # retried through the restart, applied once
        versions = patient.pull_with_versions(SPEC.name, ids)[1]
        assert versions.eq(pushes + 1).all(), versions  # rebuilt from the log, then pushed


def test_a_shard_that_keeps_exiting_on_faults_stays_up_for_an_operator(own_redis, tmp_path):
    """A fault that comes back after every restart must not loop through rebuilds: past
    its budget of exits (recorded beside its log) the shard stays up, refusing."""
    wal = tmp_path / "wal"
    wal.mkdir()
    now = time.time()
    recent = [now - k for k in range(MAX_FAULT_EXITS, 0, -1)]
    (wal / "shard-0.fault-exits.json").write_text(json.dumps(recent))
    extra = ["--store", own_redis.url, "--wal", str(wal), "--exit-on-fault"]
    with (
        LocalCluster(1, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, ONCE) as once,
        PSClient(cluster.endpoints, PATIENT) as patient,
    ):
        once.create_table(SPEC)
        once.push(SPEC.name, torch.arange(4), torch.ones(4, SPEC.dim))
        redis.Redis.from_url(own_redis.url).flushall()
        with pytest.raises(PSClientError) as first:
            once.pull(SPEC.name, torch.arange(4))  # the fault: refused as a restart at first
        assert first.value.code == Status.UNAVAILABLE
        # Retried until the shard's main loop decides (within half a second) to stay up.
        with pytest.raises(PSClientError) as refused:
            patient.pull(SPEC.name, torch.arange(4))
        assert refused.value.code == Status.FAILED_PRECONDITION
        assert "not restarting again" in refused.value.details
        assert f"{MAX_FAULT_EXITS} times" in refused.value.details
        assert "stays up, refusing" in (cluster.workdir / "shard-0.log").read_text()
        assert cluster.processes[0].poll() is None
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.NOT_SERVING


def _pull_past_the_reconnect(client: PSClient, ids: torch.Tensor) -> torch.Tensor | PSClientError:
    """The versions of ``ids``, or the error a pull ends with, past the lost connection
    (UNAVAILABLE) that a Redis restart first shows as: the shard's own answer, which is
    UNAVAILABLE too from a shard restarting on the fault (--exit-on-fault)."""
    for _ in range(3):
        try:
            return client.pull_with_versions(SPEC.name, ids)[1]
        except PSClientError as error:
            if error.code != Status.UNAVAILABLE or "restarting" in error.details:
                return error
    raise AssertionError("the shard stayed UNAVAILABLE after Redis came back")


def test_a_redis_user_without_info_is_refused_at_start_naming_the_grant(own_redis):
    raw = redis.Redis.from_url(own_redis.url)
    raw.acl_setuser(
        "ember", enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-@dangerous"]
    )
    url = own_redis.url.replace("redis://", "redis://ember:secret@")
    with (
        pytest.raises(ClusterError, match=r"refused INFO.*grant its ACL user \+info"),
        LocalCluster(1, extra_args=["--store", url]),
    ):
        pass
    raw.acl_setuser("ember", enabled=True, commands=["+info"])
    with (
        LocalCluster(1, extra_args=["--store", url]) as cluster,
        PSClient(cluster.endpoints) as client,
    ):
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(3), torch.ones(3, SPEC.dim))
        assert client.pull_with_versions(SPEC.name, torch.arange(3))[1].eq(1).all()


def test_an_operator_may_accept_an_emptied_redis(own_redis):
    extra = ["--store", own_redis.url, "--accept-empty-store"]
    with LocalCluster(1, extra_args=extra) as cluster, PSClient(cluster.endpoints) as client:
        client.create_table(SPEC)
        client.push(SPEC.name, torch.arange(10), torch.ones(10, SPEC.dim))
        redis.Redis.from_url(own_redis.url).flushall()
        _, versions = client.pull_with_versions(SPEC.name, torch.arange(10))
        assert versions.eq(0).all()  # the operator's choice: fresh rows
        client.push(SPEC.name, torch.arange(10), torch.ones(10, SPEC.dim))
        assert client.pull_with_versions(SPEC.name, torch.arange(10))[1].eq(1).all()
        assert serving_status(cluster.endpoints[0]) == health_pb2.HealthCheckResponse.SERVING


class _FaultAt:
    """Batches that run ``fault`` when the trainer draws batch ``step`` (steps ahead of it)."""

    def __init__(self, batches: list, step: int, fault) -> None:
        self.batches, self.step, self.fault = batches, step, fault

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for index, batch in enumerate(self.batches):
            if index == self.step:
                self.fault()
            yield batch


def test_training_rides_through_shards_that_exit_on_a_redis_fault_and_ends_exactly_the_same(
    own_redis, tmp_path
):
    """Compose's case end to end: Redis loses every row mid-training; the shards, run with
    --exit-on-fault, answer UNAVAILABLE, exit 75 and are started again (as a restart policy
    would) and rebuild from their logs, while the pipelined trainer's calls retry. The run
    ends bit for bit as the same run without the fault: no step lost or applied twice."""
    from ember.trainer.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    from tests.integration.test_pipeline import DIM, OPTIMIZERS, STEPS, train_steps

    cardinalities = (40, 300, 7)
    specs = {
        TableSpec(f"exits.f{f}", DIM, optimizer=OPTIMIZERS["adam"]): c
        for f, c in enumerate(cardinalities)
    }
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinalities=cardinalities, seed=3))
    batches = [data.batch(64, index) for index in range(STEPS)]
    reference_store = own_redis.url.rsplit("/", 1)[0] + "/1"  # same server, another database
    with LocalCluster(2, extra_args=["--store", reference_store]) as reference:
        expected_losses, expected_rows, _ = train_steps(reference.endpoints, specs, batches, True)

    extra = ["--store", own_redis.url, "--wal", str(tmp_path / "wal"), "--exit-on-fault"]
    with LocalCluster(2, extra_args=extra) as cluster:
        statuses: list[int] = []

        def supervise(shard: int) -> None:  # compose's restart policy, for one exit
            status = cluster.processes[shard].wait()
            statuses.append(status)
            if status == EXIT_ON_FAULT:
                cluster.restart_shard(shard)

        supervisors = [threading.Thread(target=supervise, args=(k,)) for k in range(2)]
        for thread in supervisors:
            thread.start()
        flush = redis.Redis.from_url(own_redis.url).flushall
        faulted = _FaultAt(batches, 10, flush)
        losses, rows, _ = train_steps(
            cluster.endpoints, specs, faulted, True, client_config=PATIENT
        )  # retries for about a minute, as compose's trainer does for about 30 s
        assert sorted(statuses) == [EXIT_ON_FAULT, EXIT_ON_FAULT]  # both exited, restarted
    for thread in supervisors:
        thread.join(timeout=30)
    assert losses == expected_losses
    for name, (values, versions) in expected_rows.items():
        assert torch.equal(rows[name][1], versions), name
        assert torch.equal(rows[name][0], values), name
