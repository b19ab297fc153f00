// Row gather and scatter by index: out[i] = src[index[i]] and dst[index[i]] = src[i].
//
// Single-threaded memcpy per row with prefetching of rows a few indices ahead.
// Callers overlap these copies with network transfers on other threads, where
// intra-op thread pools only add wake-ups and spinning.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace ember {
namespace {

constexpr int64_t kAhead = 8;

void check_rows(const at::Tensor& rows, const char* what) {
  TORCH_CHECK(rows.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(rows.dim() >= 1 && rows.is_contiguous(), what, " must be contiguous with at least one dimension");
}

void check_index(const at::Tensor& index, int64_t count, int64_t bound, const char* what) {
  TORCH_CHECK(index.device().is_cpu() && index.scalar_type() == at::kLong && index.dim() == 1 &&
                  index.is_contiguous(),
              what, " must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK(index.size(0) == count, what, " has ", index.size(0), " entries, expected ", count);
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(idx[i] >= 0 && idx[i] < bound, what, "[", i, "] = ", idx[i], " is out of range [0, ", bound, ")");
  }
}

int64_t row_bytes(const at::Tensor& rows) {
  return rows.dim() == 1 ? rows.element_size() : rows.stride(0) * rows.element_size();
}

void check_same_rows(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dtype mismatch: ", a.scalar_type(), " vs ", b.scalar_type());
  TORCH_CHECK(a.sizes().slice(1) == b.sizes().slice(1), "row shape mismatch: ", a.sizes(), " vs ", b.sizes());
}

// out[i] = src[index[i]]
void gather_rows(const at::Tensor& src, const at::Tensor& index, at::Tensor out) {
  check_rows(src, "src");
  check_rows(out, "out");
  check_same_rows(src, out);
  check_index(index, out.size(0), src.size(0), "index");
  const int64_t bytes = row_bytes(src);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t n = index.size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(from + idx[i + kAhead] * bytes);
    std::memcpy(to + i * bytes, from + idx[i] * bytes, bytes);
  }
}

// dst[index[i]] = src[i]
void scatter_rows(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_rows(src, "src");
  check_rows(dst, "dst");
  check_same_rows(src, dst);
  check_index(index, src.size(0), dst.size(0), "index");
  const int64_t bytes = row_bytes(src);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t n = index.size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(to + idx[i + kAhead] * bytes, 1);
    std::memcpy(to + idx[i] * bytes, from + i * bytes, bytes);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("gather_rows(Tensor src, Tensor index, Tensor(a!) out) -> ()");
  m.def("scatter_rows(Tensor(a!) dst, Tensor index, Tensor src) -> ()");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("gather_rows", gather_rows);
  m.impl("scatter_rows", scatter_rows);
}

}  // namespace ember
