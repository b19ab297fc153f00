// The CUDA hash map ops (kernels in hash_map.cu): every check runs before the
// first write.
#include <ATen/ops/_unique.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "cuda_checks.h"
#include "launchers.h"

namespace ember {
namespace {

void check_map_cuda(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_hash_map(keys, slots);
  check_ids(ids, "ids");
  check_cuda(keys, "keys");
  TORCH_CHECK(ids.device() == keys.device(), "ids must be on the map's device ", keys.device());
}

at::Tensor probe(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids, int64_t* erase_into) {
  at::Tensor out = at::empty({ids.size(0)}, ids.options());
  if (ids.size(0) == 0) return out;
  launch_hash_find(keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), keys.size(0) - 1, ids.data_ptr<int64_t>(),
                   ids.size(0), out.data_ptr<int64_t>(), erase_into, c10::cuda::getCurrentCUDAStream());
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
  launch_hash_insert(keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), keys.size(0) - 1, ids.data_ptr<int64_t>(),
                     new_slots.data_ptr<int64_t>(), n, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("hash_find", hash_find_cuda);
  m.impl("hash_insert", hash_insert_cuda);
  m.impl("hash_erase", hash_erase_cuda);
}

}  // namespace ember
