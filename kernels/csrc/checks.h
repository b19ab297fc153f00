// Shared by the CPU ops and the CUDA ops' host code: argument checks (every op
// validates its inputs and raises a clear c10::Error, a RuntimeError in Python,
// instead of reading or writing out of bounds), over device_common.h's layouts.
#pragma once

// The Tensor type and its methods only: each source includes the ATen functions it
// calls (<ATen/ops/NAME.h>), as ATen/ATen.h, all of them, takes longer to compile.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "device_common.h"

namespace ember {

inline void check_device(const at::Tensor& t, at::DeviceType type, const char* what) {
  TORCH_CHECK(t.device().type() == type, what, " is on ", t.device(), ", expected a ", type, " tensor");
}

inline void check_ids(const at::Tensor& ids, const char* what) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(), what,
              " must be a contiguous 1-D int64 tensor, got ", ids.scalar_type(), " of shape ", ids.sizes(),
              ids.is_contiguous() ? "" : " (non-contiguous)");
}

// A contiguous 1-D int64 tensor in CPU memory (ids, slots, positions read on the host).
inline void check_cpu_ids(const at::Tensor& ids, const char* what) {
  check_ids(ids, what);
  check_device(ids, at::kCPU, what);
}

inline void check_rows(const at::Tensor& rows, const char* what) {
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous(), what, " must be a contiguous 2-D tensor, got shape ",
              rows.sizes(), rows.is_contiguous() ? "" : " (non-contiguous)");
}

// Whether the bytes of two contiguous tensors overlap in memory: sharing one storage or
// not (two tensors made over one buffer have two storages and the same bytes).
inline bool bytes_overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr());
  const auto b0 = reinterpret_cast<uintptr_t>(b.data_ptr());
  const auto a_bytes = static_cast<uintptr_t>(a.nbytes());
  const auto b_bytes = static_cast<uintptr_t>(b.nbytes());
  return a_bytes && b_bytes && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

inline void check_same_rows(const at::Tensor& a, const at::Tensor& b, const char* what_a, const char* what_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what_a, " and ", what_b, " differ in dtype: ", a.scalar_type(),
              " vs ", b.scalar_type());
  TORCH_CHECK(a.size(1) == b.size(1), what_a, " and ", what_b, " differ in row width: ", a.size(1), " vs ",
              b.size(1));
}

// Host-side check that the n ids at id (in CPU memory) are all >= 0.
inline void check_non_negative_ids(const int64_t* id, int64_t n) {
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0, "ids must be >= 0, got ", id[i], " at [", i, "]");
}

// Host-side range check of an index held in CPU memory.
inline void check_index_range(const at::Tensor& index, int64_t bound, const char* what) {
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < index.size(0); ++i) {
    TORCH_CHECK(idx[i] >= 0 && idx[i] < bound, what, "[", i, "] = ", idx[i], " is out of range [0, ", bound, ")");
  }
}

inline void check_hash_map(const at::Tensor& keys, const at::Tensor& slots) {
  check_ids(keys, "keys");
  check_ids(slots, "slots");
  TORCH_CHECK(keys.device() == slots.device(), "keys and slots must be on one device");
  TORCH_CHECK(slots.size(0) == keys.size(0), "keys and slots must have equal length");
  const int64_t capacity = keys.size(0);
  TORCH_CHECK(capacity > 0 && (capacity & (capacity - 1)) == 0, "capacity must be a power of two, got ", capacity);
}

inline int64_t optimizer_state_width(int64_t kind, int64_t dim) {
  switch (kind) {
    case kSgd: return 0;
    case kAdagrad: return dim;
    case kRowwiseAdagrad: return 1;
    case kAdam: return 2 * dim;
  }
  TORCH_CHECK(false, "unknown optimizer kind ", kind, " (1 sgd, 2 adagrad, 3 rowwise_adagrad, 4 adam)");
}

// The arguments of fused_row_update, all on one device of ``type``; returns the state width.
inline int64_t check_fused_update(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& versions,
                                  const at::Tensor& slots, const at::Tensor& grads, int64_t kind,
                                  at::DeviceType type) {
  check_rows(weights, "weights");
  check_rows(state, "state");
  check_rows(grads, "grads");
  check_ids(versions, "versions");
  check_ids(slots, "slots");
  check_device(weights, type, "weights");
  const at::Tensor* all[] = {&state, &grads, &versions, &slots};
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->device() == weights.device(), "every tensor must be on ", weights.device());
  }
  TORCH_CHECK(weights.scalar_type() == at::kFloat && state.scalar_type() == at::kFloat &&
                  grads.scalar_type() == at::kFloat,
              "weights, state and grads must be float32");
  const int64_t dim = weights.size(1);
  const int64_t width = optimizer_state_width(kind, dim);
  TORCH_CHECK(state.size(0) == weights.size(0) && state.size(1) == width, "state must have shape [",
              weights.size(0), ", ", width, "] for this optimizer, got ", state.sizes());
  TORCH_CHECK(versions.size(0) == weights.size(0), "versions must have one entry per row");
  TORCH_CHECK(grads.size(0) == slots.size(0) && grads.size(1) == dim, "grads must have shape [", slots.size(0),
              ", ", dim, "], got ", grads.sizes());
  return width;
}

}  // namespace ember
