// Packing float32 rows to fp16 / bf16 and back on the GPU, round-to-nearest-even
// (c10::Half / c10::BFloat16 conversions, as torch's own .to()).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda_checks.cuh"

namespace ember {
namespace {

template <typename From, typename To>
__global__ void convert_kernel(const From* from, To* to, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    to[i] = static_cast<To>(static_cast<float>(from[i]));
  }
}

template <typename From, typename To>
at::Tensor convert(const at::Tensor& src, at::ScalarType dtype) {
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(dtype));
  const int64_t n = src.numel();
  if (n == 0) return out;
  const c10::cuda::CUDAGuard guard(src.device());
  convert_kernel<From, To><<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      src.data_ptr<From>(), out.data_ptr<To>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor pack_rows_cuda(const at::Tensor& rows, at::ScalarType dtype) {
  check_cuda(rows, "rows");
  TORCH_CHECK(rows.is_contiguous() && rows.scalar_type() == at::kFloat, "pack_rows takes contiguous float32 rows");
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "pack_rows packs to float16 or bfloat16, got ", dtype);
  return dtype == at::kHalf ? convert<float, at::Half>(rows, dtype) : convert<float, at::BFloat16>(rows, dtype);
}

at::Tensor unpack_rows_cuda(const at::Tensor& packed) {
  check_cuda(packed, "packed");
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(packed.is_contiguous() && (dtype == at::kHalf || dtype == at::kBFloat16),
              "unpack_rows takes contiguous float16 or bfloat16 rows");
  return dtype == at::kHalf ? convert<at::Half, float>(packed, at::kFloat)
                            : convert<at::BFloat16, float>(packed, at::kFloat);
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("pack_rows", pack_rows_cuda);
  m.impl("unpack_rows", unpack_rows_cuda);
}

}  // namespace ember
