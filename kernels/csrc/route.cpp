// Shard routing of tables' ids (CPU), the native form of ps_server/routing.py:
// shard = ((mix64(id ^ salt) >> 32) * num_shards) >> 32, a multiply-shift range
// reduction of the hash's high 32 bits (no division; unbiased to num_shards / 2^32).
// One call routes the ids of several tables: segment t, ids[ends[t-1] .. ends[t]),
// is salted with salts[t]. Client and shard both route every id of every step
// message, so this runs once per message on each side.
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "checks.h"

namespace ember {
namespace {

at::Tensor shard_of(const at::Tensor& ids, const at::Tensor& ends, const at::Tensor& salts, int64_t num_shards) {
  check_ids(ids, "ids");
  check_ids(ends, "ends");
  check_ids(salts, "salts");
  check_device(ids, at::kCPU, "ids");
  check_device(ends, at::kCPU, "ends");
  check_device(salts, at::kCPU, "salts");
  TORCH_CHECK(num_shards >= 1 && num_shards <= (int64_t{1} << 31), "num_shards must be in [1, 2^31], got ",
              num_shards);
  TORCH_CHECK(ends.size(0) == salts.size(0), "ends and salts must have one entry per table, got ", ends.size(0),
              " and ", salts.size(0));
  const int64_t* end = ends.data_ptr<int64_t>();
  const int64_t tables = ends.size(0);
  int64_t previous = 0;
  for (int64_t t = 0; t < tables; ++t) {
    TORCH_CHECK(end[t] >= previous, "ends must be non-decreasing from 0, got ends[", t, "] = ", end[t], " after ",
                previous);
    previous = end[t];
  }
  TORCH_CHECK(previous == ids.size(0), "ends must finish at the ", ids.size(0), " ids, got ", previous);
  at::Tensor out = at::empty_like(ids);
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* salt = salts.data_ptr<int64_t>();
  int64_t* shard = out.data_ptr<int64_t>();
  const uint64_t count = static_cast<uint64_t>(num_shards);
  int64_t i = 0;
  for (int64_t t = 0; t < tables; ++t) {
    const uint64_t key = static_cast<uint64_t>(salt[t]);
    for (; i < end[t]; ++i) {
      const uint64_t high = mix64(static_cast<uint64_t>(id[i]) ^ key) >> 32;
      shard[i] = static_cast<int64_t>((high * count) >> 32);
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("shard_of(Tensor ids, Tensor ends, Tensor salts, int num_shards) -> Tensor");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("shard_of", shard_of); }

}  // namespace ember
