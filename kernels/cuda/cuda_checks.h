// The CUDA ops' host-side checks (their *_ops.cpp): device checks and an index
// range check that runs on the device before any write.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "checks.h"

namespace ember {

inline void check_cuda(const at::Tensor& t, const char* what) { check_device(t, at::kCUDA, what); }

// Raises, naming the bounds, if any index lies outside [0, bound). One reduction, one sync.
inline void check_index_range_cuda(const at::Tensor& index, int64_t bound, const char* what) {
  if (index.numel() == 0) return;
  auto [low, high] = at::aminmax(index);
  const int64_t lo = low.item<int64_t>(), hi = high.item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < bound, what, " out of range [0, ", bound, "): min ", lo, ", max ", hi);
}

}  // namespace ember
