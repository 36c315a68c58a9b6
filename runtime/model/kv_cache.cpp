#include "runtime/model/kv_cache.h"

#include "runtime/core/error.h"

namespace infoflow {

KvCache::KvCache(Backend& backend, const ModelConfig& config, int capacity)
    : backend_(&backend),
      n_layer_(config.n_layer),
      row_(config.n_head_kv * config.head_dim),
      capacity_(capacity) {
    IF_CHECK(capacity >= 0, "KV cache capacity must be >= 0, got " << capacity);
    for (int l = 0; l < n_layer_; ++l) {
        k_.push_back(backend.alloc_floats(size_t(capacity) * row_));
        v_.push_back(backend.alloc_floats(size_t(capacity) * row_));
    }
    pos_.reserve(capacity);
    group_.reserve(capacity);
}

int KvCache::append(int n, const int32_t* pos, const int32_t* group) {
    IF_CHECK(size_ + n <= capacity_,
             "KV cache full: " << size_ << " + " << n << " slots > capacity " << capacity_);
    const int first = size_;
    for (int i = 0; i < n; ++i) {
        pos_.push_back(pos[i]);
        group_.push_back(group ? group[i] : -1);
        if (group && group[i] >= 0) any_group_ = true;
    }
    size_ += n;
    return first;
}

void KvCache::truncate(int n) {
    IF_CHECK(n >= 0 && n <= size_, "KV cache truncate to " << n << " outside [0, " << size_ << "]");
    size_ = n;
    pos_.resize(n);
    group_.resize(n);
    any_group_ = false;
    for (int32_t g : group_) any_group_ = any_group_ || g >= 0;
}

void KvCache::set_pos(int slot, int32_t pos) {
    IF_CHECK(slot >= 0 && slot < size_, "KV cache slot " << slot << " out of range");
    pos_[slot] = pos;
}

void KvCache::set_group(int slot, int32_t group) {
    IF_CHECK(slot >= 0 && slot < size_, "KV cache slot " << slot << " out of range");
    group_[slot] = group;
    if (group >= 0) any_group_ = true;
}

std::vector<SlotRun> slot_runs(const int32_t* slots, int n) {
    std::vector<SlotRun> runs;
    for (int i = 0; i < n; ++i) {
        if (!runs.empty() && runs.back().slot + runs.back().n == slots[i] &&
            runs.back().row + runs.back().n == i) {
            ++runs.back().n;
        } else {
            runs.push_back({i, slots[i], 1});
        }
    }
    return runs;
}

void KvCache::write_rows(int layer, const int32_t* slots, const float* k, const float* v, int n) {
    const size_t row = size_t(row_);
    for (const SlotRun& r : slot_runs(slots, n)) {  // one copy per run of consecutive slots
        write_range(layer, r.slot, r.n, k + size_t(r.row) * row, v + size_t(r.row) * row);
    }
}

void KvCache::read_rows(int layer, const int32_t* slots, float* k, float* v, int n) const {
    const size_t row = size_t(row_);
    for (const SlotRun& r : slot_runs(slots, n)) {
        read_range(layer, r.slot, r.n, k ? k + size_t(r.row) * row : nullptr,
                   v ? v + size_t(r.row) * row : nullptr);
    }
}

void KvCache::write_range(int layer, int first, int n, const float* k, const float* v) {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_, bytes = size_t(n) * row_ * sizeof(float);
    backend_->copy(k_[layer].data() + at, k, bytes);
    backend_->copy(v_[layer].data() + at, v, bytes);
}

void KvCache::read_range(int layer, int first, int n, float* k, float* v) const {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_, bytes = size_t(n) * row_ * sizeof(float);
    if (k) backend_->copy(k, k_[layer].data() + at, bytes);
    if (v) backend_->copy(v, v_[layer].data() + at, bytes);
}

}  // namespace infoflow
