// Software prefetching of rows read or written in random order (CPU): the hardware
// prefetcher cannot guess the next row, so a copy loop asks for the rows a few
// indices ahead and DRAM latency overlaps the copies.
#pragma once

#include <cstdint>

namespace ember {

constexpr int64_t kRowsAhead = 16;  // rows in flight: enough to cover DRAM latency on one core
constexpr int64_t kCacheLine = 64;

// Every cache line of a row, for reading (kWrite 0) or writing (kWrite 1).
template <int kWrite>
inline void prefetch_row(const char* row, int64_t bytes) {
  for (int64_t offset = 0; offset < bytes; offset += kCacheLine) __builtin_prefetch(row + offset, kWrite);
}

}  // namespace ember
