// GGUF v2/v3 reader (docs/formats.md §2). The whole file is memory-mapped; the header is parsed with a
// bounds-checked cursor, so a truncated or corrupted file is an error naming the file and the
// key or tensor at fault, never a crash.
#include "runtime/formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/formats/dequant.h"

namespace infoflow {

namespace {

using namespace gguf_value;

constexpr int kMaxArrayDepth = 8;
// Total metadata array elements per file; real files hold under 1M (tokens, merges, types).
constexpr uint64_t kMaxArrayElements = uint64_t(1) << 22;
constexpr uint64_t kMaxTensorName = 256;

const char* value_type_name(uint32_t t) {
    static const char* names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                  "int32",  "float32", "bool",   "string", "array",
                                  "uint64", "int64",   "float64"};
    return t <= kF64 ? names[t] : "unknown";
}

size_t scalar_size(uint32_t t) {
    switch (t) {
        case kU8:
        case kI8:
        case kBool:
            return 1;
        case kU16:
        case kI16:
            return 2;
        case kU32:
        case kI32:
        case kF32:
            return 4;
        case kU64:
        case kI64:
        case kF64:
            return 8;
        default:
            return 0;
    }
}

bool is_integer(uint32_t t) {
    return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kU64 ||
           t == kI64;
}

// Bounds-checked little-endian reader over the mapped header.
class Cursor {
  public:
    Cursor(const uint8_t* base, size_t size, const std::string& path)
        : base_(base), size_(size), path_(path) {}

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string& what) const {
        IF_CHECK(n <= remaining(), path_ << ": truncated GGUF file: " << what << " needs " << n
                                         << " bytes at offset " << pos_ << ", file has " << size_);
    }

    template <typename T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const std::string& what) {
        const uint64_t len = read<uint64_t>(what);
        need(len, what);
        std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(len));
        pos_ += size_t(len);
        return s;
    }

  private:
    const uint8_t* base_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& path_;
};

struct Parser {
    Cursor& cur;
    const std::string& path;
    uint64_t array_elements = 0;

    void read_scalar(uint32_t type, GgufValue& v, const std::string& key) {
        switch (type) {
            case kU8:
                v.u = cur.read<uint8_t>(key);
                break;
            case kI8:
                v.i = cur.read<int8_t>(key);
                break;
            case kU16:
                v.u = cur.read<uint16_t>(key);
                break;
            case kI16:
                v.i = cur.read<int16_t>(key);
                break;
            case kU32:
                v.u = cur.read<uint32_t>(key);
                break;
            case kI32:
                v.i = cur.read<int32_t>(key);
                break;
            case kU64:
                v.u = cur.read<uint64_t>(key);
                break;
            case kI64:
                v.i = cur.read<int64_t>(key);
                break;
            case kF32:
                v.f = cur.read<float>(key);
                break;
            case kF64:
                v.f = cur.read<double>(key);
                break;
            case kBool: {
                const uint8_t b = cur.read<uint8_t>(key);
                IF_CHECK(b <= 1, path << ": metadata key '" << key << "': bool value " << int(b)
                                      << " is neither 0 nor 1");
                v.u = b;
                v.i = b;
                break;
            }
            default:
                IF_FAIL(path << ": metadata key '" << key << "': bad value type " << type);
        }
        if (type == kU8 || type == kU16 || type == kU32 || type == kU64) {
            if (v.u <= uint64_t(INT64_MAX)) v.i = int64_t(v.u);
        } else if (type == kI8 || type == kI16 || type == kI32 || type == kI64) {
            if (v.i >= 0) v.u = uint64_t(v.i);
        }
    }

