// The CUDA row ops (kernels in rows.cu): gather_rows, scatter_rows and a
// deterministic scatter_add_rows. For the latter the index is sorted stably, so
// each destination row's contributions form a segment in their original order.
#include <ATen/ops/sort.h>
#include <ATen/ops/unique_consecutive.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "cuda_checks.h"
#include "launchers.h"

namespace ember {
namespace {

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
  launch_copy_rows(static_cast<const uint32_t*>(from.data_ptr()), static_cast<uint32_t*>(to.data_ptr()),
                   index.data_ptr<int64_t>(), rows, row_bytes / 4, gather, c10::cuda::getCurrentCUDAStream());
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

template <typename T>
void add_segments(at::Tensor dst, const at::Tensor& src, const at::Tensor& order, const at::Tensor& starts,
                  const at::Tensor& rows) {
  launch_segment_add(dst.data_ptr<T>(), src.data_ptr<T>(), order.data_ptr<int64_t>(), starts.data_ptr<int64_t>(),
                     rows.data_ptr<int64_t>(), rows.size(0), src.numel() / src.size(0),
                     c10::cuda::getCurrentCUDAStream());
}

void scatter_add_rows_cuda(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_pair_cuda(dst, index, src);
  TORCH_CHECK(dst.scalar_type() == at::kFloat || dst.scalar_type() == at::kDouble,
              "scatter_add_rows takes float32 or float64 rows, got ", dst.scalar_type());
  if (src.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(dst.device());
  auto [sorted, order] = at::sort(index, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto unique = at::unique_consecutive(sorted, /*return_inverse=*/false, /*return_counts=*/true);
  const at::Tensor& rows = std::get<0>(unique);
  at::Tensor starts = at::zeros({rows.size(0) + 1}, index.options());
  starts.narrow(0, 1, rows.size(0)).copy_(std::get<2>(unique).cumsum(0));
  if (dst.scalar_type() == at::kFloat) {
    add_segments<float>(dst, src, order, starts, rows);
  } else {
    add_segments<double>(dst, src, order, starts, rows);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("gather_rows", gather_rows_cuda);
  m.impl("scatter_rows", scatter_rows_cuda);
  m.impl("scatter_add_rows", scatter_add_rows_cuda);
}

}  // namespace ember
