// Helpers shared by the test programs.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace infoflow::test {

// A fresh temp directory (tmpfs when present: the fuzz loops write thousands of small files),
// removed when the test binary exits.
struct TempDir {
    std::string path;
    explicit TempDir(const std::string& tag) {
        for (std::string base : {"/dev/shm", "/tmp"}) {
            std::string tmpl = base + "/infoflow_test_" + tag + "_XXXXXX";
            if (mkdtemp(&tmpl[0])) {
                path = tmpl;
                return;
            }
        }
    }
    ~TempDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};

// One TempDir per test program (per tag), created on first use.
inline const std::string& shared_temp_dir(const std::string& tag) {
    static TempDir dir(tag);
    REQUIRE_FALSE(dir.path.empty());
    return dir.path;
}

}  // namespace infoflow::test