    void read_value(uint32_t type, GgufValue& v, const std::string& key, int depth) {
        v.type = type;
        if (type == kString) {
            v.s = cur.read_string("string value of '" + key + "'");
            return;
        }
        if (type != kArray) {
            read_scalar(type, v, key);
            return;
        }
        IF_CHECK(depth < kMaxArrayDepth, path << ": metadata key '" << key
                                              << "': arrays nested deeper than " << kMaxArrayDepth);
        v.elem_type = cur.read<uint32_t>("array type of '" + key + "'");
        const uint64_t n = cur.read<uint64_t>("array length of '" + key + "'");
        size_t min_elem = 0;
        if (v.elem_type == kString) {
            min_elem = 8;
        } else if (v.elem_type == kArray) {
            min_elem = 12;
        } else {
            min_elem = scalar_size(v.elem_type);
            IF_CHECK(min_elem != 0, path << ": metadata key '" << key
                                         << "': bad array element type " << v.elem_type);
        }
        IF_CHECK(n <= cur.remaining() / min_elem,
                 path << ": truncated GGUF file: metadata array '" << key << "' claims " << n
                      << " elements, only " << cur.remaining() << " bytes left");
        array_elements += n;
        IF_CHECK(array_elements <= kMaxArrayElements, path << ": metadata array '" << key
                                                           << "': more than " << kMaxArrayElements
                                                           << " array elements in the file");
        v.array.resize(size_t(n));
        for (auto& e : v.array) read_value(v.elem_type, e, key, depth + 1);
    }
};

uint64_t align_up(uint64_t o, uint64_t a) { return o + (a - o % a) % a; }

}  // namespace

