"""Durability at scale: one shard's table at 1M, 4M and 16M rows, and a log bounded by itself.

Part 1, for each size, in fresh processes (so resident memory is this table's):
  * fill: the rows created by pushes of 65,536 new ids (rows/s), with the peak
    resident set while filling against the steady one after it;
  * pull and push: random batches of 65,536 held ids (rows/s);
  * checkpoint: a full checkpoint of the shard (files, fsync, manifest) in s and MB/s;
  * then 8 pushes more go only to the write-ahead log;
  * restore, in a new process, as a starting shard does: the checkpoint's
    checksums and rows (s, MB/s), then the log's replay (MB/s); once with the
    files in the page cache as the checkpoint left them, once with the cache
    dropped (root only), next to the rate of just reading the files cold.
The growth exponent of each time is ``log(t_16M / t_1M) / log(16)`` (1: linear).

Part 2: a real shard with ``--wal-max-bytes 100000000`` takes 1 GB of pushes
(4,096 ids of dim 64 each) and checkpoints itself; the log on disk is measured
after every push. Then SIGKILL: the restart's time against the documented bound
(restore three times the table's bytes at the measured rate, replay twice the
limit at the measured rate), and every acknowledged push is there exactly once (versions).

Usage: python benchmarks/bench_scale.py [--sizes 1000000,4000000,16000000] [--wal-gb 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from ember.kernels.loader import native_ops_available
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.durability.auto_checkpoint import AutoCheckpoints, AutoPolicy
from ember.ps_server.durability.journal import replay
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from figures import Figures, add_json_flag

DIM = 64
CHUNK = 65_536
SPEC = TableSpec("scale", DIM, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.01))
LOG_PUSHES = 8
START_S = 5.0  # a shard process's start before recovery (imports, native ops), generously


def memory_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> None:
    """Start ``VmHWM`` over from the current resident set (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def new_server(work: Path) -> tuple[ParameterServer, WriteLog]:
    server = ParameterServer(0, 1, checkpoint_root=str(work))
    write_log = WriteLog(work / "wal", 0, 1, "interval")
    write_log.claim()
    return server, write_log


GRADS = np.random.default_rng(0).standard_normal((CHUNK, DIM)).astype(np.float32) * 0.01


def push(server: ParameterServer, ids: np.ndarray, seed: int) -> None:
    """One push of ``ids`` (request id from ``seed``), as a client's arrives."""
    server.push(SPEC.name, ids.tobytes(), GRADS[: len(ids)].tobytes(), f"r{seed}")


def fill_child(rows: int, work: Path) -> dict:
    """Fill, pull, push and checkpoint; then log a few pushes after the checkpoint."""
    server, write_log = new_server(work)
    write_log.open()
    server.journal.log = write_log
    server.create_table(SPEC)
    push(server, np.arange(16, dtype=np.int64), 0)  # native ops loaded before measuring
    reset_peak()
    start = time.perf_counter()
    for first in range(16, rows, CHUNK):
        push(server, np.arange(first, min(rows, first + CHUNK), dtype=np.int64), first)
    fill_s = time.perf_counter() - start
    peak, steady = memory_kib("VmHWM"), memory_kib("VmRSS")
    rng = np.random.default_rng(1)
    batches = [rng.choice(rows, CHUNK, replace=False).astype(np.int64) for _ in range(8)]
    start = time.perf_counter()
    for ids in batches:
        server.pull(SPEC.name, ids.tobytes())
    pull_s = time.perf_counter() - start
    start = time.perf_counter()
    for k, ids in enumerate(batches):
        push(server, ids, rows + k)
    push_s = time.perf_counter() - start
    auto = AutoCheckpoints(server, write_log, work / "auto", AutoPolicy(None, None, 1), print)
    auto.directory.mkdir(parents=True)
    start = time.perf_counter()
    checkpoint = auto.checkpoint()
    checkpoint_s = time.perf_counter() - start
    checkpoint_bytes = sum(path.stat().st_size for path in checkpoint.iterdir())
    for k, ids in enumerate(batches[:LOG_PUSHES]):  # only in the log
        push(server, ids, 2 * rows + k)
    write_log.close()
    return {
        "fill_rows_per_s": rows / fill_s, "fill_s": fill_s,
        "peak_kib": peak, "steady_kib": steady, "peak_over_steady": peak / steady,
        "pull_rows_per_s": len(batches) * CHUNK / pull_s,
        "push_rows_per_s": len(batches) * CHUNK / push_s,
        "checkpoint_s": checkpoint_s, "checkpoint_bytes": checkpoint_bytes,
        "checkpoint_mb_per_s": checkpoint_bytes / checkpoint_s / 1e6,
        "log_bytes": write_log.bytes_since_base,
    }  # fmt: skip


def restore_child(work: Path) -> dict:
    """Restore the checkpoint and replay the log, as a starting shard does."""
    server, write_log = new_server(work)
    native_ops_available()  # loaded before the clock starts, as a shard does
    base, _ = write_log.base()
    reset_peak()
    start = time.perf_counter()
    chain = server.checkpoints.load_chain(base)
    rows = server.checkpoints.restore(chain)
    restore_s = time.perf_counter() - start
    start = time.perf_counter()
    replayed = replay(server, write_log)
    replay_s = time.perf_counter() - start
    checkpoint_bytes = sum(path.stat().st_size for path in base.iterdir())
    log_bytes = sum(path.stat().st_size for path in (work / "wal").glob("*.wal"))
    write_log.close()
    return {
        "rows": rows, "restore_s": restore_s, "restore_mb_per_s": checkpoint_bytes / restore_s / 1e6,
        "replayed": replayed, "replay_s": replay_s,
        "replay_mb_per_s": log_bytes / replay_s / 1e6,
        "restore_peak_kib": memory_kib("VmHWM"),
    }  # fmt: skip


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def drop_page_cache() -> bool:
    """Sync and drop the page cache (root only), so a restore reads the disk."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        return True
    except OSError:
        return False


def exponent(small: float, large: float, ratio: float) -> float:
    return math.log(large / small) / math.log(ratio)


def read_rate(directory: Path) -> float:
    """MB/s of reading every file under ``directory`` once (the disk's own rate, cold)."""
    files = [path for path in directory.rglob("*") if path.is_file()]
    start = time.perf_counter()
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as source:
            while chunk := source.read(16 << 20):
                total += len(chunk)
    return total / (time.perf_counter() - start) / 1e6


def part_one(sizes: list[int], figures: Figures) -> dict:
    results = {}
    for rows in sizes:
        with tempfile.TemporaryDirectory(dir=os.environ.get("EMBER_BENCH_DIR")) as work:
            filled = run_child("fill", str(rows), work)
            warm = run_child("restore", "0", work)  # the checkpoint as the page cache holds it
            cold = drop_page_cache()
            disk_mb_per_s = read_rate(Path(work) / "auto") if cold else float("nan")
            drop_page_cache()
            restored = run_child("restore", "0", work)
        results[rows] = {
            **filled, **restored, "cold_cache": cold, "disk_read_mb_per_s": disk_mb_per_s,
            "warm_restore_s": warm["restore_s"], "warm_restore_mb_per_s": warm["restore_mb_per_s"],
        }  # fmt: skip
        r = results[rows]
        print(
            f"{rows:>10,d} rows: fill {r['fill_rows_per_s'] / 1e6:5.2f} M rows/s (peak/steady "
            f"RSS {r['peak_over_steady']:.3f}), pull {r['pull_rows_per_s'] / 1e6:5.2f} M/s, "
            f"push {r['push_rows_per_s'] / 1e6:5.2f} M/s; checkpoint {r['checkpoint_s']:6.2f} s "
            f"({r['checkpoint_mb_per_s']:4.0f} MB/s); restore {r['warm_restore_s']:6.2f} s "
            f"({r['warm_restore_mb_per_s']:4.0f} MB/s) from the page cache, {r['restore_s']:6.2f} s "
            f"({r['restore_mb_per_s']:4.0f} MB/s) from the disk (which reads "
            f"{r['disk_read_mb_per_s']:4.0f} MB/s); replay {r['replay_mb_per_s']:4.0f} MB/s",
            flush=True,
        )
    small, large = results[sizes[0]], results[sizes[-1]]
    ratio = sizes[-1] / sizes[0]
    print(f"growth exponents {sizes[0]:,d} -> {sizes[-1]:,d} rows (1 = linear):")
    for key in ("fill_s", "checkpoint_s", "warm_restore_s", "restore_s"):
        value = exponent(small[key], large[key], ratio)
        print(f"  {key:14s} {value:.3f}")
    for key in ("pull_rows_per_s", "push_rows_per_s", "replay_mb_per_s"):
        print(f"  {key:14s} rate ratio {large[key] / small[key]:.3f} (1 = flat)")
    figures.add("checkpoint time growth exponent", exponent(
        small["checkpoint_s"], large["checkpoint_s"], ratio), at_most=1.05)  # fmt: skip
    figures.add("restore time growth exponent (page cache)", exponent(
        small["warm_restore_s"], large["warm_restore_s"], ratio), at_most=1.05)  # fmt: skip
    figures.add(
        f"restore MB/s at {sizes[-1]:,d} rows (page cache)",
        large["warm_restore_mb_per_s"], at_least=400,
    )  # fmt: skip
    figures.add("restore time growth exponent (cold cache)", exponent(
        small["restore_s"], large["restore_s"], ratio))  # fmt: skip
    figures.add(
        f"restore from disk / reading its files, at {sizes[-1]:,d} rows",
        large["restore_mb_per_s"] / large["disk_read_mb_per_s"],
    )
    figures.add(
        f"peak / steady RSS filling {sizes[-1]:,d} rows", large["peak_over_steady"], at_most=1.1
    )
    return results


WAL_LIMIT = 100_000_000
WAL_IDS = 4_096
WAL_UNIVERSE = 1_000_000


def part_two(wal_gb: float, restore_mb_per_s: float, replay_mb_per_s: float, figures: Figures):
    """A shard bounding its own log under ``wal_gb`` GB of pushes, then SIGKILLed."""
    rng = np.random.default_rng(7)
    grads = torch.from_numpy(GRADS[:WAL_IDS])
    pushes = int(wal_gb * 1e9 / (WAL_IDS * (8 + 4 * DIM)))
    counts = np.zeros(WAL_UNIVERSE, dtype=np.int64)
    largest_log = 0
    with tempfile.TemporaryDirectory(dir=os.environ.get("EMBER_BENCH_DIR")) as work:
        flags = [
            "--wal", f"{work}/wal", "--checkpoint-root", f"{work}/ckpt",
            "--wal-max-bytes", str(WAL_LIMIT),
        ]  # fmt: skip
        with LocalCluster(1, extra_args=flags, workdir=Path(work) / "run") as cluster:
            with PSClient(cluster.endpoints) as client:
                client.create_table(SPEC)
                start = time.perf_counter()
                for _ in range(pushes):
                    ids = rng.choice(WAL_UNIVERSE, WAL_IDS, replace=False)
                    client.push(SPEC.name, torch.from_numpy(ids), grads)
                    counts[ids] += 1  # acknowledged
                    largest_log = max(largest_log, _log_bytes(Path(work) / "wal"))
                push_s = time.perf_counter() - start
            held = int((counts > 0).sum())
            log_at_kill = _log_bytes(Path(work) / "wal")
            cluster.kill_shard(0)
            start = time.perf_counter()
            cluster.restart_shard(0)
            ready_s = time.perf_counter() - start
            with PSClient(cluster.endpoints) as client:
                touched = np.flatnonzero(counts)
                versions = torch.cat([
                    client.pull_with_versions(SPEC.name, torch.from_numpy(part))[1]
                    for part in np.array_split(touched, max(1, len(touched) // 50_000))
                ])  # fmt: skip
            lost = int((versions.numpy() != counts[touched]).sum())
    table_mb = held * (8 + 8 * DIM + 8) / 1e6
    bound_s = START_S + 3 * table_mb / restore_mb_per_s + 2 * WAL_LIMIT / 1e6 / replay_mb_per_s
    print(
        f"log bound: {pushes} pushes ({pushes * WAL_IDS * (8 + 4 * DIM) / 1e9:.2f} GB) in "
        f"{push_s:.1f} s; largest log on disk {largest_log / 1e6:.1f} MB "
        f"({largest_log / WAL_LIMIT:.2f} of --wal-max-bytes {WAL_LIMIT / 1e6:.0f} MB); at the kill "
        f"{log_at_kill / 1e6:.1f} MB, table {held:,d} rows ({table_mb:.0f} MB); ready "
        f"{ready_s:.1f} s after SIGKILL (documented bound {bound_s:.1f} s); rows whose pushes "
        f"differ from the acknowledged ones: {lost}",
        flush=True,
    )
    figures.add("largest log on disk / --wal-max-bytes", largest_log / WAL_LIMIT, at_most=2.0)
    figures.add("ready after SIGKILL / documented bound", ready_s / bound_s, at_most=1.0)
    figures.add("rows missing or repeating an acknowledged push", lost, at_most=0)
    return {
        "pushes": pushes, "push_s": push_s, "largest_log": largest_log, "ready_s": ready_s,
        "bound_s": bound_s, "lost": lost, "rows": held,
    }  # fmt: skip


def _log_bytes(directory: Path) -> int:
    return sum(entry.stat().st_size for entry in directory.glob("*.wal"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")],
        default=[1_000_000, 4_000_000, 16_000_000],
    )  # fmt: skip
    parser.add_argument("--wal-gb", type=float, default=1.0)
    add_json_flag(parser)
    args = parser.parse_args()
    retain_freed_buffers()
    torch.set_num_threads(1)
    if args.child:
        kind, rows, work = args.child
        result = fill_child(int(rows), Path(work)) if kind == "fill" else restore_child(Path(work))
        print(json.dumps(result))
        return 0
    figures = Figures()
    print(f"one shard, table dim {DIM}, Adagrad; pushes of {CHUNK:,d} ids; {os.cpu_count()} CPUs")
    sizes = part_one(args.sizes, figures)
    slowest_restore = min(result["restore_mb_per_s"] for result in sizes.values())
    slowest_replay = min(result["replay_mb_per_s"] for result in sizes.values())
    details = {"sizes": sizes}
    if args.wal_gb > 0:
        details["log_bound"] = part_two(args.wal_gb, slowest_restore, slowest_replay, figures)
    figures.write(args.json, details)
    return 0


if __name__ == "__main__":
    sys.exit(main())
