// What the CPU ops and the CUDA kernels share, without ATen (the .cu files
// include no ATen header, c10's scalar types at most, so nvcc never parses ATen):
// the hash map's layout and probing, the optimizer codes and the hyper-parameters
// of a fused row update.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__
#else
#define EMBER_HOST_DEVICE
#endif

namespace ember {

// splitmix64 finaliser: the home bucket of an id is mix64(id ^ kIndexSalt) & (capacity - 1).
EMBER_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kIndexSalt = 0x5851F42D4C957F2DULL;
constexpr int64_t kEmpty = -1;
constexpr int64_t kTombstone = -2;

EMBER_HOST_DEVICE inline uint64_t home_bucket(int64_t id, uint64_t mask) {
  return mix64(static_cast<uint64_t>(id) ^ kIndexSalt) & mask;
}

// The bucket holding ``id`` in a map of mask + 1 buckets, or -1 when absent:
// linear probing from the home bucket, over tombstones, up to an empty bucket. A
// negative id is never held (inserts refuse them): it must not match the empty (-1)
// or erased (-2) marker of a bucket.
EMBER_HOST_DEVICE inline int64_t locate_bucket(const int64_t* keys, uint64_t mask, int64_t id) {
  if (id < 0) return -1;
  uint64_t pos = home_bucket(id, mask);
  for (uint64_t probes = 0; probes <= mask; ++probes) {
    const int64_t k = keys[pos];
    if (k == id) return static_cast<int64_t>(pos);
    if (k == kEmpty) return -1;
    pos = (pos + 1) & mask;
  }
  return -1;
}

// Optimizer codes shared with kernels/optim.py.
enum OptimizerCode : int64_t { kSgd = 1, kAdagrad = 2, kRowwiseAdagrad = 3, kAdam = 4 };

// Hyper-parameters of a fused row update as the kernels use them (float32 math,
// Adam's bias corrections from double powers, as the torch reference).
struct OptimizerHyper {
  float lr, eps, beta1, beta2, one_minus_beta1, one_minus_beta2, weight_decay;
  double beta1_d, beta2_d;
};

inline OptimizerHyper make_hyper(double lr, double eps, double beta1, double beta2, double weight_decay) {
  return OptimizerHyper{static_cast<float>(lr),          static_cast<float>(eps),
                        static_cast<float>(beta1),       static_cast<float>(beta2),
                        static_cast<float>(1.0 - beta1), static_cast<float>(1.0 - beta2),
                        static_cast<float>(weight_decay), beta1, beta2};
}

}  // namespace ember
