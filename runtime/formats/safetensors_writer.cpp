// safetensors writer: tensors laid out in insertion order, JSON header built with nlohmann.
#include "runtime/formats/safetensors_writer.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/half.h"
#include "runtime/formats/safetensors.h"

namespace infoflow {

void SafetensorsWriter::add_tensor_raw(const std::string& name, const std::vector<int64_t>& shape,
                                       const std::string& dtype, const uint8_t* bytes,
                                       size_t n_bytes) {
    IF_CHECK(name != "__metadata__", "safetensors writer: reserved tensor name '" << name << "'");
    for (const auto& t : tensors_) {
        IF_CHECK(t.name != name, "safetensors writer: duplicate tensor '" << name << "'");
    }
    const int bits = safetensors_dtype_bits(dtype);
    IF_CHECK(bits > 0, "safetensors writer: tensor '" << name << "': unknown dtype " << dtype);
    uint64_t numel = 1;
    for (int64_t d : shape) {
        IF_CHECK(d >= 0, "safetensors writer: tensor '" << name << "': negative dimension");
        numel *= uint64_t(d);
    }
    IF_CHECK(numel * bits % 8 == 0 && numel * bits / 8 == n_bytes,
             "safetensors writer: tensor '" << name << "': " << n_bytes << " bytes for " << numel
                                            << " elements of " << dtype);
    tensors_.push_back({name, shape, dtype, std::vector<uint8_t>(bytes, bytes + n_bytes)});
}

void SafetensorsWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::string& dtype, const float* data) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<uint8_t> bytes;
    if (dtype == "F32") {
        bytes.resize(size_t(numel) * 4);
        if (numel) std::memcpy(bytes.data(), data, bytes.size());
    } else if (dtype == "F16" || dtype == "BF16") {
        bytes.resize(size_t(numel) * 2);
        for (int64_t i = 0; i < numel; ++i) {
            const uint16_t h = dtype == "F16" ? fp32_to_fp16(data[i]) : fp32_to_bf16(data[i]);
            std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
    } else {
        IF_FAIL("safetensors writer: tensor '" << name << "': cannot encode fp32 as " << dtype);
    }
    add_tensor_raw(name, shape, dtype, bytes.data(), bytes.size());
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
}

size_t SafetensorsWriter::data_bytes() const {
    size_t n = 0;
    for (const auto& t : tensors_) n += t.bytes.size();
    return n;
}

std::vector<uint8_t> SafetensorsWriter::to_bytes() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        h[t.name] = {{"dtype", t.dtype},
                     {"shape", t.shape},
                     {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset += t.bytes.size();
    }
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    std::vector<uint8_t> out(size_t(8 + header.size() + offset));
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, header.data(), header.size());
    size_t pos = 8 + header.size();
    for (const auto& t : tensors_) {
        if (!t.bytes.empty()) std::memcpy(out.data() + pos, t.bytes.data(), t.bytes.size());
        pos += t.bytes.size();
    }
    return out;
}

void SafetensorsWriter::write(const std::string& path) const {
    const std::vector<uint8_t> bytes = to_bytes();
    write_file_atomic(path,
                      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace infoflow
