// unique_inverse (CPU): distinct ids in order of first occurrence, the inverse
// index (ids[i] == unique[inverse[i]]) and each distinct id's count; and
// plan_features, a trainer step's deduplication of every sparse feature in one
// call: each table's distinct ids ascending (as torch.unique(sorted=True) gives
// them), and every id's row among all tables' distinct ids.
//
// One pass over the ids with a scratch open-addressing table of (id, position)
// pairs at load <= 0.5; any int64 is a valid id (emptiness is kept in the
// position, not the key). First-occurrence order is deterministic and, unlike
// sorted order, needs no sort; plan_features sorts only the distinct ids.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"

namespace ember {
namespace {

struct Bucket {
  int64_t id;
  int64_t position;  // index into the distinct ids, -1 when empty
};

// Numbers distinct ids in order of first occurrence, over one or several arrays. Its
// table is the thread's scratch: one numbering at a time per thread.
class FirstOccurrences {
 public:
  // Room for up to ``n`` distinct ids; ``first`` receives them in order.
  FirstOccurrences(int64_t n, int64_t* first) : first_(first) {
    uint64_t capacity = 16;
    while (capacity < 2 * static_cast<uint64_t>(n)) capacity <<= 1;
    mask_ = capacity - 1;
    // Scratch kept per thread: a fresh multi-MiB table per call would pay a page
    // fault per 4 KiB before the first probe.
    thread_local std::vector<Bucket> scratch;
    if (scratch.size() < capacity) scratch.resize(capacity);
    table_ = scratch.data();
    std::fill(table_, table_ + capacity, Bucket{0, -1});
  }

  // Writes each id's number to ``out`` (and counts occurrences where ``counts`` is given).
  void number(const int64_t* id, int64_t n, int64_t* out, int64_t* counts = nullptr) {
    constexpr int64_t kAhead = 16;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&table_[home_bucket(id[i + kAhead], mask_)]);
      uint64_t pos = home_bucket(id[i], mask_);
      while (table_[pos].position >= 0 && table_[pos].id != id[i]) pos = (pos + 1) & mask_;
      Bucket& bucket = table_[pos];
      if (bucket.position < 0) {
        bucket = Bucket{id[i], distinct_};
        first_[distinct_] = id[i];
        if (counts != nullptr) counts[distinct_] = 0;
        ++distinct_;
      }
      out[i] = bucket.position;
      if (counts != nullptr) ++counts[bucket.position];
    }
  }

  int64_t distinct() const { return distinct_; }

 private:
  int64_t* first_;
  Bucket* table_;
  uint64_t mask_;
  int64_t distinct_ = 0;
};

