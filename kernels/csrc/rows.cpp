// Row movement by index (CPU):
//   gather_rows:      out[i] = src[index[i]]
//   scatter_rows:     dst[index[i]] = src[i]
//   scatter_add_rows: dst[index[i]] += src[i], in order of i (deterministic)
//
// Single-threaded, with prefetching of rows a few indices ahead. Callers overlap
// these copies with network transfers on other threads, where intra-op thread
// pools only add wake-ups and spinning. Every index is range-checked before the
// first write, so a bad index raises and changes nothing.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstring>

#include "checks.h"
#include "prefetch.h"

namespace ember {
namespace {

// A "rows" tensor: contiguous CPU, >= 1 dimension; a row is one slice along dim 0.
void check_row_tensor(const at::Tensor& rows, const char* what) {
  check_device(rows, at::kCPU, what);
  TORCH_CHECK(rows.dim() >= 1 && rows.is_contiguous(), what, " must be contiguous with at least one dimension");
}

void check_pair(const at::Tensor& a, const at::Tensor& b, const char* what_a, const char* what_b) {
  check_row_tensor(a, what_a);
  check_row_tensor(b, what_b);
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what_a, " and ", what_b, " differ in dtype: ", a.scalar_type(),
              " vs ", b.scalar_type());
  TORCH_CHECK(a.sizes().slice(1) == b.sizes().slice(1), what_a, " and ", what_b, " differ in row shape: ",
              a.sizes(), " vs ", b.sizes());
}

void check_index(const at::Tensor& index, int64_t count, int64_t bound) {
  check_ids(index, "index");
  check_device(index, at::kCPU, "index");
  TORCH_CHECK(index.size(0) == count, "index has ", index.size(0), " entries, expected ", count);
  check_index_range(index, bound, "index");
}

int64_t row_bytes(const at::Tensor& rows) { return rows.numel() ? rows.nbytes() / rows.size(0) : 0; }

void gather_rows(const at::Tensor& src, const at::Tensor& index, at::Tensor out) {
  check_pair(src, out, "src", "out");
  check_index(index, out.size(0), src.size(0));
  const int64_t bytes = row_bytes(out);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t n = index.size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) prefetch_row<0>(from + idx[i + kRowsAhead] * bytes, bytes);
    std::memcpy(to + i * bytes, from + idx[i] * bytes, bytes);
  }
}

void scatter_rows(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_pair(src, dst, "src", "dst");
  check_index(index, src.size(0), dst.size(0));
  const int64_t bytes = row_bytes(src);
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t n = index.size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) prefetch_row<1>(to + idx[i + kRowsAhead] * bytes, bytes);
    std::memcpy(to + idx[i] * bytes, from + i * bytes, bytes);
  }
}

template <typename T>
void add_rows(T* dst, const int64_t* idx, const T* src, int64_t n, int64_t width) {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) {
      prefetch_row<1>(reinterpret_cast<const char*>(dst + idx[i + kRowsAhead] * width), width * sizeof(T));
    }
    T* __restrict__ to = dst + idx[i] * width;
    const T* __restrict__ from = src + i * width;
    for (int64_t j = 0; j < width; ++j) to[j] += from[j];
  }
}

void scatter_add_rows(at::Tensor dst, const at::Tensor& index, const at::Tensor& src) {
  check_pair(src, dst, "src", "dst");
  TORCH_CHECK(dst.scalar_type() == at::kFloat || dst.scalar_type() == at::kDouble,
              "scatter_add_rows takes float32 or float64 rows, got ", dst.scalar_type());
  check_index(index, src.size(0), dst.size(0));
  const int64_t width = src.size(0) ? src.numel() / src.size(0) : 0;
  AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "scatter_add_rows", [&] {
    add_rows(dst.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), src.data_ptr<scalar_t>(), src.size(0), width);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("gather_rows(Tensor src, Tensor index, Tensor(a!) out) -> ()");
  m.def("scatter_rows(Tensor(a!) dst, Tensor index, Tensor src) -> ()");
  m.def("scatter_add_rows(Tensor(a!) dst, Tensor index, Tensor src) -> ()");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("gather_rows", gather_rows);
  m.impl("scatter_rows", scatter_rows);
  m.impl("scatter_add_rows", scatter_add_rows);
}

}  // namespace ember
