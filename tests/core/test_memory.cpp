// The weight arena (runtime/core/memory.h): 2 MiB-aligned, 64-byte-aligned pieces that do not
// overlap and keep what is written, a clear error past the capacity, and (where the kernel has
// transparent huge pages on "madvise" or "always") pages that really are huge once touched.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "runtime/core/memory.h"

using namespace infoflow;

namespace {

// AnonHugePages of this process, kB; -1 where /proc does not say.
long anon_huge_kb() {
    std::ifstream f("/proc/self/smaps_rollup");
    std::string key;
    long kb = -1;
    while (f >> key) {
        if (key == "AnonHugePages:") {
            f >> kb;
            return kb;
        }
        std::getline(f, key);
    }
    return -1;
}

std::string thp_mode() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    return s;
}

}  // namespace

TEST_CASE("huge-page arena: aligned, disjoint pieces, full is an error", "[cpu][memory]") {
    HugePageArena a(5'000'000);
    CHECK(a.capacity() == 6u << 20);  // rounded up to whole 2 MiB pages
    uint8_t* p = a.take(100);
    uint8_t* q = a.take(3'000'000);
    uint8_t* r = a.take(7);
    CHECK(reinterpret_cast<uintptr_t>(p) % (2u << 20) == 0);  // the mapping starts on a huge page
    CHECK(reinterpret_cast<uintptr_t>(q) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(r) % 64 == 0);
    CHECK(q >= p + 100);
    CHECK(r >= q + 3'000'000);
    std::memset(p, 1, 100);
    std::memset(q, 2, 3'000'000);
    std::memset(r, 3, 7);
    CHECK(p[99] == 1);
    CHECK(q[0] == 2);
    CHECK(q[2'999'999] == 2);
    CHECK(r[6] == 3);
    CHECK(a.used() <= a.capacity());
    CHECK_THROWS_WITH(a.take(4u << 20), Catch::Contains("past its capacity"));
}

TEST_CASE("huge-page arena: touched pages are huge where the kernel allows it",
          "[cpu][memory]") {
    const std::string mode = thp_mode();
    const long before = anon_huge_kb();
    HugePageArena a(16u << 20);
    uint8_t* p = a.take(16u << 20);
    std::memset(p, 7, 16u << 20);
    const long after = anon_huge_kb();
    CAPTURE(mode, before, after, a.advised());
    if (mode.find("[never]") != std::string::npos || before < 0) {
        WARN("transparent huge pages are off or not reported here (" << mode
                                                                      << "): nothing to check");
        return;
    }
    CHECK(a.advised());
    // At least half of the 16 MiB came as huge pages (the kernel may be short of free ones).
    CHECK(after - before >= 8 * 1024);
}
