// The KV store on the HDF5 1.10 C API (layout: kv_store.h, docs/store.md). Compiled only when
// CMake found HDF5; the rest of the program sees kv_store.h alone.
//
// 16-bit floats: HDF5 1.10 has no native half or bfloat16 type, so both are IEEE-style float
// types derived from F32LE (H5Tset_fields, H5Tset_size, H5Tset_ebias, in that order); bulk data
// goes through a raw uint16 buffer with that type as both memory and file type (no library
// conversion), converted with core/half.h.
#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/half.h"
#include "runtime/core/pieces.h"
#include "runtime/store/kv_store.h"

namespace infoflow {
namespace {

constexpr const char* k_format = "infoflow_sp kv store";
constexpr int k_format_version = 1;
constexpr const char* k_keys = "post-rope";  // keys after RoPE at their local positions
constexpr const char* k_rope = "neox";       // half-split pairing (HF order)
constexpr size_t k_chunk_bytes = size_t(4) << 20;

// ---- RAII for hid_t -------------------------------------------------------------------------

class Hid {
  public:
    using Closer = herr_t (*)(hid_t);
    Hid() = default;
    Hid(hid_t id, Closer close) : id_(id), close_(close) {}
    ~Hid() { reset(); }
    Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
    Hid& operator=(Hid&& o) noexcept {
        if (this != &o) {
            reset();
            id_ = o.id_;
            close_ = o.close_;
            o.id_ = -1;
        }
        return *this;
    }
    Hid(const Hid&) = delete;
    Hid& operator=(const Hid&) = delete;
    hid_t get() const { return id_; }
    bool ok() const { return id_ >= 0; }
    // Closes now and reports the status (a file's close flushes: where a full disk shows).
    herr_t close() {
        herr_t s = 0;
        if (id_ >= 0) s = close_(id_);
        id_ = -1;
        return s;
    }

  private:
    void reset() {
        if (id_ >= 0) close_(id_);
        id_ = -1;
    }
    hid_t id_ = -1;
    Closer close_ = nullptr;
};

// The innermost messages of the HDF5 error stack ("data error detected by Fletcher32 checksum").
std::string h5_error() {
    std::string out;
    auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* s = static_cast<std::string*>(data);
        if (e->desc && *e->desc) *s = e->desc;  // downward walk: the last one is the innermost
        for (char& ch : *s) {
            if (ch == '\n') ch = ' ';
        }
        return 0;
    };
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &out);
    H5Eclear2(H5E_DEFAULT);
    return out.empty() ? std::string("HDF5 error") : out;
}

void h5_quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string errno_str(int e) { return std::strerror(e); }

// IEEE half -> float, exact (F16C when the build targets it: a load is mostly this loop).
void f16_to_f32(const uint16_t* in, float* out, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) out[i] = fp16_to_fp32(in[i]);
}

// ---- types and attributes -------------------------------------------------------------------

Hid float16_type(bool bf16) {
    Hid t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    IF_CHECK(t.ok(), "HDF5: " << h5_error());
    herr_t s =
        bf16 ? H5Tset_fields(t.get(), 15, 7, 8, 0, 7) : H5Tset_fields(t.get(), 15, 10, 5, 0, 10);
    if (s >= 0) s = H5Tset_size(t.get(), 2);
    if (s >= 0) s = H5Tset_ebias(t.get(), bf16 ? 127 : 15);
    IF_CHECK(s >= 0, "HDF5: cannot build the 16-bit float type: " << h5_error());
    return t;
}

Hid string_type() {
    Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), H5T_VARIABLE);
    H5Tset_cset(t.get(), H5T_CSET_UTF8);
    return t;
}

