"""Training throughput: the single-process reference against Ember's data paths, on loopback
and on a rate-limited link.

One run, same data, model and batch size, 1 trainer and 2 shards:
  (a)  single-process DLRM with nn.EmbeddingBag tables (sparse Adagrad), no PS; a feature
       whose bags hold one id each is a sparse gather (F.embedding), as Ember pools it;
  (b)  Ember's serial path, no cache: pull, compute, push;
  (c0) the step pipeline with staleness 0, no replica (exact: equals (b)'s results);
  (c1) the step pipeline with staleness 1 and the hot rows replicated on the trainer;
  (d)  the LRU cache, its misses pulled early and its freshness checks behind the push;
  (c1) again with its step calls over UCX (shards started with --ucx; UCX_TLS=tcp), and
       with its cold rows and gradients as bfloat16 on the wire.
Each network section runs (a) too, and makes all its runs --rounds times in turn (a fresh
cluster each round), so every ratio compares runs made over the same time: each figure is
its run's median round, and a ratio divides two such figures; (a)
runs with all cores' threads and with one, and the faster counts; the one-thread run
is shown too, as (a1): the thread budget of the Ember runs' trainer. The trainer of the Ember
runs uses one thread (its shards share the cores).
The shaped section puts the shards in a network namespace behind a veth pair limited by
tc HTB (needs root; otherwise it says why and only loopback runs).

Prints samples/s and the spread of the rounds' samples/s, ratios, bytes per sample by
category, the exposed PS wait, CPU per step (trainer and shards) and the served clock lag,
then the issue's targets, met or missed.
"wait" is the time the steps were blocked on the shards; "emb" the rest of their time in the
row source, the trainer's own embedding work (hot rows' lookup and optimizer, splitting).

Usage: python benchmarks/bench_trainer.py [--steps 200] [--batch-size 1024] [--rate-mbit 25]
    [--rounds 3] [--loopback-only]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from bench_timing import process_cpu_seconds
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.ucx import ucx_missing
from ember.trainer.config import TrainConfig
from ember.trainer.data.batch import JaggedIds
from ember.trainer.data.synthetic import NUM_DENSE
from ember.trainer.models.dlrm import DLRM
from ember.trainer.train import synthetic_data, table_specs, train
from figures import Figures, add_json_flag
from shaped_link import LinkUnavailable, ShapedLink

SERIAL = "(b) serial, no cache"
RUNS = {
    SERIAL: {"cache": "none", "data_path": "serial"},
    "(c0) pipeline s=0": {"cache": "none", "data_path": "pipeline", "staleness": 0},
    "(c1) pipeline s=1, hot replica": {
        "cache": "replicated", "data_path": "pipeline", "staleness": 1,
    },
    "(d) lru, piggybacked checks": {"cache": "lru", "data_path": "pipeline"},
    "(c1) over UCX": {
        "cache": "replicated", "data_path": "pipeline", "staleness": 1,
        "client": ClientConfig(transport="ucx"),
    },
    "(c1) bfloat16 rows on the wire": {
        "cache": "replicated", "data_path": "pipeline", "staleness": 1, "wire_dtype": "bfloat16",
    },
}  # fmt: skip
CATEGORIES = ("pulled", "pushed", "hot_allreduce", "control")
WARM_UP_STEPS = 20  # an untimed serial run on each fresh cluster before the timed ones


@dataclasses.dataclass
class RunResult:
    """One run's figures."""

    samples_per_s: float
    bytes_per_sample: dict[str, float]
    exposed_wait_share: float = 0.0  # blocked on the shards (the exposed PS wait)
    embedding_work_share: float = 0.0  # the trainer's own embedding work in the row source
    trainer_cpu_ms_per_step: float = 0.0
    shards_cpu_ms_per_step: float = 0.0
    max_clock_lag: int = 0
    hit_rate: float = 0.0
    replica_sync_mib: float = 0.0  # once per run: hot replicas loaded and written back
    round_spread: float = 0.0  # (fastest - slowest) / median samples/s over the rounds

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_per_sample.values())


