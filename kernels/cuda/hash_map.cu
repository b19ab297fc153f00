// Open-addressing hash map id -> slot on the GPU: the layout of csrc/hash_map.cpp
// (keys -1 empty, -2 erased; linear probing from mix64(id ^ kIndexSalt)), so the
// map can live on the device next to the cached rows. One thread per id; inserts
// claim buckets with atomicCAS. The checks are in hash_map_ops.cpp.
#include "launch_geometry.cuh"
#include "launchers.h"

namespace ember {
namespace {

__global__ void find_kernel(const int64_t* keys, const int64_t* slots, uint64_t mask, const int64_t* ids,
                            int64_t n, int64_t* out, int64_t* keys_to_erase) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = locate_bucket(keys, mask, ids[i]);
    out[i] = pos < 0 ? -1 : slots[pos];
    if (keys_to_erase != nullptr && pos >= 0) keys_to_erase[pos] = kTombstone;
  }
}

__global__ void insert_kernel(int64_t* keys, int64_t* slots, uint64_t mask, const int64_t* ids,
                              const int64_t* values, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = ids[i];
    uint64_t pos = home_bucket(id, mask);
    while (true) {  // the host checked that empty buckets outnumber the ids
      auto* bucket = reinterpret_cast<unsigned long long*>(keys + pos);
      const auto empty = static_cast<unsigned long long>(kEmpty);
      if (atomicCAS(bucket, empty, static_cast<unsigned long long>(id)) == empty) {
        slots[pos] = values[i];
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
}

}  // namespace

void launch_hash_find(const int64_t* keys, const int64_t* slots, uint64_t mask, const int64_t* ids, int64_t n,
                      int64_t* out, int64_t* keys_to_erase, cudaStream_t stream) {
  find_kernel<<<blocks_for(n), kThreads, 0, stream>>>(keys, slots, mask, ids, n, out, keys_to_erase);
}

void launch_hash_insert(int64_t* keys, int64_t* slots, uint64_t mask, const int64_t* ids, const int64_t* values,
                        int64_t n, cudaStream_t stream) {
  insert_kernel<<<blocks_for(n), kThreads, 0, stream>>>(keys, slots, mask, ids, values, n);
}

}  // namespace ember
