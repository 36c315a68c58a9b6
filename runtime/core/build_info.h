// What this binary was built from and with: version, git commit (taken at build time; "-dirty"
// when tracked files differed from it; "unknown" outside a git checkout), the features compiled
// in, toolkits found but not used by this build, build type, compiler and CPU flags. Defined in
// a source file CMake generates (cmake/build_info.cpp.in); `infoflow_sp --version` prints it and
// every result JSON carries it.
#pragma once

namespace infoflow {

struct BuildInfo {
    const char* version;       // "0.1.0"
    const char* commit;        // "72fd0ba1c2d3", "72fd0ba1c2d3-dirty" or "unknown"
    const char* features;      // space-separated, e.g. "cpu openmp mpi"
    const char* found_unused;  // toolkits found at configure time but not used yet, e.g. "cuda"
    const char* build_type;    // "Release"
    const char* compiler;      // "GNU 12.2.0"
    const char* cpu_flags;     // "-mavx2 -mfma -mf16c"
};

const BuildInfo& build_info();

}  // namespace infoflow
