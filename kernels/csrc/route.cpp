// Shard routing of a table's ids (CPU), the native form of ps_server/routing.py:
// shard = ((mix64(id ^ salt) >> 32) * num_shards) >> 32, a multiply-shift range
// reduction of the hash's high 32 bits (no division; unbiased to num_shards / 2^32).
// Client and shard both route every id of every request, so this runs on each one.
#include <torch/library.h>

#include "checks.h"

namespace ember {
namespace {

at::Tensor shard_of(const at::Tensor& ids, int64_t salt, int64_t num_shards) {
  check_ids(ids, "ids");
  check_device(ids, at::kCPU, "ids");
  TORCH_CHECK(num_shards >= 1 && num_shards <= (int64_t{1} << 31), "num_shards must be in [1, 2^31], got ",
              num_shards);
  at::Tensor out = at::empty_like(ids);
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t* shard = out.data_ptr<int64_t>();
  const uint64_t key = static_cast<uint64_t>(salt);
  const uint64_t count = static_cast<uint64_t>(num_shards);
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const uint64_t high = mix64(static_cast<uint64_t>(id[i]) ^ key) >> 32;
    shard[i] = static_cast<int64_t>((high * count) >> 32);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) { m.def("shard_of(Tensor ids, int salt, int num_shards) -> Tensor"); }

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("shard_of", shard_of); }

}  // namespace ember
