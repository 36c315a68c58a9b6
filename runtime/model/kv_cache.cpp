#include "runtime/model/kv_cache.h"

#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow {

KvCache::KvCache(Backend& backend, const ModelConfig& config, int capacity, KvDtype dtype)
    : backend_(&backend),
      n_layer_(config.n_layer),
      row_(config.n_head_kv * config.head_dim),
      head_dim_(config.head_dim),
      capacity_(capacity),
      dtype_(dtype) {
    IF_CHECK(capacity >= 0, "KV cache capacity must be >= 0, got " << capacity);
    for (int l = 0; l < n_layer_; ++l) {
        k_.push_back(backend.alloc(size_t(capacity) * row_bytes()));
        v_.push_back(backend.alloc(size_t(capacity) * row_bytes()));
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

void KvCache::read_rows_raw(int layer, const int32_t* slots, void* k, void* v, int n) const {
    const size_t rb = row_bytes();
    for (const SlotRun& r : slot_runs(slots, n)) {
        IF_CHECK(r.slot >= 0 && r.slot + r.n <= size_, "cache slots ["
                                                           << r.slot << ", " << r.slot + r.n
                                                           << ") outside [0, " << size_ << ")");
        const size_t at = size_t(r.slot) * rb, bytes = size_t(r.n) * rb;
        backend_->copy(static_cast<char*>(k) + size_t(r.row) * rb,
                       reinterpret_cast<const char*>(k_[layer].data()) + at, bytes);
        backend_->copy(static_cast<char*>(v) + size_t(r.row) * rb,
                       reinterpret_cast<const char*>(v_[layer].data()) + at, bytes);
    }
}

void KvCache::write_range_raw(int layer, int first, int n, const void* k, const void* v) {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_bytes(), bytes = size_t(n) * row_bytes();
    backend_->copy(reinterpret_cast<char*>(k_[layer].data()) + at, k, bytes);
    backend_->copy(reinterpret_cast<char*>(v_[layer].data()) + at, v, bytes);
}

void KvCache::read_range_raw(int layer, int first, int n, void* k, void* v) const {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_bytes(), bytes = size_t(n) * row_bytes();
    backend_->copy(k, reinterpret_cast<const char*>(k_[layer].data()) + at, bytes);
    backend_->copy(v, reinterpret_cast<const char*>(v_[layer].data()) + at, bytes);
}

void KvCache::write_range(int layer, int first, int n, const float* k, const float* v) {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_bytes(), elems = size_t(n) * row_;
    char* kd = reinterpret_cast<char*>(k_[layer].data()) + at;
    char* vd = reinterpret_cast<char*>(v_[layer].data()) + at;
    if (dtype_ == KvDtype::f32) {
        backend_->copy(kd, k, elems * sizeof(float));
        backend_->copy(vd, v, elems * sizeof(float));
    } else {
        backend_->narrow_kv(dtype_, k, elems, kd);
        backend_->narrow_kv(dtype_, v, elems, vd);
    }
}

void KvCache::read_range(int layer, int first, int n, float* k, float* v) const {
    if (n <= 0) return;
    IF_CHECK(first >= 0 && first + n <= size_,
             "cache slots [" << first << ", " << first + n << ") outside [0, " << size_ << ")");
    const size_t at = size_t(first) * row_bytes(), elems = size_t(n) * row_;
    const char* ks = reinterpret_cast<const char*>(k_[layer].data()) + at;
    const char* vs = reinterpret_cast<const char*>(v_[layer].data()) + at;
    if (dtype_ == KvDtype::f32) {
        if (k) backend_->copy(k, ks, elems * sizeof(float));
        if (v) backend_->copy(v, vs, elems * sizeof(float));
    } else {
        if (k) backend_->widen_kv(dtype_, ks, elems, k);
        if (v) backend_->widen_kv(dtype_, vs, elems, v);
    }
}

void KvCache::attn_kv(int layer, int first, AttnParams& p) const {
    IF_CHECK(first >= 0 && first <= size_,
             "cache slot " << first << " outside [0, " << size_ << "]");
    p.kv_dtype = dtype_;
    p.kv_stride = row_;
    const size_t at = size_t(first) * row_bytes();
    const char* kb = reinterpret_cast<const char*>(k_[layer].data()) + at;
    const char* vb = reinterpret_cast<const char*>(v_[layer].data()) + at;
    if (dtype_ == KvDtype::f32) {
        p.k = reinterpret_cast<const float*>(kb);
        p.v = reinterpret_cast<const float*>(vb);
        p.k16 = p.v16 = nullptr;
    } else {
        p.k16 = reinterpret_cast<const uint16_t*>(kb);
        p.v16 = reinterpret_cast<const uint16_t*>(vb);
        p.k = p.v = nullptr;
    }
}

void KvCache::score_k(int layer, int first, ScoreParams& p) const {
    AttnParams a;
    attn_kv(layer, first, a);
    p.kv_dtype = a.kv_dtype;
    p.kv_stride = a.kv_stride;
    p.k = a.k;
    p.k16 = a.k16;
}

float* KvCache::k(int layer) {
    IF_CHECK(dtype_ == KvDtype::f32, "fp32 access to a " << kv_dtype_name(dtype_) << " KV cache");
    return k_[layer].data();
}
float* KvCache::v(int layer) {
    IF_CHECK(dtype_ == KvDtype::f32, "fp32 access to a " << kv_dtype_name(dtype_) << " KV cache");
    return v_[layer].data();
}
const float* KvCache::k(int layer) const { return const_cast<KvCache*>(this)->k(layer); }
const float* KvCache::v(int layer) const { return const_cast<KvCache*>(this)->v(layer); }

}  // namespace infoflow