REFERENCE, ONE_THREAD = "(a) reference, no PS", "(a1) reference, one thread"


def reference_runs(config: TrainConfig) -> dict[str, RunResult]:
    """(a) with every core's threads and with one: the faster is the baseline at its best;
    the one-thread run, shown beside it, has the thread budget of the Ember runs' trainer
    (their shards share the cores)."""
    runs = {}
    for threads in (os.cpu_count() or 1, 1):
        torch.set_num_threads(threads)
        runs[threads] = reference_run(config)
    return {REFERENCE: max(runs.values(), key=lambda r: r.samples_per_s), ONE_THREAD: runs[1]}


def reference_run(config: TrainConfig) -> RunResult:
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
    cpu_before, start = time.process_time(), time.perf_counter()
    for step in range(config.steps):
        batch = data.batch(config.batch_size, step)
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        embedded = torch.stack([_pooled(bag, f) for bag, f in zip(bags, batch.sparse)], dim=1)
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, embedded), batch.labels)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
    wall = time.perf_counter() - start
    return RunResult(
        config.steps * config.batch_size / wall,
        dict.fromkeys(CATEGORIES, 0.0),
        trainer_cpu_ms_per_step=(time.process_time() - cpu_before) * 1000 / config.steps,
    )


def _pooled(bag: torch.nn.EmbeddingBag, feature: JaggedIds) -> torch.Tensor:
    """A feature's pooled rows: a gather where every bag holds one id (the op Ember's collection
    pools such batches with, there over all tables at once), else the bag's own pooling."""
    if feature.one_id_per_bag():
        return F.embedding(feature.values, bag.weight, sparse=True)
    return bag(feature.values, feature.offsets)


def ember_run(config: TrainConfig, shard_pids: list[int]) -> RunResult:
    """One Ember run. CPU: the trainer's training loop (all its threads), and the shards'
    over the whole run (their share of setup and evaluation included)."""
    shards_before = sum(map(process_cpu_seconds, shard_pids))
    report = train(config)
    shards_cpu = sum(map(process_cpu_seconds, shard_pids)) - shards_before
    steps = report["steps"]
    return RunResult(
        report["samples_per_s"],
        {c: report[f"bytes_{c}_per_sample"] for c in CATEGORIES},
        exposed_wait_share=report["ps_wait_s"] / report["wall_s"],
        embedding_work_share=report["embedding_work_s"] / report["wall_s"],
        trainer_cpu_ms_per_step=report["cpu_s"] * 1000 / steps,
        shards_cpu_ms_per_step=shards_cpu * 1000 / steps,
        max_clock_lag=report["max_clock_lag"],
        hit_rate=report["cache_hit_rate"],
        replica_sync_mib=report["bytes_replica_sync"] / 2**20,
    )


def run_section(
    base: TrainConfig, cluster_args: dict, label: str, bound: int, rounds: int
) -> dict[str, RunResult]:
    """(a) and every Ember run, all of them ``rounds`` times in turn (so drift over the section
    meets every run alike): each round's Ember runs against a fresh cluster of 2 shards,
    warmed by a short untimed serial run, and its (a) before that cluster starts. Each run's
    figures are those of its median round by samples/s."""
    no_ucx = ucx_missing()
    runs = {}
    for name, change in RUNS.items():
        if "client" in change and change["client"].transport == "ucx" and no_ucx:
            print(f"  {name}: skipped, UCX does not load here ({no_ucx})")
        else:
            runs[name] = change
    results: dict[str, list[RunResult]] = {}
    for _ in range(rounds):
        for name, result in reference_runs(base).items():
            results.setdefault(name, []).append(result)
        with LocalCluster(2, [] if no_ucx else ["--ucx"], **cluster_args) as cluster:
            pids = [p.pid for p in cluster.processes]
            warm_up = dataclasses.replace(
                base, endpoints=tuple(cluster.endpoints), table_prefix=f"{label}warm",
                steps=WARM_UP_STEPS, **RUNS[SERIAL],
            )  # fmt: skip
            train(warm_up)  # untimed: no run meets the fresh shards cold
            for number, (name, change) in enumerate(runs.items()):
                bounds = (
                    {"pull_bound": bound, "push_bound": bound} if change["cache"] == "lru" else {}
                )
                config = dataclasses.replace(
                    base, endpoints=tuple(cluster.endpoints),
                    table_prefix=f"{label}{number}", **change, **bounds,
                )  # fmt: skip
                results.setdefault(name, []).append(ember_run(config, pids))
    return {name: _median_round(each) for name, each in results.items()}


