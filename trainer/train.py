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

import dataclasses
import itertools
import os
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ember.ps_server.client import PSClient
from ember.ps_server.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.cache.cached_source import CachedRowSource
from ember.trainer.cache.hot_cache import POLICIES, HotEmbeddingCache
from ember.trainer.cache.profiler import profile_hot_ids
from ember.trainer.cache.replicated_source import ReplicatedRowSource
from ember.trainer.data.batch import Batch
from ember.trainer.data.criteo import CriteoTSVReader
from ember.trainer.data.synthetic import NUM_DENSE, SyntheticCriteo, SyntheticCriteoConfig
from ember.trainer.embedding import PSEmbeddingBagCollection, PSRowSource
from ember.trainer.metrics import log_loss, roc_auc
from ember.trainer.models.dlrm import DLRM
from ember.trainer.progress import ProgressBar
from torch.nn.parallel import DistributedDataParallel


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What one training run does (every rank gets the same config)."""

    endpoints: tuple[str, ...]
    steps: int = 200
    batch_size: int = 1024
    eval_batches: int = 8
    dim: int = 16
    optimizer: str = "adagrad"
    sparse_lr: float = 0.05
    dense_lr: float = 0.05
    max_cardinality: int = 200_000
    zipf_exponent: float = 1.2
    seed: int = 0
    criteo_path: str | None = None
    table_prefix: str = "criteo"
    progress: bool = True
    device: str = "auto"
    heldout_every: int = 10
    cache: str = "none"
    cache_mb: float = 16.0
    pull_bound: int = 0
    push_bound: int = 0
    profile_batches: int = 8

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not self.endpoints:
            raise ValueError("endpoints must list at least one shard")
        for name in ("steps", "batch_size", "eval_batches", "dim", "max_cardinality"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.optimizer.upper() not in OptimizerKind.__members__:
            raise ValueError(
                f"optimizer must be one of {', '.join(k.lower() for k in OptimizerKind.__members__)}"
            )
        if not (self.sparse_lr > 0 and self.dense_lr > 0):
            raise ValueError("learning rates must be > 0")
        if self.cache not in ("none", "replicated", *POLICIES):
            raise ValueError(
                f"cache must be one of none, replicated, {', '.join(POLICIES)}, got {self.cache!r}"
            )
        if self.cache != "none" and not self.cache_mb > 0:
            raise ValueError(f"cache_mb must be > 0, got {self.cache_mb}")
        if self.pull_bound < 0 or self.push_bound < 0 or self.profile_batches < 1:
            raise ValueError("pull_bound and push_bound must be >= 0 and profile_batches >= 1")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {self.heldout_every}")
        resolve_device(self.device)


@dataclasses.dataclass
class _Timer:
    seconds: float = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start


RowSourceKind = PSRowSource | CachedRowSource | ReplicatedRowSource


class _TimedSource:
    """A row source that also accounts the time spent waiting for it."""

    def __init__(self, inner: RowSourceKind) -> None:
        self.inner = inner
        self.wait = _Timer()

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self.wait:
            return self.inner.rows(requests)

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        with self.wait:
            self.inner.apply_gradients(updates)


def train(config: TrainConfig) -> dict:
    """Train on this rank; returns the run report (complete on rank 0)."""
    config.validate()
    device = resolve_device(config.device)
    rank, world = _init_distributed(device)
    data = synthetic_data(config)
    specs = table_specs(config, data.num_features)
    torch.manual_seed(config.seed)  # identical dense initialisation on every rank
    model = DLRM(NUM_DENSE, data.num_features, config.dim).to(device)
    dense_model = (
        DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if world > 1
        else model
    )
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=config.dense_lr)
    reader = CriteoTSVReader(buckets=config.max_cardinality, batch_size=config.batch_size)
    with PSClient(list(config.endpoints)) as client:
        for spec in specs:
            client.create_table(spec)
        inner = build_row_source(client, config, specs, data, (rank, world), device)
        source = _TimedSource(inner)
        ebc = PSEmbeddingBagCollection(
            source, [s.name for s in specs], grad_scale=1.0 / world, device=device
        )
        progress = ProgressBar(config.steps) if config.progress and rank == 0 else None
        losses: list[float] = []
        batches = _train_batches(config, data, reader, rank, world)
        start = time.perf_counter()
        # A file's parts can differ by a batch between ranks; synthetic parts never do.
        uneven = config.criteo_path is not None and world > 1
        while len(losses) < config.steps:
            batch = next(batches, None)
            has_batch = batch is not None
            if uneven:
                has_batch = _every_rank_has_a_batch(has_batch, device)
            if not has_batch:
                break
            batch = batch.to(device)
            dense_opt.zero_grad()
            logits = dense_model(batch.dense, ebc(batch.sparse))
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
            loss.backward()
            dense_opt.step()
            ebc.step()
            losses.append(_mean_over_ranks(loss.detach(), world))
            if progress:
                elapsed = time.perf_counter() - start
                progress.update(
                    len(losses),
                    **{
                        "samples/s": len(losses) * config.batch_size * world / elapsed,
                        "loss": losses[-1],
                    },
                )
        with source.wait:
            flush(inner)
        wall = time.perf_counter() - start
        samples = len(losses) * config.batch_size
        report = {
            "rank": rank,
            "world_size": world,
            "device": str(device),
            "steps": len(losses),
            "samples_per_s": samples * world / wall if wall else 0.0,
            "cache_hit_rate": 0.0 if isinstance(inner, PSRowSource) else inner.hit_rate(),
            "bytes_pulled_per_sample": inner.traffic.bytes_pulled / max(1, samples),
            "bytes_pushed_per_sample": inner.traffic.bytes_pushed / max(1, samples),
            "final_train_loss": float(np.mean(losses[-10:])) if losses else float("nan"),
            "train_losses": losses,
            "wall_s": wall,
            "ps_wait_s": source.wait.seconds,
            "compute_s": wall - source.wait.seconds,
            "malformed_lines": reader.stats.malformed,
            "config": dataclasses.asdict(config),
        }
        if rank == 0:
            report.update(_evaluate(model, ebc, heldout_batches(config, data), device))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return report


def resolve_device(requested: str) -> torch.device:
    """The device a rank trains on.

    ``auto`` is ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` without
    an index is ``cuda:LOCAL_RANK`` (one GPU per torchrun rank).

    Raises:
        ValueError: not cpu, cuda or cuda:N, or a GPU that torch does not see.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {requested!r}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {requested!r}, but torch sees no GPU (torch {torch.__version__}, built with "
            f"CUDA {torch.version.cuda or 'none'}); use --device cpu"
        )
    index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise ValueError(f"device cuda:{index}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def process_group_backend(device: torch.device) -> str:
    """The torch.distributed backend for ranks on ``device``: NCCL for GPUs, gloo for CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"


def build_row_source(
    client: PSClient,
    config: TrainConfig,
    specs: list[TableSpec],
    data: SyntheticCriteo,
    rank_of: tuple[int, int],
    device: torch.device,
) -> RowSourceKind:
    """The PS directly, hot-embedding caches, or replicated hot rows, sized by a profiling pass.

    ``rank_of`` is ``(rank, world size)``. The replicated hot set must be the same on every
    rank, so it is profiled on part 0 of the data everywhere; caches profile the rank's own part.
    """
    if config.cache == "none":
        return PSRowSource(client)
    rank, world = rank_of
    part = 0 if config.cache == "replicated" else rank
    names = [s.name for s in specs]
    sample = profile_batches(config, data, part, world)
    hot = profile_hot_ids(sample, names, int(config.cache_mb * 2**20), config.dim)
    if config.cache == "replicated":
        source = ReplicatedRowSource(
            client, {s.name: s for s in specs}, hot, writer=rank == 0, device=device
        )
    else:
        caches = {
            spec.name: HotEmbeddingCache(
                config.dim,
                max(1, len(hot[spec.name])),
                config.cache,
                config.pull_bound,
                config.push_bound,
                local_lr=spec.optimizer.lr,
                hot_ids=hot[spec.name] if config.cache == "static" else None,
                device=device,
            )
            for spec in specs
        }
        source = CachedRowSource(client, caches)
    source.warm()
    return source


def profile_batches(
    config: TrainConfig, data: SyntheticCriteo, part: int, parts: int
) -> Iterator[Batch]:
    """The first ``profile_batches`` training batches of ``part`` of ``parts`` (a rank's
    share), from the data the run trains on."""
    if config.criteo_path is None:
        return (
            data.batch(config.batch_size, index, "train", part=part)
            for index in range(config.profile_batches)
        )
    reader = CriteoTSVReader(buckets=config.max_cardinality, batch_size=config.batch_size)
    batches = _dealt(reader.read(config.criteo_path, "train", config.heldout_every), part, parts)
    return itertools.islice(batches, config.profile_batches)


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


def flush(source: RowSourceKind) -> None:
    """Push or write back whatever the source holds locally (no-op for the direct source)."""
    if not isinstance(source, PSRowSource):
        source.flush()


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
    yield from _dealt(reader.read(config.criteo_path, "train", config.heldout_every), rank, world)


def _dealt(batches: Iterator[Batch], part: int, parts: int) -> Iterator[Batch]:
    """Batch b of ``batches`` goes to part ``b % parts``: this part's batches."""
    return itertools.islice(batches, part, None, parts)


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
