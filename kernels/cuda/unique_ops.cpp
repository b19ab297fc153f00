// unique_inverse on the GPU, first-occurrence order as on the CPU, from ATen
// primitives (no kernel of its own): a stable sort groups equal ids with their
// earliest position first; groups are then ordered by that position.
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sort.h>
#include <torch/library.h>

#include <tuple>

#include "cuda_checks.h"

namespace ember {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_inverse_cuda(const at::Tensor& ids) {
  check_ids(ids, "ids");
  check_cuda(ids, "ids");
  const c10::cuda::CUDAGuard guard(ids.device());
  const int64_t n = ids.size(0);
  if (n == 0) return {ids.clone(), ids.clone(), ids.clone()};
  auto [sorted, position] = at::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  at::Tensor starts_group = at::ones({n}, ids.options().dtype(at::kBool));
  starts_group.narrow(0, 1, n - 1).copy_(sorted.narrow(0, 1, n - 1).ne(sorted.narrow(0, 0, n - 1)));
  at::Tensor group = starts_group.to(at::kLong).cumsum(0).sub_(1);  // group of each sorted entry
  at::Tensor heads = starts_group.nonzero().squeeze(1);               // sorted index of each group's head
  at::Tensor first = position.index_select(0, heads);                 // earliest position of each group
  at::Tensor order = at::argsort(first);                               // groups by first occurrence
  at::Tensor rank = at::empty_like(order).index_copy_(0, order, at::arange(order.size(0), ids.options()));
  at::Tensor inverse = at::empty_like(ids).index_copy_(0, position, rank.index_select(0, group));
  at::Tensor ends = at::cat({heads.narrow(0, 1, heads.size(0) - 1), at::full({1}, n, ids.options())});
  at::Tensor counts = ends.sub(heads).index_select(0, order);
  return {sorted.index_select(0, heads).index_select(0, order), inverse, counts};
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) { m.impl("unique_inverse", unique_inverse_cuda); }

}  // namespace ember
