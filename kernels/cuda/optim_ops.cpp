// The CUDA fused row update op (kernel in optim.cu): every check runs before the
// first write.
#include <torch/library.h>

#include "cuda_checks.h"
#include "launchers.h"

namespace ember {
namespace {

void fused_row_update_cuda(at::Tensor weights, at::Tensor state, at::Tensor versions, const at::Tensor& slots,
                           const at::Tensor& grads, int64_t kind, double lr, double eps, double beta1, double beta2,
                           double weight_decay) {
  const int64_t width = check_fused_update(weights, state, versions, slots, grads, kind, at::kCUDA);
  check_index_range_cuda(slots, weights.size(0), "slots");
  if (slots.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(weights.device());
  launch_fused_row_update(weights.data_ptr<float>(), state.data_ptr<float>(), versions.data_ptr<int64_t>(),
                          slots.data_ptr<int64_t>(), grads.data_ptr<float>(), slots.size(0), weights.size(1), width,
                          kind, make_hyper(lr, eps, beta1, beta2, weight_decay), c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) { m.impl("fused_row_update", fused_row_update_cuda); }

}  // namespace ember
