"""Hot-row gradients summed over two ranks (gloo, real processes), replicas grouped by
optimizer: every rank gets the same union of touched rows with the summed gradients."""

import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.cache.replica_groups import ReplicaGroups
from ember.trainer.timer import Timer

# Per rank, per group: (rows touched, their gradients). Group 0: SGD tables a (3 rows) and
# d (2 rows); group 1: Adagrad table b (4 rows). Rank 1 touches nothing of group 0.
TOUCHED = [
    {0: ([4, 0], [[1.0, 1.0], [2.0, 2.0]]), 1: ([3], [[5.0, 5.0]])},
    {1: ([0, 3], [[7.0, 7.0], [9.0, 9.0]])},
]


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        sgd, adagrad = OptimizerSpec(OptimizerKind.SGD), OptimizerSpec(OptimizerKind.ADAGRAD)
        specs = {
            name: TableSpec(name, 2, optimizer=optimizer)
            for name, optimizer in (("a", sgd), ("d", sgd), ("b", adagrad))
        }
        sizes = {"a": 3, "d": 2, "b": 4}
        replicas = ReplicaGroups(
            specs, {t: torch.arange(n) for t, n in sizes.items()}, 2, torch.device("cpu")
        )
        mine = {g: (torch.tensor(r), torch.tensor(v)) for g, (r, v) in TOUCHED[rank].items()}
        summed, flush, _ = replicas.summed_over_ranks(mine, rank == 1, Timer())
        result = {str(g): [r.tolist(), v.tolist()] for g, (r, v) in summed.items()}
        with open(f"{out}.{rank}", "w") as file:
            json.dump({"summed": result, "flush": flush}, file)
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_each_groups_touched_rows_alike(tmp_path):
    out = str(tmp_path / "result")
    mp.spawn(_rank, args=(str(tmp_path / "store"), out), nprocs=2)
    results = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in range(2)]
    expected = {
        "0": [[0, 4], [[2.0, 2.0], [1.0, 1.0]]],  # only rank 0 touched group 0
        "1": [[0, 3], [[7.0, 7.0], [14.0, 14.0]]],  # row 3 from both ranks
    }
    for result in results:
        assert result == {"summed": expected, "flush": True}  # rank 1 asked for a flush
