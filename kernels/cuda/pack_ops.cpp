// The CUDA pack and unpack ops (kernels in pack.cu).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda_checks.h"
#include "launchers.h"

namespace ember {
namespace {

at::Tensor pack_rows_cuda(const at::Tensor& rows, at::ScalarType dtype) {
  check_cuda(rows, "rows");
  TORCH_CHECK(rows.is_contiguous() && rows.scalar_type() == at::kFloat, "pack_rows takes contiguous float32 rows");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "pack_rows packs to float16 or bfloat16, got ", dtype);
  at::Tensor out = at::empty(rows.sizes(), rows.options().dtype(dtype));
  if (rows.numel() == 0) return out;
  const c10::cuda::CUDAGuard guard(rows.device());
  launch_pack_rows(rows.data_ptr<float>(), static_cast<uint16_t*>(out.data_ptr()), rows.numel(),
                   dtype == at::kBFloat16, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor unpack_rows_cuda(const at::Tensor& packed) {
  check_cuda(packed, "packed");
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(packed.is_contiguous() && (dtype == at::kHalf || dtype == at::kBFloat16),
              "unpack_rows takes contiguous float16 or bfloat16 rows");
  at::Tensor out = at::empty(packed.sizes(), packed.options().dtype(at::kFloat));
  if (packed.numel() == 0) return out;
  const c10::cuda::CUDAGuard guard(packed.device());
  launch_unpack_rows(static_cast<const uint16_t*>(packed.data_ptr()), out.data_ptr<float>(), packed.numel(),
                     dtype == at::kBFloat16, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("pack_rows", pack_rows_cuda);
  m.impl("unpack_rows", unpack_rows_cuda);
}

}  // namespace ember
