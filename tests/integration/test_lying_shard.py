"""A shard whose answers do not match the requests (a bug, another version, a corrupted
message) gets a clear INTERNAL error naming it, never rows placed by a guess."""

import concurrent.futures

import grpc
import numpy as np
import pytest
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.wire.messages import pb, pb_grpc
from ember.ps_server.wire.table_spec import TableSpec

DIM = 4
TABLES = [TableSpec("a", DIM), TableSpec("b", DIM)]


class LyingShard(pb_grpc.ParameterServerServicer):
    """Knows tables a and b; answers batches with one answer short, and stale pulls with
    a position past the ids asked for (``stale`` picks which lie)."""

    def __init__(self, stale: str) -> None:
        self.stale = stale

    def Stats(self, request, context):
        return pb.StatsResponse(shard=0, num_shards=1)

    def ListTables(self, request, context):
        return pb.ListTablesResponse(tables=[spec.to_proto() for spec in TABLES])

    def PullBatch(self, request, context):
        answer = pb.PullResponse(values=np.zeros((1, DIM), np.float32).tobytes())
        return pb.PullBatchResponse(responses=[answer] * (len(request.requests) - 1))

    def PullStale(self, request, context):
        asked = len(request.ids) // 8
        rows = np.zeros((1, DIM), np.float32).tobytes()
        if self.stale == "outside":
            return pb.PullStaleResponse(
                positions=np.array([asked], np.int64).tobytes(), values=rows,
                versions=np.array([3], np.int64).tobytes(), dim=DIM,
            )  # fmt: skip
        return pb.PullStaleResponse(  # "short": one position, no version
            positions=np.array([0], np.int64).tobytes(), values=rows, dim=DIM
        )


@pytest.fixture(params=["outside", "short"])
def lying_shard(request):
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    pb_grpc.add_ParameterServerServicer_to_server(LyingShard(request.param), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_a_batch_answered_short_is_an_internal_error_naming_the_shard(lying_shard):
    client = PSClient([lying_shard], ClientConfig(max_attempts=1))
    with client, pytest.raises(PSClientError) as info:
        client.pull_many({"a": [1, 2], "b": [3]})
    assert info.value.code == Status.INTERNAL and info.value.endpoint == lying_shard
    assert "1 answers to 2 requests" in str(info.value)


def test_a_stale_pull_answer_that_does_not_fit_the_request_is_an_internal_error(lying_shard):
    client = PSClient([lying_shard], ClientConfig(max_attempts=1))
    with client, pytest.raises(PSClientError) as info:
        client.pull_stale("a", [1, 2], [0, 0], bound=0)
    assert info.value.code == Status.INTERNAL and info.value.endpoint == lying_shard
    assert "PullStale: an answer" in str(info.value)
