// Row movement by index on the GPU (semantics of csrc/rows.cpp):
//   gather_rows / scatter_rows: one block-stride loop over (row, word) pairs,
//     copying 4-byte words (every row type Ember moves is a multiple of 4 bytes).
//   scatter_add_rows: deterministic. The index is sorted stably, so each
//     destination row's contributions form a segment in their original order;
//     one block per segment adds them in that order, the same sequence of
//     float additions as the CPU op, hence bit-identical results.
#include <ATen/Dispatch.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/unique_consecutive.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>
#include <utility>

#include "cuda_checks.cuh"

namespace ember {
namespace {

__global__ void copy_rows_kernel(const uint32_t* from, uint32_t* to, const int64_t* index, int64_t rows,
                                 int64_t words, bool gather) {
  const int64_t total = rows * words;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / words, w = k % words;
    if (gather) {
      to[i * words + w] = from[index[i] * words + w];
    } else {
      to[index[i] * words + w] = from[i * words + w];
    }
  }
}

template <typename T>
__global__ void segment_add_kernel(T* dst, const T* src, const int64_t* order, const int64_t* starts,
                                   const int64_t* rows, int64_t segments, int64_t width) {
  for (int64_t s = blockIdx.x; s < segments; s += gridDim.x) {
    T* to = dst + rows[s] * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      T acc = to[j];
      for (int64_t e = starts[s]; e < starts[s + 1]; ++e) acc += src[order[e] * width + j];
      to[j] = acc;
    }
  }
}

void check_pair_cuda(const at::Tensor& table, const at::Tensor& index, const at::Tensor& rows) {
  check_cuda(table, "rows");
  TORCH_CHECK(index.device() == table.device() && rows.device() == table.device(),
              "rows, index and the other rows must share one device");
  check_ids(index, "index");
  TORCH_CHECK(table.dim() >= 1 && table.is_contiguous() && rows.is_contiguous(), "rows must be contiguous");
  TORCH_CHECK(table.scalar_type() == rows.scalar_type() && table.sizes().slice(1) == rows.sizes().slice(1),
              "row dtype or shape mismatch: ", table.sizes(), " vs ", rows.sizes());
  TORCH_CHECK(index.size(0) == rows.size(0), "index has ", index.size(0), " entries, expected ", rows.size(0));
  check_index_range_cuda(index, table.size(0), "index");
}

void move_rows(const at::Tensor& from, at::Tensor to, const at::Tensor& index, int64_t rows, bool gather) {
  const int64_t row_bytes = rows ? to.nbytes() / to.size(0) : 0;
  if (rows == 0 || row_bytes == 0) return;
  TORCH_CHECK(row_bytes % 4 == 0, "rows must be a multiple of 4 bytes on CUDA, got ", row_bytes);
  const c10::cuda::CUDAGuard guard(to.device());
  const int64_t words = row_bytes / 4;
  copy_rows_kernel<<<blocks_for(rows * words), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const uint32_t*>(from.data_ptr()), static_cast<uint32_t*>(to.data_ptr()),
      index.data_ptr<int64_t>(), rows, words, gather);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void gather_rows_cuda(const at::Tensor& src, const at::Tensor& index, at::Tensor out) {
  check_pair_cuda(src, index, out);
  move_rows(src, out, index, out.size(0), /*gather=*/true);
}

void scatter_rows_cuda(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_pair_cuda(dst, index, src);
  move_rows(src, dst, index, src.size(0), /*gather=*/false);
}

void scatter_add_rows_cuda(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_pair_cuda(dst, index, src);
  TORCH_CHECK(dst.scalar_type() == at::kFloat || dst.scalar_type() == at::kDouble,
              "scatter_add_rows takes float32 or float64 rows, got ", dst.scalar_type());
  if (src.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(dst.device());
  auto [sorted, order] = at::sort(index, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto [rows, counts] = [&] {
    auto result = at::unique_consecutive(sorted, /*return_inverse=*/false, /*return_counts=*/true);
    return std::make_pair(std::get<0>(result), std::get<2>(result));
  }();
  at::Tensor starts = at::zeros({rows.size(0) + 1}, index.options());
  starts.narrow(0, 1, rows.size(0)).copy_(counts.cumsum(0));
  const int64_t width = src.numel() / src.size(0);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, width)));
  AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "scatter_add_rows_cuda", [&] {
    segment_add_kernel<scalar_t><<<blocks_for(rows.size(0) * kThreads), threads, 0,
                                   c10::cuda::getCurrentCUDAStream()>>>(
        dst.data_ptr<scalar_t>(), src.data_ptr<scalar_t>(), order.data_ptr<int64_t>(), starts.data_ptr<int64_t>(),
        rows.data_ptr<int64_t>(), rows.size(0), width);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("gather_rows", gather_rows_cuda);
  m.impl("scatter_rows", scatter_rows_cuda);
  m.impl("scatter_add_rows", scatter_add_rows_cuda);
}

}  // namespace ember
