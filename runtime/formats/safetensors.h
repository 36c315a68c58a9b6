// safetensors reader (docs/formats.md §6): one memory-mapped file, or a Hugging Face directory holding
// model.safetensors or shards listed by model.safetensors.index.json. The header is validated
// once (length cap, dtypes, shapes, offsets tiling the buffer); errors name the file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace infoflow {

struct SafetensorsTensorInfo {
    std::string name;
    std::string dtype;           // as written: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;  // PyTorch order (not reversed)
    uint64_t begin = 0;          // relative to the byte buffer
    uint64_t end = 0;            // exclusive
    int64_t numel() const;
};

// Bits per element of a safetensors dtype; 0 when the dtype is unknown.
int safetensors_dtype_bits(const std::string& dtype);

class SafetensorsFile {
  public:
    explicit SafetensorsFile(const std::string& path);  // throws infoflow::Error naming the path
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    size_t file_size() const { return size_; }
    size_t data_start() const { return data_start_; }  // 8 + header length
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
    const SafetensorsTensorInfo* find(const std::string& name) const;  // nullptr if absent
    const SafetensorsTensorInfo& info(const std::string& name) const;  // throws naming it
    const uint8_t* tensor_data(const SafetensorsTensorInfo& t) const;  // any alignment

    // Converts an F32/F16/BF16 tensor to fp32; dst: [numel]. Other dtypes are rejected with an
    // error naming the tensor, its dtype and the file.
    void read_f32(const SafetensorsTensorInfo& t, float* dst) const;
    std::vector<float> read_f32(const std::string& name) const;

  private:
    std::string path_;
    int fd_ = -1;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    size_t data_start_ = 0;
    std::map<std::string, std::string> metadata_;
    std::vector<SafetensorsTensorInfo> tensors_;
    std::map<std::string, size_t> index_;
};

// All tensors of a checkpoint: `path` is a .safetensors file, or a directory holding
// model.safetensors or model.safetensors.index.json (+ the shards it names).
class SafetensorsModel {
  public:
    explicit SafetensorsModel(const std::string& path);

    bool has(const std::string& name) const { return where_.count(name) != 0; }
    const SafetensorsTensorInfo& info(const std::string& name) const;  // throws naming it
    const SafetensorsFile& file_of(const std::string& name) const;     // throws naming it
    std::vector<std::string> names() const;                            // sorted
    std::vector<float> read_f32(const std::string& name) const;
    void read_f32(const std::string& name, float* dst) const;
    const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

  private:
    std::string path_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace infoflow
