// Upsert and step the rows of several tables in one op (CPU): the write of a shard's
// step update (every table of a clock), or of one push (a list of one).
//
// Per table, for distinct ids (>= 0): each id the map lacks gets a slot, the tail of
// free_slots first, in order (as InMemoryStore hands out reused slots), then next_slot,
// next_slot + 1, ...; it enters the map, and its row is made as the table's initializer
// makes it (hashed-uniform by init.cpp's rule, or zeros) with zero state and version 0.
// Then every row takes one optimizer step (optim.cpp's; a held id given twice is stepped
// twice, as there). Returns, per table, (ids absent, how many take a free slot), and
// whether it applied. Where any table has more absent ids than its map_room (inserts
// its map takes before it must grow), or its arrays lack rows for the new slots past
// next_slot, nothing is written to any table and applied is false: the caller makes
// room for that many and calls again.
//
// All-or-nothing over every table: the arguments (no two tables sharing storage, map_room
// below the map's buckets), the ids, the range of every slot and the distinctness of each
// table's absent ids are checked for all tables before any is written, so the writes that
// follow cannot fail.
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

// Per-table integers and floats, flattened table by table (see the schema below).
constexpr int64_t kIntsPerTable = 6;    // next_slot, map_room, uniform, name_salt, seed_key, kind
constexpr int64_t kFloatsPerTable = 6;  // scale, lr, eps, beta1, beta2, weight_decay

// One table's write, planned (and checked) before any table is written.
struct TablePlan {
  std::vector<int64_t> slot;       // every id's slot (new ones included once fits)
  std::vector<int64_t> new_ids;    // the absent ids, in order
  std::vector<int64_t> new_slots;  // their slots
  int64_t missing = 0;
  int64_t reused = 0;
  bool fits = false;
};

TablePlan plan_table(const at::Tensor& keys, const at::Tensor& map_slots, const at::Tensor& weights,
                     const at::Tensor& state, const at::Tensor& versions, const at::Tensor& ids,
                     const at::Tensor& grads, const at::Tensor& free_slots, int64_t next_slot, int64_t map_room,
                     int64_t kind) {
  check_hash_map(keys, map_slots);
  check_device(keys, at::kCPU, "keys");
  check_fused_update(weights, state, versions, ids, grads, kind, at::kCPU);
  check_ids(free_slots, "free_slots");
  check_device(free_slots, at::kCPU, "free_slots");
  const int64_t n = ids.size(0);
  const int64_t rows = weights.size(0);
  const int64_t* id = ids.data_ptr<int64_t>();
  check_non_negative_ids(id, n);
  TORCH_CHECK(next_slot >= 0 && next_slot <= rows, "next_slot ", next_slot, " is outside [0, ", rows, "]");
  TORCH_CHECK(map_room >= 0 && map_room < keys.size(0), "map_room ", map_room, " is outside [0, ", keys.size(0),
              ") (the map must keep an empty bucket)");

  TablePlan plan;
  plan.slot.resize(n);
  const uint64_t mask = static_cast<uint64_t>(keys.size(0) - 1);
  find_slots(keys.data_ptr<int64_t>(), map_slots.data_ptr<int64_t>(), mask, id, n, plan.slot.data());
  plan.missing = std::count(plan.slot.begin(), plan.slot.end(), int64_t{-1});
  const int64_t free_count = free_slots.size(0);
  plan.reused = std::min(plan.missing, free_count);
  plan.fits = plan.missing <= map_room && next_slot + (plan.missing - plan.reused) <= rows;
  if (!plan.fits) return plan;
  const int64_t* free = free_slots.data_ptr<int64_t>() + (free_count - plan.reused);
  plan.new_ids.reserve(plan.missing);
  plan.new_slots.reserve(plan.missing);
  for (int64_t i = 0; i < n; ++i) {
    int64_t& s = plan.slot[i];
    if (s < 0) {
      const int64_t k = static_cast<int64_t>(plan.new_slots.size());
      s = k < plan.reused ? free[k] : next_slot + (k - plan.reused);
      plan.new_ids.push_back(id[i]);
      plan.new_slots.push_back(s);
    }
    TORCH_CHECK(s >= 0 && s < rows, "slot ", s, " of id ", id[i], " is outside the ", rows, " rows");
  }
  std::vector<int64_t> sorted(plan.new_ids);
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  TORCH_CHECK(twice == sorted.end(), "id ", twice == sorted.end() ? 0 : *twice,
              " is absent and given twice in ids (they must be distinct)");
  return plan;
}

