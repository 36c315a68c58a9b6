#include "runtime/core/memory.h"

#include <cstdio>
#include <cstring>

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

}  // namespace infoflow
