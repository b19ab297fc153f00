// Packing float32 rows to fp16 / bf16 and back (CPU), for the wire.
//
// Rounding is round-to-nearest-even with NaN kept quiet, bit-identical to
// torch's conversions (``rows.to(dtype)``). bf16 is plain bit arithmetic that
// the compiler vectorises; fp16 uses the F16C conversion instructions where
// the CPU has them (checked at run time), else c10::Half.
#include <immintrin.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>

#include "checks.h"

namespace ember {
namespace {

void float_to_bf16(const float* from, uint16_t* to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, from + i, sizeof bits);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    to[i] = nan ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  }
}

void bf16_to_float(const uint16_t* from, float* to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(from[i]) << 16;
    std::memcpy(to + i, &bits, sizeof bits);
  }
}

__attribute__((target("avx,f16c"))) void float_to_half_f16c(const float* from, uint16_t* to, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i), half);
  }
  for (; i < n; ++i) to[i] = at::Half(from[i]).x;
}

__attribute__((target("avx,f16c"))) void half_to_float_f16c(const uint16_t* from, float* to, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i))));
  }
  for (; i < n; ++i) to[i] = static_cast<float>(c10::Half(from[i], c10::Half::from_bits()));
}

bool has_f16c() { return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c"); }

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
  auto* to = static_cast<uint16_t*>(out.data_ptr());
  const int64_t n = rows.numel();
  if (dtype == at::kBFloat16) {
    float_to_bf16(from, to, n);
  } else if (has_f16c()) {
    float_to_half_f16c(from, to, n);
  } else {
    for (int64_t i = 0; i < n; ++i) to[i] = at::Half(from[i]).x;
  }
  return out;
}

at::Tensor unpack_rows(const at::Tensor& packed) {
  check_packable(packed, "packed");
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "unpack_rows takes float16 or bfloat16, got ", dtype);
  at::Tensor out = at::empty(packed.sizes(), packed.options().dtype(at::kFloat));
  const auto* from = static_cast<const uint16_t*>(packed.data_ptr());
  float* to = out.data_ptr<float>();
  const int64_t n = packed.numel();
  if (dtype == at::kBFloat16) {
    bf16_to_float(from, to, n);
  } else if (has_f16c()) {
    half_to_float_f16c(from, to, n);
  } else {
    for (int64_t i = 0; i < n; ++i) to[i] = static_cast<float>(c10::Half(from[i], c10::Half::from_bits()));
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
