// safetensors reader: mmap + validated JSON header (docs/formats.md §6). Tensor bytes are read with
// memcpy since the buffer gives no alignment guarantee.
#include "runtime/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow {

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // safetensors MAX_HEADER_SIZE

bool is_dir(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

int safetensors_dtype_bits(const std::string& d) {
    static const std::map<std::string, int> bits = {
        {"BOOL", 8},    {"U8", 8},      {"I8", 8},          {"I16", 16},        {"U16", 16},
        {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
        {"F64", 64},    {"I64", 64},    {"U64", 64},        {"C64", 64},        {"F8_E5M2", 8},
        {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F6_E2M3", 6},
        {"F6_E3M2", 6}, {"F4", 4},
    };
    auto it = bits.find(d);
    return it == bits.end() ? 0 : it->second;
}

int64_t SafetensorsTensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    IF_CHECK(fd_ >= 0, path << ": cannot open safetensors file: " << std::strerror(errno));
    try {
        struct stat st;
        IF_CHECK(::fstat(fd_, &st) == 0, path << ": cannot stat: " << std::strerror(errno));
        IF_CHECK(S_ISREG(st.st_mode), path << ": not a regular file");
        size_ = size_t(st.st_size);
        IF_CHECK(size_ >= 8, path << ": not a safetensors file: only " << size_ << " bytes");
        void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
        IF_CHECK(m != MAP_FAILED, path << ": mmap failed: " << std::strerror(errno));
        base_ = static_cast<const uint8_t*>(m);

        uint64_t n = 0;
        std::memcpy(&n, base_, 8);
        IF_CHECK(n <= kMaxHeader, path << ": safetensors header length " << n
                                       << " exceeds the limit " << kMaxHeader);
        IF_CHECK(n <= size_ - 8, path << ": truncated safetensors file: header length " << n
                                      << " but only " << size_ - 8 << " bytes follow");
        data_start_ = size_t(8 + n);
        const uint64_t buffer = size_ - data_start_;

        nlohmann::json h;
        try {
            h = nlohmann::json::parse(base_ + 8, base_ + 8 + n);
        } catch (const nlohmann::json::exception& e) {
            IF_FAIL(path << ": safetensors header is not valid JSON: " << e.what());
        }
        IF_CHECK(h.is_object(), path << ": safetensors header is not a JSON object");

        for (auto it = h.begin(); it != h.end(); ++it) {
            const std::string& name = it.key();
            const nlohmann::json& v = it.value();
            if (name == "__metadata__") {
                IF_CHECK(v.is_object(), path << ": __metadata__ is not an object");
                for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
                    IF_CHECK(m2.value().is_string(),
                             path << ": __metadata__ value '" << m2.key() << "' is not a string");
                    metadata_[m2.key()] = m2.value().get<std::string>();
                }
                continue;
            }
            IF_CHECK(v.is_object(), path << ": tensor '" << name << "': entry is not an object");
            SafetensorsTensorInfo t;
            t.name = name;
            auto dt = v.find("dtype");
            IF_CHECK(dt != v.end() && dt->is_string(),
                     path << ": tensor '" << name << "': missing or non-string dtype");
            t.dtype = dt->get<std::string>();
            const int bits = safetensors_dtype_bits(t.dtype);
            IF_CHECK(bits > 0,
                     path << ": tensor '" << name << "': unknown dtype '" << t.dtype << "'");
            auto sh = v.find("shape");
            IF_CHECK(sh != v.end() && sh->is_array(),
                     path << ": tensor '" << name << "': missing or non-array shape");
            IF_CHECK(sh->size() <= 8,
                     path << ": tensor '" << name << "': " << sh->size() << " dimensions");
            uint64_t numel = 1;
            for (const auto& d : *sh) {
                IF_CHECK(d.is_number_unsigned(), path << ": tensor '" << name
                                                      << "': shape holds a non-integer or "
                                                      << "negative value " << d.dump());
                const uint64_t dim = d.get<uint64_t>();
                IF_CHECK(
                    dim <= (uint64_t(1) << 40) && (dim == 0 || numel <= (uint64_t(1) << 50) / dim),
                    path << ": tensor '" << name << "': impossible shape " << sh->dump());
                numel *= dim;
                t.shape.push_back(int64_t(dim));
            }
            auto off = v.find("data_offsets");
            IF_CHECK(off != v.end() && off->is_array() && off->size() == 2 &&
                         (*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned(),
                     path << ": tensor '" << name << "': data_offsets must be two non-negative "
                          << "integers");
            t.begin = (*off)[0].get<uint64_t>();
            t.end = (*off)[1].get<uint64_t>();
            IF_CHECK(t.begin <= t.end && t.end <= buffer,
                     path << ": tensor '" << name << "': data_offsets [" << t.begin << ", " << t.end
                          << "] outside the " << buffer << "-byte buffer");
            const uint64_t want_bits = numel * uint64_t(bits);
            IF_CHECK(want_bits % 8 == 0 && t.end - t.begin == want_bits / 8,
                     path << ": tensor '" << name << "': " << t.end - t.begin << " bytes for shape "
                          << sh->dump() << " of " << t.dtype);
            index_.emplace(name, tensors_.size());
            tensors_.push_back(std::move(t));
        }

        std::vector<const SafetensorsTensorInfo*> order;
        for (const auto& t : tensors_) order.push_back(&t);
        std::sort(order.begin(), order.end(),
                  [](const SafetensorsTensorInfo* a, const SafetensorsTensorInfo* b) {
                      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
                  });
        uint64_t pos = 0;
        for (const auto* t : order) {
            IF_CHECK(t->begin == pos, path << ": tensor '" << t->name << "': data_offsets begin "
                                           << t->begin << " but the previous tensor ends at " << pos
                                           << " (tensors must tile the buffer)");
            pos = t->end;
        }
        IF_CHECK(pos == buffer,
                 path << ": tensors cover " << pos << " bytes of a " << buffer << "-byte buffer");
    } catch (...) {
        if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
        ::close(fd_);
        throw;
    }
}

SafetensorsFile::~SafetensorsFile() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
    const SafetensorsTensorInfo* t = find(name);
    IF_CHECK(t, path_ << ": missing tensor '" << name << "'");
    return *t;
}

const uint8_t* SafetensorsFile::tensor_data(const SafetensorsTensorInfo& t) const {
    return base_ + data_start_ + t.begin;
}

void SafetensorsFile::read_f32(const SafetensorsTensorInfo& t, float* dst) const {
    const uint8_t* src = tensor_data(t);
    const int64_t n = t.numel();
    if (n == 0) return;  // an empty tensor: dst may be null (memcpy needs valid pointers)
    if (t.dtype == "F32") {
        std::memcpy(dst, src, size_t(n) * 4);
    } else if (t.dtype == "F16") {
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, src + 2 * i, 2);
            dst[i] = fp16_to_fp32(h);
        }
    } else if (t.dtype == "BF16") {
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_fp32(h);
        }
    } else {
        IF_FAIL(path_ << ": tensor '" << t.name << "' has dtype " << t.dtype
                      << "; only F32, F16 and BF16 are supported");
    }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
    const SafetensorsTensorInfo& t = info(name);
    std::vector<float> out(size_t(t.numel()));
    read_f32(t, out.data());
    return out;
}

