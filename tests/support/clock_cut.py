"""What the clock-cut checkpoint tests share: one SGD table, a two-rank exact job's updates
(a distinct gradient per clock and rank), threads, and the clocks a checkpoint's metadata holds."""

import json
import threading

import numpy as np
from ember.ps_server.errors import (
    CheckpointStateError,
    InvalidArgumentError,
)
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids, pb
from ember.ps_server.wire.step_codec import (
    StepClockView,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

SGD = OptimizerSpec(OptimizerKind.SGD, lr=1.0)
SPEC = TableSpec("emb", dim=4, optimizer=SGD)
IDS = np.arange(0, 80, 3, dtype=np.int64)
JOB = "job-cut"


def grads(clock: int, rank: int, count: int = len(IDS)) -> np.ndarray:
    return np.full((count, 4), 10.0**clock * (rank + 1), dtype="<f4")  # distinct per clock


def update_request(clock: int, rank: int, ids: np.ndarray = IDS) -> bytes:
    view = StepClockView(JOB, 2, rank, clock, pb.EXACT, 30_000)
    return encode_update_request([("emb", encode_ids(ids), grads(clock, rank, len(ids)))], view)


def in_threads(*calls) -> list[threading.Thread]:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    return threads


def applied_in_meta(directory, shard: int, shards: int) -> list[int]:
    meta = json.loads((directory / f"shard-{shard}-of-{shards}.meta.json").read_text())
    return meta["step_clocks"][JOB]["applied"]


def write_c1_in_thread(server: ParameterServer, tmp_path) -> tuple[threading.Thread, list]:
    """Checkpoint "c1" of the cut {JOB: [0, 0]} written in a thread; the list gets its error."""
    failures: list[Exception] = []

    def write() -> None:
        try:
            server.checkpoints.write("c1", str(tmp_path / "c1"), "", cut={JOB: [0, 0]})
        except (CheckpointStateError, InvalidArgumentError) as error:
            failures.append(error)

    (writer,) = in_threads(write)
    return writer, failures
