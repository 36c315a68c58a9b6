// The one translation unit that compiles Catch2's implementation (tests/catch_session.h), and the
// CPU-path variants of the test executables: `--isa=NAME` (avx2, avx512 or amx) runs the tests on
// that kernel path (INFOFLOW_CPU_ISA; amx on the tile emulator where the CPU has no AMX), exits 77
// (skipped) where the path cannot run here, and fails a run that ended on another path (as does
// a run under INFOFLOW_EXPECT_ISA, which tests/cpu_paths/run_on_path.sh sets).
#define CATCH_CONFIG_RUNNER
#include "tests/catch_session.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace infoflow::testing {
namespace {

// Takes `--isa=NAME` out of argv; "" when absent.
std::string take_isa_arg(int& argc, char** argv) {
    std::string isa;
    int out = 1;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--isa=", 6) == 0) {
            isa = argv[i] + 6;
        } else {
            argv[out++] = argv[i];
        }
    }
    argc = out;
    argv[argc] = nullptr;
    return isa;
}

bool listing(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::strncmp(argv[i], "--list", 6) == 0) return true;
    return false;
}

}  // namespace

int run_catch_session(int argc, char** argv) {
    const std::string isa = take_isa_arg(argc, argv);
    if (!isa.empty()) {
        // Before any kernel reads them (the path is fixed at the first read).
        setenv("INFOFLOW_CPU_ISA", isa.c_str(), 1);
        setenv("INFOFLOW_EXPECT_ISA", isa.c_str(), 1);
        if (isa == "amx" && !cpu::cpu_has_amx()) setenv("INFOFLOW_AMX_EMULATE", "1", 1);
        bool runnable = false;
        for (const cpu::CpuIsa p : cpu::cpu_paths_runnable())
            runnable |= isa == cpu::cpu_isa_name(p);
        if (!runnable && !listing(argc, argv)) {
            std::printf("skipped: the %s path cannot run on this CPU (%s)\n", isa.c_str(),
                        cpu::cpu_has_avx512() ? cpu::cpu_amx_missing().c_str() : "no AVX-512");
            return 77;
        }
    }
    Catch::Session session;
    int rc = session.applyCommandLine(argc, argv);
    if (rc == 0) rc = session.run();
    if (rc == 77) rc = 1;  // 77 failed assertions are a failure, not CTest's "skipped"
    // The path asked for: --isa, or INFOFLOW_EXPECT_ISA from tests/cpu_paths/run_on_path.sh.
    const char* expect = std::getenv("INFOFLOW_EXPECT_ISA");
    if (expect && *expect && !listing(argc, argv)) {
        const char* used = cpu::cpu_isa_name(cpu::active_cpu_isa());
        if (std::strcmp(expect, used) != 0) {
            std::printf("error: the tests were to run on the %s path, but ended on the %s path\n",
                        expect, used);
            rc = rc ? rc : 1;
        }
    }
    return rc;
}

}  // namespace infoflow::testing
