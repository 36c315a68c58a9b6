// Per-layer KV cache: `size()` slots in use out of `capacity()`, each slot a token with its
// position and visibility group (see AttnParams). Keys are stored post-RoPE at the slot's
// position; V is position-free. Slots need not be in position order, but attention skips more
// work when they come in sorted runs. Rows are stored as `dtype()` (model.kv_dtype): f32 is the
// exact reference, f16/bf16 round each element once when it is written (on any backend: the
// backend's narrow_kv / widen_kv convert in its own memory).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/model_config.h"

namespace infoflow {

// Consecutive rows that go to consecutive cache slots: rows [row, row + n) -> slots
// [slot, slot + n), so writing new K/V into the cache takes one copy per run.
struct SlotRun {
    int row = 0;
    int slot = 0;
    int n = 0;
};
std::vector<SlotRun> slot_runs(const int32_t* slots /*[n]*/, int n);

class KvCache {
  public:
    KvCache(Backend& backend, const ModelConfig& config, int capacity,
            KvDtype dtype = KvDtype::f32);
    KvCache(KvCache&&) = default;
    KvCache& operator=(KvCache&&) = delete;

    int size() const { return size_; }
    int capacity() const { return capacity_; }
    int n_layer() const { return n_layer_; }
    int row() const { return row_; }  // elements per slot per layer: n_head_kv * head_dim
    int head_dim() const { return head_dim_; }
    KvDtype dtype() const { return dtype_; }
    Backend& backend() const { return *backend_; }  // where the rows live
    size_t row_bytes() const { return size_t(row_) * kv_dtype_size(dtype_); }

    // Appends `n` slots (contents undefined until written) and returns the first index.
    int append(int n, const int32_t* pos /*[n]*/, const int32_t* group /*[n] or nullptr*/);
    void truncate(int n);  // drops slots >= n
    void clear() { truncate(0); }

    // K/V rows in and out of the cache as fp32 (narrowed to / widened from dtype()): every copy
    // of whole rows goes through these or the *_raw ones, so the storage type of the cache is
    // known here alone. Pointers are in the backend's memory.
    // Slot slots[i] of `layer` <- row i of k and v.
    void write_rows(int layer, const int32_t* slots /*[n]*/, const float* k /*[n, row]*/,
                    const float* v /*[n, row]*/, int n);
    // Row i of k and v <- slot slots[i] of `layer`; k or v may be nullptr (not read).
    void read_rows(int layer, const int32_t* slots /*[n]*/, float* k /*[n, row]*/,
                   float* v /*[n, row]*/, int n) const;
    // The same for the contiguous slots [first, first + n).
    void write_range(int layer, int first, int n, const float* k /*[n, row]*/,
                     const float* v /*[n, row]*/);
    void read_range(int layer, int first, int n, float* k /*[n, row]*/,
                    float* v /*[n, row]*/) const;

    // Rows in the storage type (row_bytes() each), for exchanging them between ranks unchanged.
    void read_rows_raw(int layer, const int32_t* slots /*[n]*/, void* k /*[n, row]*/,
                       void* v /*[n, row]*/, int n) const;
    void write_range_raw(int layer, int first, int n, const void* k /*[n, row]*/,
                         const void* v /*[n, row]*/);
    void read_range_raw(int layer, int first, int n, void* k /*[n, row]*/,
                        void* v /*[n, row]*/) const;

    // Points the op at slots [first, size()) of `layer`: k/v (or k16/v16) and kv_dtype; the
    // caller sets n_kv and the positions.
    void attn_kv(int layer, int first, AttnParams& p) const;
    void score_k(int layer, int first, ScoreParams& p) const;

    // The layer's fp32 storage (dtype() f32 only; throws otherwise).
    float* k(int layer);  // [capacity, row]
    float* v(int layer);  // [capacity, row]
    const float* k(int layer) const;
    const float* v(int layer) const;

    // Slot metadata, host copies (the CPU backend reads them directly; a device backend keeps
    // mirrors in sync through `sync_meta`).
    const std::vector<int32_t>& pos() const { return pos_; }
    const std::vector<int32_t>& group() const { return group_; }
    void set_pos(int slot, int32_t pos);
    void set_group(int slot, int32_t group);
    const int32_t* pos_data() const { return pos_.data(); }
    const int32_t* group_data() const { return group_.data(); }
    bool has_groups() const { return any_group_; }

  private:
    Backend* backend_;
    int n_layer_ = 0;
    int row_ = 0;
    int head_dim_ = 0;
    int capacity_ = 0;
    int size_ = 0;
    bool any_group_ = false;
    KvDtype dtype_ = KvDtype::f32;
    std::vector<Buffer> k_, v_;
    std::vector<int32_t> pos_, group_;
};

}  // namespace infoflow
