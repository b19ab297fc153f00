"""One trainer rank of the sequence recommender: SASRec with item and user rows on the PS.

Every rank draws the same global batch (``batch_size * world`` samples) and
the balancer splits it: each rank trains on its share, so the ranks' samples
are always a split of the global batch. Item rows (history, target and
sampled negatives) and user rows go through the PS-backed embedding module
and the step pipeline (``--cache none``). A rank's loss is its samples' summed
loss over the global batch, so the ranks' gradients add up to the global
mean's: the dense ones are summed by one all-reduce, the sparse ones by the
shards (exact mode).

Each step's forward and backward are timed on every rank before the dense
gradients' all-reduce (DDP's would fold the wait for the slowest rank into
every rank's backward); the report gives the per-rank compute time and the
straggler ratio (max over mean per step), measured and as the balancer's
cost model predicts it. Rank 0 evaluates HR@10 and NDCG@10 on held-out users
(the target among ``EVAL_NEGATIVES`` sampled items), next to the popularity
baseline.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.wire.table_spec import InitializerSpec, OptimizerKind, OptimizerSpec, TableSpec
from ember.trainer.balance import (
    SampleCost,
    assign,
    calibrate_cost,
    predicted_costs,
    straggler_ratio,
)
from ember.trainer.config import SASREC_HEADS, TrainConfig
from ember.trainer.data.batch import JaggedIds
from ember.trainer.data.interactions import InteractionsFile
from ember.trainer.data.sequences import SequenceBatch
from ember.trainer.data.synthetic_sequences import SyntheticSequences, SyntheticSequencesConfig
from ember.trainer.embedding import PSEmbeddingBagCollection
from ember.trainer.lookahead import Lookahead
from ember.trainer.models.sasrec import (
    SASRec,
    bucket_widths,
    hit_rate_ndcg_at_k,
    sample_negatives,
    sampled_softmax_loss,
)
from ember.trainer.rank_zero import decided_on_rank_zero
from ember.trainer.sources import TimedSource, build_row_source, close, flush

log = logging.getLogger(__name__)

EVAL_NEGATIVES = 100
CALIBRATION_ITEMS = 4096


def train_sequences(config: TrainConfig, device: torch.device, rank: int, world: int) -> dict:
    """Train SASRec on this rank; returns the run report (evaluation on rank 0)."""
    data, num_items = _data(config, world)
    specs = [
        TableSpec(
            f"{config.table_prefix}.{name}", config.dim, InitializerSpec(scale=0.05, seed=config.seed),
            OptimizerSpec(OptimizerKind[config.optimizer.upper()], lr=config.sparse_lr),
        )
        for name in ("items", "users")
    ]  # fmt: skip
    torch.manual_seed(config.seed)  # the same dense initialisation on every rank
    model = SASRec(config.dim, config.max_len, heads=SASREC_HEADS).to(device)
    dense_opt = torch.optim.Adam(model.parameters(), lr=config.dense_lr)
    cost = _sample_cost(config, model, device, world)
    with PSClient(list(config.endpoints), config.client) as client:
        for spec in specs:
            client.create_table(spec)
        inner = build_row_source(client, config, specs, None, (rank, world), device)
        source = TimedSource(inner)
        ebc = PSEmbeddingBagCollection(source, [s.name for s in specs], device=device)
        shares = _my_shares(config, data, num_items, rank, world, cost)
        steps: list[_Step] = []
        start = time.perf_counter()
        # Planned on this thread, not beside the compute as train() plans: each step's compute
        # is timed to balance the ranks, and planning beside it would count in it.
        ahead = Lookahead(
            shares, source.lookahead, config.steps, lambda upcoming: ebc.prefetch(upcoming.features)
        )
        while len(steps) < config.steps and (share := ahead.take()) is not None:
            dense_opt.zero_grad()
            items, users = ebc.lookup(share.features)
            with source.inside:
                ahead.announce()  # the next steps' rows come while this one computes
            _synchronize(device)
            began = time.perf_counter()
            scores = _scores(model, share.batch, items, users)
            loss = sampled_softmax_loss(scores) * share.batch.batch_size / share.global_size
            loss.backward()
            _synchronize(device)
            seconds = time.perf_counter() - began
            _sum_over_ranks(model, world)
            ebc.step()  # first: the embedding update leaves while the dense step runs
            dense_opt.step()
            steps.append(_Step(share, *_gathered(seconds, loss.item(), world, device)))
        with source.inside:
            flush(inner)
        wall = time.perf_counter() - start
        if len(steps) < config.steps:
            log.warning(
                "the data ran out after %d of %d steps (%s)",
                len(steps), config.steps, config.interactions_path,
            )  # fmt: skip
        report = _report(config, steps, wall, source, cost, data)
        report.update(rank=rank, world_size=world, config=dataclasses.asdict(config))
        report["dense_checksums"] = _checksums(model, world, device)
        if rank == 0:
            report.update(_evaluate(model, ebc, data, num_items, config, device))
        close(inner)
    return report


def _data(config: TrainConfig, world: int) -> tuple[SyntheticSequences | InteractionsFile, int]:
    """The data every rank trains on, and its item count. A file is read on every rank;
    the ranks check they read the same samples (or raise together), and a file too small
    to train on is refused before any table exists."""
    if config.interactions_path is None:
        items = min(config.max_cardinality, SyntheticSequencesConfig.num_items)
        synthetic = SyntheticSequences(
            SyntheticSequencesConfig(num_items=items, max_len=config.max_len, seed=config.seed)
        )
        return synthetic, synthetic.config.num_items
    outcome: tuple = (None, "")
    interactions = None
    try:
        interactions = InteractionsFile.read(
            config.interactions_path, config.max_len, config.heldout_every
        )
        outcome = (interactions.summary(), "")
    except (OSError, ValueError) as error:
        outcome = (None, f"{type(error).__name__}: {error}")
    every = [outcome] * world
    if world > 1:
        dist.all_gather_object(every, outcome)
    failed = [f"rank {rank}: {why}" for rank, (_, why) in enumerate(every) if why]
    if failed:
        raise ValueError(f"reading {config.interactions_path} failed: {'; '.join(failed)}")
    if len({summary for summary, _ in every}) > 1:
        raise ValueError(
            f"the ranks read different data from {config.interactions_path}: "
            f"{[summary for summary, _ in every]}"
        )
    train_samples = interactions.num_samples("train")
    if train_samples < world or interactions.num_items < 2:
        raise ValueError(
            f"{config.interactions_path} has {train_samples} training samples and "
            f"{interactions.num_items} items: training needs a sample per rank ({world}) "
            "and 2 items (a target and a negative)"
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


@dataclasses.dataclass
class _Share:
    """This rank's part of one global batch, with its lookups."""

    batch: SequenceBatch
    features: list[JaggedIds]
    global_size: int
    predicted_costs: list[float]  # every rank's, by the balancer's cost model


