"""gRPC keepalive: when the host on the other side of a held call vanishes (no FIN, no
RST, nothing), each side notices within a few keepalive intervals instead of when TCP
gives up: the trainer's call fails UNAVAILABLE, and the shard stops waiting for it and
withdraws its update."""

import threading
import time

import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.held_updates import wait_until_held, wait_until_withdrawn
from tests.support.vanishing_proxy import VanishingProxy

KEEPALIVE_S = 1.0
WAIT_S = 120.0  # the held update's own wait: far beyond what keepalive takes


def test_both_sides_of_a_held_update_notice_a_vanished_peer_by_keepalive(table_name):
    spec = TableSpec(table_name, dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.1))
    ids = torch.arange(4)
    config = ClientConfig(keepalive_s=KEEPALIVE_S, max_attempts=1, timeout_s=WAIT_S)
    with (
        LocalCluster(1, ["--keepalive-s", str(KEEPALIVE_S)]) as cluster,
        VanishingProxy(cluster.endpoints[0]) as proxy,
        PSClient([proxy.endpoint], config) as client,
    ):
        client.create_table(spec)
        steps = StepClient(client, StepJob(table_name, world=2, rank=0, wait_s=WAIT_S))
        failures: list[PSClientError] = []

        def update() -> None:
            try:
                steps.update({spec.name: (ids, torch.ones(4, 4))}, 0)
            except PSClientError as error:
                failures.append(error)

        sender = threading.Thread(target=update)
        sender.start()
        wait_until_held(cluster.endpoints, table_name, spec.name, ids)
        proxy.vanish()
        started = time.monotonic()
        sender.join(30)
        assert not sender.is_alive(), "the trainer still waits on a vanished shard"
        assert [f.code for f in failures] == [Status.UNAVAILABLE], failures
        assert time.monotonic() - started < 30  # not the update's 120 s wait
        # The shard's own pings go unanswered too: it drops the call and withdraws.
        wait_until_withdrawn(cluster.endpoints, table_name, spec.name, ids, within_s=30)
