// Main of tests_amx_hw: the AMX path's shared cases (test_amx_ops.cpp, test_amx_model.cpp) on
// the CPU's own tiles. Exits 77 (CTest SKIP_RETURN_CODE: reported as skipped, label amx) where the
// CPU or the OS does not provide AMX, so a machine without it never reports these as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/cpu_features.h"

int main(int argc, char** argv) {
    unsetenv("INFOFLOW_AMX_EMULATE");  // the CPU's tiles, never the emulator
    if (!infoflow::cpu::cpu_has_amx()) {
        std::printf("no AMX on this CPU (%s): skipping the AMX hardware tests (exit 77)\n",
                    infoflow::cpu::cpu_amx_missing().c_str());
        return 77;
    }
    const int rc = Catch::Session().run(argc, argv);
    return rc == 77 ? 1 : rc;  // 77 failed assertions are a failure, not CTest's "skipped"
}
