// The CPU hash map's probing (hash_map.cpp), shared by the ops that find and insert
// ids: the hash_* ops and upsert_row_updates.
#pragma once

#include <cstdint>

namespace ember {

// out[i] = the slot of id[i], or -1 where the map (keys, slots, mask + 1 buckets) lacks it.
void find_slots(const int64_t* key, const int64_t* slot, uint64_t mask, const int64_t* id, int64_t n, int64_t* out);

// Inserts n distinct absent ids (>= 0), id[i] -> value[i]. All-or-nothing: on a
// duplicate or a full map the ids inserted so far are removed again, leaving the exact
// previous layout, and the error is raised.
void insert_distinct(int64_t* key, int64_t* slot, uint64_t mask, const int64_t* id, const int64_t* value, int64_t n);

}  // namespace ember