const char* ggml_type_name(uint32_t type) {
    switch (GgmlType(type)) {
        case GgmlType::F32:
            return "F32";
        case GgmlType::F16:
            return "F16";
        case GgmlType::Q4_0:
            return "Q4_0";
        case GgmlType::Q4_1:
            return "Q4_1";
        case GgmlType::Q5_0:
            return "Q5_0";
        case GgmlType::Q5_1:
            return "Q5_1";
        case GgmlType::Q8_0:
            return "Q8_0";
        case GgmlType::Q8_1:
            return "Q8_1";
        case GgmlType::Q2_K:
            return "Q2_K";
        case GgmlType::Q3_K:
            return "Q3_K";
        case GgmlType::Q4_K:
            return "Q4_K";
        case GgmlType::Q5_K:
            return "Q5_K";
        case GgmlType::Q6_K:
            return "Q6_K";
        case GgmlType::Q8_K:
            return "Q8_K";
        case GgmlType::I8:
            return "I8";
        case GgmlType::I16:
            return "I16";
        case GgmlType::I32:
            return "I32";
        case GgmlType::I64:
            return "I64";
        case GgmlType::F64:
            return "F64";
        case GgmlType::BF16:
            return "BF16";
    }
    static thread_local char buf[32];
    std::snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

uint64_t GgufTensorInfo::n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return n;
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    IF_CHECK(fd_ >= 0, path << ": cannot open GGUF file: " << std::strerror(errno));
    try {
        struct stat st;
        IF_CHECK(::fstat(fd_, &st) == 0, path << ": cannot stat: " << std::strerror(errno));
        IF_CHECK(S_ISREG(st.st_mode), path << ": not a regular file");
        size_ = size_t(st.st_size);
        IF_CHECK(size_ >= 24, path << ": not a GGUF file: only " << size_ << " bytes");
        void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
        IF_CHECK(m != MAP_FAILED, path << ": mmap failed: " << std::strerror(errno));
        base_ = static_cast<const uint8_t*>(m);

        Cursor cur(base_, size_, path_);
        IF_CHECK(std::memcmp(base_, "GGUF", 4) == 0,
                 path << ": not a GGUF file (magic bytes are not \"GGUF\")");
        cur.read<uint32_t>("magic");
        version_ = cur.read<uint32_t>("version");
        IF_CHECK(version_ != 0x03000000u && version_ != 0x02000000u,
                 path << ": big-endian GGUF files are not supported");
        IF_CHECK(version_ == 2 || version_ == 3,
                 path << ": unsupported GGUF version " << version_ << " (need 2 or 3)");
        const uint64_t n_tensors = cur.read<uint64_t>("tensor count");
        const uint64_t n_kv = cur.read<uint64_t>("metadata count");
        // Smallest tensor info: name length 8 + n_dims 4 + one ne 8 + type 4 + offset 8.
        IF_CHECK(n_tensors <= cur.remaining() / 32, path << ": tensor count " << n_tensors
                                                         << " is impossible for a file of " << size_
                                                         << " bytes");
        // Smallest key/value: key length 8 + type 4 + one byte.
        IF_CHECK(n_kv <= cur.remaining() / 13, path << ": metadata count " << n_kv
                                                    << " is impossible for a file of " << size_
                                                    << " bytes");

        Parser parser{cur, path_};
        for (uint64_t k = 0; k < n_kv; ++k) {
            const std::string key = cur.read_string("metadata key #" + std::to_string(k));
            IF_CHECK(!key.empty(), path << ": metadata key #" << k << " is empty");
            IF_CHECK(kv_.count(key) == 0, path << ": duplicate metadata key '" << key << "'");
            const uint32_t type = cur.read<uint32_t>("value type of '" + key + "'");
            IF_CHECK(type <= kF64,
                     path << ": metadata key '" << key << "' has unknown value type " << type);
            GgufValue v;
            parser.read_value(type, v, key, 0);
            kv_.emplace(key, std::move(v));
        }

        uint64_t alignment = 32;
        if (has("general.alignment")) {
            const GgufValue& a = value("general.alignment");
            IF_CHECK(is_integer(a.type), path << ": general.alignment has type "
                                              << value_type_name(a.type)
                                              << ", expected an integer");
            alignment = a.u;
            IF_CHECK(
                a.i > 0 && alignment <= (uint64_t(1) << 30) && (alignment & (alignment - 1)) == 0,
                path << ": general.alignment " << a.i << " is not a power of two");
        }

        for (uint64_t t = 0; t < n_tensors; ++t) {
            GgufTensorInfo ti;
            ti.name = cur.read_string("name of tensor #" + std::to_string(t));
            const std::string what = "tensor '" + ti.name + "'";
            IF_CHECK(!ti.name.empty() && ti.name.size() <= kMaxTensorName,
                     path << ": tensor #" << t << " has a name of " << ti.name.size()
                          << " bytes (need 1.." << kMaxTensorName << ")");
            IF_CHECK(tensor_index_.count(ti.name) == 0,
                     path << ": duplicate tensor name '" << ti.name << "'");
            const uint32_t n_dims = cur.read<uint32_t>("n_dims of " + what);
            IF_CHECK(n_dims >= 1 && n_dims <= 4,
                     path << ": " << what << " has " << n_dims << " dimensions (need 1..4)");
            uint64_t n_el = 1;
            for (uint32_t d = 0; d < n_dims; ++d) {
                const uint64_t ne = cur.read<uint64_t>("shape of " + what);
                IF_CHECK(ne <= (uint64_t(1) << 40) && (ne == 0 || n_el <= (uint64_t(1) << 50) / ne),
                         path << ": " << what << " has an impossible shape (ne[" << d
                              << "] = " << ne << ")");
                n_el *= ne;
                ti.ne.push_back(ne);
            }
            ti.type = cur.read<uint32_t>("type of " + what);
            IF_CHECK(ggml_type_known(ti.type),
                     path << ": " << what << " has unknown ggml type " << ggml_type_name(ti.type));
            const int64_t be = ggml_block_elems(ti.type);
            IF_CHECK(ti.ne[0] % uint64_t(be) == 0,
                     path << ": " << what << ": row length ne[0] = " << ti.ne[0]
                          << " is not a multiple of the " << ggml_type_name(ti.type)
                          << " block size " << be);
            ti.n_bytes = n_el / uint64_t(be) * ggml_block_bytes(ti.type);
            ti.offset = cur.read<uint64_t>("offset of " + what);
            IF_CHECK(ti.offset % alignment == 0,
                     path << ": " << what << ": data offset " << ti.offset
                          << " is not a multiple of the alignment " << alignment);
            tensor_index_.emplace(ti.name, tensors_.size());
            tensors_.push_back(std::move(ti));
        }

        data_start_ = size_t(align_up(cur.pos(), alignment));
        if (tensors_.empty()) {
            data_start_ = std::min(data_start_, size_);
        } else {
            IF_CHECK(data_start_ <= size_, path << ": truncated GGUF file: data section starts at "
                                                << data_start_ << ", file has " << size_
                                                << " bytes");
        }
        const uint64_t data_size = size_ - data_start_;
        for (const auto& ti : tensors_) {
            IF_CHECK(ti.offset <= data_size && ti.n_bytes <= data_size - ti.offset,
                     path << ": tensor '" << ti.name << "' (offset " << ti.offset << ", "
                          << ti.n_bytes << " bytes) extends past the end of the file (" << data_size
                          << " data bytes)");
        }
        std::vector<const GgufTensorInfo*> order;
        for (const auto& ti : tensors_) {
            if (ti.n_bytes > 0) order.push_back(&ti);
        }
        std::sort(order.begin(), order.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
            return a->offset < b->offset;
        });
        for (size_t k = 1; k < order.size(); ++k) {
            IF_CHECK(order[k - 1]->offset + order[k - 1]->n_bytes <= order[k]->offset,
                     path << ": tensors '" << order[k - 1]->name << "' and '" << order[k]->name
                          << "' overlap");
        }
    } catch (...) {
        if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
        ::close(fd_);
        throw;
    }
}

