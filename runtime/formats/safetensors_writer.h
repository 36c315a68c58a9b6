// Small safetensors writer (docs/formats.md §6): tensors from fp32 stored as F32/F16/BF16, or raw bytes
// of any dtype; header padded with spaces to a multiple of 8; written atomically.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace infoflow {

class SafetensorsWriter {
  public:
    // shape: PyTorch order; data: [product(shape)] fp32; dtype: "F32", "F16" or "BF16".
    void add_tensor(const std::string& name, const std::vector<int64_t>& shape,
                    const std::string& dtype, const float* data);
    // Any dtype; n_bytes must match the shape.
    void add_tensor_raw(const std::string& name, const std::vector<int64_t>& shape,
                        const std::string& dtype, const uint8_t* bytes, size_t n_bytes);
    void set_metadata(const std::string& key, const std::string& value);

    size_t n_tensors() const { return tensors_.size(); }
    size_t data_bytes() const;                  // size of the tensor buffer
    std::vector<uint8_t> to_bytes() const;      // the exact file contents
    void write(const std::string& path) const;  // atomic; throws naming the path

  private:
    struct Tensor {
        std::string name;
        std::vector<int64_t> shape;
        std::string dtype;
        std::vector<uint8_t> bytes;
    };
    std::vector<Tensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace infoflow
