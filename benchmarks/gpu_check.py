"""Build the CUDA ops, check each against its reference on fresh random inputs, and time them.

Run on a machine with an NVIDIA GPU and a CUDA build of torch (a few minutes):
    python benchmarks/gpu_check.py --out gpu_check.json
Every op is compared with its pure-torch reference on the same device; gather
and scatter-add are timed against a device-to-device copy of the same bytes
(target >= 60%). Then one trainer rank trains DLRM on the GPU (``--device
cuda``: model, batches, pooled rows, cache and hot replicas on the GPU)
against a local shard, once per data path (:data:`TRAINING_PATHS`: the static
cache, the serial path, the step pipeline with staleness 0, and with
staleness 1 and the hot replica, the default's best), checking that each
one's losses are finite and fall, and that the pipeline with staleness 0
gives the serial path's losses (it is exact by design). Without
a GPU the script says so plainly and runs the same checks and a smaller
training run on the CPU in a dry mode (no CUDA figures), so the script itself
stays tested; the CUDA figures are then pending.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable

import torch
from ember.kernels import loader
from ember.kernels.dedup import unique_inverse
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import apply_rows, fused_row_update, state_width
from ember.kernels.pack import pack_rows, unpack_rows
from ember.kernels.rows import gather_rows, scatter_add_rows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec
from ember.trainer.device_staging import DeviceStaging


def reference(op: Callable[..., object], *args: object) -> object:
    """``op`` run on its pure-torch reference backend."""
    with loader.reference_backend():
        return op(*args)


def check_ops(device: torch.device, n: int, dim: int) -> dict[str, bool]:
    """Each op on fresh random inputs against its reference; ``{op: passed}``."""
    ids = torch.randint(0, n // 4, (n,), device=device)
    checks: dict[str, bool] = {}
    native_unique = unique_inverse(ids)
    checks["unique_inverse"] = all(
        torch.equal(a, b) for a, b in zip(native_unique, reference(unique_inverse, ids))
    )
    unique, inverse, _ = native_unique
    index = IdIndex(len(unique), device=device)
    index.insert(unique, torch.arange(len(unique), device=device))
    index.erase(unique[::3].contiguous())
    probe = torch.cat([ids, ids + n])
    checks["hash_map"] = torch.equal(index.find(probe), reference(index.find, probe))
    table = torch.randn(n, dim, device=device)
    out = torch.empty(n, dim, device=device)
    checks["gather_rows"] = torch.equal(gather_rows(table, ids, out), table[ids])
    grads = torch.randn(n, dim, device=device)
    summed = scatter_add_rows(torch.zeros(len(unique), dim, device=device), inverse, grads)
    again = scatter_add_rows(torch.zeros(len(unique), dim, device=device), inverse, grads)
    exact = torch.zeros(len(unique), dim, dtype=torch.float64, device=device).index_add_(
        0, inverse, grads.double()
    )
    checks["scatter_add_rows"] = torch.equal(summed, again) and torch.allclose(
        summed.double(), exact, rtol=1e-4, atol=1e-4
    )
    for kind in OptimizerKind:
        spec = OptimizerSpec(kind, lr=0.05, weight_decay=0.01)
        weights = torch.randn(len(unique), dim, device=device)
        state = torch.rand(len(unique), state_width(kind, dim), device=device)
        versions = torch.randint(0, 9, (len(unique),), device=device)
        slots = torch.randperm(len(unique), device=device)[: len(unique) // 2]
        row_grads = torch.randn(len(slots), dim, device=device)
        w, s, steps = weights[slots], state[slots], versions[slots] + 1
        apply_rows(spec, w, s, row_grads, steps)
        fused_row_update(spec, weights, state, versions, slots, row_grads)
        checks[f"fused_row_update.{kind.name.lower()}"] = (
            torch.allclose(weights[slots], w, rtol=1e-5, atol=1e-6)
            and torch.allclose(state[slots], s, rtol=1e-5, atol=1e-6)
            and torch.equal(versions[slots], steps)
        )
    for dtype in (torch.float16, torch.bfloat16):
        packed = pack_rows(table, dtype)
        checks[f"pack_rows.{dtype}"] = torch.equal(
            packed.view(torch.int16), table.to(dtype).view(torch.int16)
        ) and torch.equal(unpack_rows(packed), packed.float())
    checks["device_staging"] = check_staging(device, n, dim)
    return checks


def check_staging(device: torch.device, n: int, dim: int) -> bool:
    """Rows staged behind ~1 s of GPU work on the copy stream are not there yet when staged
    (the check itself would prove nothing otherwise), and arrive whole, on the device, once
    taken: the consuming stream waits for the copies."""
    rows = {"a": torch.randn(n, dim), "b": torch.randn(n // 3, dim)}
    staging = DeviceStaging(device)
    if staging.stream is not None:
        rows = {t: part.pin_memory() for t, part in rows.items()}  # staging pins no more
        with torch.cuda.stream(staging.stream):
            torch.cuda._sleep(2_000_000_000)  # GPU cycles ahead of the copies
    staged = staging.stage(rows)
    held_back = staged.ready is None or not staged.ready.query()  # the host: nothing to hold
    taken = staging.take(staged)
    copies = {t: part.clone() for t, part in taken.items()}  # read on the consuming stream
    arrived = all(
        taken[t].device == staging.device and torch.equal(copies[t].cpu(), rows[t]) for t in rows
    )
    return arrived and held_back


def seconds(run: Callable[[], object], device: torch.device, repeats: int = 20) -> float:
    """Median time of ``run`` (CUDA events on a GPU)."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            run()
            times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2]


