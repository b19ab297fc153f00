"""One trainer rank of the sequence recommender: SASRec with item and user rows on the PS.

Every rank draws the same global batch (``batch_size * world`` samples) and
the balancer splits it: each rank trains on its share, so the ranks' samples
are always a split of the global batch. Item rows (history, target and
sampled negatives) and user rows go through the PS-backed embedding module
and the step pipeline (``--cache none``); the dense part is DDP. The loss is
summed over a rank's samples and divided by the global batch, so ranks with
different shares still average every sample alike.

Each step's forward and backward are timed on every rank; the report gives
the per-rank compute time and the straggler ratio (max over mean per step).
Rank 0 evaluates HR@10 and NDCG@10 on held-out users (the target among
``EVAL_NEGATIVES`` sampled items), next to the popularity baseline.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.balance import assign, calibrate_alpha
from ember.trainer.config import TrainConfig
from ember.trainer.data.batch import JaggedIds
from ember.trainer.data.interactions import InteractionsFile
from ember.trainer.data.sequences import SequenceBatch
from ember.trainer.data.synthetic_sequences import SyntheticSequences, SyntheticSequencesConfig
from ember.trainer.embedding import PSEmbeddingBagCollection
from ember.trainer.models.sasrec import SASRec, hit_rate_ndcg_at_k, sample_negatives
from ember.trainer.sources import TimedSource, build_row_source, close, flush
from torch.nn.parallel import DistributedDataParallel

EVAL_NEGATIVES = 100
CALIBRATION_LENGTHS = (2, 4, 8, 16, 32, 64)


def train_sequences(config: TrainConfig, device: torch.device, rank: int, world: int) -> dict:
    """Train SASRec on this rank; returns the run report (evaluation on rank 0)."""
    data, num_items = _data(config)
    specs = [
        TableSpec(
            f"{config.table_prefix}.{name}", config.dim, InitializerSpec(scale=0.05, seed=config.seed),
            OptimizerSpec(OptimizerKind[config.optimizer.upper()], lr=config.sparse_lr),
        )
        for name in ("items", "users")
    ]  # fmt: skip
    torch.manual_seed(config.seed)
    model = SASRec(config.dim, config.max_len).to(device)
    dense_model = (
        DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if world > 1
        else model
    )
    dense_opt = torch.optim.Adam(model.parameters(), lr=config.dense_lr)
    alpha = _cost_alpha(config, model, device, world)
    with PSClient(list(config.endpoints), config.client) as client:
        for spec in specs:
            client.create_table(spec)
        inner = build_row_source(client, config, specs, None, (rank, world), device)
        source = TimedSource(inner)
        ebc = PSEmbeddingBagCollection(
            source, [s.name for s in specs], grad_scale=1.0 / world, device=device
        )
        shares = _my_shares(config, data, num_items, rank, world, alpha)
        compute: list[list[float]] = []
        start, samples = time.perf_counter(), 0
        upcoming = next(shares, None)
        while upcoming is not None and len(compute) < config.steps:
            (batch, negatives, features), upcoming = upcoming, next(shares, None)
            dense_opt.zero_grad()
            items, users = ebc.lookup(features)
            if upcoming is not None and len(compute) + 1 < config.steps:
                ebc.prefetch(upcoming[2])
            began = time.perf_counter()
            loss = _loss(dense_model, batch, negatives, items, users, config, world)
            loss.backward()
            seconds = time.perf_counter() - began
            dense_opt.step()
            ebc.step()
            compute.append(_gathered(seconds, world, device))
            samples += config.batch_size * world
        with source.wait:
            flush(inner)
        wall = time.perf_counter() - start
        report = _report(config, compute, samples, wall, source.wait.seconds, alpha, data)
        report.update(rank=rank, world_size=world, config=dataclasses.asdict(config))
        if rank == 0:
            report.update(_evaluate(model, ebc, data, num_items, config, device))
        close(inner)
    return report


def _data(config: TrainConfig) -> tuple[SyntheticSequences | InteractionsFile, int]:
    if config.interactions_path is None:
        synthetic = SyntheticSequences(
            SyntheticSequencesConfig(max_len=config.max_len, seed=config.seed)
        )
        return synthetic, synthetic.config.num_items
    interactions = InteractionsFile.read(
        config.interactions_path, config.max_len, config.heldout_every
    )
    return interactions, interactions.num_items


def _global_batches(
    config: TrainConfig, data: SyntheticSequences | InteractionsFile, world: int
) -> Iterator[SequenceBatch]:
    size = config.batch_size * world
    if isinstance(data, SyntheticSequences):
        return (data.batch(size, index) for index in range(config.steps))
    # A file's last batch may be short; it still trains when every rank gets a sample.
    return (b for b in data.batches(size, "train", seed=config.seed) if b.batch_size >= world)


def _my_shares(
    config: TrainConfig, data, num_items: int, rank: int, world: int, alpha: float
) -> Iterator[tuple[SequenceBatch, torch.Tensor, list[JaggedIds]]]:
    """This rank's share of each global batch, its negatives and its lookup features."""
    for step, batch in enumerate(_global_batches(config, data, world)):
        mine = batch.select(assign(batch.lengths, world, config.balancer, alpha)[rank])
        seed = np.random.SeedSequence([config.seed, step, rank]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(seed))
        negatives = sample_negatives(
            generator, mine.batch_size, config.negatives, num_items, mine.targets
        )
        yield mine, negatives, lookup_features(mine, negatives)


