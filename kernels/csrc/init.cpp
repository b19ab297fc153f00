// Initial rows of a table with a uniform initializer (CPU), the native form of
// ps_server/initializers.py: element c of id i is
//   bits = mix64(row_key(i) + (c + 1) * kStream),  row_key(i) = mix64(mix64(i ^ name_salt) ^ seed_key)
//   u = ((bits >> 40) + 0.5) / 2^24,  value = float((2u - 1) * scale)
// in double precision, operation for operation as the numpy reference (built with
// -ffp-contract=off), so both give the same bits. Shards make the rows of every id
// they read or write for the first time, so this runs on the training path.
#include <torch/library.h>

#include "checks.h"
#include "init_rows.h"

namespace ember {
namespace {

constexpr uint64_t kStream = 0xD1B54A32D192ED03ull;
constexpr double kInv2To24 = 1.0 / static_cast<double>(1 << 24);

}  // namespace

void fill_uniform_row(int64_t id, uint64_t name_salt, uint64_t seed_key, int64_t dim, double scale, float* out) {
  const uint64_t row_key = mix64(mix64(static_cast<uint64_t>(id) ^ name_salt) ^ seed_key);
  for (int64_t c = 0; c < dim; ++c) {
    const uint64_t bits = mix64(row_key + static_cast<uint64_t>(c + 1) * kStream);
    const double u = (static_cast<double>(bits >> 40) + 0.5) * kInv2To24;
    out[c] = static_cast<float>((2.0 * u - 1.0) * scale);
  }
}

namespace {

at::Tensor uniform_rows(const at::Tensor& ids, int64_t name_salt, int64_t seed_key, int64_t dim,
                        double scale) {
  check_ids(ids, "ids");
  check_device(ids, at::kCPU, "ids");
  TORCH_CHECK(dim >= 1 && dim <= (int64_t{1} << 20), "dim must be in [1, 2^20], got ", dim);
  const int64_t n = ids.size(0);
  at::Tensor out = at::empty({n, dim}, ids.options().dtype(at::kFloat));
  const int64_t* id = ids.data_ptr<int64_t>();
  float* value = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    fill_uniform_row(id[i], static_cast<uint64_t>(name_salt), static_cast<uint64_t>(seed_key), dim, scale,
                     value + i * dim);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("uniform_rows(Tensor ids, int name_salt, int seed_key, int dim, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("uniform_rows", uniform_rows); }

}  // namespace ember