def bandwidth(device: torch.device, n: int, dim: int) -> dict[str, float]:
    """GB/s of gather, scatter-add and a same-size device copy, and their ratios."""
    table = torch.randn(4 * n, dim, device=device)
    ids = torch.randint(0, len(table), (n,), device=device)
    out, src = torch.empty(n, dim, device=device), torch.randn(n, dim, device=device)
    unique, inverse, _ = unique_inverse(ids)
    summed = torch.zeros(len(unique), dim, device=device)
    nbytes = n * dim * 4
    copy_s = seconds(lambda: out.copy_(src), device)
    gather_s = seconds(lambda: gather_rows(table, ids, out), device)
    scatter_s = seconds(lambda: scatter_add_rows(summed, inverse, src), device)
    copy_bw = 2 * nbytes / copy_s
    gather_bw = 2 * nbytes / gather_s
    scatter_bw = 3 * nbytes / scatter_s  # reads the source and the row, writes the row
    return {
        "copy_GBps": copy_bw / 1e9,
        "gather_GBps": gather_bw / 1e9,
        "scatter_add_GBps": scatter_bw / 1e9,
        "gather_vs_copy": gather_bw / copy_bw,
        "scatter_add_vs_copy": scatter_bw / copy_bw,
    }


# The trainer's data paths a GPU run covers: {name: TrainConfig fields}.
TRAINING_PATHS = {
    "static cache": {"cache": "static", "data_path": "pipeline"},
    "serial, no cache": {"cache": "none", "data_path": "serial"},
    "pipeline s=0": {"cache": "none", "data_path": "pipeline", "staleness": 0},
    "pipeline s=1, hot replica": {"cache": "replicated", "data_path": "pipeline", "staleness": 1},
}
# The pipeline with staleness 0 is exact: its losses are the serial path's, up to the order
# in which float32 sums differ between the two runs' kernels (on the CPU they are equal).
EXACT_RTOL = 1e-4


