// Packing float32 rows to fp16 / bf16 and back on the GPU, round-to-nearest-even
// (c10::Half / c10::BFloat16 conversions, as torch's own .to()). The checks are in
// pack_ops.cpp.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "launch_geometry.cuh"
#include "launchers.h"

namespace ember {
namespace {

static_assert(sizeof(c10::Half) == sizeof(uint16_t) && sizeof(c10::BFloat16) == sizeof(uint16_t),
              "16-bit rows travel as their bits");

template <typename From, typename To>
__global__ void convert_kernel(const From* from, To* to, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    to[i] = static_cast<To>(static_cast<float>(from[i]));
  }
}

template <typename From, typename To>
void launch_convert(const void* from, void* to, int64_t n, cudaStream_t stream) {
  convert_kernel<From, To><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const From*>(from),
                                                                    static_cast<To*>(to), n);
}

}  // namespace

void launch_pack_rows(const float* from, uint16_t* to, int64_t n, bool bfloat16, cudaStream_t stream) {
  if (bfloat16) {
    launch_convert<float, c10::BFloat16>(from, to, n, stream);
  } else {
    launch_convert<float, c10::Half>(from, to, n, stream);
  }
}

void launch_unpack_rows(const uint16_t* from, float* to, int64_t n, bool bfloat16, cudaStream_t stream) {
  if (bfloat16) {
    launch_convert<c10::BFloat16, float>(from, to, n, stream);
  } else {
    launch_convert<c10::Half, float>(from, to, n, stream);
  }
}

}  // namespace ember
