// Packing float32 rows to fp16 / bf16 and back (CPU), for the wire.
//
// Rounding is round-to-nearest-even, as torch's own conversions (c10::Half and
// c10::BFloat16 constructors), so packed bytes equal ``rows.to(dtype)``.
#include <torch/library.h>

#include "checks.h"

namespace ember {
namespace {

void check_packable(const at::Tensor& t, const char* what) {
  check_device(t, at::kCPU, what);
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

at::Tensor pack_rows(const at::Tensor& rows, at::ScalarType dtype) {
  check_packable(rows, "rows");
  TORCH_CHECK(rows.scalar_type() == at::kFloat, "pack_rows takes float32 rows, got ", rows.scalar_type());
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "pack_rows packs to float16 or bfloat16, got ", dtype);
  at::Tensor out = at::empty(rows.sizes(), rows.options().dtype(dtype));
  const float* from = rows.data_ptr<float>();
  const int64_t n = rows.numel();
  if (dtype == at::kHalf) {
    auto* to = out.data_ptr<at::Half>();
    for (int64_t i = 0; i < n; ++i) to[i] = at::Half(from[i]);
  } else {
    auto* to = out.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < n; ++i) to[i] = at::BFloat16(from[i]);
  }
  return out;
}

at::Tensor unpack_rows(const at::Tensor& packed) {
  check_packable(packed, "packed");
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "unpack_rows takes float16 or bfloat16, got ", dtype);
  at::Tensor out = at::empty(packed.sizes(), packed.options().dtype(at::kFloat));
  float* to = out.data_ptr<float>();
  const int64_t n = packed.numel();
  if (dtype == at::kHalf) {
    const auto* from = packed.data_ptr<at::Half>();
    for (int64_t i = 0; i < n; ++i) to[i] = static_cast<float>(from[i]);
  } else {
    const auto* from = packed.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < n; ++i) to[i] = static_cast<float>(from[i]);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("pack_rows(Tensor rows, ScalarType dtype) -> Tensor");
  m.def("unpack_rows(Tensor packed) -> Tensor");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("pack_rows", pack_rows);
  m.impl("unpack_rows", unpack_rows);
}

}  // namespace ember
