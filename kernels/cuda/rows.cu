// Row movement by index on the GPU (semantics of csrc/rows.cpp):
//   copy_rows: one block-stride loop over (row, word) pairs, copying 4-byte words
//     (every row type Ember moves is a multiple of 4 bytes);
//   segment_add: one block per segment of a stably sorted index, adding its rows in
//     their original order, the same sequence of float additions as the CPU op,
//     hence bit-identical results.
// The checks and the sort are in rows_ops.cpp.
#include <algorithm>

#include "launch_geometry.cuh"
#include "launchers.h"

namespace ember {
namespace {

__global__ void copy_rows_kernel(const uint32_t* from, uint32_t* to, const int64_t* index, int64_t rows,
                                 int64_t words, bool gather) {
  const int64_t total = rows * words;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / words, w = k % words;
    if (gather) {
      to[i * words + w] = from[index[i] * words + w];
    } else {
      to[index[i] * words + w] = from[i * words + w];
    }
  }
}

template <typename T>
__global__ void segment_add_kernel(T* dst, const T* src, const int64_t* order, const int64_t* starts,
                                   const int64_t* rows, int64_t segments, int64_t width) {
  for (int64_t s = blockIdx.x; s < segments; s += gridDim.x) {
    T* to = dst + rows[s] * width;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      T acc = to[j];
      for (int64_t e = starts[s]; e < starts[s + 1]; ++e) acc += src[order[e] * width + j];
      to[j] = acc;
    }
  }
}

template <typename T>
void launch_segment_add_of(T* dst, const T* src, const int64_t* order, const int64_t* starts, const int64_t* rows,
                           int64_t segments, int64_t width, cudaStream_t stream) {
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, width)));
  segment_add_kernel<T><<<blocks_for(segments * kThreads), threads, 0, stream>>>(dst, src, order, starts, rows,
                                                                                  segments, width);
}

}  // namespace

void launch_copy_rows(const uint32_t* from, uint32_t* to, const int64_t* index, int64_t rows, int64_t words,
                      bool gather, cudaStream_t stream) {
  copy_rows_kernel<<<blocks_for(rows * words), kThreads, 0, stream>>>(from, to, index, rows, words, gather);
}

void launch_segment_add(float* dst, const float* src, const int64_t* order, const int64_t* starts,
                        const int64_t* rows, int64_t segments, int64_t width, cudaStream_t stream) {
  launch_segment_add_of(dst, src, order, starts, rows, segments, width, stream);
}

void launch_segment_add(double* dst, const double* src, const int64_t* order, const int64_t* starts,
                        const int64_t* rows, int64_t segments, int64_t width, cudaStream_t stream) {
  launch_segment_add_of(dst, src, order, starts, rows, segments, width, stream);
}

}  // namespace ember
