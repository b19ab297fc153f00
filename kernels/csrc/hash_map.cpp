// Open-addressing hash map from non-negative int64 id to int64 slot (CPU).
//
// The map's storage is two int64 tensors owned by the caller (keys: -1 empty,
// -2 erased; slots), so Python keeps ownership, sizing and rehashing; these ops
// only probe. Linear probing from mix64(id ^ kIndexSalt) & (capacity - 1), the
// layout rule shared with the CUDA ops and the pure-torch reference
// (kernels/hash_index.py). Erase leaves a tombstone that lookups step over and
// inserts never reuse, so the layout is the same whichever backend wrote it.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "checks.h"
#include "hash_map.h"
#include "prefetch.h"

namespace ember {
namespace {

constexpr int64_t kBucketsAhead = 16;  // home buckets are random: prefetch a few ids ahead

struct Probe {
  const int64_t* key;
  uint64_t mask;
  uint64_t home(int64_t id) const { return home_bucket(id, mask); }
  int64_t locate(int64_t id) const { return locate_bucket(key, mask, id); }
};

void check_cpu_map(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_hash_map(keys, slots);
  check_ids(ids, "ids");
  check_device(keys, at::kCPU, "keys");
  check_device(ids, at::kCPU, "ids");
}

// Visits the bucket of every id (or -1), prefetching the buckets of later ids.
template <typename Visit>
void for_each_bucket(const int64_t* key, const int64_t* slot, uint64_t mask, const int64_t* id, int64_t n,
                     Visit visit) {
  const Probe probe{key, mask};
  for (int64_t i = 0; i < std::min(n, kBucketsAhead); ++i) __builtin_prefetch(probe.key + probe.home(id[i]));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kBucketsAhead < n) {
      const uint64_t ahead = probe.home(id[i + kBucketsAhead]);
      __builtin_prefetch(probe.key + ahead);
      __builtin_prefetch(slot + ahead);
    }
    visit(i, probe.locate(id[i]));
  }
}

template <typename Visit>
void for_each_bucket(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids, Visit visit) {
  for_each_bucket(keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), static_cast<uint64_t>(keys.size(0) - 1),
                  ids.data_ptr<int64_t>(), ids.size(0), visit);
}

}  // namespace

void find_slots(const int64_t* key, const int64_t* slot, uint64_t mask, const int64_t* id, int64_t n, int64_t* out) {
  for_each_bucket(key, slot, mask, id, n, [&](int64_t i, int64_t pos) { out[i] = pos < 0 ? -1 : slot[pos]; });
}

void insert_distinct(int64_t* key, int64_t* slot, uint64_t mask, const int64_t* id, const int64_t* value, int64_t n) {
  const Probe probe{key, mask};
  int64_t i = 0;
  // Each id inserted is the last insert of its probe chain when undone in reverse order,
  // so emptying its bucket restores the exact previous layout.
  auto fail = [&](const std::string& why) {
    for (int64_t j = i - 1; j >= 0; --j) key[probe.locate(id[j])] = kEmpty;
    TORCH_CHECK(false, why);
  };
  for (; i < n; ++i) {
    uint64_t pos = home_bucket(id[i], mask);
    uint64_t probes = 0;
    while (key[pos] != kEmpty) {
      if (key[pos] == id[i]) fail("id " + std::to_string(id[i]) + " is already in the map or twice in ids");
      if (++probes >= mask) {
        fail("hash map is full: no empty bucket for id " + std::to_string(id[i]) + " among " +
             std::to_string(mask + 1) + " (one must stay empty); rehash into a larger map");
      }
      pos = (pos + 1) & mask;
    }
    key[pos] = id[i];
    slot[pos] = value[i];
  }
}

namespace {

at::Tensor hash_find(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids) {
  check_cpu_map(keys, slots, ids);
  at::Tensor out = at::empty({ids.size(0)}, ids.options());
  find_slots(keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), static_cast<uint64_t>(keys.size(0) - 1),
             ids.data_ptr<int64_t>(), ids.size(0), out.data_ptr<int64_t>());
  return out;
}