// ---- checkpoints: one file or a (sharded) directory ---------------------------------------

SafetensorsModel::SafetensorsModel(const std::string& path) : path_(path) {
    std::vector<std::string> shard_paths;
    std::string index_path;
    if (is_dir(path)) {
        const std::string single = path + "/model.safetensors";
        index_path = path + "/model.safetensors.index.json";
        if (is_file(index_path)) {
            std::ifstream in(index_path);
            IF_CHECK(in, index_path << ": cannot open");
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(in);
            } catch (const nlohmann::json::exception& e) {
                IF_FAIL(index_path << ": not valid JSON: " << e.what());
            }
            IF_CHECK(j.is_object(), index_path << ": not a JSON object");
            auto wm = j.find("weight_map");
            IF_CHECK(wm != j.end() && wm->is_object(),
                     index_path << ": missing or non-object key 'weight_map'");
            std::map<std::string, size_t> shard_index;
            std::map<std::string, std::string> wanted;  // tensor -> shard file name
            for (auto it = wm->begin(); it != wm->end(); ++it) {
                IF_CHECK(it.value().is_string(),
                         index_path << ": weight_map entry '" << it.key() << "' is not a string");
                const std::string shard = it.value().get<std::string>();
                IF_CHECK(!shard.empty() && shard.find('/') == std::string::npos,
                         index_path << ": weight_map entry '" << it.key() << "' names a bad shard '"
                                    << shard << "'");
                if (!shard_index.count(shard)) {
                    shard_index.emplace(shard, files_.size());
                    files_.push_back(std::make_unique<SafetensorsFile>(path + "/" + shard));
                }
                wanted.emplace(it.key(), shard);
            }
            for (const auto& [name, shard] : wanted) {
                const size_t f = shard_index.at(shard);
                IF_CHECK(files_[f]->find(name), index_path << ": tensor '" << name
                                                           << "' is mapped to " << shard
                                                           << " but that file lacks it");
                where_.emplace(name, f);
            }
            return;
        }
        IF_CHECK(is_file(single), path << ": neither model.safetensors nor "
                                       << "model.safetensors.index.json found");
        shard_paths.push_back(single);
    } else {
        shard_paths.push_back(path);
    }
    for (const auto& p : shard_paths) {
        files_.push_back(std::make_unique<SafetensorsFile>(p));
        for (const auto& t : files_.back()->tensors()) {
            IF_CHECK(where_.count(t.name) == 0, p << ": duplicate tensor '" << t.name << "'");
            where_.emplace(t.name, files_.size() - 1);
        }
    }
}

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
    auto it = where_.find(name);
    IF_CHECK(it != where_.end(), path_ << ": missing tensor '" << name << "'");
    return *files_[it->second];
}

const SafetensorsTensorInfo& SafetensorsModel::info(const std::string& name) const {
    return file_of(name).info(name);
}

std::vector<std::string> SafetensorsModel::names() const {
    std::vector<std::string> out;
    for (const auto& kv : where_) out.push_back(kv.first);
    return out;
}

std::vector<float> SafetensorsModel::read_f32(const std::string& name) const {
    return file_of(name).read_f32(name);
}

void SafetensorsModel::read_f32(const std::string& name, float* dst) const {
    const SafetensorsFile& f = file_of(name);
    f.read_f32(f.info(name), dst);
}

}  // namespace infoflow
