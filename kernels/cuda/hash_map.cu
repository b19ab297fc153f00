// Open-addressing hash map id -> slot on the GPU: the layout of csrc/hash_map.cpp
// (keys -1 empty, -2 erased; linear probing from mix64(id ^ kIndexSalt)), so the
// map can live on the device next to the cached rows. One thread per id; inserts
// claim buckets with atomicCAS. Every check runs before the first write.
#include <ATen/ops/_unique.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "cuda_checks.cuh"

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

void check_map_cuda(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_hash_map(keys, slots);
  check_ids(ids, "ids");
  check_cuda(keys, "keys");
  TORCH_CHECK(ids.device() == keys.device(), "ids must be on the map's device ", keys.device());
}

at::Tensor probe(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids, int64_t* erase_into) {
  at::Tensor out = at::empty({ids.size(0)}, ids.options());
  if (ids.size(0) == 0) return out;
  find_kernel<<<blocks_for(ids.size(0)), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), keys.size(0) - 1, ids.data_ptr<int64_t>(),
      ids.size(0), out.data_ptr<int64_t>(), erase_into);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor hash_find_cuda(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_map_cuda(keys, slots, ids);
  const c10::cuda::CUDAGuard guard(keys.device());
  return probe(keys, slots, ids, nullptr);
}

at::Tensor hash_erase_cuda(at::Tensor keys, at::Tensor slots, const at::Tensor& ids) {
  check_map_cuda(keys, slots, ids);
  const c10::cuda::CUDAGuard guard(keys.device());
  // Lookups of one batch never cross a tombstone written by the same batch wrongly:
  // a tombstone is stepped over exactly like the live key it replaced.
  return probe(keys, slots, ids, keys.data_ptr<int64_t>());
}

void hash_insert_cuda(at::Tensor keys, at::Tensor slots, const at::Tensor& ids, const at::Tensor& new_slots) {
  check_map_cuda(keys, slots, ids);
  check_ids(new_slots, "new_slots");
  TORCH_CHECK(new_slots.device() == keys.device() && new_slots.size(0) == ids.size(0),
              "new_slots must be on the map's device with one entry per id");
  const int64_t n = ids.size(0);
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(keys.device());
  TORCH_CHECK(ids.min().item<int64_t>() >= 0, "ids must be >= 0");
  TORCH_CHECK(std::get<0>(at::_unique(ids)).size(0) == n, "an id is already in the map or twice in ids");
  TORCH_CHECK(!probe(keys, slots, ids, nullptr).ge(0).any().item<bool>(),
              "an id is already in the map or twice in ids");
  const int64_t empty = keys.eq(kEmpty).sum().item<int64_t>();
  TORCH_CHECK(n < empty, "hash map is full: ", n, " ids, ", empty, " empty buckets (one must stay empty); ",
              "rehash into a larger map");
  insert_kernel<<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), keys.size(0) - 1, ids.data_ptr<int64_t>(),
      new_slots.data_ptr<int64_t>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("hash_find", hash_find_cuda);
  m.impl("hash_insert", hash_insert_cuda);
  m.impl("hash_erase", hash_erase_cuda);
}

}  // namespace ember
