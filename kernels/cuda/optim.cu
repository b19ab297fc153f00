// Fused row-wise optimizer step on the GPU (semantics of csrc/optim.cpp): one
// block per slot, threads across the row; row-wise Adagrad reduces the squared
// gradient in shared memory. Slots must be distinct (one block owns a row).
#include <torch/library.h>

#include "cuda_checks.cuh"

namespace ember {
namespace {

struct HyperCuda {
  float lr, eps, beta1, beta2, one_minus_beta1, one_minus_beta2, weight_decay;
  double beta1_d, beta2_d;
};

__global__ void fused_update_kernel(float* weights, float* state, int64_t* versions, const int64_t* slots,
                                    const float* grads, int64_t n, int64_t dim, int64_t width, int64_t kind,
                                    HyperCuda h) {
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

void fused_row_update_cuda(at::Tensor weights, at::Tensor state, at::Tensor versions, const at::Tensor& slots,
                           const at::Tensor& grads, int64_t kind, double lr, double eps, double beta1, double beta2,
                           double weight_decay) {
  check_rows(weights, "weights");
  check_rows(state, "state");
  check_rows(grads, "grads");
  check_ids(versions, "versions");
  check_ids(slots, "slots");
  const at::Tensor* all[] = {&weights, &state, &grads, &versions, &slots};
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->device() == weights.device(), "every tensor must be on ", weights.device());
  }
  check_cuda(weights, "weights");
  TORCH_CHECK(weights.scalar_type() == at::kFloat && state.scalar_type() == at::kFloat &&
                  grads.scalar_type() == at::kFloat,
              "weights, state and grads must be float32");
  TORCH_CHECK(kind >= kSgd && kind <= kAdam, "unknown optimizer kind ", kind);
  const int64_t dim = weights.size(1);
  const int64_t width = state.size(1);
  const int64_t expected = kind == kSgd ? 0 : kind == kAdagrad ? dim : kind == kRowwiseAdagrad ? 1 : 2 * dim;
  TORCH_CHECK(state.size(0) == weights.size(0) && width == expected, "state must have shape [", weights.size(0),
              ", ", expected, "], got ", state.sizes());
  TORCH_CHECK(versions.size(0) == weights.size(0), "versions must have one entry per row");
  TORCH_CHECK(grads.size(0) == slots.size(0) && grads.size(1) == dim, "grads must have shape [", slots.size(0),
              ", ", dim, "]");
  check_index_range_cuda(slots, weights.size(0), "slots");
  if (slots.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(weights.device());
  const HyperCuda h{static_cast<float>(lr),         static_cast<float>(eps),
                    static_cast<float>(beta1),      static_cast<float>(beta2),
                    static_cast<float>(1.0 - beta1), static_cast<float>(1.0 - beta2),
                    static_cast<float>(weight_decay), beta1, beta2};
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, dim)));
  const int rounded = 1 << (32 - __builtin_clz(static_cast<unsigned>(threads - 1)));  // power of two for the reduction
  fused_update_kernel<<<static_cast<int>(std::min<int64_t>(slots.size(0), 65535)), rounded, 0,
                        c10::cuda::getCurrentCUDAStream()>>>(
      weights.data_ptr<float>(), state.data_ptr<float>(), versions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
      grads.data_ptr<float>(), slots.size(0), dim, width, kind, h);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(ember, CUDA, m) { m.impl("fused_row_update", fused_row_update_cuda); }

}  // namespace ember
