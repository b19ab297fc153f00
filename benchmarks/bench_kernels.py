"""Native ops against their pure-torch references, at 1M ids and dim 64.

One run, one process, one thread (the native ops are single-threaded by design:
shards and trainers overlap them with network work), median of several repeats:
  dedup        unique_inverse               vs torch.unique(return_inverse, return_counts)
  gather       gather_rows                  vs torch.index_select(out=)
  scatter_add  scatter_add_rows             vs Tensor.index_add_
  hash find    IdIndex.find (native)        vs the same map probed by the torch reference
  hash gather  IdIndex.gather (find + copy) vs the same map read by the torch reference
  optimizer    fused_row_update (Adagrad)   vs gather + apply_rows + scatter
  pack         pack_rows (fp16, bf16)       vs Tensor.to(float16 / bfloat16)
plus gather and scatter-add bandwidth against a same-size memcpy (Tensor.copy_).

Usage: python benchmarks/bench_kernels.py [--ids 1000000] [--dim 64] [--table-rows 4000000]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from bench_timing import median_seconds, paired_medians
from ember.kernels import loader
from ember.kernels.dedup import unique_inverse
from ember.kernels.id_index import IdIndex
from ember.kernels.optim import apply_rows, fused_row_update
from ember.kernels.pack import pack_rows
from ember.kernels.rows import gather_rows, scatter_add_rows
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec
from figures import Figures, add_json_flag


def _with_reference(op: Callable[..., object], *args: object) -> object:
    with loader.reference_backend():
        return op(*args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--table-rows", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=11)
    add_json_flag(parser)
    args = parser.parse_args()
    if not loader.native_ops_available():
        print("native ops unavailable: nothing to compare (see `ember doctor`)")
        return 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n, dim, repeats = args.ids, args.dim, args.repeats
    # Uniform ids over a table larger than the caches: every gather row is a cache
    # miss (the hard case for bandwidth), and ~12% of the ids repeat.
    ids = torch.randint(0, args.table_rows, (n,))
    table = torch.randn(args.table_rows, dim)
    grads = torch.randn(n, dim)
    unique, inverse, _ = unique_inverse(ids)
    gathered = torch.empty(n, dim)
    summed = torch.zeros(len(unique), dim)
    row_bytes = n * dim * 4

    results: list[tuple[str, float, float]] = []  # (name, native s, reference s)

    def compare(name: str, native: Callable[[], object], reference: Callable[[], object]) -> None:
        native_s, reference_s = paired_medians([native, reference], repeats)
        results.append((name, native_s, reference_s))

    compare(
        "dedup",
        lambda: unique_inverse(ids),
        lambda: torch.unique(ids, return_inverse=True, return_counts=True),
    )
    compare(
        "gather",
        lambda: gather_rows(table, ids, gathered),
        lambda: torch.index_select(table, 0, ids, out=gathered),
    )
    compare(
        "scatter_add",
        lambda: scatter_add_rows(summed, inverse, grads),
        lambda: summed.index_add_(0, inverse, grads),
    )
    index = IdIndex(len(unique))
    index.insert(unique, torch.arange(len(unique)))
    compare("hash find", lambda: index.find(ids), lambda: _with_reference(index.find, ids))
    compare(
        "hash gather",
        lambda: index.gather(ids, table, gathered),
        lambda: _with_reference(index.gather, ids, table, gathered),
    )
    spec = OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.01)
    state = torch.zeros(args.table_rows, dim)
    versions = torch.zeros(args.table_rows, dtype=torch.int64)
    slots, row_grads = unique, torch.randn(len(unique), dim)

    def gathered_update() -> None:
        w, s, steps = table[slots], state[slots], versions[slots] + 1
        apply_rows(spec, w, s, row_grads, steps)
        table[slots], state[slots], versions[slots] = w, s, steps

    compare(
        "optimizer",
        lambda: fused_row_update(spec, table, state, versions, slots, row_grads),
        gathered_update,
    )
    for dtype in (torch.float16, torch.bfloat16):
        compare(
            f"pack {str(dtype)[6:]}",
            lambda dtype=dtype: pack_rows(grads, dtype),
            lambda dtype=dtype: grads.to(dtype),
        )
    copy_target = torch.empty(n, dim)
    memcpy = median_seconds(lambda: copy_target.copy_(grads), repeats)

    print(
        f"kernels: {n:,} uniform ids ({len(unique):,} distinct), dim {dim}, table {args.table_rows:,} rows,"
    )
    print(f"one thread, median of {repeats}; torch {torch.__version__}")
    print(f"{'op':<12} {'native ms':>10} {'torch ms':>10} {'speed-up':>9}")
    for name, native_s, reference_s in results:
        print(
            f"{name:<12} {native_s * 1e3:>10.2f} {reference_s * 1e3:>10.2f} {reference_s / native_s:>8.2f}x"
        )
    combined = {name: (a, b) for name, a, b in results}
    trio = [combined[k] for k in ("dedup", "gather", "scatter_add")]
    speedup = sum(b for _, b in trio) / sum(a for a, _ in trio)
    print(f"dedup + gather + scatter_add combined: {speedup:.2f}x (target >= 1.5x)")
    gather_bw = row_bytes / combined["gather"][0]
    scatter_bw = row_bytes / combined["scatter_add"][0]
    copy_bw = 2 * row_bytes / memcpy  # a copy reads and writes
    print(f"memcpy {row_bytes / 2**20:.0f} MiB: {copy_bw / 1e9:.2f} GB/s (read + write)")
    print(
        f"gather: {2 * gather_bw / 1e9:.2f} GB/s = {2 * gather_bw / copy_bw:.0%} of memcpy (target >= 50%); "
        f"scatter_add: {3 * scatter_bw / 1e9:.2f} GB/s (read 2, write 1) = {3 * scatter_bw / copy_bw:.0%}"
    )
    figures = Figures()
    figures.add("dedup + gather + scatter_add, native / torch speed-up", speedup, at_least=1.5)
    figures.add("gather bandwidth / memcpy", 2 * gather_bw / copy_bw, at_least=0.5)
    for name, native_s, reference_s in results:
        figures.add(f"{name}, native / torch speed-up", reference_s / native_s)
    figures.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
