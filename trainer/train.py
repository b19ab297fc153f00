"""One trainer rank: DLRM with embeddings on the parameter servers.

Run directly for one rank, or under ``torchrun`` (env://) for several: dense
parameters are synchronised with DDP (gloo on CPU, NCCL on GPU: the process
group follows the device), each rank trains on its own part of the data, and
sparse traffic goes to the shards. The model, dense features, labels, pooled
rows and cache storage live on the configured device.

Data: synthetic Criteo-style batches, or a Criteo TSV file, whose held-out
split (every ``heldout_every``-th line) is what rank 0 evaluates on and whose
training lines are dealt to the ranks batch by batch. Every rank runs the same
number of steps: when any rank's part of the file runs out, all stop.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.config import TrainConfig, process_group_backend, resolve_device
from ember.trainer.data.batch import Batch
from ember.trainer.data.criteo import CriteoTSVReader
from ember.trainer.data.synthetic import NUM_DENSE, SyntheticCriteo, SyntheticCriteoConfig
from ember.trainer.embedding import PSEmbeddingBagCollection
from ember.trainer.lookahead import Lookahead
from ember.trainer.metrics import log_loss, roc_auc
from ember.trainer.models.dlrm import DLRM
from ember.trainer.plan.apply import applied
from ember.trainer.report import run_report
from ember.trainer.sources import (
    TimedSource,
    build_row_source,
    close,
    dealt,
    flush,
    release,
)
from ember.trainer.telemetry import Telemetry
from ember.trainer.train_sequences import train_sequences
from torch.nn.parallel import DistributedDataParallel


def train(config: TrainConfig) -> dict:
    """Train on this rank; returns the run report (complete on rank 0)."""
    config.validate()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = resolve_device(config.device)
    rank, world = _init_distributed(device)
    if config.model == "sasrec":
        report = train_sequences(config, device, rank, world)
        _leave_process_group(world)
        return report
    data = synthetic_data(config)
    specs = table_specs(config, data.num_features)
    config = applied(config, data, [s.name for s in specs], world)
    torch.manual_seed(config.seed)  # identical dense initialisation on every rank
    model = DLRM(NUM_DENSE, data.num_features, config.dim).to(device)
    dense_model = (
        DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if world > 1
        else model
    )
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=config.dense_lr)
    reader = CriteoTSVReader(buckets=config.max_cardinality, batch_size=config.batch_size)
    # Telemetry first: a metrics port that is taken fails before anything is held.
    with (
        Telemetry(config, rank, world) as telemetry,
        PSClient(list(config.endpoints), config.client) as client,
    ):
        for spec in specs:
            client.create_table(spec)
        inner = build_row_source(client, config, specs, data, (rank, world), device)
        source = TimedSource(inner)
        ebc = PSEmbeddingBagCollection(
            source, [s.name for s in specs], grad_scale=1.0 / world, device=device
        )
        losses: list[float] = []
        # The clocked pipeline plans the next steps on a thread of its own (see Lookahead).
        batches = Lookahead(
            _train_batches(config, data, reader, rank, world), source.lookahead, config.steps,
            lambda upcoming: ebc.prefetch(upcoming.sparse), background=config.clocked(),
        )  # fmt: skip
        start, cpu_start = time.perf_counter(), time.process_time()
        # A file's parts can differ by a batch between ranks; synthetic parts never do.
        uneven = config.criteo_path is not None and world > 1
        try:
            with batches:
                while len(losses) < config.steps:
                    has_batch = batches.has_batch()
                    if uneven:
                        has_batch = _every_rank_has_a_batch(has_batch, device)
                    if not has_batch:
                        break
                    batch = batches.take()
                    dense_opt.zero_grad()
                    pooled = ebc(batch.sparse)
                    with source.inside:
                        batches.announce()  # the next steps' rows come while this computes
                    batch = batch.to(device)
                    logits = dense_model(batch.dense, pooled)
                    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
                    loss.backward()
                    with source.inside:
                        batches.settle()  # this step's update carries the next steps' reads
                    ebc.step()  # first: the embedding update leaves while the dense step runs
                    dense_opt.step()
                    losses.append(_mean_over_ranks(loss.detach(), world))
                    if _write_back_due(config, len(losses)):
                        with source.inside:
                            flush(inner)  # bounds what a crashed trainer loses of its replicas
                    telemetry.step(len(losses), losses[-1], source, time.perf_counter() - start)
            flush_started = time.perf_counter()
            with source.inside:
                flush(inner, last=True)
            final_flush = time.perf_counter() - flush_started
        except BaseException:
            release(inner)  # checkpoints stop waiting for this job's replicas
            raise
        wall = time.perf_counter() - start
        report = run_report(config, rank, world, device, losses, wall, source, reader)
        report["cpu_s"] = time.process_time() - cpu_start  # this process, all its threads
        # The last write-back of the replicas (and wait for the updates in flight): a cost
        # per run, in wall_s; steady-state steps take (wall_s - final_flush_s) / steps.
        report["final_flush_s"] = final_flush
        # What carried the rows: the step calls' transport, or gRPC's pulls and pushes.
        report["transport"] = client.shard_rpc.data_plane.name if config.clocked() else "grpc"
        if rank == 0:
            report.update(_evaluate(model, ebc, heldout_batches(config, data), device))
        telemetry.finish(report)
        close(inner)
    _leave_process_group(world)
    return report


def _leave_process_group(world: int) -> None:
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def heldout_batches(config: TrainConfig, data: SyntheticCriteo) -> Iterator[Batch]:
    """Up to ``eval_batches`` held-out batches: the synthetic test split, or the Criteo
    file's held-out lines."""
    if config.criteo_path is None:
        return (
            data.batch(config.batch_size, index, "test") for index in range(config.eval_batches)
        )
    reader = CriteoTSVReader(buckets=config.max_cardinality, batch_size=config.batch_size)
    batches = reader.read(config.criteo_path, "heldout", config.heldout_every)
    return itertools.islice(batches, config.eval_batches)


