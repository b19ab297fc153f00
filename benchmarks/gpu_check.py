"""Build the CUDA ops, check each against its reference on fresh random inputs, and time them.

Run on a machine with an NVIDIA GPU and a CUDA build of torch (a few minutes):
    python benchmarks/gpu_check.py --out gpu_check.json
Every op is compared with its pure-torch reference on the same device; gather
and scatter-add are timed against a device-to-device copy of the same bytes
(target >= 60%). Then one trainer rank trains DLRM on the GPU (``--device
cuda``: model, batches, pooled rows and cache on the GPU) against a local
shard for a short run, checking that its losses are finite and fall. Without
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
    return checks


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


def training_run(device: torch.device, steps: int, batch_size: int) -> dict[str, object]:
    """One trainer rank on ``device`` against a 1-shard local cluster, static cache on."""
    from ember.ps_server.cluster import LocalCluster
    from ember.trainer.config import TrainConfig
    from ember.trainer.train import train

    with LocalCluster(1) as cluster:
        config = TrainConfig(
            endpoints=tuple(cluster.endpoints), steps=steps, batch_size=batch_size,
            eval_batches=2, device=str(device), cache="static", cache_mb=4.0, progress=False,
        )  # fmt: skip
        report = train(config)
    losses = report["train_losses"]
    head, tail = losses[: len(losses) // 4], losses[-(len(losses) // 4) :]
    return {
        "device": report["device"],
        "steps": report["steps"],
        "samples_per_s": report["samples_per_s"],
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
    training = training_run(device, steps=60 if gpu else 16, batch_size=2048 if gpu else 256)
    print(
        f"training on {training['device']}: {training['steps']} steps, "
        f"{training['samples_per_s']:,.0f} samples/s, loss {training['first_losses_mean']:.4f} -> "
        f"{training['last_losses_mean']:.4f}, held-out AUC {training['heldout_auc']:.4f}: "
        f"{'ok' if training['ok'] else 'FAILED'}"
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
    return 0 if native and all(checks.values()) and training["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
