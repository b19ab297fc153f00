// Launch geometry shared by the kernels: grid-stride loops over at most 65535
// blocks of kThreads threads.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ember {

constexpr int kThreads = 256;

inline int blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535)));
}

}  // namespace ember