def synthetic_data(config: TrainConfig) -> SyntheticCriteo:
    """The synthetic data set a run trains on (Criteo cardinalities capped by the config)."""
    cardinalities = tuple(
        min(c, config.max_cardinality) for c in SyntheticCriteoConfig().cardinalities
    )
    return SyntheticCriteo(
        SyntheticCriteoConfig(
            cardinalities=cardinalities, zipf_exponent=config.zipf_exponent, seed=config.seed
        )
    )


def table_specs(config: TrainConfig, num_features: int) -> list[TableSpec]:
    """One PS table per sparse feature."""
    return [
        TableSpec(
            f"{config.table_prefix}.f{f}",
            config.dim,
            InitializerSpec(scale=0.05, seed=config.seed),
            OptimizerSpec(OptimizerKind[config.optimizer.upper()], lr=config.sparse_lr),
        )
        for f in range(num_features)
    ]


def _write_back_due(config: TrainConfig, steps: int) -> bool:
    """Whether replicated hot rows are written back after ``steps`` steps (every rank
    agrees: all run the same steps)."""
    return (
        config.cache == "replicated" and config.flush_every > 0 and steps % config.flush_every == 0
    )


def _init_distributed(device: torch.device) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(process_group_backend(device), init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def _every_rank_has_a_batch(has_batch: bool, device: torch.device) -> bool:
    """Whether every rank has a batch for the next step, so that all run the same steps
    (a rank whose part of a file ran out would otherwise leave the others in an all-reduce)."""
    flag = torch.tensor([1 if has_batch else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    """The step's loss averaged over ranks. The all-reduce also keeps the ranks in step: no
    rank pulls rows for the next step before every rank has pushed this step's gradients."""
    if world > 1:
        dist.all_reduce(loss)
        loss /= world
    return loss.item()


def _train_batches(
    config: TrainConfig, data: SyntheticCriteo, reader: CriteoTSVReader, rank: int, world: int
) -> Iterator[Batch]:
    if config.criteo_path is None:
        for index in range(config.steps):
            yield data.batch(config.batch_size, index, "train", part=rank)
        return
    yield from dealt(reader.read(config.criteo_path, "train", config.heldout_every), rank, world)


def _evaluate(
    model: DLRM, ebc: PSEmbeddingBagCollection, batches: Iterator[Batch], device: torch.device
) -> dict:
    model.eval()
    ebc.eval()
    labels, scores = [], []
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(device)
            scores.append(torch.sigmoid(model(batch.dense, ebc(batch.sparse))).cpu().numpy())
            labels.append(batch.labels.cpu().numpy())
    model.train()
    ebc.train()
    if not labels:
        return {"heldout_auc": float("nan"), "heldout_logloss": float("nan"), "heldout_samples": 0}
    y, p = np.concatenate(labels), np.concatenate(scores)
    return {
        "heldout_auc": roc_auc(y, p) if 0 < y.sum() < len(y) else float("nan"),  # one class
        "heldout_logloss": log_loss(y, p),
        "heldout_samples": len(y),
    }
