// Upsert and step a table's rows in one op (CPU): the write of a shard's push.
//
// For distinct ids (>= 0): each id the map lacks gets a slot, the tail of free_slots
// first, in order (as InMemoryStore hands out reused slots), then next_slot,
// next_slot + 1, ...; it enters the map, and its row is made as the table's
// initializer makes it (hashed-uniform by init.cpp's rule, or zeros) with zero state
// and version 0. Then every row takes one optimizer step (optim.cpp's; a held id
// given twice is stepped twice, as there). Returns (ids absent, how many take a free
// slot, applied). Where more ids are absent than map_room (inserts the map takes before
// it must grow), or the arrays lack rows for the new slots past next_slot, nothing is
// written and applied is false: the caller makes room for that many and calls again. All-or-nothing:
// the arguments, the ids and the range of every slot are checked before anything is
// written, and a failed insert (an id twice, a full map) is undone before its error.
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "checks.h"
#include "hash_map.h"
#include "init_rows.h"
#include "optim_step.h"

namespace ember {
namespace {

std::tuple<int64_t, int64_t, bool> upsert_row_update(at::Tensor keys, at::Tensor map_slots, at::Tensor weights,
                                                     at::Tensor state, at::Tensor versions, const at::Tensor& ids,
                                                     const at::Tensor& grads, const at::Tensor& free_slots,
                                                     int64_t next_slot, int64_t map_room, bool uniform,
                                                     int64_t name_salt, int64_t seed_key, double scale, int64_t kind,
                                                     double lr, double eps, double beta1, double beta2,
                                                     double weight_decay) {
  check_hash_map(keys, map_slots);
  check_device(keys, at::kCPU, "keys");
  const int64_t width = check_fused_update(weights, state, versions, ids, grads, kind, at::kCPU);
  check_ids(free_slots, "free_slots");
  check_device(free_slots, at::kCPU, "free_slots");
  const int64_t n = ids.size(0);
  const int64_t dim = weights.size(1);
  const int64_t rows = weights.size(0);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0, "ids must be >= 0, got ", id[i], " at [", i, "]");

  int64_t* key = keys.data_ptr<int64_t>();
  int64_t* bucket_slot = map_slots.data_ptr<int64_t>();
  const uint64_t mask = static_cast<uint64_t>(keys.size(0) - 1);
  std::vector<int64_t> slot(n);
  find_slots(key, bucket_slot, mask, id, n, slot.data());
  const int64_t missing = std::count(slot.begin(), slot.end(), int64_t{-1});
  const int64_t free_count = free_slots.size(0);
  const int64_t reused = std::min(missing, free_count);
  TORCH_CHECK(next_slot >= 0 && next_slot <= rows, "next_slot ", next_slot, " is outside [0, ", rows, "]");
  if (missing > map_room || next_slot + (missing - reused) > rows) return {missing, reused, false};
  const int64_t* free = free_slots.data_ptr<int64_t>() + (free_count - reused);
  std::vector<int64_t> new_ids, new_slots;
  new_ids.reserve(missing);
  new_slots.reserve(missing);
  for (int64_t i = 0; i < n; ++i) {
    if (slot[i] < 0) {
      const int64_t k = static_cast<int64_t>(new_slots.size());
      slot[i] = k < reused ? free[k] : next_slot + (k - reused);
      new_ids.push_back(id[i]);
      new_slots.push_back(slot[i]);
    }
    TORCH_CHECK(slot[i] >= 0 && slot[i] < rows, "slot ", slot[i], " of id ", id[i], " is outside the ", rows,
                " rows");
  }

  insert_distinct(key, bucket_slot, mask, new_ids.data(), new_slots.data(), missing);  // undone if it throws
  float* w = weights.data_ptr<float>();
  float* s = state.data_ptr<float>();
  int64_t* version = versions.data_ptr<int64_t>();
  for (int64_t k = 0; k < missing; ++k) {
    const int64_t r = new_slots[k];
    if (uniform) {
      fill_uniform_row(new_ids[k], static_cast<uint64_t>(name_salt), static_cast<uint64_t>(seed_key), dim, scale,
                       w + r * dim);
    } else {
      std::fill_n(w + r * dim, dim, 0.0f);
    }
    std::fill_n(s + r * width, width, 0.0f);
    version[r] = 0;
  }
  step_table_rows(kind, make_hyper(lr, eps, beta1, beta2, weight_decay), w, s, version, grads.data_ptr<float>(),
                  slot.data(), n, dim, width);
  return {missing, reused, true};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def(
      "upsert_row_update(Tensor(a!) keys, Tensor(b!) map_slots, Tensor(c!) weights, Tensor(d!) state, "
      "Tensor(e!) versions, Tensor ids, Tensor grads, Tensor free_slots, int next_slot, int map_room, "
      "bool uniform, int name_salt, int seed_key, float scale, int kind, float lr, float eps, float beta1, "
      "float beta2, float weight_decay) -> (int, int, bool)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("upsert_row_update", upsert_row_update); }

}  // namespace ember
