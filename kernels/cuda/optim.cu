// Fused row-wise optimizer step on the GPU (semantics of csrc/optim.cpp): one
// block per slot, threads across the row; row-wise Adagrad reduces the squared
// gradient in shared memory. Slots must be distinct (one block owns a row). The
// checks are in optim_ops.cpp.
#include <algorithm>

#include "launch_geometry.cuh"
#include "launchers.h"

namespace ember {
namespace {

__global__ void fused_update_kernel(float* weights, float* state, int64_t* versions, const int64_t* slots,
                                    const float* grads, int64_t n, int64_t dim, int64_t width, int64_t kind,
                                    OptimizerHyper h) {
  __shared__ float reduce[kThreads];
  __shared__ int64_t step;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = slots[i];
    float* w = weights + r * dim;
    float* s = state + r * width;
    const float* grad = grads + i * dim;
    if (threadIdx.x == 0) step = ++versions[r];
    __syncthreads();
    float partial = 0.0f;
    if (kind == kRowwiseAdagrad) {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const float g = h.weight_decay != 0.0f ? grad[j] + h.weight_decay * w[j] : grad[j];
        partial += g * g;
      }
    }
    reduce[threadIdx.x] = partial;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) reduce[threadIdx.x] += reduce[threadIdx.x + stride];
      __syncthreads();
    }
    const float bias1 = static_cast<float>(1.0 - pow(h.beta1_d, static_cast<double>(step)));
    const float bias2 = static_cast<float>(1.0 - pow(h.beta2_d, static_cast<double>(step)));
    if (kind == kRowwiseAdagrad && threadIdx.x == 0) s[0] += reduce[0] / static_cast<float>(dim);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float g = h.weight_decay != 0.0f ? grad[j] + h.weight_decay * w[j] : grad[j];
      if (kind == kSgd) {
        w[j] -= h.lr * g;
      } else if (kind == kAdagrad) {
        s[j] += g * g;
        w[j] -= (h.lr * g) / (sqrtf(s[j]) + h.eps);
      } else if (kind == kRowwiseAdagrad) {
        w[j] -= (h.lr * g) / (sqrtf(s[0]) + h.eps);
      } else {
        float* m = s;
        float* v = s + dim;
        m[j] = m[j] * h.beta1 + h.one_minus_beta1 * g;
        v[j] = v[j] * h.beta2 + h.one_minus_beta2 * g * g;
        w[j] -= (h.lr * (m[j] / bias1)) / (sqrtf(v[j] / bias2) + h.eps);
      }
    }
    __syncthreads();
  }
}

}  // namespace

void launch_fused_row_update(float* weights, float* state, int64_t* versions, const int64_t* slots,
                             const float* grads, int64_t n, int64_t dim, int64_t width, int64_t kind,
                             const OptimizerHyper& hyper, cudaStream_t stream) {
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, dim)));
  const int rounded = 1 << (32 - __builtin_clz(static_cast<unsigned>(threads - 1)));  // power of two for the reduction
  fused_update_kernel<<<static_cast<int>(std::min<int64_t>(n, 65535)), rounded, 0, stream>>>(
      weights, state, versions, slots, grads, n, dim, width, kind, hyper);
}

}  // namespace ember
