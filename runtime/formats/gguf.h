// GGUF v2/v3 reader (docs/formats.md §2): memory-mapped, every offset and size bounds-checked against
// the file; errors name the file and the key or tensor at fault. Read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace infoflow {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    BF16 = 30,
};

const char* ggml_type_name(uint32_t type);

// GGUF metadata value type ids (docs/formats.md §2.1), shared by the reader and the writer.
namespace gguf_value {
enum : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
};
}  // namespace gguf_value

struct GgufTensorInfo {
    std::string name;
    std::vector<uint64_t> ne;  // GGUF order: ne[0] is the row length (PyTorch shape reversed)
    uint32_t type = 0;         // GgmlType value
    uint64_t offset = 0;       // relative to the data section
    uint64_t n_bytes = 0;      // checked: data_start + offset + n_bytes <= file size
    uint64_t n_elements() const;
};

// One metadata value. Arrays hold their elements; nested arrays are kept as `array`.
struct GgufValue {
    uint32_t type = 0;  // GGUF metadata value type (0..12)
    uint64_t u = 0;     // unsigned integers and bool
    int64_t i = 0;      // signed integers (also filled for unsigned ones that fit)
    double f = 0.0;     // floats
    std::string s;      // strings
    uint32_t elem_type = 0;
    std::vector<GgufValue> array;
};

class GgufFile {
  public:
    explicit GgufFile(const std::string& path);  // throws infoflow::Error naming the path
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t file_size() const { return size_; }
    size_t data_start() const { return data_start_; }

    bool has(const std::string& key) const;
    const GgufValue& value(const std::string& key) const;  // throws naming the missing key
    // Typed getters accept any integer width for integers and either float width for floats;
    // the wrong type is an error naming the key and both types.
    std::string get_string(const std::string& key) const;
    int64_t get_int(const std::string& key) const;
    double get_float(const std::string& key) const;
    bool get_bool(const std::string& key) const;
    std::vector<std::string> get_string_array(const std::string& key) const;
    std::vector<int64_t> get_int_array(const std::string& key) const;
    std::vector<double> get_float_array(const std::string& key) const;
    int64_t get_int_or(const std::string& key, int64_t dflt) const;
    double get_float_or(const std::string& key, double dflt) const;
    bool get_bool_or(const std::string& key, bool dflt) const;
    std::string get_string_or(const std::string& key, const std::string& dflt) const;
    const std::map<std::string, GgufValue>& metadata() const { return kv_; }

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent
    const uint8_t* tensor_data(const GgufTensorInfo& t) const;

  private:
    std::string path_;
    uint32_t version_ = 0;
    int fd_ = -1;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    size_t data_start_ = 0;
    std::map<std::string, GgufValue> kv_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

}  // namespace infoflow