@dataclasses.dataclass
class _Step:
    share: _Share
    seconds: list[float]  # every rank's compute
    loss: float  # the global batch's mean


def _my_shares(
    config: TrainConfig, data, num_items: int, rank: int, world: int, cost: SampleCost
) -> Iterator[_Share]:
    """This rank's share of each global batch (every rank computes the same split: the
    balancer is a pure function of the lengths), its negatives and lookup features."""
    for step, batch in enumerate(_global_batches(config, data, world)):
        # The model pads each sample to its power-of-two bucket: that is what it costs.
        padded = bucket_widths(batch.lengths, config.max_len)
        lengths = padded if config.balancer == "cost" else batch.lengths
        split = assign(lengths, world, config.balancer, cost)
        mine = batch.select(split[rank])
        seed = np.random.SeedSequence([config.seed, step, rank]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(seed))
        negatives = sample_negatives(
            generator, mine.batch_size, config.negatives, num_items, mine.targets
        )
        features = lookup_features(mine, negatives)
        yield _Share(mine, features, batch.batch_size, predicted_costs(padded, split, cost))


def lookup_features(batch: SequenceBatch, negatives: torch.Tensor) -> list[JaggedIds]:
    """The item ids (history, then each sample's target and ``negatives`` [batch, N], sample
    by sample) and the user ids, each id a bag of its own: one row per id comes back."""
    candidates = torch.cat([batch.targets[:, None], negatives], dim=1)
    items = torch.cat([batch.history.values, candidates.reshape(-1)])
    return [_singles(items), _singles(batch.users)]


def _singles(ids: torch.Tensor) -> JaggedIds:
    return JaggedIds(ids, torch.arange(len(ids) + 1, dtype=torch.int64))