GgufFile::~GgufFile() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
}

bool GgufFile::has(const std::string& key) const { return kv_.count(key) != 0; }

const GgufValue& GgufFile::value(const std::string& key) const {
    auto it = kv_.find(key);
    IF_CHECK(it != kv_.end(), path_ << ": missing metadata key '" << key << "'");
    return it->second;
}

std::string GgufFile::get_string(const std::string& key) const {
    const GgufValue& v = value(key);
    IF_CHECK(v.type == kString, path_ << ": metadata key '" << key << "' has type "
                                      << value_type_name(v.type) << ", expected string");
    return v.s;
}

int64_t GgufFile::get_int(const std::string& key) const {
    const GgufValue& v = value(key);
    IF_CHECK(is_integer(v.type), path_ << ": metadata key '" << key << "' has type "
                                       << value_type_name(v.type) << ", expected an integer");
    IF_CHECK(v.type != kU64 || v.u <= uint64_t(INT64_MAX),
             path_ << ": metadata key '" << key << "' value " << v.u << " is too large");
    return v.i;
}

double GgufFile::get_float(const std::string& key) const {
    const GgufValue& v = value(key);
    if (v.type == kF32 || v.type == kF64) return v.f;
    IF_CHECK(is_integer(v.type), path_ << ": metadata key '" << key << "' has type "
                                       << value_type_name(v.type) << ", expected a float");
    return double(v.i);
}

bool GgufFile::get_bool(const std::string& key) const {
    const GgufValue& v = value(key);
    IF_CHECK(v.type == kBool, path_ << ": metadata key '" << key << "' has type "
                                    << value_type_name(v.type) << ", expected bool");
    return v.u != 0;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
    const GgufValue& v = value(key);
    IF_CHECK(v.type == kArray && v.elem_type == kString,
             path_ << ": metadata key '" << key << "' has type " << value_type_name(v.type)
                   << (v.type == kArray ? std::string(" of ") + value_type_name(v.elem_type) : "")
                   << ", expected array of string");
    std::vector<std::string> out;
    out.reserve(v.array.size());
    for (const auto& e : v.array) out.push_back(e.s);
    return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
    const GgufValue& v = value(key);
    IF_CHECK(v.type == kArray && is_integer(v.elem_type),
             path_ << ": metadata key '" << key << "' has type " << value_type_name(v.type)
                   << (v.type == kArray ? std::string(" of ") + value_type_name(v.elem_type) : "")
                   << ", expected array of integers");
    std::vector<int64_t> out;
    out.reserve(v.array.size());
    for (const auto& e : v.array) {
        IF_CHECK(e.type != kU64 || e.u <= uint64_t(INT64_MAX),
                 path_ << ": metadata key '" << key << "': element " << e.u << " is too large");
        out.push_back(e.i);
    }
    return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
    const GgufValue& v = value(key);
    const bool ok =
        v.type == kArray && (v.elem_type == kF32 || v.elem_type == kF64 || is_integer(v.elem_type));
    IF_CHECK(ok,
             path_ << ": metadata key '" << key << "' has type " << value_type_name(v.type)
                   << (v.type == kArray ? std::string(" of ") + value_type_name(v.elem_type) : "")
                   << ", expected array of floats");
    std::vector<double> out;
    out.reserve(v.array.size());
    for (const auto& e : v.array) out.push_back(is_integer(e.type) ? double(e.i) : e.f);
    return out;
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t dflt) const {
    return has(key) ? get_int(key) : dflt;
}

double GgufFile::get_float_or(const std::string& key, double dflt) const {
    return has(key) ? get_float(key) : dflt;
}

bool GgufFile::get_bool_or(const std::string& key, bool dflt) const {
    return has(key) ? get_bool(key) : dflt;
}

std::string GgufFile::get_string_or(const std::string& key, const std::string& dflt) const {
    return has(key) ? get_string(key) : dflt;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& t) const {
    return base_ + data_start_ + t.offset;
}

}  // namespace infoflow
