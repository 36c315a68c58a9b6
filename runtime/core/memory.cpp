#include "runtime/core/memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/core/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace infoflow {
namespace {

// A "Name:   1234 kB" line of /proc/self/status in MiB.
double status_mib(const char* field) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1.0;
    char line[256];
    double mib = -1.0;
    const size_t n = std::strlen(field);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
            long kb = 0;
            if (std::sscanf(line + n + 1, "%ld", &kb) == 1) mib = double(kb) / 1024.0;
            break;
        }
    }
    std::fclose(f);
    return mib;
}

}  // namespace

double peak_rss_mib() { return status_mib("VmHWM"); }

double current_rss_mib() { return status_mib("VmRSS"); }

bool reset_peak_rss() {
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = std::fputs("5", f) >= 0;
    return std::fclose(f) == 0 && ok;
}

void return_free_memory() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

HugePageArena::HugePageArena(size_t bytes) {
    capacity_ = round_up(bytes > 0 ? bytes : 1, kHugePage);
    // Map one huge page more than needed, then trim to a 2 MiB-aligned range.
    const size_t map = capacity_ + kHugePage;
    void* m = ::mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    IF_CHECK(m != MAP_FAILED,
             "mapping " << (map >> 20) << " MiB for the weights failed: " << std::strerror(errno));
    uint8_t* raw = static_cast<uint8_t*>(m);
    const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1);
    base_ = reinterpret_cast<uint8_t*>(at);
    const size_t head = size_t(base_ - raw), tail = map - head - capacity_;
    if (head > 0) ::munmap(raw, head);
    if (tail > 0) ::munmap(base_ + capacity_, tail);
#if defined(MADV_HUGEPAGE)
    advised_ = ::madvise(base_, capacity_, MADV_HUGEPAGE) == 0;
#endif
}

HugePageArena::~HugePageArena() {
    if (base_) ::munmap(base_, capacity_);
}

uint8_t* HugePageArena::take(size_t bytes) {
    const size_t at = round_up(used_, 64);
    IF_CHECK(at + bytes <= capacity_,
             "weight arena: " << bytes << " bytes past its capacity of " << capacity_);
    used_ = at + bytes;
    return base_ + at;
}

}  // namespace infoflow
