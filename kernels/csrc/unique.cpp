// unique_inverse (CPU): distinct ids in order of first occurrence, the inverse
// index (ids[i] == unique[inverse[i]]) and each distinct id's count; and
// sorted_unique_inverse: the distinct ids ascending with their inverse index (what
// torch.unique(sorted=True, return_inverse=True) gives), for a trainer's per-step
// deduplication.
//
// One pass over the ids with a scratch open-addressing table of (id, position)
// pairs at load <= 0.5; any int64 is a valid id (emptiness is kept in the
// position, not the key). First-occurrence order is deterministic and, unlike
// sorted order, needs no sort; the sorted form sorts only the distinct ids.
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
  int64_t position;  // index into the unique ids, -1 when empty
};

// Fills unique[0..distinct), inverse[0..n) and, where given, counts; returns distinct.
int64_t first_occurrences(const int64_t* id, int64_t n, int64_t* out_unique, int64_t* out_inverse,
                          int64_t* out_counts) {
  uint64_t capacity = 16;
  while (capacity < 2 * static_cast<uint64_t>(n)) capacity <<= 1;
  const uint64_t mask = capacity - 1;
  // Scratch kept per thread: a fresh multi-MiB table per call would pay a page
  // fault per 4 KiB before the first probe.
  thread_local std::vector<Bucket> scratch;
  if (scratch.size() < capacity) scratch.resize(capacity);
  Bucket* table = scratch.data();
  std::fill(table, table + capacity, Bucket{0, -1});
  auto home = [&](int64_t i) { return home_bucket(id[i], mask); };
  constexpr int64_t kAhead = 16;
  int64_t distinct = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&table[home(i + kAhead)]);
    uint64_t pos = home(i);
    while (table[pos].position >= 0 && table[pos].id != id[i]) pos = (pos + 1) & mask;
    Bucket& bucket = table[pos];
    if (bucket.position < 0) {
      bucket = Bucket{id[i], distinct};
      out_unique[distinct] = id[i];
      if (out_counts != nullptr) out_counts[distinct] = 0;
      ++distinct;
    }
    out_inverse[i] = bucket.position;
    if (out_counts != nullptr) ++out_counts[bucket.position];
  }
  return distinct;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_inverse(const at::Tensor& ids) {
  check_ids(ids, "ids");
  check_device(ids, at::kCPU, "ids");
  const int64_t n = ids.size(0);
  at::Tensor unique = at::empty({n}, ids.options());
  at::Tensor inverse = at::empty({n}, ids.options());
  at::Tensor counts = at::empty({n}, ids.options());
  const int64_t distinct = first_occurrences(ids.data_ptr<int64_t>(), n, unique.data_ptr<int64_t>(),
                                             inverse.data_ptr<int64_t>(), counts.data_ptr<int64_t>());
  return {unique.narrow(0, 0, distinct).clone(), inverse, counts.narrow(0, 0, distinct).clone()};
}

std::tuple<at::Tensor, at::Tensor> sorted_unique_inverse(const at::Tensor& ids) {
  check_ids(ids, "ids");
  check_device(ids, at::kCPU, "ids");
  const int64_t n = ids.size(0);
  std::vector<int64_t> first(n);
  at::Tensor inverse = at::empty({n}, ids.options());
  int64_t* out_inverse = inverse.data_ptr<int64_t>();
  const int64_t distinct = first_occurrences(ids.data_ptr<int64_t>(), n, first.data(), out_inverse, nullptr);
  std::vector<std::pair<int64_t, int64_t>> order(distinct);  // (id, first-occurrence number)
  for (int64_t k = 0; k < distinct; ++k) order[k] = {first[k], k};
  std::sort(order.begin(), order.end());
  at::Tensor unique = at::empty({distinct}, ids.options());
  int64_t* out_unique = unique.data_ptr<int64_t>();
  std::vector<int64_t> rank(distinct);
  for (int64_t k = 0; k < distinct; ++k) {
    out_unique[k] = order[k].first;
    rank[order[k].second] = k;
  }
  for (int64_t i = 0; i < n; ++i) out_inverse[i] = rank[out_inverse[i]];
  return {unique, inverse};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ember, m) {
  m.def("unique_inverse(Tensor ids) -> (Tensor, Tensor, Tensor)");
  m.def("sorted_unique_inverse(Tensor ids) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("unique_inverse", unique_inverse);
  m.impl("sorted_unique_inverse", sorted_unique_inverse);
}

}  // namespace ember
