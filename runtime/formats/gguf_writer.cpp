// GGUF v3 writer: serializes metadata and tensors in insertion order, tensor data aligned to
// the file's alignment, and renames a finished temp file into place.
#include "runtime/formats/gguf_writer.h"

#include <cstring>
#include <string_view>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/formats/dequant.h"

namespace infoflow {

namespace {

using namespace gguf_value;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
    switch (v.type) {
        case kU8:
            put<uint8_t>(out, uint8_t(v.u));
            break;
        case kI8:
            put<int8_t>(out, int8_t(v.i));
            break;
        case kU16:
            put<uint16_t>(out, uint16_t(v.u));
            break;
        case kI16:
            put<int16_t>(out, int16_t(v.i));
            break;
        case kU32:
            put<uint32_t>(out, uint32_t(v.u));
            break;
        case kI32:
            put<int32_t>(out, int32_t(v.i));
            break;
        case kU64:
            put<uint64_t>(out, v.u);
            break;
        case kI64:
            put<int64_t>(out, v.i);
            break;
        case kF32:
            put<float>(out, float(v.f));
            break;
        case kF64:
            put<double>(out, v.f);
            break;
        case kBool:
            put<uint8_t>(out, v.u ? 1 : 0);
            break;
        case kString:
            put_string(out, v.s);
            break;
        case kArray:
            put<uint32_t>(out, v.elem_type);
            put<uint64_t>(out, v.array.size());
            for (const auto& e : v.array) {
                IF_CHECK(e.type == v.elem_type, "GGUF writer: key '" << key << "': array element "
                                                                     << "type " << e.type
                                                                     << " != " << v.elem_type);
                put_value(out, e, key);
            }
            break;
        default:
            IF_FAIL("GGUF writer: key '" << key << "' has bad value type " << v.type);
    }
}

GgufValue scalar(uint32_t type) {
    GgufValue v;
    v.type = type;
    return v;
}

template <typename T, typename F>
GgufValue make_array(uint32_t elem_type, const std::vector<T>& xs, F fill) {
    GgufValue v = scalar(kArray);
    v.elem_type = elem_type;
    v.array.reserve(xs.size());
    for (const T& x : xs) {
        GgufValue e = scalar(elem_type);
        fill(e, x);
        v.array.push_back(std::move(e));
    }
    return v;
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
    IF_CHECK(alignment >= 1 && (alignment & (alignment - 1)) == 0,
             "GGUF writer: alignment " << alignment << " is not a power of two");
    if (alignment != 32) set_u32("general.alignment", alignment);
}

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
    for (auto& kv : kv_) {
        if (kv.first == key) {
            kv.second = v;
            return;
        }
    }
    kv_.emplace_back(key, v);
}

void GgufWriter::set_u8(const std::string& k, uint8_t x) {
    auto v = scalar(kU8);
    v.u = x;
    set_value(k, v);
}
void GgufWriter::set_i8(const std::string& k, int8_t x) {
    auto v = scalar(kI8);
    v.i = x;
    set_value(k, v);
}
void GgufWriter::set_u16(const std::string& k, uint16_t x) {
    auto v = scalar(kU16);
    v.u = x;
    set_value(k, v);
}
void GgufWriter::set_i16(const std::string& k, int16_t x) {
    auto v = scalar(kI16);
    v.i = x;
    set_value(k, v);
}
void GgufWriter::set_u32(const std::string& k, uint32_t x) {
    auto v = scalar(kU32);
    v.u = x;
    set_value(k, v);
}
void GgufWriter::set_i32(const std::string& k, int32_t x) {
    auto v = scalar(kI32);
    v.i = x;
    set_value(k, v);
}
void GgufWriter::set_u64(const std::string& k, uint64_t x) {
    auto v = scalar(kU64);
    v.u = x;
    set_value(k, v);
}
void GgufWriter::set_i64(const std::string& k, int64_t x) {
    auto v = scalar(kI64);
    v.i = x;
    set_value(k, v);
}
void GgufWriter::set_f32(const std::string& k, float x) {
    auto v = scalar(kF32);
    v.f = x;
    set_value(k, v);
}
void GgufWriter::set_f64(const std::string& k, double x) {
    auto v = scalar(kF64);
    v.f = x;
    set_value(k, v);
}
void GgufWriter::set_bool(const std::string& k, bool x) {
    auto v = scalar(kBool);
    v.u = x;
    set_value(k, v);
}