// The ``distinct`` ids of ``first`` ascending into ``sorted``; returns each
// first-occurrence number's rank among them.
std::vector<int64_t> sort_distinct(const int64_t* first, int64_t distinct, int64_t* sorted) {
  std::vector<std::pair<int64_t, int64_t>> order(distinct);  // (id, first-occurrence number)
  for (int64_t k = 0; k < distinct; ++k) order[k] = {first[k], k};
  std::sort(order.begin(), order.end());
  std::vector<int64_t> rank(distinct);
  for (int64_t k = 0; k < distinct; ++k) {
    sorted[k] = order[k].first;
    rank[order[k].second] = k;
  }
  return rank;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_inverse(const at::Tensor& ids) {
  check_ids(ids, "ids");
  check_device(ids, at::kCPU, "ids");
  const int64_t n = ids.size(0);
  at::Tensor unique = at::empty({n}, ids.options());
  at::Tensor inverse = at::empty({n}, ids.options());
  at::Tensor counts = at::empty({n}, ids.options());
  FirstOccurrences numbering(n, unique.data_ptr<int64_t>());
  numbering.number(ids.data_ptr<int64_t>(), n, inverse.data_ptr<int64_t>(), counts.data_ptr<int64_t>());
  const int64_t distinct = numbering.distinct();
  return {unique.narrow(0, 0, distinct).clone(), inverse, counts.narrow(0, 0, distinct).clone()};
}

// Raises ValueError naming feature ``f`` unless its ids are >= 0 and its offsets rise
// from 0 to the number of its ids; returns whether every bag holds exactly one id.
bool check_feature(int64_t f, const at::Tensor& values, const at::Tensor& offsets) {
  const int64_t n = values.size(0), bags = offsets.size(0) - 1;
  const int64_t* id = values.data_ptr<int64_t>();
  const int64_t* offset = offsets.data_ptr<int64_t>();
  int64_t smallest_id = 0;
  for (int64_t i = 0; i < n; ++i) smallest_id = std::min(smallest_id, id[i]);
  TORCH_CHECK_VALUE(smallest_id >= 0, "feature ", f, ": ids must be >= 0, got ", smallest_id);
  bool rising = offset[0] == 0 && offset[bags] == n;
  bool one_id_bags = n == bags;
  for (int64_t b = 0; b < bags; ++b) {  // compared, not subtracted: no overflow
    rising = rising && offset[b + 1] >= offset[b];
    one_id_bags = one_id_bags && offset[b + 1] == offset[b] + 1;
  }
  TORCH_CHECK_VALUE(rising, "feature ", f, ": offsets must rise from 0 to len(ids) = ", n);
  return one_id_bags;
}

std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> plan_features(const std::vector<at::Tensor>& values,
                                                                          const std::vector<at::Tensor>& offsets,
                                                                          const std::vector<int64_t>& table_of,
                                                                          int64_t num_tables) {
  const int64_t features = static_cast<int64_t>(values.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(offsets.size()) == features &&
                        static_cast<int64_t>(table_of.size()) == features,
                    "values, offsets and table_of must have one entry per feature, got ", values.size(), ", ",
                    offsets.size(), ", ", table_of.size());
  TORCH_CHECK_VALUE(num_tables >= 0, "num_tables must be >= 0, got ", num_tables);
  std::vector<int64_t> start(features + 1, 0);  // each feature's first id among all ids
  std::vector<std::vector<int64_t>> members(num_tables);
  at::Tensor one_id_bags = at::empty({features}, at::kBool);
  for (int64_t f = 0; f < features; ++f) {
    TORCH_CHECK_VALUE(0 <= table_of[f] && table_of[f] < num_tables, "feature ", f, ": table ", table_of[f],
                      " is out of range [0, ", num_tables, ")");
    check_device(values[f], at::kCPU, "ids");
    check_device(offsets[f], at::kCPU, "offsets");
    check_ids(values[f], "ids");
    check_ids(offsets[f], "offsets");
    TORCH_CHECK_VALUE(offsets[f].size(0) >= 1, "feature ", f, ": ids and offsets must be 1-D with at least one offset");
    one_id_bags.data_ptr<bool>()[f] = check_feature(f, values[f], offsets[f]);
    members[table_of[f]].push_back(f);
    start[f + 1] = start[f] + values[f].size(0);
  }
  at::Tensor inverse = at::empty({start[features]}, at::kLong);
  int64_t* out = inverse.data_ptr<int64_t>();
  std::vector<at::Tensor> unique;
  unique.reserve(num_tables);
  int64_t row = 0;  // the first row of the table's distinct ids among all tables'
  std::vector<int64_t> first;
  for (int64_t t = 0; t < num_tables; ++t) {
    int64_t n = 0;
    for (int64_t f : members[t]) n += values[f].size(0);
    first.resize(n);
    FirstOccurrences numbering(n, first.data());
    for (int64_t f : members[t]) numbering.number(values[f].data_ptr<int64_t>(), values[f].size(0), out + start[f]);
    const int64_t distinct = numbering.distinct();
    at::Tensor sorted = at::empty({distinct}, at::kLong);
    const std::vector<int64_t> rank = sort_distinct(first.data(), distinct, sorted.data_ptr<int64_t>());
    for (int64_t f : members[t]) {
      for (int64_t i = start[f]; i < start[f + 1]; ++i) out[i] = row + rank[out[i]];
    }
    unique.push_back(sorted);
    row += distinct;
  }
  return {unique, inverse, one_id_bags};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("unique_inverse(Tensor ids) -> (Tensor, Tensor, Tensor)");
  m.def("plan_features(Tensor[] values, Tensor[] offsets, int[] table_of, int num_tables) -> (Tensor[], Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("unique_inverse", unique_inverse);
  m.impl("plan_features", plan_features);
}

}  // namespace ember
