// split_by_sorted_keys (CPU): which of a step's ids are in a sorted key set.
//
// For ids and ascending distinct keys (the caller's promise: checking it would cost a pass
// over every key per call): the positions of the ids found among the keys
// (ascending), the positions of the others (ascending) and, for each found id, its
// key's position. One binary search per id, in one pass: what a trainer does per table
// per step to split ids into replicated (hot) and fetched (cold) rows.
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "checks.h"

namespace ember {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> split_by_sorted_keys(const at::Tensor& keys, const at::Tensor& ids) {
  check_ids(keys, "keys");
  check_ids(ids, "ids");
  check_device(keys, at::kCPU, "keys");
  check_device(ids, at::kCPU, "ids");
  const int64_t n = ids.size(0);
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* key_end = key + keys.size(0);
  at::Tensor found_at = at::empty({n}, ids.options());
  at::Tensor missing_at = at::empty({n}, ids.options());
  at::Tensor key_at = at::empty({n}, ids.options());
  int64_t* found = found_at.data_ptr<int64_t>();
  int64_t* missing = missing_at.data_ptr<int64_t>();
  int64_t* position = key_at.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t hits = 0, misses = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* at = std::lower_bound(key, key_end, id[i]);
    if (at != key_end && *at == id[i]) {
      found[hits] = i;
      position[hits++] = at - key;
    } else {
      missing[misses++] = i;
    }
  }
  return {found_at.narrow(0, 0, hits).clone(), missing_at.narrow(0, 0, misses).clone(),
          key_at.narrow(0, 0, hits).clone()};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("split_by_sorted_keys(Tensor keys, Tensor ids) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("split_by_sorted_keys", split_by_sorted_keys); }

}  // namespace ember
