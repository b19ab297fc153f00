// The hashed-uniform initial row of an id (init.cpp), shared by uniform_rows,
// initial_rows_at (the rows a joined read found absent) and upsert_row_updates, which
// makes the rows of ids a push writes for the first time.
#pragma once

#include <cstdint>

namespace ember {

// out[0..dim) = the initial row of ``id`` (see init.cpp for the rule).
void fill_uniform_row(int64_t id, uint64_t name_salt, uint64_t seed_key, int64_t dim, double scale, float* out);

}  // namespace ember
