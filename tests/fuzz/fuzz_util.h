// Shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.cpp, run by launch/fuzz.sh).
// The readers take file names, so each input is written to a per-process file on tmpfs first.
// The contract a target checks: any input either parses or throws infoflow::Error; a crash, a
// sanitizer report, a hang or any other exception type (std::bad_alloc, a JSON library error,
// std::out_of_range) is a bug and aborts the run.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

namespace infoflow::fuzz {

// A file holding `size` bytes of `data`, rewritten for every input.
inline const std::string& input_file(const uint8_t* data, size_t size, const char* suffix) {
    static const std::string path = [&] {
        const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        return std::string(dir) + "/infoflow_fuzz_" + std::to_string(::getpid()) + suffix;
    }();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) {
        std::perror(path.c_str());
        std::abort();
    }
    if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
    return path;
}

// Runs `fn`; infoflow::Error is the expected way to reject an input, anything else aborts.
template <class F>
void expect_parse_or_error(F&& fn) {
    try {
        fn();
    } catch (const Error&) {
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz: an exception other than infoflow::Error escaped: %s\n",
                     e.what());
        std::abort();
    }
}

// Aborts with `what` when `ok` is false (a property of a parsed input did not hold).
inline void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz: property violated: %s\n", what);
        std::abort();
    }
}

}  // namespace infoflow::fuzz
