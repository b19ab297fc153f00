// The CUDA kernels' launchers: plain pointers, sizes and a stream, no ATen. The
// .cu files define them (nvcc compiles only kernels and these); the *_ops.cpp
// files check the tensors, take the device's current stream and call them (the
// host compiler parses ATen once per op, nvcc never does).
// Each launcher queues its kernel on ``stream`` and returns at once; the caller
// checks the launch (C10_CUDA_KERNEL_LAUNCH_CHECK). Row and id counts are > 0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_common.h"

namespace ember {

// out[i] = the slot of ids[i] in the map (keys, slots, mask + 1 buckets), or -1;
// with keys_to_erase (the map's keys), each found id's bucket becomes a tombstone.
void launch_hash_find(const int64_t* keys, const int64_t* slots, uint64_t mask, const int64_t* ids, int64_t n,
                      int64_t* out, int64_t* keys_to_erase, cudaStream_t stream);

// Inserts n distinct absent ids (>= 0), ids[i] -> values[i]; the map must keep an
// empty bucket after them (the caller checked).
void launch_hash_insert(int64_t* keys, int64_t* slots, uint64_t mask, const int64_t* ids, const int64_t* values,
                        int64_t n, cudaStream_t stream);

// One optimizer step of ``kind`` per distinct slot (csrc/optim.cpp's semantics).
void launch_fused_row_update(float* weights, float* state, int64_t* versions, const int64_t* slots,
                             const float* grads, int64_t n, int64_t dim, int64_t width, int64_t kind,
                             const OptimizerHyper& hyper, cudaStream_t stream);

// n float32 values to float16 (or bfloat16) bits, round to nearest even, and back.
void launch_pack_rows(const float* from, uint16_t* to, int64_t n, bool bfloat16, cudaStream_t stream);
void launch_unpack_rows(const uint16_t* from, float* to, int64_t n, bool bfloat16, cudaStream_t stream);

// Rows of ``words`` 4-byte words: gather to[i] = from[index[i]], else scatter
// to[index[i]] = from[i], for i < rows.
void launch_copy_rows(const uint32_t* from, uint32_t* to, const int64_t* index, int64_t rows, int64_t words,
                      bool gather, cudaStream_t stream);

// dst[rows[s]] += src[order[e]] for e in [starts[s], starts[s + 1]), in that order,
// for each of ``segments`` segments of rows ``width`` values wide.
void launch_segment_add(float* dst, const float* src, const int64_t* order, const int64_t* starts,
                        const int64_t* rows, int64_t segments, int64_t width, cudaStream_t stream);
void launch_segment_add(double* dst, const double* src, const int64_t* order, const int64_t* starts,
                        const int64_t* rows, int64_t segments, int64_t width, cudaStream_t stream);

}  // namespace ember