def _median_round(results: list[RunResult]) -> RunResult:
    """The round of median samples/s (the upper of the middle two of an even count), with the
    spread of the rounds' samples/s."""
    ordered = sorted(results, key=lambda r: r.samples_per_s)
    median = ordered[len(ordered) // 2]
    spread = (ordered[-1].samples_per_s - ordered[0].samples_per_s) / median.samples_per_s
    return dataclasses.replace(median, round_spread=spread)


def print_section(title: str, results: dict[str, RunResult]) -> None:
    reference, serial = results[REFERENCE], results[SERIAL]
    print(f"\n{title}")
    print(
        f"{'run':<32} {'samples/s':>9} {'spread':>6} {'/(a)':>5} {'/(b)':>5} {'B/sample':>8} {'/(b)':>5} "
        f"{'pull':>5} {'push':>5} {'hot':>5} {'ctrl':>5} {'wait':>5} {'emb':>5} {'CPU ms/step':>12} "
        f"{'lag':>3} {'hit':>5} {'sync MiB':>8}"
    )
    for name, r in results.items():
        share = r.total_bytes / serial.total_bytes
        b = r.bytes_per_sample
        print(
            f"{name:<32} {r.samples_per_s:>9.0f} {r.round_spread:>6.0%} "
            f"{r.samples_per_s / reference.samples_per_s:>5.2f} "
            f"{r.samples_per_s / serial.samples_per_s:>5.2f} {r.total_bytes:>8.0f} {share:>5.2f} "
            f"{b['pulled']:>5.0f} {b['pushed']:>5.0f} {b['hot_allreduce']:>5.0f} "
            f"{b['control']:>5.0f} {r.exposed_wait_share:>5.0%} {r.embedding_work_share:>5.0%} "
            f"{r.trainer_cpu_ms_per_step:>5.0f} + {r.shards_cpu_ms_per_step:>4.0f} "
            f"{r.max_clock_lag:>3} {r.hit_rate:>5.0%} {r.replica_sync_mib:>8.1f}"
        )


def targets(loopback: dict[str, RunResult], shaped: dict[str, RunResult] | None) -> list:
    """``(target, measured, goal, ">=" or "<=")`` for each of the issue's targets."""
    a, b = loopback[REFERENCE], loopback[SERIAL]
    c0, c1 = loopback["(c0) pipeline s=0"], loopback["(c1) pipeline s=1, hot replica"]
    rows = [
        ("loopback (c1)/(a) >= 0.7", c1.samples_per_s / a.samples_per_s, 0.7, ">="),
        ("loopback (c1)/(b) >= 1.7", c1.samples_per_s / b.samples_per_s, 1.7, ">="),
        ("loopback (c1) exposed wait <= 10% of wall", c1.exposed_wait_share, 0.10, "<="),
        ("loopback (c1) bytes/sample <= 20% of (b)", c1.total_bytes / b.total_bytes, 0.2, "<="),
        ("loopback (c0)/(b) >= 1.3", c0.samples_per_s / b.samples_per_s, 1.3, ">="),
    ]
    if shaped is not None:
        ratio = (
            shaped["(c1) pipeline s=1, hot replica"].samples_per_s / shaped[SERIAL].samples_per_s
        )
        rows.append(("shaped (c1)/(b) >= 3", ratio, 3.0, ">="))
    return rows


def open_link(rate_mbit: float, stack: contextlib.ExitStack) -> ShapedLink | None:
    """The shaped link, up before this process starts UCX (which uses only the devices
    present when it starts); None, saying why, where it cannot be made."""
    try:
        return stack.enter_context(ShapedLink(rate_mbit))
    except LinkUnavailable as reason:
        print(f"shaped link unavailable ({reason}); loopback only")
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--max-cardinality", type=int, default=100_000)
    parser.add_argument("--cache-mb", type=float, default=16.0)
    parser.add_argument("--bound", type=int, default=2, help="pull and push bound of (d)")
    parser.add_argument(
        "--rate-mbit", type=float, default=25.0, help="shaped link rate, each direction"
    )
    parser.add_argument("--loopback-only", action="store_true", help="skip the shaped link")
    parser.add_argument(
        "--rounds", type=int, default=3, help="times every run is made, in turn; median shown"
    )
    add_json_flag(parser)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    # SIGTERM unwinds like Ctrl-C, so the shaped link's namespace is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    retain_freed_buffers()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the shards' (this process has its threads)
    with contextlib.ExitStack() as stack:
        link = None if args.loopback_only else open_link(args.rate_mbit, stack)
        # UCX over TCP on loopback and, for the shaped section, on the veth pair (each
        # process uses the devices it has; the others are reported missing at warning level).
        os.environ.setdefault("UCX_TLS", "tcp")
        devices = ["lo", *(link.devices if link else ())]
        os.environ.setdefault("UCX_NET_DEVICES", ",".join(devices))
        os.environ.setdefault("UCX_LOG_LEVEL", "error")
        base = TrainConfig(
            endpoints=("unused:0",), steps=args.steps, batch_size=args.batch_size,
            max_cardinality=args.max_cardinality, eval_batches=1, progress=False,
            cache_mb=args.cache_mb, torch_threads=1,
        )  # fmt: skip
        print(
            f"DLRM, 26 tables (cardinality cap {args.max_cardinality}), dim {base.dim}, batch "
            f"{args.batch_size}, {args.steps} steps, 2 shards; hot set / cache "
            f"{args.cache_mb} MiB; (d) bounds {args.bound}; {os.cpu_count()} CPUs; median of "
            f"{args.rounds} rounds"
        )
        sections = {"loopback": run_section(base, {}, "loop", args.bound, args.rounds)}
        print_section("loopback", sections["loopback"])
        shaped = None
        if link is not None:
            measured = link.measure_mbit()
            title = (
                f"shaped link: tc HTB {args.rate_mbit:g} Mbit/s each way, measured "
                f"{measured:.1f} Mbit/s (one TCP stream into the shards' namespace)"
            )
            cluster_args = {
                "host": link.peer_address,
                "server_command": [
                    *link.command_prefix, sys.executable, "-m", "ember.cli.main", "ps",
                ],
            }  # fmt: skip
            shaped = sections["shaped"] = run_section(
                base, cluster_args, "shaped", args.bound, args.rounds
            )
            print_section(title, shaped)
    print("\ntargets")
    checks = targets(sections["loopback"], shaped)
    for name, value, goal, op in checks:
        met = value >= goal if op == ">=" else value <= goal
        print(f"  {name:<44} measured {value:6.2f}  {'met' if met else 'MISSED'}")
    loop = sections["loopback"]
    print(
        f"  context: (a) on one thread is {loop[ONE_THREAD].samples_per_s / loop[REFERENCE].samples_per_s:.2f}"
        f" of (a); (c1) is {loop['(c1) pipeline s=1, hot replica'].samples_per_s / loop[ONE_THREAD].samples_per_s:.2f}"
        " of (a) on one thread, the Ember trainer's thread budget here"
    )
    figures = Figures()
    for name, value, goal, op in checks:
        figures.add(name, value, **{"at_least" if op == ">=" else "at_most": goal})
    details = {
        section: {name: dataclasses.asdict(result) for name, result in results.items()}
        for section, results in sections.items()
    }
    figures.write(args.json, details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
