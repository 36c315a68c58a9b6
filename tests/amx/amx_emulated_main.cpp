// Main of tests_amx: the AMX path's tests on the tile emulator (kernels/cpu/amx_tiles.h), which
// runs on any CPU with AVX-512. INFOFLOW_AMX_EMULATE=1 is the test hook that selects it; it is
// set here, before anything reads it, so the executable runs the same way under CTest and by
// hand. tests_amx_hw (amx_hw_main.cpp) runs the shared cases on the CPU's tiles instead. Without
// AVX-512 (which the amx path runs besides the tiles) it exits 77: skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/cpu_features.h"

int main(int argc, char** argv) {
    setenv("INFOFLOW_AMX_EMULATE", "1", 1);
    bool listing = false;
    for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
    if (!listing && !infoflow::cpu::cpu_has_avx512()) {
        std::printf("skipped: the amx path needs AVX-512, which this CPU lacks\n");
        return 77;
    }
    const int rc = Catch::Session().run(argc, argv);
    return rc == 77 ? 1 : rc;  // 77 failed assertions are a failure, not CTest's "skipped"
}
