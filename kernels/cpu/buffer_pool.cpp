// A bounded pool of freed CPU buffers (buffer_pool.h).
#include "kernels/cpu/buffer_pool.h"

#include <cstdlib>

namespace infoflow::cpu {

BufferPool::~BufferPool() {
    std::lock_guard<std::mutex> lock(mu_);
    free_all_locked();
}

size_t BufferPool::class_bytes(size_t bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < kMinPooledBytes) return rounded;
    size_t base = kMinPooledBytes;
    while (base * 2 <= rounded) base *= 2;
    for (size_t q = 4; q <= 8; ++q) {  // base * q / 4: 1, 1.25, 1.5, 1.75, 2
        const size_t c = base / 4 * q;
        if (c >= rounded) return c;
    }
    return base * 2;
}

void* BufferPool::take(size_t bytes) {
    // No pool (limit 0, every job but serve): the block as asked, untracked.
    if (limit_.load(std::memory_order_relaxed) == 0) {
        return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    }
    const size_t c = class_bytes(bytes);
    if (c < kMinPooledBytes) return std::aligned_alloc(64, c);
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = free_.find(c);
        if (it != free_.end() && !it->second.empty()) {
            void* p = it->second.back().p;
            it->second.pop_back();
            held_ -= c;
            ++reused_;
            return p;
        }
    }
    void* p = std::aligned_alloc(64, c);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    class_of_[p] = c;
    tracked_.store(class_of_.size(), std::memory_order_relaxed);
    return p;
}

void BufferPool::give(void* p) {
    if (p == nullptr) return;
    if (tracked_.load(std::memory_order_relaxed) == 0) {  // nothing pooled is out or held
        std::free(p);
        return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = class_of_.find(p);
    if (it == class_of_.end()) {  // a small block, or one taken while there was no pool
        std::free(p);
        return;
    }
    const size_t c = it->second;
    if (c > limit_) {
        class_of_.erase(it);
        tracked_.store(class_of_.size(), std::memory_order_relaxed);
        std::free(p);
        return;
    }
    while (held_ + c > limit_) evict_oldest_locked();
    free_[c].push_back({p, ++clock_, std::chrono::steady_clock::now()});
    held_ += c;
}

void BufferPool::evict_oldest_locked() {
    auto oldest = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second.empty()) continue;
        if (oldest == free_.end() || it->second.front().stamp < oldest->second.front().stamp) {
            oldest = it;
        }
    }
    if (oldest == free_.end()) return;
    void* p = oldest->second.front().p;
    oldest->second.pop_front();
    held_ -= oldest->first;
    class_of_.erase(p);
    tracked_.store(class_of_.size(), std::memory_order_relaxed);
    std::free(p);
}

void BufferPool::free_all_locked() {
    for (auto& [c, blocks] : free_) {
        for (const Held& h : blocks) {
            class_of_.erase(h.p);
            std::free(h.p);
        }
    }
    free_.clear();
    held_ = 0;
    tracked_.store(class_of_.size(), std::memory_order_relaxed);
}

void BufferPool::release_idle(std::chrono::steady_clock::duration age) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto before = std::chrono::steady_clock::now() - age;
    for (auto& [c, blocks] : free_) {
        while (!blocks.empty() && blocks.front().at < before) {
            class_of_.erase(blocks.front().p);
            std::free(blocks.front().p);
            blocks.pop_front();
            held_ -= c;
        }
    }
    tracked_.store(class_of_.size(), std::memory_order_relaxed);
}

void BufferPool::set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_.store(bytes);
    while (held_ > limit_) evict_oldest_locked();
}

size_t BufferPool::limit() const { return limit_.load(); }

size_t BufferPool::held_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
}

uint64_t BufferPool::reused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reused_;
}

}  // namespace infoflow::cpu
