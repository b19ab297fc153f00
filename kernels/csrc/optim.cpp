// Fused row-wise optimizer step (CPU), in place on a table's storage by slot.
//
// For each i, with row r = slots[i]: versions[r] += 1, then the optimizer of
// ``kind`` updates weights[r] and state[r] with gradient grads[i] (plus L2
// weight decay) and step t = versions[r]. One pass, no gathered copies.
// Arithmetic is float32 in the order of the pure-torch reference
// (kernels/optim.py). torch's vectorised CPU kernels fuse multiply-adds
// (addcmul, add with alpha) on CPUs with FMA; this op does the same there, so
// both give the same bits and a model trained through either matches. Slots
// should be distinct: a repeated slot is stepped once per occurrence.
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "checks.h"
#include "optim_step.h"
#include "prefetch.h"

namespace ember {
namespace {

// a * b + c, fused (one rounding) where torch's kernels fuse it.
template <bool kFused>
inline __attribute__((always_inline)) float mul_add(float a, float b, float c) {
  if constexpr (kFused) {
    return __builtin_fmaf(a, b, c);
  } else {
    return a * b + c;
  }
}

template <bool kFused>
inline __attribute__((always_inline)) void step_row(int64_t kind, const OptimizerHyper& h, float* w, float* s,
                                                     const float* grad, int64_t dim, int64_t t, float* g) {
  for (int64_t j = 0; j < dim; ++j) g[j] = h.weight_decay != 0.0f ? grad[j] + h.weight_decay * w[j] : grad[j];
  switch (kind) {
    case kSgd:
      for (int64_t j = 0; j < dim; ++j) w[j] -= h.lr * g[j];
      break;
    case kAdagrad:
      for (int64_t j = 0; j < dim; ++j) {
        s[j] = mul_add<kFused>(g[j], g[j], s[j]);
        w[j] -= (h.lr * g[j]) / (std::sqrt(s[j]) + h.eps);
      }
      break;
    case kRowwiseAdagrad: {
      float sum = 0.0f;
      for (int64_t j = 0; j < dim; ++j) sum += g[j] * g[j];
      s[0] += sum / static_cast<float>(dim);
      const float denom = std::sqrt(s[0]) + h.eps;
      for (int64_t j = 0; j < dim; ++j) w[j] -= (h.lr * g[j]) / denom;
      break;
    }
    case kAdam: {
      float* m = s;
      float* v = s + dim;
      const float bias1 = static_cast<float>(1.0 - std::pow(h.beta1_d, static_cast<double>(t)));
      const float bias2 = static_cast<float>(1.0 - std::pow(h.beta2_d, static_cast<double>(t)));
      for (int64_t j = 0; j < dim; ++j) {
        m[j] = mul_add<kFused>(g[j], h.one_minus_beta1, m[j] * h.beta1);
        v[j] = mul_add<kFused>(h.one_minus_beta2 * g[j], g[j], v[j] * h.beta2);
        w[j] -= (h.lr * (m[j] / bias1)) / (std::sqrt(v[j] / bias2) + h.eps);
      }
      break;
    }
  }
}

template <bool kFused>
inline __attribute__((always_inline)) void step_rows(int64_t kind, const OptimizerHyper& h, float* w, float* s,
                                                      int64_t* version, const float* grad, const int64_t* slot,
                                                      int64_t n, int64_t dim, int64_t width) {
  std::vector<float> scratch(dim);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) {  // slots are random rows: fetch the weights and state a few rows ahead
      const int64_t ahead = slot[i + kRowsAhead];
      prefetch_row<1>(reinterpret_cast<const char*>(w + ahead * dim), dim * static_cast<int64_t>(sizeof(float)));
      prefetch_row<1>(reinterpret_cast<const char*>(s + ahead * width), width * static_cast<int64_t>(sizeof(float)));
    }
    const int64_t r = slot[i];
    const int64_t t = ++version[r];
    step_row<kFused>(kind, h, w + r * dim, s + r * width, grad + i * dim, dim, t, scratch.data());
  }
}

__attribute__((target("fma"))) void step_rows_fused(int64_t kind, const OptimizerHyper& h, float* w, float* s,
                                                     int64_t* version, const float* grad, const int64_t* slot,
                                                     int64_t n, int64_t dim, int64_t width) {
  step_rows<true>(kind, h, w, s, version, grad, slot, n, dim, width);
}

}  // namespace

void step_table_rows(int64_t kind, const OptimizerHyper& h, float* w, float* s, int64_t* version, const float* grad,
                     const int64_t* slot, int64_t n, int64_t dim, int64_t width) {
  if (__builtin_cpu_supports("fma")) {
    step_rows_fused(kind, h, w, s, version, grad, slot, n, dim, width);
  } else {
    step_rows<false>(kind, h, w, s, version, grad, slot, n, dim, width);
  }
}

namespace {

void fused_row_update(at::Tensor weights, at::Tensor state, at::Tensor versions, const at::Tensor& slots,
                      const at::Tensor& grads, int64_t kind, double lr, double eps, double beta1, double beta2,
                      double weight_decay) {
  const int64_t width = check_fused_update(weights, state, versions, slots, grads, kind, at::kCPU);
  const int64_t dim = weights.size(1);
  check_index_range(slots, weights.size(0), "slots");
  step_table_rows(kind, make_hyper(lr, eps, beta1, beta2, weight_decay), weights.data_ptr<float>(),
                  state.data_ptr<float>(), versions.data_ptr<int64_t>(), grads.data_ptr<float>(),
                  slots.data_ptr<int64_t>(), slots.size(0), dim, width);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def(
      "fused_row_update(Tensor(a!) weights, Tensor(b!) state, Tensor(c!) versions, Tensor slots, Tensor grads, "
      "int kind, float lr, float eps, float beta1, float beta2, float weight_decay) -> ()");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("fused_row_update", fused_row_update); }

}  // namespace ember
