// Process memory: the resident-set figures the jobs report (Linux /proc/self/status) and the
// hand-back of freed heap pages after a large release (the chunk K/V once they are in the
// context cache).
#pragma once

#include <cstddef>
#include <cstdint>

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

// One anonymous mapping for large read-mostly data (the model's stored weight matrices), 2 MiB
// aligned and advised to be backed by transparent huge pages (MADV_HUGEPAGE), with bump
// allocation. A decoded token streams every weight once: through 4 KiB pages that is a TLB miss
// per page, ~25,000 per token for SmolLM2. Where the kernel refuses the advice (THP off) the
// mapping keeps ordinary pages and works the same. Freed as a whole.
class HugePageArena {
  public:
    explicit HugePageArena(size_t bytes);
    ~HugePageArena();
    HugePageArena(const HugePageArena&) = delete;
    HugePageArena& operator=(const HugePageArena&) = delete;

    // `bytes` more, 64-byte aligned; throws past the capacity.
    uint8_t* take(size_t bytes);
    size_t capacity() const { return capacity_; }
    size_t used() const { return used_; }
    bool advised() const { return advised_; }  // MADV_HUGEPAGE accepted

  private:
    uint8_t* base_ = nullptr;
    size_t capacity_ = 0;
    size_t used_ = 0;
    bool advised_ = false;
};

}  // namespace infoflow
