// Small GGUF v3 writer (docs/formats.md §2): metadata of every value type (nested arrays included) and
// tensors encoded from fp32 (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) or given as raw bytes.
// Everything is held in memory and written atomically (temp file + rename). Used by tests to
// build fixtures and by tools that save models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/formats/gguf.h"

namespace infoflow {

class GgufWriter {
  public:
    explicit GgufWriter(uint32_t alignment = 32);  // written as general.alignment when != 32

    void set_version(uint32_t v) { version_ = v; }  // 2 or 3

    // Scalars; setting a key again replaces its value (its position is kept).
    void set_u8(const std::string& key, uint8_t v);
    void set_i8(const std::string& key, int8_t v);
    void set_u16(const std::string& key, uint16_t v);
    void set_i16(const std::string& key, int16_t v);
    void set_u32(const std::string& key, uint32_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set_i64(const std::string& key, int64_t v);
    void set_f32(const std::string& key, float v);
    void set_f64(const std::string& key, double v);
    void set_bool(const std::string& key, bool v);
    void set_string(const std::string& key, const std::string& v);
    // Arrays.
    void set_string_array(const std::string& key, const std::vector<std::string>& v);
    void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
    void set_u32_array(const std::string& key, const std::vector<uint32_t>& v);
    void set_i64_array(const std::string& key, const std::vector<int64_t>& v);
    void set_f32_array(const std::string& key, const std::vector<float>& v);
    // Any value, nested arrays included (fields used as in GgufValue: u, i, f, s, elem_type).
    void set_value(const std::string& key, const GgufValue& v);

    // ne: GGUF order (ne[0] = row length); data: [product(ne)] fp32, encoded as `type`.
    void add_tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                    const float* data);
    // Already-encoded bytes; n_bytes must equal ggml_row_bytes(type, ne[0]) * rows.
    void add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                        const uint8_t* bytes, size_t n_bytes);

    void write(const std::string& path) const;  // throws naming the path
    std::vector<uint8_t> to_bytes() const;      // the exact file contents

  private:
    struct Tensor {
        std::string name;
        std::vector<uint64_t> ne;
        uint32_t type;
        std::vector<uint8_t> bytes;
    };
    uint32_t version_ = 3;
    uint32_t alignment_;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::vector<Tensor> tensors_;
};

}  // namespace infoflow
