// Tests of the file utilities: whole-file reads, atomic writes (no temp file left behind on
// success or failure), FNV-1a hashing.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

using namespace infoflow;

namespace {

// A fresh directory under $TMPDIR (or /tmp), removed with its files at scope exit.
struct TempDir {
    std::string path;
    TempDir() {
        const char* base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/infoflow_fs_XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        REQUIRE(::mkdtemp(buf.data()) != nullptr);
        path = buf.data();
    }
    ~TempDir() {
        for (const auto& f : list()) ::unlink((path + "/" + f).c_str());
        ::rmdir(path.c_str());
    }
    std::vector<std::string> list() const {
        std::vector<std::string> out;
        if (DIR* d = ::opendir(path.c_str())) {
            while (dirent* e = ::readdir(d)) {
                const std::string n = e->d_name;
                if (n != "." && n != "..") out.push_back(n);
            }
            ::closedir(d);
        }
        return out;
    }
};

}  // namespace

TEST_CASE("read_file returns the bytes and names the path on errors", "[cpu][fs]") {
    TempDir dir;
    const std::string p = dir.path + "/a.bin";
    const std::string bytes = std::string("hello\0world\n", 12);
    write_file_atomic(p, bytes);
    CHECK(read_file(p) == bytes);
    CHECK(file_exists(p));
    CHECK_FALSE(file_exists(dir.path));
    CHECK_FALSE(file_exists(dir.path + "/missing.txt"));

    const std::string missing = dir.path + "/missing.txt";
    CHECK_THROWS_WITH(read_file(missing),
                      Catch::Contains("'" + missing + "'") && Catch::Contains("No such file"));
    CHECK_THROWS_WITH(read_file(dir.path), Catch::Contains("'" + dir.path + "'"));

    write_file_atomic(dir.path + "/empty", "");
    CHECK(read_file(dir.path + "/empty").empty());
}

TEST_CASE("write_file_atomic replaces the target and leaves no temp file", "[cpu][fs]") {
    TempDir dir;
    const std::string p = dir.path + "/out.json";
    write_file_atomic(p, "first");
    write_file_atomic(p, "second, longer");
    CHECK(read_file(p) == "second, longer");
    CHECK(dir.list() == std::vector<std::string>{"out.json"});
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0644);

    // A large write goes through several write() calls.
    const std::string big(5 << 20, 'x');
    write_file_atomic(p, big);
    CHECK(read_file(p).size() == big.size());
    CHECK(dir.list() == std::vector<std::string>{"out.json"});
}

TEST_CASE("write_file_atomic fails cleanly", "[cpu][fs]") {
    TempDir dir;
    SECTION("missing target directory") {
        const std::string p = dir.path + "/no_such_dir/out.json";
        CHECK_THROWS_WITH(write_file_atomic(p, "x"), Catch::Contains("'" + p + "'"));
        CHECK(dir.list().empty());
    }
    SECTION("target is a directory: the old content is kept, the temp file removed") {
        const std::string sub = dir.path + "/sub";
        REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
        write_file_atomic(sub + "/keep", "k");
        CHECK_THROWS_WITH(write_file_atomic(sub, "x"), Catch::Contains("'" + sub + "'"));
        CHECK(dir.list() == std::vector<std::string>{"sub"});
        CHECK(read_file(sub + "/keep") == "k");
        ::unlink((sub + "/keep").c_str());
        ::rmdir(sub.c_str());
    }
    SECTION("empty path") { CHECK_THROWS_AS(write_file_atomic("", "x"), Error); }
}

TEST_CASE("AtomicFile commits by name or removes its temp file", "[cpu][fs]") {
    TempDir dir;
    const std::string p = dir.path + "/cache.h5";
    {
        AtomicFile f(p);
        CHECK(f.temp_path() != p);
        CHECK(f.temp_path().rfind(dir.path + "/", 0) == 0);
        CHECK(dir.list().size() == 1);  // the reserved temp file
        // Not committed: the destructor removes it.
    }
    CHECK(dir.list().empty());
    {
        AtomicFile f(p);
        AtomicFile g(std::move(f));  // ownership moves; only g removes or commits
        write_file_atomic(dir.path + "/other", "o");
        REQUIRE(::rename((dir.path + "/other").c_str(), g.temp_path().c_str()) == 0);
        g.commit();
        CHECK_THROWS_AS(g.commit(), Error);
    }
    CHECK(read_file(p) == "o");
    CHECK(dir.list() == std::vector<std::string>{"cache.h5"});
}

TEST_CASE("fnv1a64 matches the reference values and chains", "[cpu][fs]") {
    // Reference vectors of 64-bit FNV-1a.
    CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
    CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
    CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
    CHECK(fnv1a64("bar", fnv1a64("foo")) == fnv1a64("foobar"));
    CHECK(hex64(255) == "00000000000000ff");
    CHECK(fnv1a64_hex("foobar") == "85944171f73967e8");
}