void write_attr(hid_t obj, const char* name, const std::string& value, const std::string& file) {
    Hid space(H5Screate(H5S_SCALAR), H5Sclose);
    Hid type = string_type();
    Hid a(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const char* p = value.c_str();
    IF_CHECK(a.ok() && H5Awrite(a.get(), type.get(), &p) >= 0,
             "cannot write '" << file << "': attribute " << name << ": " << h5_error());
}

void write_attr(hid_t obj, const char* name, int64_t value, const std::string& file) {
    Hid space(H5Screate(H5S_SCALAR), H5Sclose);
    Hid a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    IF_CHECK(a.ok() && H5Awrite(a.get(), H5T_NATIVE_INT64, &value) >= 0,
             "cannot write '" << file << "': attribute " << name << ": " << h5_error());
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

std::string read_str_attr(hid_t obj, const char* name, const std::string& file) {
    IF_CHECK(has_attr(obj, name), "KV store '" << file << "': attribute '" << name
                                               << "' is missing (not a store "
                                               << "written by infoflow_sp, or a damaged file)");
    Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    Hid ft(H5Aget_type(a.get()), H5Tclose);
    IF_CHECK(H5Tget_class(ft.get()) == H5T_STRING,
             "KV store '" << file << "': attribute '" << name << "' is not a string");
    Hid type = string_type();
    char* p = nullptr;
    IF_CHECK(H5Aread(a.get(), type.get(), &p) >= 0,
             "KV store '" << file << "': attribute '" << name << "': " << h5_error());
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& file) {
    IF_CHECK(has_attr(obj, name), "KV store '" << file << "': attribute '" << name
                                               << "' is missing (not a store written by "
                                                  "infoflow_sp, or a damaged file)");
    Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    int64_t v = 0;
    IF_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, &v) >= 0,
             "KV store '" << file << "': attribute '" << name << "': " << h5_error());
    return v;
}

void write_identity(hid_t root, const StoreIdentity& id, const std::string& file) {
    write_attr(root, "format", k_format, file);
    write_attr(root, "format_version", k_format_version, file);
    write_attr(root, "model_fingerprint", id.model_fingerprint, file);
    write_attr(root, "tokenizer_hash", id.tokenizer_hash, file);
    write_attr(root, "arch", arch_name(id.arch), file);
    write_attr(root, "n_layer", id.n_layer, file);
    write_attr(root, "n_head_kv", id.n_head_kv, file);
    write_attr(root, "head_dim", id.head_dim, file);
    write_attr(root, "dtype", store_dtype_name(id.dtype), file);
    write_attr(root, "keys", k_keys, file);
    write_attr(root, "rope", k_rope, file);
}

// Refuses a file whose identity differs from `want`, naming the file and the attribute.
void check_identity(hid_t root, const StoreIdentity& want, const std::string& file) {
    const std::string fmt = read_str_attr(root, "format", file);
    IF_CHECK(fmt == k_format, "KV store '" << file << "': attribute 'format' is '" << fmt
                                           << "', expected '" << k_format << "'");
    const int64_t ver = read_int_attr(root, "format_version", file);
    IF_CHECK(ver == k_format_version, "KV store '" << file << "' has format_version " << ver
                                                   << "; this build reads version "
                                                   << k_format_version << " (rebuild the store)");
    auto same = [&](const char* name, const std::string& have, const std::string& expect,
                    const char* hint) {
        IF_CHECK(have == expect, "KV store '" << file << "' was written for " << name << " = '"
                                              << have << "', this run has '" << expect
                                              << "': refused (" << hint << ")");
    };
    const char* rebuild = "another model or tokenizer; rebuild the store or set another store.path";
    same("model_fingerprint", read_str_attr(root, "model_fingerprint", file),
         want.model_fingerprint, rebuild);
    same("tokenizer_hash", read_str_attr(root, "tokenizer_hash", file), want.tokenizer_hash,
         rebuild);
    same("arch", read_str_attr(root, "arch", file), arch_name(want.arch), rebuild);
    same("n_layer", std::to_string(read_int_attr(root, "n_layer", file)),
         std::to_string(want.n_layer), rebuild);
    same("n_head_kv", std::to_string(read_int_attr(root, "n_head_kv", file)),
         std::to_string(want.n_head_kv), rebuild);
    same("head_dim", std::to_string(read_int_attr(root, "head_dim", file)),
         std::to_string(want.head_dim), rebuild);
    same("dtype", read_str_attr(root, "dtype", file), store_dtype_name(want.dtype),
         "set store.dtype to the store's dtype, or use another store.path");
    same("keys", read_str_attr(root, "keys", file), k_keys, "unknown key convention");
    same("rope", read_str_attr(root, "rope", file), k_rope, "unknown RoPE convention");
}

// ---- paths and the writers' lock --------------------------------------------------------------