at::Tensor hash_erase(at::Tensor keys, at::Tensor slots, const at::Tensor& ids) {
  check_cpu_map(keys, slots, ids);
  at::Tensor out = at::empty({ids.size(0)}, ids.options());
  int64_t* result = out.data_ptr<int64_t>();
  int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for_each_bucket(keys, slots, ids, [&](int64_t i, int64_t pos) {
    result[i] = pos < 0 ? -1 : slot[pos];
    if (pos >= 0) key[pos] = kTombstone;
  });
  return out;
}

// Inserts distinct absent ids (see insert_distinct).
void hash_insert(at::Tensor keys, at::Tensor slots, const at::Tensor& ids, const at::Tensor& new_slots) {
  check_cpu_map(keys, slots, ids);
  check_ids(new_slots, "new_slots");
  check_device(new_slots, at::kCPU, "new_slots");
  TORCH_CHECK(ids.size(0) == new_slots.size(0), "ids and new_slots must have equal length, got ", ids.size(0),
              " and ", new_slots.size(0));
  const int64_t n = ids.size(0);
  const int64_t* id = ids.data_ptr<int64_t>();
  check_non_negative_ids(id, n);
  insert_distinct(keys.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), static_cast<uint64_t>(keys.size(0) - 1),
                  id, new_slots.data_ptr<int64_t>(), n);
}

// The src row of every id (-1 where absent) into src_row, each checked to lie inside src's
// rows; returns the ascending positions of the absent ids. Reads the map, writes no row.
at::Tensor locate_rows(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& ids, int64_t rows,
                       int64_t* src_row) {
  const int64_t* slot = slots.data_ptr<int64_t>();
  std::vector<int64_t> missing;
  for_each_bucket(keys, slots, ids, [&](int64_t i, int64_t pos) {
    if (pos < 0) {
      src_row[i] = -1;
      missing.push_back(i);
      return;
    }
    src_row[i] = slot[pos];
    TORCH_CHECK(src_row[i] >= 0 && src_row[i] < rows, "the map holds slot ", src_row[i], " outside src's ", rows,
                " rows");
  });
  at::Tensor result = at::empty({static_cast<int64_t>(missing.size())}, ids.options());
  std::copy(missing.begin(), missing.end(), result.data_ptr<int64_t>());
  return result;
}

// to's row i = from's row src_row[i] (rows of ``bytes``), where src_row[i] >= 0; the rows,
// random in from, are copied with the next ones prefetched.
void copy_located_rows(const int64_t* src_row, int64_t n, const char* from, char* to, int64_t bytes) {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n && src_row[i + kRowsAhead] >= 0) {
      prefetch_row<0>(from + src_row[i + kRowsAhead] * bytes, bytes);
    }
    if (src_row[i] >= 0) std::memcpy(to + i * bytes, from + src_row[i] * bytes, bytes);
  }
}

void check_gather_source(const at::Tensor& src, const at::Tensor& out) {
  check_rows(src, "src");
  check_device(src, at::kCPU, "src");
  check_device(out, at::kCPU, "out");
  TORCH_CHECK(!bytes_overlap(out, src), "out must not share src's storage");
}

// out[i] = src[slot of ids[i]] for every id in the map (the read path of a table: no
// slot tensor crosses into Python); returns the ascending positions of the ids not in
// the map, whose rows of out are left as they were. Two passes: every id's row is found
// and checked, and the result allocated, before any row is copied (an error leaves out
// untouched), then the rows are copied. out must not share src's storage (a row could be
// overwritten before it is read).
at::Tensor hash_gather_rows(const at::Tensor& keys, const at::Tensor& slots, const at::Tensor& src,
                            const at::Tensor& ids, at::Tensor out) {
  check_cpu_map(keys, slots, ids);
  check_rows(out, "out");
  check_gather_source(src, out);
  check_same_rows(src, out, "src", "out");
  TORCH_CHECK(out.size(0) == ids.size(0), "out has ", out.size(0), " rows, ids has ", ids.size(0), " entries");
  const int64_t n = ids.size(0);
  std::unique_ptr<int64_t[]> src_row(new int64_t[n]);
  at::Tensor result = locate_rows(keys, slots, ids, src.size(0), src_row.get());
  copy_located_rows(src_row.get(), n, static_cast<const char*>(src.data_ptr()), static_cast<char*>(out.data_ptr()),
                    src.size(1) * static_cast<int64_t>(src.element_size()));
  return result;
}

