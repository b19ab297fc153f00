"""A shard rebuilding its rows from its log listens, reports NOT_SERVING and refuses every
call as retryable, marked as a restart's; a client waits for it past ``max_attempts`` (up
to ``restart_patience_s``) and reads the rebuilt rows. The shard's recovery is held on its
Redis (stopped with SIGSTOP, resumed when the shard's first refusal reaches the waiting
client), so the call meets the recovery for certain, without a sleep. (The shard's Redis
read gives up after its 10 s socket timeout: the resume comes well within a second.)"""

import concurrent.futures
import logging
import os
import signal

import grpc
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.client.transport import TransportError
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from grpc_health.v1 import health_pb2

from tests.support.health import serving_status

SPEC = TableSpec("rows", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))
IDS = torch.arange(10)
# One try for a shard that cannot be reached (the waiting client's connection, lost with
# the shard's process, costs one more): only a shard that says it is restarting is waited for.
IMPATIENT = ClientConfig(max_attempts=1, restart_patience_s=0)


def test_a_client_waits_for_a_shard_rebuilding_its_rows(
    own_redis, tmp_path, monkeypatch, transport, caplog
):
    extra = ["--store", own_redis.url, "--wal", str(tmp_path / "wal")]
    extra += ["--ucx"] if transport == "ucx" else []
    waiting = ClientConfig(
        transport=transport, max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05
    )
    redis_pid = own_redis.process.pid
    with (
        LocalCluster(1, extra_args=extra) as cluster,
        PSClient(cluster.endpoints, waiting) as client,
        concurrent.futures.ThreadPoolExecutor(1) as supervisor,
    ):
        endpoint = cluster.endpoints[0]
        client.create_table(SPEC)
        client.push(SPEC.name, IDS, torch.ones(10, SPEC.dim))  # logged
        steps = StepClient(client, StepJob("recovering", world=1))
        pushed = steps.lookup({SPEC.name: IDS})[0][SPEC.name]
        cluster.kill_shard(0)
        os.kill(redis_pid, signal.SIGSTOP)  # the restarted shard's recovery waits on it
        try:
            restarted = supervisor.submit(cluster.restart_shard, 0)  # returns once it serves
            with grpc.insecure_channel(endpoint) as channel:
                grpc.channel_ready_future(channel).result(timeout=60)  # it listens
            assert serving_status(endpoint) == health_pb2.HealthCheckResponse.NOT_SERVING

            with (
                PSClient(cluster.endpoints, IMPATIENT) as impatient,
                pytest.raises(PSClientError) as refused,
            ):
                impatient.pull(SPEC.name, IDS)
            assert refused.value.code == Status.UNAVAILABLE, refused.value
            # Blocked on its first Redis command, and it says so.
            assert "recovering its rows (checking its store)" in refused.value.details
            assert "still restarting after restart_patience_s = 0 s" in refused.value.details

            calls = _resume_on_first_restarting_answer(client, redis_pid, monkeypatch)
            with caplog.at_level(logging.INFO, "ember.ps_server.client.shard_rpc"):
                rebuilt = steps.lookup({SPEC.name: IDS})[0][SPEC.name]
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        restarted.result(timeout=60)
    assert torch.equal(rebuilt, pushed)  # the logged push, rebuilt once
    refusals = [error for _, error in calls if error is not None]
    assert all(error.status == Status.UNAVAILABLE for error in refusals), refusals
    met = next(n for n, (_, error) in enumerate(calls) if error is not None and error.restarting)
    # From then on the lookup's payload waits for a cheap call to find the shard serving:
    # it is sent once more, and answered.
    assert [method for method, _ in calls[met + 1 :]].count("Lookup") == 1, calls
    assert calls[-1] == ("Lookup", None), calls
    said = [record.getMessage() for record in caplog.records]  # once each, not per retry
    assert [line.split(" (")[0] for line in said] == [
        f"shard {endpoint} is restarting",
        f"shard {endpoint} serves again",
    ], said


def _resume_on_first_restarting_answer(
    client: PSClient, redis_pid: int, monkeypatch
) -> list[tuple[str, TransportError | None]]:
    """Every call that ``client``'s data plane carries from now on, with the error it met;
    the first refusal that says the shard is restarting resumes the stopped Redis, so the
    shard's recovery goes on."""
    transport = client.shard_rpc.data_plane
    call = transport.call
    calls: list[tuple[str, TransportError | None]] = []

    def watched(shard_call, timeout_s):
        try:
            reply = call(shard_call, timeout_s)
        except TransportError as error:
            calls.append((shard_call.method, error))
            if error.restarting:
                os.kill(redis_pid, signal.SIGCONT)
            raise
        calls.append((shard_call.method, None))
        return reply

    monkeypatch.setattr(transport, "call", watched)
    return calls
