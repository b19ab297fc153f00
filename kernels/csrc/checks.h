// Argument checks shared by the CPU and CUDA ops: every op validates its
// inputs and raises a clear c10::Error (a RuntimeError in Python) instead of
// reading or writing out of bounds.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ember {

inline void check_device(const at::Tensor& t, at::DeviceType type, const char* what) {
  TORCH_CHECK(t.device().type() == type, what, " is on ", t.device(), ", expected a ", type, " tensor");
}

inline void check_ids(const at::Tensor& ids, const char* what) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(), what,
              " must be a contiguous 1-D int64 tensor, got ", ids.scalar_type(), " of shape ", ids.sizes(),
              ids.is_contiguous() ? "" : " (non-contiguous)");
}

inline void check_rows(const at::Tensor& rows, const char* what) {
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous(), what, " must be a contiguous 2-D tensor, got shape ",
              rows.sizes(), rows.is_contiguous() ? "" : " (non-contiguous)");
}

inline void check_same_rows(const at::Tensor& a, const at::Tensor& b, const char* what_a, const char* what_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what_a, " and ", what_b, " differ in dtype: ", a.scalar_type(),
              " vs ", b.scalar_type());
  TORCH_CHECK(a.size(1) == b.size(1), what_a, " and ", what_b, " differ in row width: ", a.size(1), " vs ",
              b.size(1));
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

// splitmix64 finaliser: the home bucket of an id is mix64(id ^ kIndexSalt) & (capacity - 1).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kIndexSalt = 0x5851F42D4C957F2DULL;
constexpr int64_t kEmpty = -1;
constexpr int64_t kTombstone = -2;

// Optimizer codes shared with kernels/optim.py.
enum OptimizerCode : int64_t { kSgd = 1, kAdagrad = 2, kRowwiseAdagrad = 3, kAdam = 4 };

}  // namespace ember
