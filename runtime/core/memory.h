// Process memory: the resident-set figures the jobs report (Linux /proc/self/status) and the
// hand-back of freed heap pages after a large release (the chunk K/V once they are in the
// context cache).
#pragma once

namespace infoflow {

// Peak resident set size of this process so far (VmHWM), in MiB; -1 where unavailable.
double peak_rss_mib();

// Current resident set size (VmRSS), in MiB; -1 where unavailable.
double current_rss_mib();

// Resets the peak (VmHWM) to the current resident size, so that a later peak_rss_mib() is the
// peak of what ran in between (Linux >= 4.0, /proc/self/clear_refs); false where not possible.
bool reset_peak_rss();

// Returns freed heap memory to the system (glibc malloc_trim), so that freeing many buffers
// below the allocator's mmap threshold lowers the resident size; a no-op elsewhere.
void return_free_memory();

}  // namespace infoflow
