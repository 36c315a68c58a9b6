// Small file utilities shared by the loaders and writers: whole-file reads whose errors name the
// path, atomic writes (temp file in the same directory + fsync + rename, so a crash or an error
// never leaves a half-written target, docs/design.md §8), and the FNV-1a hash used for config and cache
// fingerprints. Not a general filesystem layer: no directory walking, no locking.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace infoflow {

// Whole file as bytes. Throws infoflow::Error "cannot read 'PATH': REASON" on any failure.
std::string read_file(const std::string& path);

// True when `path` names an existing regular file (not a directory).
bool file_exists(const std::string& path);

// Replaces `path` with `bytes` atomically: the bytes go to a unique temp file next to `path`,
// are fsync'ed, then renamed over `path`, and the directory is fsync'ed. On any error the temp
// file is removed, `path` is left as it was, and infoflow::Error names `path`.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The same protocol for writers that need a file name rather than bytes (e.g. an HDF5 library
// writing by name): reserve a temp path next to the target, write it by any means, `commit()`.
// Destroying an uncommitted AtomicFile removes the temp file. Move-only.
class AtomicFile {
  public:
    explicit AtomicFile(std::string target_path);  // creates the (empty) temp file
    ~AtomicFile();
    AtomicFile(AtomicFile&& o) noexcept;
    AtomicFile& operator=(AtomicFile&& o) noexcept;
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    const std::string& temp_path() const { return temp_path_; }
    const std::string& target_path() const { return target_path_; }
    // fsync the temp file, rename it over the target, fsync the directory. Throws naming the
    // target (the temp file is then removed).
    void commit();

  private:
    void discard() noexcept;
    std::string target_path_;
    std::string temp_path_;
    bool committed_ = false;
};

// 64-bit FNV-1a. `seed` chains calls: fnv1a64(b, fnv1a64(a)) == fnv1a64(a + b).
constexpr uint64_t k_fnv1a64_offset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t seed = k_fnv1a64_offset);

// Lower-case hex, always 16 digits: hex64(255) == "00000000000000ff".
std::string hex64(uint64_t v);

// hex64(fnv1a64(bytes)).
std::string fnv1a64_hex(std::string_view bytes);

}  // namespace infoflow