def training_runs(device: torch.device, steps: int, batch_size: int) -> dict[str, object]:
    """One trainer rank on ``device`` per data path, each against a new 1-shard local
    cluster, and whether the pipeline with staleness 0 matched the serial path."""
    from ember.ps_server.cluster import LocalCluster
    from ember.trainer.config import TrainConfig
    from ember.trainer.train import train

    runs, losses = {}, {}
    for name, fields in TRAINING_PATHS.items():
        # A cluster per run: the same table names, so every run starts from the same rows.
        with LocalCluster(1) as cluster:
            config = TrainConfig(
                endpoints=tuple(cluster.endpoints), steps=steps, batch_size=batch_size,
                eval_batches=2, device=str(device), cache_mb=4.0, progress=False, **fields,
            )  # fmt: skip
            report = train(config)
        losses[name] = report["train_losses"]
        runs[name] = _training_summary(report)
    differs = _max_relative_difference(losses["pipeline s=0"], losses["serial, no cache"])
    return {
        "runs": runs,
        "pipeline_s0_max_relative_difference": differs,
        "pipeline_s0_exact": differs <= EXACT_RTOL,
    }


def _max_relative_difference(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference of two runs' losses (inf where the runs differ in
    length or a loss is not finite)."""
    if len(losses) != len(reference) or not all(map(math.isfinite, losses + reference)):
        return math.inf
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def _training_summary(report: dict) -> dict[str, object]:
    losses = report["train_losses"]
    head, tail = losses[: len(losses) // 4], losses[-(len(losses) // 4) :]
    return {
        "device": report["device"],
        "steps": report["steps"],
        "samples_per_s": report["samples_per_s"],
        "exposed_ps_wait_share": report["ps_wait_s"] / report["wall_s"],
        "first_losses_mean": sum(head) / len(head),
        "last_losses_mean": sum(tail) / len(tail),
        "heldout_auc": report["heldout_auc"],
        "ok": all(math.isfinite(x) for x in losses) and sum(tail) < sum(head),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        print(
            f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
        )
    else:
        print(
            "no GPU found (torch.cuda.is_available() is False): DRY MODE on the CPU, small inputs;"
        )
        print("the CUDA ops are not built and the CUDA figures stay pending.")
    n = args.ids if gpu else min(args.ids, 100_000)
    started = time.perf_counter()
    native = loader.native_ops_available()
    print(
        f"native build: {'ok' if native else 'FAILED, reference only'} ({time.perf_counter() - started:.0f} s)"
    )
    checks = check_ops(device, n, args.dim)
    for name, passed in checks.items():
        print(f"  {name:<32} {'ok' if passed else 'MISMATCH'}")
    figures = bandwidth(device, n, args.dim) if gpu else {}
    for name, value in figures.items():
        print(f"  {name:<32} {value:.2f}")
    training = training_runs(device, steps=60 if gpu else 16, batch_size=2048 if gpu else 256)
    for name, run in training["runs"].items():
        print(
            f"training on {run['device']}, {name}: {run['steps']} steps, "
            f"{run['samples_per_s']:,.0f} samples/s, exposed PS wait "
            f"{run['exposed_ps_wait_share']:.0%}, loss {run['first_losses_mean']:.4f} -> "
            f"{run['last_losses_mean']:.4f}, held-out AUC {run['heldout_auc']:.4f}: "
            f"{'ok' if run['ok'] else 'FAILED'}"
        )
    print(
        "pipeline s=0 against the serial path: losses differ by at most "
        f"{training['pipeline_s0_max_relative_difference']:.2e} (relative; at most "
        f"{EXACT_RTOL:g} allowed): {'ok' if training['pipeline_s0_exact'] else 'FAILED'}"
    )
    report = {
        "device": torch.cuda.get_device_name(0)
        if gpu
        else f"cpu ({platform.processor() or 'unknown'})",
        "dry_mode": not gpu,
        "native": native,
        "ids": n,
        "dim": args.dim,
        "checks": checks,
        "bandwidth": figures,
        "training": training,
    }
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)
    trained = training["pipeline_s0_exact"] and all(r["ok"] for r in training["runs"].values())
    return 0 if native and all(checks.values()) and trained else 1


if __name__ == "__main__":
    sys.exit(main())
