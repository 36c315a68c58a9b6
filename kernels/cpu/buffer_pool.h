// A bounded pool of freed CPU buffers, kept for the next allocation of the same size class
// (docs/serve.md "Memory"). Job serve frees a request's buffers -- the stored documents' K/V,
// the request's KV cache, the recompute's scratch -- and gives free heap memory back to the
// system after every request, so the resident memory stays flat; without a pool the next
// request then page-faults the same ~100 MB in again (tens of milliseconds of its TTFT). The
// pool keeps up to `limit` bytes of freed blocks: they stay resident and are reused, and the
// memory held beyond what is in use is never more than the limit.
//
// Blocks of at least kMinPooledBytes are rounded up to a size class (four per power of two, so
// a block is at most 25 % larger than asked) and handed out again for any request in the same
// class. A freed block that would take the pool over its limit evicts the oldest blocks held,
// of any class, first. Limit 0 (the default): nothing is kept, every block is freed at once.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

namespace infoflow::cpu {

class BufferPool {
  public:
    static constexpr size_t kMinPooledBytes = size_t(64) << 10;

    BufferPool() = default;
    ~BufferPool();
    BufferPool(const BufferPool&) = delete;
    BufferPool& operator=(const BufferPool&) = delete;

    // The size class of a block of `bytes`: itself (rounded to 64) below kMinPooledBytes,
    // else the next of 2^k * {1, 1.25, 1.5, 1.75}.
    static size_t class_bytes(size_t bytes);

    // A 64-byte aligned block of at least `bytes` (nullptr if the system has none): a held one of
    // the same class, newest first, else a new one.
    void* take(size_t bytes);
    // Back from use: kept (within the limit) or freed.
    void give(void* p);

    // Frees the blocks held longer than `age` unused: the pool follows the recent requests'
    // sizes, not every size it has seen.
    void release_idle(std::chrono::steady_clock::duration age);
    // The most bytes of free blocks held; lowering it frees the oldest at once.
    void set_limit(size_t bytes);
    size_t limit() const;
    size_t held_bytes() const;  // free blocks held now
    uint64_t reused() const;    // takes served from the pool so far

  private:
    struct Held {
        void* p;
        uint64_t stamp;  // when it was given back: the oldest goes first
        std::chrono::steady_clock::time_point at;
    };
    void evict_oldest_locked();
    void free_all_locked();

    mutable std::mutex mu_;
    std::atomic<size_t> limit_{0};
    std::atomic<size_t> tracked_{0};  // class_of_.size(): 0 = every block is a plain one
    size_t held_ = 0;
    uint64_t clock_ = 0;
    uint64_t reused_ = 0;
    std::map<size_t, std::deque<Held>> free_;     // class -> blocks, oldest at the front
    std::unordered_map<void*, size_t> class_of_;  // every pooled-size block out or held
};

}  // namespace infoflow::cpu
