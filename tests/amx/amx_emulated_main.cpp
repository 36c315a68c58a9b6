// Main of tests_amx: the AMX path's tests on the tile emulator (kernels/cpu/amx_tiles.h), which
// runs on any CPU with AVX-512. INFOFLOW_AMX_EMULATE=1 is the test hook that selects it; it is
// set here, before anything reads it, so the executable runs the same way under CTest and by
// hand. tests_amx_hw (amx_hw_main.cpp) runs the shared cases on the CPU's tiles instead.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

int main(int argc, char** argv) {
    setenv("INFOFLOW_AMX_EMULATE", "1", 1);
    return Catch::Session().run(argc, argv);
}
