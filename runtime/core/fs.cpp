// File utilities: whole-file reads, atomic writes (temp + fsync + rename), FNV-1a hashing.
#include "runtime/core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/core/error.h"

namespace infoflow {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Directory part of `path` ("." when there is none) and the file name part.
std::pair<std::string, std::string> split_path(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return {".", path};
    if (slash == 0) return {"/", path.substr(1)};
    return {path.substr(0, slash), path.substr(slash + 1)};
}

// Best effort: makes the rename durable. Some filesystems refuse fsync on directories.
void fsync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
}

}  // namespace

std::string read_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error("cannot read '" + path + "': " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
        ::close(fd);
        throw Error("cannot read '" + path + "': " + errno_text(err));
    }
    std::string out;
    if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
    std::vector<char> buf(1 << 16);
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            ::close(fd);
            throw Error("cannot read '" + path + "': " + errno_text(err));
        }
        if (n == 0) break;
        out.append(buf.data(), static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
}

bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

AtomicFile::AtomicFile(std::string target_path) : target_path_(std::move(target_path)) {
    IF_CHECK(!target_path_.empty(), "cannot write a file with an empty path");
    const auto [dir, base] = split_path(target_path_);
    IF_CHECK(!base.empty(), "cannot write '" << target_path_ << "': it names a directory");
    std::string tmpl = (dir == "/" ? "/" : dir + "/") + "." + base + ".tmp.XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
        throw Error("cannot write '" + target_path_ + "': cannot create a temp file in '" + dir +
                    "': " + errno_text(errno));
    }
    ::fchmod(fd, 0644);  // mkstemp creates 0600; results and caches are meant to be shared
    ::close(fd);
    temp_path_ = name.data();
}

AtomicFile::~AtomicFile() { discard(); }

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : target_path_(std::move(o.target_path_)),
      temp_path_(std::move(o.temp_path_)),
      committed_(o.committed_) {
    o.temp_path_.clear();
    o.committed_ = true;
}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
    if (this != &o) {
        discard();
        target_path_ = std::move(o.target_path_);
        temp_path_ = std::move(o.temp_path_);
        committed_ = o.committed_;
        o.temp_path_.clear();
        o.committed_ = true;
    }
    return *this;
}

void AtomicFile::discard() noexcept {
    if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
    temp_path_.clear();
}

void AtomicFile::commit() {
    IF_CHECK(!committed_ && !temp_path_.empty(),
             "AtomicFile for '" << target_path_ << "' committed twice");
    auto fail = [&](const std::string& what, int err) {
        discard();
        throw Error("cannot write '" + target_path_ + "': " + what + ": " + errno_text(err));
    };
    const int fd = ::open(temp_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot reopen the temp file", errno);
    if (::fsync(fd) != 0) {
        const int err = errno;
        ::close(fd);
        fail("fsync failed", err);
    }
    ::close(fd);
    if (::rename(temp_path_.c_str(), target_path_.c_str()) != 0) fail("rename failed", errno);
    committed_ = true;
    temp_path_.clear();
    fsync_dir(split_path(target_path_).first);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFile file(path);
    const int fd = ::open(file.temp_path().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) throw Error("cannot write '" + path + "': " + errno_text(errno));
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            ::close(fd);
            throw Error("cannot write '" + path + "': " + errno_text(err));
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) throw Error("cannot write '" + path + "': " + errno_text(errno));
    file.commit();
}

uint64_t fnv1a64(std::string_view bytes, uint64_t seed) {
    uint64_t h = seed;
    for (const char c : bytes) {
        h ^= static_cast<unsigned char>(c);
        h *= 0x100000001b3ull;
    }
    return h;
}

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string fnv1a64_hex(std::string_view bytes) { return hex64(fnv1a64(bytes)); }

}  // namespace infoflow
