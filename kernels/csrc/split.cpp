// split_tables (CPU): which of a step's ids are in a sorted key set, for every table
// of the step in one call.
//
// For each table's ids and its ascending distinct keys (the caller's promise: checking
// it would cost a pass over every key per call): the positions of the ids found among
// the keys (ascending), the positions of the others (ascending) and, for each found id,
// its key's position. One binary search per id: what a trainer does per step to split
// ids into replicated (hot) and fetched (cold) rows.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"

namespace ember {
namespace {

// Searches the ``n`` ids of ``id`` among the keys [key, key_end): appends the found
// ones' positions (plus ``id_base``) to ``found`` and their keys' positions (plus
// ``key_base``) to ``position``, the others' positions to ``missing``.
void split_ids(const int64_t* key, const int64_t* key_end, const int64_t* id, int64_t n, int64_t id_base,
               int64_t key_base, int64_t* found, int64_t* position, int64_t* missing, int64_t& hits,
               int64_t& misses) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* at = std::lower_bound(key, key_end, id[i]);
    if (at != key_end && *at == id[i]) {
      found[hits] = id_base + i;
      position[hits++] = key_base + (at - key);
    } else {
      missing[misses++] = id_base + i;
    }
  }
}

// Table i's ids searched among its keys; positions count the ids of all tables, table
// after table, and key positions start at key_start[i]. Also each table's found count.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> split_tables(const std::vector<at::Tensor>& keys,
                                                                        const std::vector<at::Tensor>& ids,
                                                                        const std::vector<int64_t>& key_start) {
  const int64_t tables = static_cast<int64_t>(ids.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(keys.size()) == tables && static_cast<int64_t>(key_start.size()) == tables,
                    "keys, ids and key_start must have one entry per table, got ", keys.size(), ", ", ids.size(), ", ",
                    key_start.size());
  int64_t n = 0;
  for (int64_t t = 0; t < tables; ++t) {
    check_cpu_ids(keys[t], "keys");
    check_cpu_ids(ids[t], "ids");
    n += ids[t].size(0);
  }
  const auto options = at::TensorOptions().dtype(at::kLong);
  at::Tensor found_at = at::empty({n}, options);
  at::Tensor missing_at = at::empty({n}, options);
  at::Tensor key_at = at::empty({n}, options);
  at::Tensor found_counts = at::empty({tables}, options);
  int64_t hits = 0, misses = 0, id_base = 0;
  for (int64_t t = 0; t < tables; ++t) {
    const int64_t before = hits;
    const int64_t* key = keys[t].data_ptr<int64_t>();
    split_ids(key, key + keys[t].size(0), ids[t].data_ptr<int64_t>(), ids[t].size(0), id_base, key_start[t],
              found_at.data_ptr<int64_t>(), key_at.data_ptr<int64_t>(), missing_at.data_ptr<int64_t>(), hits,
              misses);
    found_counts.data_ptr<int64_t>()[t] = hits - before;
    id_base += ids[t].size(0);
  }
  return {found_at.narrow(0, 0, hits).clone(), missing_at.narrow(0, 0, misses).clone(),
          key_at.narrow(0, 0, hits).clone(), found_counts};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("split_tables(Tensor[] keys, Tensor[] ids, int[] key_start) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("split_tables", split_tables); }

}  // namespace ember