std::string dir_of(const std::string& path) {
    const size_t s = path.rfind('/');
    if (s == std::string::npos) return ".";
    return s == 0 ? "/" : path.substr(0, s);
}
std::string base_of(const std::string& path) {
    const size_t s = path.rfind('/');
    return s == std::string::npos ? path : path.substr(s + 1);
}

// flock on PATH.lock; waits up to `timeout_s`, then fails cleanly naming the store.
class WriterLock {
  public:
    WriterLock(const std::string& store, double timeout_s) {
        const std::string lock = store + ".lock";
        fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        IF_CHECK(fd_ >= 0, "cannot write KV store '" << store << "': cannot open lock file '"
                                                     << lock << "': " << errno_str(errno));
        const auto t0 = std::chrono::steady_clock::now();
        while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            if (err != EWOULDBLOCK && err != EINTR) {
                ::close(fd_);
                IF_FAIL("cannot lock KV store '" << store << "' (" << lock
                                                 << "): " << errno_str(err));
            }
            const double waited =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (waited > timeout_s) {
                ::close(fd_);
                IF_FAIL("KV store '" << store << "' is locked by another writer (" << lock
                                     << ") for more than " << timeout_s << " s; gave up");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ~WriterLock() {
        if (fd_ >= 0) {
            ::flock(fd_, LOCK_UN);
            ::close(fd_);
        }
    }
    WriterLock(const WriterLock&) = delete;
    WriterLock& operator=(const WriterLock&) = delete;

  private:
    int fd_ = -1;
};

// Removes temp files a killed writer left behind (only called with the lock held, so no live
// writer owns them): ".NAME.tmp.XXXXXX" next to the index and in the document folder.
void remove_stale_temps(const std::string& index_path, const std::string& doc_dir) {
    auto sweep = [](const std::string& dir, const std::string& prefix) {
        DIR* d = ::opendir(dir.c_str());
        if (!d) return;
        while (dirent* e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (n.rfind(prefix, 0) == 0 && n.find(".tmp.") != std::string::npos) {
                ::unlink((dir + "/" + n).c_str());
            }
        }
        ::closedir(d);
    };
    sweep(dir_of(index_path), "." + base_of(index_path) + ".tmp.");
    sweep(doc_dir, ".");
}

// ---- datasets ---------------------------------------------------------------------------------

Hid chunked_dcpl(int rank, const hsize_t* chunk, int compression) {
    Hid p(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    herr_t s = H5Pset_chunk(p.get(), rank, chunk);
    if (s >= 0 && compression > 0) s = H5Pset_shuffle(p.get());
    if (s >= 0 && compression > 0) s = H5Pset_deflate(p.get(), unsigned(compression));
    if (s >= 0) s = H5Pset_fletcher32(p.get());
    IF_CHECK(s >= 0, "HDF5: dataset properties: " << h5_error());
    return p;
}

void write_ints(hid_t parent, const char* name, const std::vector<int32_t>& v, int compression,
                const std::string& file) {
    const hsize_t dims[1] = {hsize_t(v.size())};
    const hsize_t chunk[1] = {std::min<hsize_t>(dims[0], 1u << 20)};
    Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    Hid dcpl = chunked_dcpl(1, chunk, compression);
    Hid d(
        H5Dcreate2(parent, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        H5Dclose);
    IF_CHECK(
        d.ok() &&
            H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0 &&
            d.close() >= 0,
        "cannot write '" << file << "': dataset " << name << ": " << h5_error());
}

void write_kv(hid_t parent, const char* name, const std::vector<float>& x, int n, int n_head_kv,
              int head_dim, StoreDType dtype, int compression, const std::string& file,
              std::vector<uint16_t>& scratch) {
    const hsize_t dims[3] = {hsize_t(n), hsize_t(n_head_kv), hsize_t(head_dim)};
    const size_t el = dtype == StoreDType::f32 ? 4 : 2;
    const size_t row_bytes = size_t(n_head_kv) * head_dim * el;
    const hsize_t rows = std::max<hsize_t>(1, std::min<hsize_t>(n, k_chunk_bytes / row_bytes));
    const hsize_t chunk[3] = {rows, dims[1], dims[2]};
    Hid space(H5Screate_simple(3, dims, nullptr), H5Sclose);
    Hid dcpl = chunked_dcpl(3, chunk, compression);
    Hid half;
    hid_t ftype = H5T_IEEE_F32LE, mtype = H5T_NATIVE_FLOAT;
    const void* buf = x.data();
    if (dtype != StoreDType::f32) {
        half = float16_type(dtype == StoreDType::bf16);
        ftype = mtype = half.get();
        scratch.resize(x.size());
        if (dtype == StoreDType::f16) {
            for (size_t i = 0; i < x.size(); ++i) scratch[i] = fp32_to_fp16(x[i]);
        } else {
            for (size_t i = 0; i < x.size(); ++i) scratch[i] = fp32_to_bf16(x[i]);
        }
        buf = scratch.data();
    }
    Hid d(H5Dcreate2(parent, name, ftype, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
          H5Dclose);
    IF_CHECK(d.ok() && H5Dwrite(d.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0 &&
                 d.close() >= 0,
             "cannot write '" << file << "': dataset " << name << ": " << h5_error());
}

// Opens dataset `name`, checks its shape is `dims`, reads it; checksum failures name it.
void read_dataset(hid_t parent, const std::string& name, const std::vector<hsize_t>& dims,
                  hid_t mtype, void* out, const std::string& file, const std::string& key) {
    Hid d(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
    IF_CHECK(d.ok(), "KV store document " << key << " ('" << file << "'): dataset '" << name
                                          << "' is missing: " << h5_error());
    Hid space(H5Dget_space(d.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> have(std::max(rank, 0));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), have.data(), nullptr);
    IF_CHECK(have == dims, "KV store document " << key << " ('" << file << "'): dataset '" << name
                                                << "' has the wrong shape");
    IF_CHECK(H5Dread(d.get(), mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0,
             "KV store document " << key << " ('" << file << "'): dataset '" << name
                                  << "' cannot be read: " << h5_error()
                                  << " (corrupt file; delete the document or rebuild the store)");
}

// ---- the store --------------------------------------------------------------------------------

class Hdf5KvStore final : public KvStore {
  public:
    Hdf5KvStore(const StoreOptions& opt, const StoreIdentity& id)
        : opt_(opt), id_(id), doc_dir_(opt.path + ".d") {
        h5_quiet();
        if (file_exists(opt_.path)) {
            read_index();
        } else {
            IF_CHECK(opt_.writable, "KV store '" << opt_.path
                                                 << "' does not exist (build it with job = "
                                                    "\"cache-build\", or set store.mode = "
                                                    "\"read-write\")");
        }
    }

    const std::string& path() const override { return opt_.path; }
    const StoreIdentity& identity() const override { return id_; }
    bool contains(const std::string& key) const override { return keys_.count(key) > 0; }
    int n_documents() const override { return int(keys_.size()); }

    uint64_t document_bytes(const std::string& key) const override {
        struct stat st {};
        if (::stat(doc_path(key).c_str(), &st) != 0) return 0;
        return uint64_t(st.st_size);
    }

    StoredChunk load(const std::string& key, const std::vector<int32_t>& tokens) const override {
        h5_quiet();
        IF_CHECK(contains(key), "KV store '" << opt_.path << "' has no document " << key);
        const std::string file = doc_path(key);
        Hid f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
        IF_CHECK(f.ok(), "KV store '" << opt_.path << "': cannot open document file '" << file
                                      << "': " << h5_error());
        check_identity(f.get(), id_, file);
        IF_CHECK(read_int_attr(f.get(), "complete", file) == 1,
                 "KV store document " << key << " ('" << file << "') is not complete");
        StoredChunk c;
        c.key = read_str_attr(f.get(), "key", file);
        IF_CHECK(c.key == key, "KV store document file '" << file << "' holds key " << c.key);
        const int64_t n = read_int_attr(f.get(), "n_tokens", file);
        c.sink_id = int32_t(read_int_attr(f.get(), "sink_id", file));
        c.chunking = read_str_attr(f.get(), "chunking", file);
        IF_CHECK(n == int64_t(tokens.size()),
                 "KV store document " << key << " ('" << file << "') has " << n
                                      << " tokens, the request's chunk " << tokens.size());
        c.tokens.resize(n);
        c.local_pos.resize(n);
        read_dataset(f.get(), "tokens", {hsize_t(n)}, H5T_NATIVE_INT32, c.tokens.data(), file, key);
        IF_CHECK(c.tokens == tokens, "KV store document " << key << " ('" << file
                                                          << "'): its token ids differ from the "
                                                             "request's chunk (key collision)");
        read_dataset(f.get(), "positions", {hsize_t(n)}, H5T_NATIVE_INT32, c.local_pos.data(), file,
                     key);
        const size_t count = size_t(n) * id_.n_head_kv * id_.head_dim;
        const std::vector<hsize_t> dims = {hsize_t(n), hsize_t(id_.n_head_kv),
                                           hsize_t(id_.head_dim)};
        Hid half;
        if (id_.dtype != StoreDType::f32) half = float16_type(id_.dtype == StoreDType::bf16);
        std::vector<uint16_t> raw;
        c.k.resize(id_.n_layer);
        c.v.resize(id_.n_layer);
        char lname[32];
        for (int l = 0; l < id_.n_layer; ++l) {
            std::snprintf(lname, sizeof(lname), "layer_%03d", l);
            for (int which = 0; which < 2; ++which) {
                std::vector<float>& dst = which == 0 ? c.k[l] : c.v[l];
                const std::string name = std::string(lname) + (which == 0 ? "/k" : "/v");
                dst.resize(count);
                if (id_.dtype == StoreDType::f32) {
                    read_dataset(f.get(), name, dims, H5T_NATIVE_FLOAT, dst.data(), file, key);
                    continue;
                }
                raw.resize(count);
                read_dataset(f.get(), name, dims, half.get(), raw.data(), file, key);
                if (id_.dtype == StoreDType::f16) {
                    f16_to_f32(raw.data(), dst.data(), count);
                } else {
                    for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_fp32(raw[i]);
                }
            }
            // A point for job serve's time slice (pieces.h): a document's read is otherwise
            // one piece of ~5-10 ms (a 390-token SmolLM2 document).
            piece_done(0.0);
        }
        return c;
    }

    int add(const std::vector<const StoredChunk*>& chunks) override {
        IF_CHECK(opt_.writable, "KV store '" << opt_.path << "' is open read-only "
                                             << "(store.mode = \"read\")");
        h5_quiet();
        std::error_code ec;
        const std::string parent = dir_of(opt_.path);
        std::filesystem::create_directories(parent, ec);
        IF_CHECK(!ec, "cannot write KV store '" << opt_.path << "': cannot create folder '"
                                                << parent << "': " << ec.message());
        WriterLock lock(opt_.path, opt_.lock_timeout_s);
        // Another writer may have committed since we read the index.
        if (file_exists(opt_.path)) read_index();
        if (::mkdir(doc_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
            IF_FAIL("cannot write KV store '" << opt_.path << "': cannot create '" << doc_dir_
                                              << "': " << errno_str(errno));
        }
        remove_stale_temps(opt_.path, doc_dir_);
        std::set<std::string> added;
        for (const StoredChunk* c : chunks) {
            if (keys_.count(c->key) || added.count(c->key)) continue;
            write_document(*c);
            added.insert(c->key);
        }
        if (added.empty()) return 0;
        std::set<std::string> all = keys_;
        all.insert(added.begin(), added.end());
        write_index(all);
        keys_ = std::move(all);
        return int(added.size());
    }

  private:
    std::string doc_path(const std::string& key) const { return doc_dir_ + "/" + key + ".h5"; }

    void read_index() {
        Hid f(H5Fopen(opt_.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
        IF_CHECK(f.ok(), "cannot open KV store '" << opt_.path << "': " << h5_error()
                                                  << " (not an HDF5 file, or damaged)");
        check_identity(f.get(), id_, opt_.path);
        Hid g(H5Gopen2(f.get(), "documents", H5P_DEFAULT), H5Gclose);
        IF_CHECK(g.ok(), "KV store '" << opt_.path << "': group /documents is missing");
        std::set<std::string> keys;
        auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
            static_cast<std::set<std::string>*>(data)->insert(name);
            return 0;
        };
        hsize_t idx = 0;
        IF_CHECK(H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &keys) >= 0,
                 "KV store '" << opt_.path << "': cannot list /documents: " << h5_error());
        keys_ = std::move(keys);
    }

    void write_document(const StoredChunk& c) {
        const std::string target = doc_path(c.key);
        const int n = c.size();
        IF_CHECK(n > 0, "KV store: document " << c.key << " has no tokens");
        IF_CHECK(int(c.k.size()) == id_.n_layer && int(c.v.size()) == id_.n_layer &&
                     int(c.local_pos.size()) == n,
                 "KV store: document " << c.key << " has the wrong number of layers");
        AtomicFile tmp(target);
        {
            Hid f(H5Fcreate(tmp.temp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                  H5Fclose);
            IF_CHECK(f.ok(), "cannot write KV store '" << opt_.path << "': cannot create '"
                                                       << tmp.temp_path() << "': " << h5_error());
            write_identity(f.get(), id_, target);
            write_ints(f.get(), "tokens", c.tokens, opt_.compression, target);
            write_ints(f.get(), "positions", c.local_pos, opt_.compression, target);
            std::vector<uint16_t> scratch;
            char lname[32];
            const size_t count = size_t(n) * id_.n_head_kv * id_.head_dim;
            for (int l = 0; l < id_.n_layer; ++l) {
                IF_CHECK(c.k[l].size() == count && c.v[l].size() == count,
                         "KV store: document " << c.key << " layer " << l << " has the wrong size");
                std::snprintf(lname, sizeof(lname), "layer_%03d", l);
                Hid g(H5Gcreate2(f.get(), lname, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
                IF_CHECK(g.ok(),
                         "cannot write '" << target << "': group " << lname << ": " << h5_error());
                write_kv(g.get(), "k", c.k[l], n, id_.n_head_kv, id_.head_dim, id_.dtype,
                         opt_.compression, target, scratch);
                write_kv(g.get(), "v", c.v[l], n, id_.n_head_kv, id_.head_dim, id_.dtype,
                         opt_.compression, target, scratch);
            }
            write_attr(f.get(), "key", c.key, target);
            write_attr(f.get(), "n_tokens", n, target);
            write_attr(f.get(), "sink_id", c.sink_id, target);
            write_attr(f.get(), "chunking", c.chunking, target);
            write_attr(f.get(), "complete", 1, target);  // last: a reader checks it
            IF_CHECK(f.close() >= 0, "cannot write KV store document '" << target
                                                                        << "': " << h5_error()
                                                                        << " (file system full?)");
        }
        tmp.commit();
    }

    void write_index(const std::set<std::string>& keys) {
        AtomicFile tmp(opt_.path);
        {
            Hid f(H5Fcreate(tmp.temp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                  H5Fclose);
            IF_CHECK(f.ok(), "cannot write KV store '" << opt_.path << "': " << h5_error());
            write_identity(f.get(), id_, opt_.path);
            Hid g(H5Gcreate2(f.get(), "documents", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Gclose);
            IF_CHECK(g.ok(), "cannot write KV store '" << opt_.path << "': " << h5_error());
            // Relative to the index's folder: HDF5 (and h5py) resolve it there.
            const std::string rel = base_of(opt_.path) + ".d/";
            for (const std::string& k : keys) {
                IF_CHECK(H5Lcreate_external((rel + k + ".h5").c_str(), "/", g.get(), k.c_str(),
                                            H5P_DEFAULT, H5P_DEFAULT) >= 0,
                         "cannot write KV store '" << opt_.path << "': link " << k << ": "
                                                   << h5_error());
            }
            write_attr(f.get(), "n_documents", int64_t(keys.size()), opt_.path);
            g.close();
            IF_CHECK(f.close() >= 0, "cannot write KV store '" << opt_.path << "': " << h5_error()
                                                               << " (file system full?)");
        }
        tmp.commit();
    }

    StoreOptions opt_;
    StoreIdentity id_;
    std::string doc_dir_;
    std::set<std::string> keys_;
};

}  // namespace

std::unique_ptr<KvStore> open_hdf5_kv_store(const StoreOptions& opt, const StoreIdentity& id) {
    return std::make_unique<Hdf5KvStore>(opt, id);
}

}  // namespace infoflow