def lookup_features(batch: SequenceBatch, candidates: torch.Tensor) -> list[JaggedIds]:
    """The item ids (history, then targets, then ``candidates`` row by row) and the user
    ids, each id a bag of its own: the collection returns one row per id."""
    items = torch.cat([batch.history.values, batch.targets, candidates.reshape(-1)])
    return [_singles(items), _singles(batch.users)]


def _singles(ids: torch.Tensor) -> JaggedIds:
    return JaggedIds(ids, torch.arange(len(ids) + 1, dtype=torch.int64))


def _scores(model, batch: SequenceBatch, items: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
    """Scores [batch, 1 + candidates]: column 0 the target."""
    nnz = len(batch.history.values)
    representation = model(items[:nnz], batch.history.offsets, users)
    candidates = items[nnz:].view(batch.batch_size, -1, items.shape[1])
    return SASRec.score(representation, candidates)


def _loss(model, batch, negatives, items, users, config: TrainConfig, world: int) -> torch.Tensor:
    scores = _scores(model, batch, items, users)
    target = torch.zeros(len(scores), dtype=torch.int64, device=scores.device)
    summed = torch.nn.functional.cross_entropy(scores, target, reduction="sum")
    return summed * world / (config.batch_size * world)  # DDP averages over ranks


def _gathered(seconds: float, world: int, device: torch.device) -> list[float]:
    """Every rank's compute seconds of this step."""
    if world == 1:
        return [seconds]
    mine = torch.tensor([seconds], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return [float(t) for t in every]


def _cost_alpha(config: TrainConfig, model: SASRec, device: torch.device, world: int) -> float:
    """The balancer's exponent: given, or timed on rank 0 and broadcast (every rank must
    split batches alike)."""
    if config.balance_alpha is not None or config.balancer != "cost":
        return config.balance_alpha or 1.0
    alpha = [0.0]
    if not dist.is_initialized() or dist.get_rank() == 0:
        alpha[0] = calibrated_alpha(model, config.dim, config.max_len, device)
    if world > 1:
        dist.broadcast_object_list(alpha, src=0)
    return alpha[0]


def calibrated_alpha(model: SASRec, dim: int, max_len: int, device: torch.device) -> float:
    """The exponent of ``seconds = a + b * length^alpha``, from timed forward and backward
    passes of 64 samples at each length (the fastest of 3)."""
    lengths = sorted({min(length, max_len) for length in CALIBRATION_LENGTHS})
    seconds = []
    for length in lengths:
        rows = torch.randn(64 * length, dim, device=device, requires_grad=True)
        users = torch.randn(64, dim, device=device)
        offsets = torch.arange(0, 64 * length + 1, length, dtype=torch.int64)
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            model(rows, offsets, users).sum().backward()
            best = min(best, time.perf_counter() - began)
        model.zero_grad()
        seconds.append(best / 64)
    return calibrate_alpha(lengths, seconds) if len(lengths) >= 3 else 1.0


def _report(config, compute, samples, wall, wait, alpha, data) -> dict:
    per_step = np.array(compute) if compute else np.zeros((0, 1))
    ratios = per_step.max(axis=1) / per_step.mean(axis=1) if len(per_step) else np.array([])
    return {
        "model": "sasrec",
        "steps": len(compute),
        "samples_per_s": samples / wall if wall else 0.0,
        "wall_s": wall,
        "ps_wait_s": wait,
        "balancer": config.balancer,
        "balance_alpha": alpha,
        "compute_s_per_rank": per_step.sum(axis=0).tolist(),
        "step_compute_max_s": float(per_step.max(axis=1).mean()) if len(per_step) else 0.0,
        "straggler_ratio": float(ratios.mean()) if len(ratios) else 1.0,
        "truncated_histories": data.stats.truncated,
        "dropped_empty_histories": data.stats.dropped_empty,
    }


def _evaluate(model, ebc, data, num_items: int, config: TrainConfig, device) -> dict:
    """HR@10 and NDCG@10 of the model and of item popularity on held-out users."""
    model.eval()
    ebc.eval()
    ranking = _popularity(data, num_items)
    model_scores, popular_scores = [], []
    with torch.no_grad():
        for index, batch in enumerate(_heldout(config, data)):
            generator = torch.Generator().manual_seed(config.seed + index)
            candidates = torch.cat(
                [
                    batch.targets[:, None],
                    sample_negatives(
                        generator, batch.batch_size, EVAL_NEGATIVES, num_items, batch.targets
                    ),
                ],
                dim=1,
            )
            items, users = ebc.lookup(lookup_features(batch, candidates[:, 1:]))
            model_scores.append(_scores(model, batch, items, users).cpu())
            popular_scores.append(-ranking[candidates].to(torch.float64))
    model.train()
    ebc.train()
    if not model_scores:
        return {"heldout_hr10": float("nan"), "heldout_ndcg10": float("nan")}
    hr, ndcg = hit_rate_ndcg_at_k(torch.cat(model_scores))
    popular_hr, popular_ndcg = hit_rate_ndcg_at_k(torch.cat(popular_scores))
    return {
        "heldout_hr10": hr,
        "heldout_ndcg10": ndcg,
        "popularity_hr10": popular_hr,
        "popularity_ndcg10": popular_ndcg,
        "heldout_samples": sum(len(s) for s in model_scores),
    }


def _heldout(config: TrainConfig, data) -> Iterator[SequenceBatch]:
    if isinstance(data, SyntheticSequences):
        return (data.batch(config.batch_size, i, "test") for i in range(config.eval_batches))
    batches = data.batches(config.batch_size, "test")
    return (b for _, b in zip(range(config.eval_batches), batches))


def _popularity(data, num_items: int) -> torch.Tensor:
    """Each item's popularity rank (0 the most popular) from training data."""
    if isinstance(data, SyntheticSequences):
        order = data.popularity_ranking(num_items)
    else:
        counts = torch.zeros(num_items, dtype=torch.int64)
        for batch in data.batches(4096, "train"):
            items = torch.cat([batch.history.values, batch.targets])
            counts += torch.bincount(items, minlength=num_items)
        order = torch.argsort(counts, descending=True, stable=True)
    ranks = torch.full((num_items,), num_items, dtype=torch.int64)
    ranks[order] = torch.arange(len(order))
    return ranks
