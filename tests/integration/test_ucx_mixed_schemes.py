"""A shard and a client on different UCX rendezvous schemes still exchange large frames.

Over TCP alone the client side of this process rendezvouses by put (Ember's default with
UCX_TLS=tcp); the shard here is started on UCX's own scheme, as a peer that predates that
default, or sets its own, would be. An earlier default (larger TCP segments) crashed such a
peer on its first large message.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.raw_frames import require_ucx

DIM = 64
IDS = 40_000  # 10 MiB of float32 rows each way: far past UCX's 8 KiB rendezvous threshold


def test_large_frames_cross_between_put_and_the_default_scheme(table_name: str) -> None:
    require_ucx()
    if os.environ.get("UCX_TLS", "").strip().lower() != "tcp":
        pytest.skip("the rendezvous default is Ember's over UCX_TLS=tcp only; UCX_TLS is not")
    shard_env = {**os.environ, "UCX_RNDV_SCHEME": "auto"}
    with (
        LocalCluster(1, ["--ucx"], env=shard_env) as cluster,
        PSClient(cluster.endpoints, ClientConfig(transport="ucx")) as client,
    ):
        assert os.environ.get("UCX_RNDV_SCHEME") == "put_zcopy"  # this process: by put
        client.create_table(
            TableSpec(table_name, DIM, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=1.0))
        )
        step = StepClient(client, StepJob(f"mixed-{os.getpid()}", mode="async"))
        ids = np.arange(IDS, dtype=np.int64) * 3
        before = step.lookup({table_name: ids})[0][table_name]  # the shard sends 10 MiB
        grads = torch.randn(IDS, DIM, generator=torch.Generator().manual_seed(1))
        step.update({table_name: (ids, grads)}, 0)  # the client sends 10 MiB
        after = step.lookup({table_name: ids})[0][table_name]
        assert client.shard_rpc.data_plane.name == "ucx"
        torch.testing.assert_close(after, before - grads, rtol=0, atol=1e-6)
