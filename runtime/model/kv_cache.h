// Per-layer KV cache: `size()` slots in use out of `capacity()`, each slot a token with its
// position and visibility group (see AttnParams). Keys are stored post-RoPE at the slot's
// position; V is position-free. Slots need not be in position order, but attention skips more
// work when they are.
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
    KvCache(Backend& backend, const ModelConfig& config, int capacity);
    KvCache(KvCache&&) = default;
    KvCache& operator=(KvCache&&) = delete;

    int size() const { return size_; }
    int capacity() const { return capacity_; }
    int n_layer() const { return n_layer_; }
    int row() const { return row_; }  // floats per slot per layer: n_head_kv * head_dim

    // Appends `n` slots (contents undefined until written) and returns the first index.
    int append(int n, const int32_t* pos /*[n]*/, const int32_t* group /*[n] or nullptr*/);
    void truncate(int n);  // drops slots >= n
    void clear() { truncate(0); }

    // K/V rows in and out of the cache: every copy of whole rows goes through these, so the
    // storage type of the cache is known here alone. Pointers are in the backend's memory.
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

    // The layer's storage, for attention over the cache.
    float* k(int layer) { return k_[layer].data(); }  // [capacity, row]
    float* v(int layer) { return v_[layer].data(); }  // [capacity, row]
    const float* k(int layer) const { return k_[layer].data(); }
    const float* v(int layer) const { return v_[layer].data(); }

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
    int capacity_ = 0;
    int size_ = 0;
    bool any_group_ = false;
    std::vector<Buffer> k_, v_;
    std::vector<int32_t> pos_, group_;
};

}  // namespace infoflow
