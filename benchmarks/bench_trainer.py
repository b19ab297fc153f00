"""Training throughput: single-process reference vs Ember without and with the hot cache.

One run, same data, model and batch size:
  (a) single-process DLRM with nn.EmbeddingBag tables (sparse Adagrad),
  (b) Ember, 1 trainer, 2 shards, cache off,
  (c) Ember, 1 trainer, 2 shards, hot cache on (static and lru) with bounded staleness,
and, for comparison, the replicated hot set (exact, no staleness).
Prints samples/s, ratios and bytes per sample.

Usage: python benchmarks/bench_trainer.py [--steps 60] [--batch-size 1024] [--max-cardinality 100000]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.malloc_tuning import retain_freed_buffers
from ember.trainer.config import TrainConfig
from ember.trainer.data.synthetic import NUM_DENSE
from ember.trainer.models.dlrm import DLRM
from ember.trainer.train import synthetic_data, table_specs, train


def reference_samples_per_s(config: TrainConfig) -> float:
    """(a): nn.EmbeddingBag tables in this process, sparse Adagrad, same data and model."""
    data = synthetic_data(config)
    specs = table_specs(config, data.num_features)
    torch.manual_seed(config.seed)
    model = DLRM(NUM_DENSE, data.num_features, config.dim)
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(c, config.dim, mode="sum", sparse=True, include_last_offset=True)
        for c in data.config.cardinalities
    )
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=config.dense_lr)
    sparse_opt = torch.optim.Adagrad(bags.parameters(), lr=specs[0].optimizer.lr)
    start = time.perf_counter()
    for step in range(config.steps):
        batch = data.batch(config.batch_size, step)
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        embedded = torch.stack(
            [bag(f.values, f.offsets) for bag, f in zip(bags, batch.sparse)], dim=1
        )
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, embedded), batch.labels)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
    return config.steps * config.batch_size / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--max-cardinality", type=int, default=100_000)
    parser.add_argument("--cache-mb", type=float, default=16.0)
    parser.add_argument(
        "--bound", type=int, default=4, help="pull and push bound of the cached runs"
    )
    args = parser.parse_args()
    retain_freed_buffers()
    base = TrainConfig(
        endpoints=("unused:0",), steps=args.steps, batch_size=args.batch_size,
        max_cardinality=args.max_cardinality, eval_batches=1, progress=False,
    )  # fmt: skip
    results = {"(a) reference, nn.EmbeddingBag": (reference_samples_per_s(base), None, None)}
    runs = [
        ("(b) Ember, cache off", {"cache": "none"}),
        ("(c) Ember, static cache", {"cache": "static"}),
        ("(c) Ember, lru cache", {"cache": "lru"}),
        ("Ember, replicated hot rows", {"cache": "replicated"}),
    ]
    with LocalCluster(2) as cluster:
        for number, (name, change) in enumerate(runs):
            config = TrainConfig(
                **{
                    **base.__dict__,
                    "endpoints": tuple(cluster.endpoints),
                    "table_prefix": f"bench{number}",
                    "cache_mb": args.cache_mb,
                    "pull_bound": args.bound if change["cache"] != "none" else 0,
                    "push_bound": args.bound if change["cache"] != "none" else 0,
                    **change,
                }
            )
            report = train(config)
            results[name] = (report["samples_per_s"], report, report["cache_hit_rate"])
    reference = results["(a) reference, nn.EmbeddingBag"][0]
    uncached = results["(b) Ember, cache off"]
    print(
        f"DLRM, 26 tables (cardinality cap {args.max_cardinality}), dim {base.dim}, batch {args.batch_size}, "
        f"{args.steps} steps; cache {args.cache_mb} MiB, bounds {args.bound}"
    )
    print(
        f"{'run':<32} {'samples/s':>10} {'vs (a)':>7} {'vs (b)':>7} {'hit rate':>8} {'B/sample':>9} {'vs (b)':>7}"
    )
    for name, (speed, report, hit_rate) in results.items():
        if report is None:
            print(f"{name:<32} {speed:>10.0f} {1.0:>7.2f}")
            continue
        traffic = report["bytes_pulled_per_sample"] + report["bytes_pushed_per_sample"]
        base_traffic = (
            uncached[1]["bytes_pulled_per_sample"] + uncached[1]["bytes_pushed_per_sample"]
        )
        print(
            f"{name:<32} {speed:>10.0f} {speed / reference:>7.2f} {speed / uncached[0]:>7.2f} "
            f"{hit_rate:>8.1%} {traffic:>9.0f} {traffic / base_traffic:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