void GgufWriter::set_string(const std::string& k, const std::string& x) {
    auto v = scalar(kString);
    v.s = x;
    set_value(k, v);
}

void GgufWriter::set_string_array(const std::string& k, const std::vector<std::string>& xs) {
    set_value(k, make_array(kString, xs, [](GgufValue& e, const std::string& x) { e.s = x; }));
}

void GgufWriter::set_i32_array(const std::string& k, const std::vector<int32_t>& xs) {
    set_value(k, make_array(kI32, xs, [](GgufValue& e, int32_t x) { e.i = x; }));
}

void GgufWriter::set_u32_array(const std::string& k, const std::vector<uint32_t>& xs) {
    set_value(k, make_array(kU32, xs, [](GgufValue& e, uint32_t x) { e.u = x; }));
}

void GgufWriter::set_i64_array(const std::string& k, const std::vector<int64_t>& xs) {
    set_value(k, make_array(kI64, xs, [](GgufValue& e, int64_t x) { e.i = x; }));
}

void GgufWriter::set_f32_array(const std::string& k, const std::vector<float>& xs) {
    set_value(k, make_array(kF32, xs, [](GgufValue& e, float x) { e.f = x; }));
}

void GgufWriter::add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne,
                                uint32_t type, const uint8_t* bytes, size_t n_bytes) {
    IF_CHECK(!ne.empty() && ne.size() <= 4,
             "GGUF writer: tensor '" << name << "' has " << ne.size() << " dims");
    for (const auto& t : tensors_) {
        IF_CHECK(t.name != name, "GGUF writer: duplicate tensor '" << name << "'");
    }
    uint64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
    const size_t want = ggml_row_bytes(type, int64_t(ne[0])) * rows;
    IF_CHECK(n_bytes == want, "GGUF writer: tensor '" << name << "': " << n_bytes
                                                      << " bytes given, " << want << " expected");
    tensors_.push_back({name, ne, type, std::vector<uint8_t>(bytes, bytes + n_bytes)});
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                            const float* data) {
    IF_CHECK(!ne.empty() && ne.size() <= 4,
             "GGUF writer: tensor '" << name << "' has " << ne.size() << " dims");
    uint64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
    const size_t row_bytes = ggml_row_bytes(type, int64_t(ne[0]));
    std::vector<uint8_t> bytes(row_bytes * rows);
    for (uint64_t r = 0; r < rows; ++r) {
        quantize_row(type, data + r * ne[0], bytes.data() + r * row_bytes, int64_t(ne[0]));
    }
    add_tensor_raw(name, ne, type, bytes.data(), bytes.size());
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, 0x46554747u);
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kv_.size());
    for (const auto& [key, v] : kv_) {
        put_string(out, key);
        put<uint32_t>(out, v.type);
        put_value(out, v, key);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        put_string(out, t.name);
        put<uint32_t>(out, uint32_t(t.ne.size()));
        for (uint64_t d : t.ne) put<uint64_t>(out, d);
        put<uint32_t>(out, t.type);
        put<uint64_t>(out, offset);
        offset += t.bytes.size();
        offset += (alignment_ - offset % alignment_) % alignment_;
    }
    out.resize(out.size() + (alignment_ - out.size() % alignment_) % alignment_, 0);
    for (const auto& t : tensors_) {
        out.insert(out.end(), t.bytes.begin(), t.bytes.end());
        out.resize(out.size() + (alignment_ - out.size() % alignment_) % alignment_, 0);
    }
    return out;
}

void GgufWriter::write(const std::string& path) const {
    const std::vector<uint8_t> bytes = to_bytes();
    write_file_atomic(path,
                      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace infoflow
