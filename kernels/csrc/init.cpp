// Initial rows of a table with a uniform initializer (CPU), the native form of
// ps_server/initializers.py: element c of id i is
//   bits = mix64(row_key(i) + (c + 1) * kStream),  row_key(i) = mix64(mix64(i ^ name_salt) ^ seed_key)
//   u = ((bits >> 40) + 0.5) / 2^24,  value = float((2u - 1) * scale)
// in double precision, operation for operation as the numpy reference (built with
// -ffp-contract=off), so both give the same bits. Shards make the rows of every id
// they read or write for the first time, so this runs on the training path.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

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
  check_cpu_ids(ids, "ids");
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

// What initial_rows_at writes into a row (kinds, per table).
enum InitialRow : int64_t { kZeroRow = 1, kUniformRow = 2 };

// The initial rows of ids[k][positions[k][i]] written into the bytes of out, whatever their
// alignment: row i of table k lies at byte offsets[k] + positions[k][i] * row_bytes[k], as
// zero bytes (kinds[k] 1) or the table's hashed-uniform float32 row (2: salts[k],
// seeds[k], scales[k]; row_bytes[k] / 4 values). The rows a joined gather found absent
// (hash_gather_joined), made after the tables' locks are released. Every table is checked
// and the scratch row allocated before any byte is written.
void initial_rows_at(at::TensorList ids, at::TensorList positions, at::IntArrayRef offsets,
                     at::IntArrayRef row_bytes, at::IntArrayRef kinds, at::IntArrayRef salts, at::IntArrayRef seeds,
                     at::ArrayRef<double> scales, at::Tensor out) {
  const size_t tables = ids.size();
  TORCH_CHECK(positions.size() == tables && offsets.size() == tables && row_bytes.size() == tables &&
                  kinds.size() == tables && salts.size() == tables && seeds.size() == tables &&
                  scales.size() == tables,
              "ids, positions, offsets, row_bytes, kinds, salts, seeds and scales must have one entry per table");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous(),
              "out must be a contiguous 1-D uint8 tensor, got ", out.scalar_type(), " of shape ", out.sizes(),
              out.is_contiguous() ? "" : " (non-contiguous)");
  check_device(out, at::kCPU, "out");
  int64_t widest = 0;
  for (size_t k = 0; k < tables; ++k) {
    check_cpu_ids(ids[k], "ids");
    check_cpu_ids(positions[k], "positions");
    TORCH_CHECK(!bytes_overlap(out, ids[k]) && !bytes_overlap(out, positions[k]),
                "out must not share the storage of table ", k, "'s ids or positions");
    TORCH_CHECK(kinds[k] == kZeroRow || kinds[k] == kUniformRow, "table ", k, ": unknown kind ", kinds[k],
                " (1 zeros, 2 uniform)");
    TORCH_CHECK(row_bytes[k] >= 0 && (kinds[k] == kZeroRow || (row_bytes[k] % 4 == 0 && row_bytes[k] / 4 <= (1 << 20))),
                "table ", k, ": rows of ", row_bytes[k], " bytes (uniform rows: float32, at most 2^20 values)");
    const int64_t n = ids[k].size(0);
    TORCH_CHECK(offsets[k] >= 0 && offsets[k] <= out.numel() &&
                    (row_bytes[k] == 0 || n <= (out.numel() - offsets[k]) / row_bytes[k]),
                "table ", k, "'s ", n, " rows of ", row_bytes[k], " bytes do not fit in out after byte ", offsets[k]);
    const int64_t* position = positions[k].data_ptr<int64_t>();
    for (int64_t i = 0; i < positions[k].size(0); ++i) {
      TORCH_CHECK(position[i] >= 0 && position[i] < n, "table ", k, "'s position ", position[i], " is outside its ",
                  n, " ids");
    }
    if (kinds[k] == kUniformRow && positions[k].size(0)) widest = std::max(widest, row_bytes[k] / 4);
  }
  std::vector<float> row(widest);  // made aside: a row of out may not be aligned for floats
  char* to = static_cast<char*>(out.data_ptr());
  for (size_t k = 0; k < tables; ++k) {
    const int64_t* id = ids[k].data_ptr<int64_t>();
    const int64_t* position = positions[k].data_ptr<int64_t>();
    for (int64_t i = 0; i < positions[k].size(0); ++i) {
      if (row_bytes[k] == 0) break;
      char* at = to + offsets[k] + position[i] * row_bytes[k];
      if (kinds[k] == kZeroRow) {
        std::memset(at, 0, row_bytes[k]);
        continue;
      }
      fill_uniform_row(id[position[i]], static_cast<uint64_t>(salts[k]), static_cast<uint64_t>(seeds[k]),
                       row_bytes[k] / 4, scales[k], row.data());
      std::memcpy(at, row.data(), row_bytes[k]);
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("uniform_rows(Tensor ids, int name_salt, int seed_key, int dim, float scale) -> Tensor");
  m.def(
      "initial_rows_at(Tensor[] ids, Tensor[] positions, int[] offsets, int[] row_bytes, int[] kinds, int[] salts, "
      "int[] seeds, float[] scales, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("uniform_rows", uniform_rows);
  m.impl("initial_rows_at", initial_rows_at);
}

}  // namespace ember