def _scores(model, batch: SequenceBatch, items: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
    """Scores [batch, 1 + negatives]: column 0 the target (the layout of
    :func:`lookup_features`)."""
    nnz = len(batch.history.values)
    representation = model(items[:nnz], batch.history.offsets, users)
    candidates = items[nnz:].view(batch.batch_size, -1, items.shape[1])
    return SASRec.score(representation, candidates)


def _synchronize(device: torch.device) -> None:
    """Wait for the compute stream's queued work, so the host clock times it (CUDA is
    async); copies on other streams are not waited for."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _sum_over_ranks(model: torch.nn.Module, world: int) -> None:
    """Sum every rank's dense gradients (one all-reduce of one flat buffer)."""
    if world == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    start = 0
    for parameter, grad in zip(model.parameters(), grads):
        parameter.grad = flat[start : start + grad.numel()].view_as(grad)
        start += grad.numel()


def _every_rank(values: list[float], world: int, device: torch.device) -> list[list[float]]:
    """Each rank's ``values`` (float64), rank by rank."""
    if world == 1:
        return [values]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def _checksums(model: torch.nn.Module, world: int, device: torch.device) -> list[float]:
    """Every rank's sum of its dense parameters (equal when the ranks stayed in step)."""
    mine = float(torch.stack([p.detach().double().sum() for p in model.parameters()]).sum())
    return [rank[0] for rank in _every_rank([mine], world, device)]


def _gathered(
    seconds: float, loss: float, world: int, device: torch.device
) -> tuple[list[float], float]:
    """Every rank's compute seconds of this step, and the global batch's mean loss."""
    every = _every_rank([seconds, loss], world, device)
    return [rank[0] for rank in every], sum(rank[1] for rank in every)


def _sample_cost(
    config: TrainConfig, model: SASRec, device: torch.device, world: int
) -> SampleCost:
    """The balancer's cost model (``cost`` splits by it; every balancer's predicted
    straggler ratio is priced by it): ``--balance-alpha`` and ``--balance-fixed``, or timed
    on rank 0 and broadcast (every rank must split batches alike; a failure on rank 0 is
    raised on every rank)."""
    if config.balance_alpha is not None:
        return SampleCost(config.balance_alpha, fixed=config.balance_fixed)
    if world == 1:
        return SampleCost()  # one rank: nothing to balance
    return decided_on_rank_zero(
        lambda: calibrated_cost(model, config, device),
        world,
        "calibrating the balancer's cost",
        error=RuntimeError,
    )


def calibrated_cost(model: SASRec, config: TrainConfig, device: torch.device) -> SampleCost:
    """``seconds = a + b * length^alpha`` fitted to timed forward and backward passes at
    every width the model pads to (powers of two up to ``max_len``, and ``max_len``), each
    of up to a rank's batch of samples and about ``CALIBRATION_ITEMS`` history items (a
    pass's own overhead is shared as in training; the fastest of 3)."""
    dim, max_len = config.dim, config.max_len
    lengths = sorted({min(2**k, max_len) for k in range(max_len.bit_length() + 1)})
    seconds = []
    for length in lengths:
        count = max(2, min(config.batch_size, CALIBRATION_ITEMS // length))
        rows = torch.randn(count * length, dim, device=device, requires_grad=True)
        users = torch.randn(count, dim, device=device)
        offsets = torch.arange(0, count * length + 1, length, dtype=torch.int64)
        best = float("inf")
        for _ in range(3):
            _synchronize(device)
            began = time.perf_counter()
            model(rows, offsets, users).sum().backward()
            _synchronize(device)
            best = min(best, time.perf_counter() - began)
        model.zero_grad()
        seconds.append(best / count)
    return calibrate_cost(lengths, seconds) if len(lengths) >= 3 else SampleCost()


def _report(
    config: TrainConfig, steps: list[_Step], wall: float, source: TimedSource, cost, data
) -> dict:
    seconds = np.array([step.seconds for step in steps]) if steps else np.zeros((0, 1))
    measured = [straggler_ratio(step.seconds) for step in steps]
    predicted = [straggler_ratio(step.share.predicted_costs) for step in steps]
    losses = [step.loss for step in steps]
    return {
        "model": "sasrec",
        "steps": len(steps),
        "samples_per_s": sum(s.share.global_size for s in steps) / wall if wall else 0.0,
        "wall_s": wall,
        "ps_wait_s": source.ps_wait_s,
        "embedding_work_s": source.embedding_work_s,
        "train_losses": losses,
        "final_train_loss": float(np.mean(losses[-10:])) if losses else float("nan"),
        "balancer": config.balancer,
        "balance_cost": dataclasses.asdict(cost),  # priced every balancer's prediction
        "compute_s_per_rank": seconds.sum(axis=0).tolist(),
        "step_compute_max_s": float(seconds.max(axis=1).mean()) if steps else 0.0,
        "step_compute_mean_s": float(seconds.mean()) if steps else 0.0,
        "straggler_ratio": float(np.mean(measured)) if steps else 1.0,
        "predicted_straggler_ratio": float(np.mean(predicted)) if steps else 1.0,
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
    order = data.popularity_ranking(num_items)
    ranks = torch.full((num_items,), num_items, dtype=torch.int64)
    ranks[order] = torch.arange(len(order))
    return ranks
