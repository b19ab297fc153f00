"""The row sources a trainer rank reads and updates embeddings through, built from its config.

``cache`` none: the PS directly (serial) or the step pipeline; ``replicated``:
the profiled hot set replicated on every rank in front of either; ``static``,
``lru``, ``lfu``: a hot-embedding cache in front of the PS, serial or with the
next step's misses pulled early and its freshness checks sent behind this
step's push.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator

import torch
import torch.distributed as dist
from ember.kernels.optim import state_width
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.wire.table_spec import OptimizerKind, TableSpec
from ember.trainer.cache.cached_source import CachedRowSource
from ember.trainer.cache.hot_cache import HotEmbeddingCache
from ember.trainer.cache.profiler import (
    cache_bytes_per_row,
    profile_hot_ids,
    replica_bytes_per_row,
)
from ember.trainer.cache.replicated_source import ReplicatedRowSource
from ember.trainer.config import TrainConfig
from ember.trainer.data.batch import Batch
from ember.trainer.data.criteo import CriteoTSVReader
from ember.trainer.data.synthetic import SyntheticCriteo
from ember.trainer.embedding import PSRowSource
from ember.trainer.pipeline import PipelinedRowSource
from ember.trainer.pipeline_timing import PipelineTiming
from ember.trainer.timer import Timer

log = logging.getLogger(__name__)

PROFILE_FIRST_BATCH = 1 << 40  # synthetic profile samples: far past any run's batches
RowSourceKind = PSRowSource | PipelinedRowSource | CachedRowSource | ReplicatedRowSource


class TimedSource:
    """A row source that also accounts where the step's time in it goes.

    ``inside``: time the training thread spent on the source's behalf: in its calls
    (waiting, and this rank's embedding work: hot rows' lookups and optimizer steps,
    placing rows), and, as the training loops time it, planning the next steps' ids
    (deduplicating, splitting hot from cold, :meth:`prefetch`) or waiting for a planning
    thread to finish that. :attr:`ps_wait_s`: the part of it blocked on the shards or on
    other ranks (collectives); the exposed PS wait. A pipeline's background lookups and
    updates, and a planning thread's own time, are in neither.
    """

    def __init__(self, inner: RowSourceKind) -> None:
        self.inner = inner
        self.inside = Timer()
        self._blocked_before = inner.blocked_s  # taking hot rows over is setup, not a step

    @property
    def ps_wait_s(self) -> float:
        """Seconds the training thread was blocked on the shards or other ranks since this
        wrapper was made."""
        return self.inner.blocked_s - self._blocked_before

    @property
    def embedding_work_s(self) -> float:
        """Seconds of the training thread's time in the source that were not wait: this
        rank's own embedding work."""
        return self.inside.seconds - self.ps_wait_s

    def rows(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self.inside:
            return self.inner.rows(requests)

    @property
    def lookahead(self) -> int:
        """How many steps ahead the source takes ids (see the RowSource protocol)."""
        return getattr(self.inner, "lookahead", 1)

    def prefetch(self, requests: dict[str, torch.Tensor]) -> None:
        """Hand later steps' ids on, untimed: a planning thread may call it (see
        :mod:`ember.trainer.lookahead`); the training loop times the announcing, and the
        wait for the planning, in :attr:`inside`."""
        prefetch = getattr(self.inner, "prefetch", None)
        if prefetch is not None:
            prefetch(requests)

    def apply_gradients(self, updates: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        with self.inside:
            self.inner.apply_gradients(updates)

    def read(self, requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self.inside:  # whatever it waits for is in ps_wait_s too
            return self.inner.read(requests)


def build_row_source(
    client: PSClient,
    config: TrainConfig,
    specs: list[TableSpec],
    data: SyntheticCriteo,
    rank_of: tuple[int, int],
    device: torch.device,
) -> RowSourceKind:
    """The row source ``config`` asks for, its hot set profiled on this rank's data.

    ``rank_of`` is ``(rank, world size)``. The replicated hot set must be the same on every
    rank, so it is profiled on part 0 of the data everywhere; caches profile the rank's own
    part. Pipelines of one job share a job name (new per run, chosen by rank 0).
    """
    rank, world = rank_of
    cold = PSRowSource(client)
    if config.clocked():
        job = StepJob(
            job_name(world), world, rank, config.update_mode, config.wait_s,
            replica=config.cache == "replicated",
        )  # fmt: skip
        wire_dtypes = {spec.name: config.wire_dtype for spec in specs}
        cold = PipelinedRowSource(StepClient(client, job, wire_dtypes), config.staleness, device)
    if config.cache == "none":
        return cold
    part = 0 if config.cache == "replicated" else rank
    names = [s.name for s in specs]
    sample = profile_batches(config, data, part, world)
    hot = profile_hot_ids(sample, names, int(config.cache_mb * 2**20), hot_row_bytes(config))
    if config.cache == "replicated":
        source = ReplicatedRowSource(
            client, {s.name: s for s in specs}, hot, writer=rank == 0, cold=cold, device=device
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
        source = CachedRowSource(client, caches, overlap=config.pipelined())
    source.warm()
    return source


def hot_row_bytes(config: TrainConfig) -> int:
    """Trainer memory of one hot row of ``config``'s cache (what ``cache_mb`` is divided
    by): a replica holds its optimizer state, a cache row its pending gradient."""
    if config.cache == "replicated":
        kind = OptimizerKind[config.optimizer.upper()]
        return replica_bytes_per_row(config.dim, state_width(kind, config.dim))
    return cache_bytes_per_row(config.dim)


def job_name(world: int) -> str:
    """A job name new for this run, the same on every rank (rank 0's, broadcast)."""
    name = [f"train-{uuid.uuid4().hex}"]
    if world > 1:
        dist.broadcast_object_list(name, src=0)
    return name[0]


def profile_batches(
    config: TrainConfig, data: SyntheticCriteo, part: int, parts: int
) -> Iterator[Batch]:
    """``profile_batches`` training batches of ``part`` of ``parts`` (a rank's share): for
    synthetic data, batches drawn like the run's but never trained on (a sample of the
    law, so the hot set is not fitted to the steps it is measured on); for a file, its first
    training batches."""
    if config.criteo_path is None:
        return (
            data.batch(config.batch_size, PROFILE_FIRST_BATCH + index, "train", part=part)
            for index in range(config.profile_batches)
        )
    reader = CriteoTSVReader(buckets=config.max_cardinality, batch_size=config.batch_size)
    batches = dealt(reader.read(config.criteo_path, "train", config.heldout_every), part, parts)
    return itertools.islice(batches, config.profile_batches)


def dealt(batches: Iterator[Batch], part: int, parts: int) -> Iterator[Batch]:
    """Batch b of ``batches`` goes to part ``b % parts``: this part's batches."""
    return itertools.islice(batches, part, None, parts)


def flush(source: RowSourceKind, last: bool = False) -> None:
    """Push, write back or wait for whatever the source holds locally or has in flight;
    ``last``: training is over (replicas are no longer held)."""
    if isinstance(source, ReplicatedRowSource):
        source.flush(last=last)
    elif (flush_source := getattr(source, "flush", None)) is not None:
        flush_source()


def release(source: RowSourceKind) -> None:
    """Training failed: a replicated source stops holding its replicas on the shards (best
    effort; the rows stepped since its last write-back are lost)."""
    if isinstance(source, ReplicatedRowSource):
        try:
            source.release()
        except Exception as error:  # noqa: BLE001 - the failure being raised matters more
            log.warning("could not release this job's replicas on the shards: %s", error)


def pipeline_timing(source: RowSourceKind) -> PipelineTiming | None:
    """The step pipeline's timing where ``source`` is one or wraps one, else None."""
    inner = getattr(source, "cold", source)
    return inner.timing if isinstance(inner, PipelinedRowSource) else None


def close(source: RowSourceKind) -> None:
    """Stop a source's background work (after :meth:`flush`)."""
    inner = getattr(source, "cold", source)
    stop = getattr(inner, "close", None)
    if stop is not None:
        stop()