std::tuple<std::vector<int64_t>, std::vector<int64_t>, bool> upsert_row_updates(
    at::TensorList keys, at::TensorList map_slots, at::TensorList weights, at::TensorList state,
    at::TensorList versions, at::TensorList ids, at::TensorList grads, at::TensorList free_slots,
    at::IntArrayRef table_ints, at::ArrayRef<double> table_floats) {
  const int64_t tables = static_cast<int64_t>(keys.size());
  const at::TensorList lists[] = {map_slots, weights, state, versions, ids, grads, free_slots};
  for (const at::TensorList& list : lists) {
    TORCH_CHECK(static_cast<int64_t>(list.size()) == tables, "every tensor list must have one entry per table (",
                tables, "), got ", list.size());
  }
  TORCH_CHECK(static_cast<int64_t>(table_ints.size()) == kIntsPerTable * tables &&
                  static_cast<int64_t>(table_floats.size()) == kFloatsPerTable * tables,
              "table_ints and table_floats must hold ", kIntsPerTable, " and ", kFloatsPerTable,
              " values per table, got ", table_ints.size(), " and ", table_floats.size(), " for ", tables,
              " tables");
  // Tables must not share storage: a second table's writes would land on the first's.
  std::vector<const void*> storage;
  for (int64_t t = 0; t < tables; ++t) {
    for (const at::Tensor* x : {&keys[t], &map_slots[t], &weights[t], &state[t], &versions[t]}) {
      if (x->numel()) storage.push_back(x->data_ptr());
    }
  }
  std::sort(storage.begin(), storage.end());
  TORCH_CHECK(std::adjacent_find(storage.begin(), storage.end()) == storage.end(),
              "two tables (or two arrays of one table) share storage");
  std::vector<TablePlan> plans;
  plans.reserve(tables);
  bool fits = true;
  for (int64_t t = 0; t < tables; ++t) {
    const int64_t* in = table_ints.data() + kIntsPerTable * t;
    plans.push_back(plan_table(keys[t], map_slots[t], weights[t], state[t], versions[t], ids[t], grads[t],
                               free_slots[t], in[0], in[1], in[5]));
    fits = fits && plans.back().fits;
  }
  std::vector<int64_t> missing(tables), reused(tables);
  for (int64_t t = 0; t < tables; ++t) {
    missing[t] = plans[t].missing;
    reused[t] = plans[t].reused;
  }
  if (!fits) return {missing, reused, false};

  for (int64_t t = 0; t < tables; ++t) {
    const TablePlan& plan = plans[t];
    const int64_t* in = table_ints.data() + kIntsPerTable * t;
    const double* fl = table_floats.data() + kFloatsPerTable * t;
    const bool uniform = in[2] != 0;
    const int64_t dim = weights[t].size(1);
    const int64_t width = state[t].size(1);
    insert_distinct(keys[t].data_ptr<int64_t>(), map_slots[t].data_ptr<int64_t>(),
                    static_cast<uint64_t>(keys[t].size(0) - 1), plan.new_ids.data(), plan.new_slots.data(),
                    plan.missing);  // room and distinctness are checked: it cannot fail
    float* w = weights[t].data_ptr<float>();
    float* s = state[t].data_ptr<float>();
    int64_t* version = versions[t].data_ptr<int64_t>();
    for (int64_t k = 0; k < plan.missing; ++k) {
      const int64_t r = plan.new_slots[k];
      if (uniform) {
        fill_uniform_row(plan.new_ids[k], static_cast<uint64_t>(in[3]), static_cast<uint64_t>(in[4]), dim, fl[0],
                         w + r * dim);
      } else {
        std::fill_n(w + r * dim, dim, 0.0f);
      }
      std::fill_n(s + r * width, width, 0.0f);
      version[r] = 0;
    }
    step_table_rows(in[5], make_hyper(fl[1], fl[2], fl[3], fl[4], fl[5]), w, s, version,
                    grads[t].data_ptr<float>(), plan.slot.data(), static_cast<int64_t>(plan.slot.size()), dim,
                    width);
  }
  return {missing, reused, true};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def(
      "upsert_row_updates(Tensor(a!)[] keys, Tensor(b!)[] map_slots, Tensor(c!)[] weights, Tensor(d!)[] state, "
      "Tensor(e!)[] versions, Tensor[] ids, Tensor[] grads, Tensor[] free_slots, int[] table_ints, "
      "float[] table_floats) -> (int[], int[], bool)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) { m.impl("upsert_row_updates", upsert_row_updates); }

}  // namespace ember
