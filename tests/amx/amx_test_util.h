// Helpers shared by the AMX tests (tests/amx).
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm_exact.h"

namespace infoflow::cpu {

// Weight rows given in fp32 ([rows, k]), read in place: the GemmRows of the tests.
struct RowsOfFloats : GemmRows {
    RowsOfFloats(const float* w, int k) : w_(w), k_(k) {}
    const float* fetch(int j0, int, int c0, int, float*, int64_t* ld) const override {
        *ld = k_;
        return w_ + int64_t(j0) * k_ + c0;
    }

  private:
    const float* w_;
    int k_;
};

}  // namespace infoflow::cpu
