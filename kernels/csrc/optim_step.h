// The CPU optimizer step over a table's rows by slot (optim.cpp), shared by the ops
// that step rows in place: fused_row_update and upsert_row_updates.
#pragma once

#include <cstdint>

#include "checks.h"

namespace ember {

// For each i, with row r = slot[i]: ++version[r], then one step of optimizer ``kind``
// on w[r] and s[r] with gradient grad[i] (rows of ``dim`` weights and ``width`` state
// values). Slots must be in range; FMA where the CPU has it, as torch's kernels.
void step_table_rows(int64_t kind, const OptimizerHyper& h, float* w, float* s, int64_t* version, const float* grad,
                     const int64_t* slot, int64_t n, int64_t dim, int64_t width);

}  // namespace ember
