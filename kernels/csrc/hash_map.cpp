// Open-addressing hash map from non-negative int64 id to int64 slot.
//
// The map's storage is two int64 tensors owned by the caller (keys, -1 = empty;
// slots), so Python keeps ownership, sizing and growth; these ops only probe.
// Linear probing from splitmix64(id ^ kIndexSalt) & (capacity - 1): the same
// layout rule as the pure-numpy reference in ps_server/id_index.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace ember {
namespace {

constexpr uint64_t kIndexSalt = 0x5851F42D4C957F2DULL;
constexpr int64_t kEmpty = -1;

inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void check_map(const at::Tensor& keys, const at::Tensor& slots) {
  TORCH_CHECK(keys.device().is_cpu() && slots.device().is_cpu(), "hash map tensors must be on the CPU");
  TORCH_CHECK(keys.scalar_type() == at::kLong && slots.scalar_type() == at::kLong,
              "hash map keys and slots must be int64");
  TORCH_CHECK(keys.dim() == 1 && slots.sizes() == keys.sizes(), "keys and slots must be 1-D of equal length");
  TORCH_CHECK(keys.is_contiguous() && slots.is_contiguous(), "keys and slots must be contiguous");
  const int64_t capacity = keys.size(0);
  TORCH_CHECK(capacity > 0 && (capacity & (capacity - 1)) == 0, "capacity must be a power of two, got ", capacity);
}

void check_ids(const at::Tensor& ids, const char* what) {
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              what, " must be a contiguous 1-D int64 CPU tensor");
}

at::Tensor hash_find(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_map(keys, slots);
  check_ids(ids, "ids");
  const int64_t n = ids.size(0);
  const uint64_t mask = static_cast<uint64_t>(keys.size(0) - 1);
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  at::Tensor out = at::empty({n}, ids.options());
  int64_t* result = out.data_ptr<int64_t>();
  // Home buckets are random: prefetch a few ids ahead so cache misses overlap.
  constexpr int64_t kAhead = 16;
  auto home = [&](int64_t i) { return mix64(static_cast<uint64_t>(id[i]) ^ kIndexSalt) & mask; };
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) {
    __builtin_prefetch(key + home(i));
    __builtin_prefetch(slot + home(i));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const uint64_t ahead = home(i + kAhead);
      __builtin_prefetch(key + ahead);
      __builtin_prefetch(slot + ahead);
    }
    const int64_t wanted = id[i];
    uint64_t pos = home(i);
    int64_t found = -1;
    for (uint64_t probes = 0; probes <= mask; ++probes) {
      const int64_t k = key[pos];
      if (k == wanted) {
        found = slot[pos];
        break;
      }
      if (k == kEmpty) break;
      pos = (pos + 1) & mask;
    }
    result[i] = found;
  }
  return out;
}

void hash_insert(at::Tensor keys, at::Tensor slots, const at::Tensor& ids, const at::Tensor& new_slots) {
  check_map(keys, slots);
  check_ids(ids, "ids");
  check_ids(new_slots, "new_slots");
  TORCH_CHECK(ids.size(0) == new_slots.size(0), "ids and new_slots must have equal length");
  const uint64_t mask = static_cast<uint64_t>(keys.size(0) - 1);
  int64_t* key = keys.data_ptr<int64_t>();
  int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* value = new_slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    TORCH_CHECK(id[i] >= 0, "ids must be >= 0, got ", id[i]);
    uint64_t pos = mix64(static_cast<uint64_t>(id[i]) ^ kIndexSalt) & mask;
    uint64_t probes = 0;
    while (key[pos] != kEmpty) {
      TORCH_CHECK(key[pos] != id[i], "id ", id[i], " is already in the map");
      TORCH_CHECK(++probes <= mask, "hash map is full");
      pos = (pos + 1) & mask;
    }
    key[pos] = id[i];
    slot[pos] = value[i];
  }
}

}  // namespace

TORCH_LIBRARY(ember, m) {
  m.def("hash_find(Tensor keys, Tensor slots, Tensor ids) -> Tensor");
  m.def("hash_insert(Tensor(a!) keys, Tensor(b!) slots, Tensor ids, Tensor new_slots) -> ()");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("hash_find", hash_find);
  m.impl("hash_insert", hash_insert);
}

}  // namespace ember