// hash_gather_rows of several maps (one table's each) into the bytes of out, whatever
// their alignment: table k's rows, ids[k].size(0) of src[k]'s row bytes, start at byte
// offsets[k], at or after the end of table k-1's. Every table is checked and located
// before any row is copied (an error leaves out untouched). Returns each table's absent
// positions (ascending; their rows are left as they were: initial_rows_at makes them).
std::vector<at::Tensor> hash_gather_joined(at::TensorList keys, at::TensorList slots, at::TensorList src,
                                           at::TensorList ids, at::IntArrayRef offsets, at::Tensor out) {
  const size_t tables = keys.size();
  TORCH_CHECK(slots.size() == tables && src.size() == tables && ids.size() == tables && offsets.size() == tables,
              "keys, slots, src, ids and offsets must have one entry per table, got ", tables, ", ", slots.size(),
              ", ", src.size(), ", ", ids.size(), " and ", offsets.size());
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous(),
              "out must be a contiguous 1-D uint8 tensor, got ", out.scalar_type(), " of shape ", out.sizes(),
              out.is_contiguous() ? "" : " (non-contiguous)");
  int64_t total = 0;
  for (size_t k = 0; k < tables; ++k) {
    check_cpu_map(keys[k], slots[k], ids[k]);
    check_gather_source(src[k], out);
    for (const at::Tensor* map : {&keys[k], &slots[k], &ids[k]}) {
      TORCH_CHECK(!bytes_overlap(out, *map), "out must not share the storage of table ", k, "'s keys, slots or ids");
    }
    TORCH_CHECK(src[k].size(1) <= std::numeric_limits<int64_t>::max() / src[k].element_size(), "table ", k,
                "'s rows of ", src[k].size(1), " values are too wide");
    total += ids[k].size(0);
  }
  std::unique_ptr<int64_t[]> src_row(new int64_t[total]);
  std::vector<at::Tensor> absent;
  int64_t end = 0, first = 0;
  for (size_t k = 0; k < tables; ++k) {
    const int64_t row_bytes = src[k].size(1) * static_cast<int64_t>(src[k].element_size());
    TORCH_CHECK(offsets[k] >= end && offsets[k] <= out.numel(), "table ", k, "'s rows start at byte ", offsets[k],
                ": out has ", out.numel(), " and the rows before end at ", end);
    TORCH_CHECK(row_bytes == 0 || ids[k].size(0) <= (out.numel() - offsets[k]) / row_bytes, "table ", k, "'s ",
                ids[k].size(0), " rows of ", row_bytes, " bytes do not fit in out after byte ", offsets[k]);
    end = offsets[k] + ids[k].size(0) * row_bytes;
    absent.push_back(locate_rows(keys[k], slots[k], ids[k], src[k].size(0), src_row.get() + first));
    first += ids[k].size(0);
  }
  char* to = static_cast<char*>(out.data_ptr());
  first = 0;
  for (size_t k = 0; k < tables; ++k) {
    const int64_t row_bytes = src[k].size(1) * static_cast<int64_t>(src[k].element_size());
    copy_located_rows(src_row.get() + first, ids[k].size(0), static_cast<const char*>(src[k].data_ptr()),
                      to + offsets[k], row_bytes);
    first += ids[k].size(0);
  }
  return absent;
}

}  // namespace

TORCH_LIBRARY(ember, m) {
  m.def("hash_find(Tensor keys, Tensor slots, Tensor ids) -> Tensor");
  m.def("hash_insert(Tensor(a!) keys, Tensor(b!) slots, Tensor ids, Tensor new_slots) -> ()");
  m.def("hash_erase(Tensor(a!) keys, Tensor(b!) slots, Tensor ids) -> Tensor");
  m.def("hash_gather_rows(Tensor keys, Tensor slots, Tensor src, Tensor ids, Tensor(a!) out) -> Tensor");
  m.def(
      "hash_gather_joined(Tensor[] keys, Tensor[] slots, Tensor[] src, Tensor[] ids, int[] offsets, "
      "Tensor(a!) out) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(ember, CPU, m) {
  m.impl("hash_find", hash_find);
  m.impl("hash_insert", hash_insert);
  m.impl("hash_erase", hash_erase);
  m.impl("hash_gather_rows", hash_gather_rows);
  m.impl("hash_gather_joined", hash_gather_joined);
}

}  // namespace ember
