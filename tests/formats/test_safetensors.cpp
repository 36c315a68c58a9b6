// safetensors reader and writer (docs/formats.md §6): round trip of F32/F16/BF16 (+ raw dtypes, 0-rank
// and empty tensors), header validation with named errors, every truncation, seeded mutation
// fuzzing, and sharded directories with model.safetensors.index.json.
#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/formats/safetensors.h"
#include "runtime/formats/safetensors_writer.h"
#include "tests/test_util.h"

using namespace infoflow;

namespace {

const std::string& tmp_dir() { return test::shared_temp_dir("st"); }

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
    const std::string p = tmp_dir() + "/" + name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    return p;
}

void write_text(const std::string& p, const std::string& text) {
    std::ofstream out(p, std::ios::trunc);
    out << text;
}

// A file from a literal header and a buffer of `n_buffer` bytes.
std::vector<uint8_t> raw_file(const std::string& header, size_t n_buffer) {
    std::vector<uint8_t> b(8 + header.size() + n_buffer, 0);
    const uint64_t n = header.size();
    std::memcpy(b.data(), &n, 8);
    std::memcpy(b.data() + 8, header.data(), header.size());
    return b;
}

std::string error_of(const std::vector<uint8_t>& b, const std::string& name = "bad.safetensors") {
    const std::string p = write_bytes(name, b);
    try {
        SafetensorsFile f(p);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

SafetensorsWriter sample_writer() {
    SafetensorsWriter w;
    std::vector<float> a(6), b(12), c(5);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) - 2.5f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.25f * float(i);
    for (size_t i = 0; i < c.size(); ++i) c[i] = -1.0f - float(i);
    w.add_tensor("a.f32", {2, 3}, "F32", a.data());
    w.add_tensor("b.f16", {3, 4}, "F16", b.data());
    w.add_tensor("c.bf16", {5}, "BF16", c.data());
    const float s = 7.0f;
    w.add_tensor("scalar", {}, "F32", &s);
    w.add_tensor("empty", {0, 4}, "F32", nullptr);
    const int64_t ids[3] = {1, -2, 3};
    w.add_tensor_raw("ids", {3}, "I64", reinterpret_cast<const uint8_t*>(ids), sizeof ids);
    w.set_metadata("format", "pt");
    return w;
}

bool parse_and_touch(const std::string& p) {
    try {
        SafetensorsFile f(p);
        for (const auto& t : f.tensors()) {
            if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") continue;
            std::vector<float> y(size_t(t.numel()));
            f.read_f32(t, y.data());
        }
        return true;
    } catch (const Error&) {
        return false;
    }
}

}  // namespace

TEST_CASE("safetensors: write and read back", "[safetensors]") {
    const std::string p = tmp_dir() + "/sample.safetensors";
    sample_writer().write(p);
    SafetensorsFile f(p);
    CHECK((f.data_start() - 8) % 8 == 0);  // header padded to a multiple of 8
    CHECK(f.tensors().size() == 6);
    CHECK(f.metadata().at("format") == "pt");
    const auto& a = f.info("a.f32");
    CHECK(a.dtype == "F32");
    CHECK(a.shape == std::vector<int64_t>{2, 3});
    CHECK(f.read_f32("a.f32") == std::vector<float>{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f});
    auto b = f.read_f32("b.f16");
    REQUIRE(b.size() == 12);
    for (size_t i = 0; i < b.size(); ++i) CHECK(b[i] == 0.25f * float(i));
    CHECK(f.read_f32("c.bf16") == std::vector<float>{-1, -2, -3, -4, -5});
    CHECK(f.info("scalar").shape.empty());
    CHECK(f.read_f32("scalar") == std::vector<float>{7.0f});
    CHECK(f.info("empty").numel() == 0);
    CHECK(f.read_f32("empty").empty());
    try {
        f.read_f32("ids");
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("ids") && Catch::Contains("I64") &&
                                 Catch::Contains("sample.safetensors"));
    }
    try {
        f.info("nope");
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("nope"));
    }
    SafetensorsModel m(p);
    CHECK(m.has("b.f16"));
    CHECK(m.names().size() == 6);
    CHECK(m.read_f32("c.bf16")[4] == -5.0f);
}

TEST_CASE("safetensors: bad headers give named errors", "[safetensors]") {
    const std::string t = R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
    CHECK(error_of(raw_file("{" + t + "}", 8)).empty());
    struct Case {
        const char* what;
        std::vector<uint8_t> bytes;
        const char* expect;
    };
    std::vector<uint8_t> huge(16, 0);
    const uint64_t big = 100000001;
    std::memcpy(huge.data(), &big, 8);
    std::vector<uint8_t> past(16, 0);
    const uint64_t n = 100;
    std::memcpy(past.data(), &n, 8);
    const std::vector<Case> cases = {
        {"too short", {1, 2, 3}, "only 3 bytes"},
        {"header cap", huge, "exceeds the limit"},
        {"header past the end", past, "truncated"},
        {"not json", raw_file("{\"x\": ", 0), "not valid JSON"},
        {"not an object", raw_file("[1, 2]", 0), "not a JSON object"},
        {"entry not an object", raw_file("{\"x\": 5}", 0), "'x'"},
        {"unknown dtype",
         raw_file(R"({"x": {"dtype": "F17", "shape": [2], "data_offsets": [0, 8]}})", 8),
         "unknown dtype 'F17'"},
        {"missing dtype", raw_file(R"({"x": {"shape": [2], "data_offsets": [0, 8]}})", 8), "dtype"},
        {"negative dim",
         raw_file(R"({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
         "negative"},
        {"float dim",
         raw_file(R"({"x": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8),
         "shape"},
        {"size mismatch",
         raw_file(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
         "8 bytes for shape [3] of F32"},
        {"reversed offsets",
         raw_file(R"({"x": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
         "data_offsets"},
        {"past the buffer",
         raw_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
         "outside"},
        {"bad offsets",
         raw_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8),
         "data_offsets"},
        {"overlap",
         raw_file(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                 "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  12),
         "'y'"},
        {"gap",
         raw_file(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                  12),
         "tile"},
        {"trailing bytes", raw_file("{" + t + "}", 12), "cover 8 bytes of a 12-byte buffer"},
        {"metadata not strings", raw_file(R"({"__metadata__": {"a": 1}})", 0), "__metadata__"},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        const std::string err = error_of(c.bytes);
        CHECK_THAT(err, Catch::Contains(c.expect));
        CHECK_THAT(err, Catch::Contains("bad.safetensors"));
    }
    CHECK_THROWS_AS(SafetensorsFile(tmp_dir() + "/missing.safetensors"), Error);
}

TEST_CASE("safetensors: every truncation throws", "[safetensors]") {
    const std::vector<uint8_t> good = sample_writer().to_bytes();
    REQUIRE(parse_and_touch(write_bytes("whole.safetensors", good)));
    for (size_t len = 0; len < good.size(); ++len) {
        INFO("prefix length " << len << " of " << good.size());
        const std::vector<uint8_t> cut(good.begin(), good.begin() + long(len));
        CHECK_FALSE(parse_and_touch(write_bytes("cut.safetensors", cut)));
    }
}

TEST_CASE("safetensors: seeded mutation fuzzing never crashes", "[safetensors][fuzz]") {
    const std::vector<uint8_t> good = sample_writer().to_bytes();
    std::mt19937_64 rng(777);
    int parsed = 0, rejected = 0;
    const char interesting[] = "{}[]\":,0123456789-eE. FBUI";
    for (int it = 0; it < 3000; ++it) {
        std::vector<uint8_t> b = good;
        const size_t at = size_t(rng() % b.size());
        switch (rng() % 5) {
            case 0:
                b[at] ^= uint8_t(1u << (rng() % 8));
                break;
            case 1:
                b[at] = uint8_t(interesting[rng() % (sizeof interesting - 1)]);
                break;
            case 2:
                b.resize(at);
                break;
            case 3:
                b.insert(b.begin() + long(at), uint8_t(rng()));
                break;
            default:
                b[size_t(rng() % 8)] = uint8_t(rng());
                break;  // header length
        }
        (parse_and_touch(write_bytes("fuzz.safetensors", b)) ? parsed : rejected)++;
    }
    for (int it = 0; it < 300; ++it) {
        std::vector<uint8_t> b(size_t(rng() % 256));
        for (auto& c : b) c = uint8_t(rng());
        if (b.size() >= 8) {
            const uint64_t n = (rng() % 2) ? b.size() - 8 : rng() % 64;
            std::memcpy(b.data(), &n, 8);
        }
        (parse_and_touch(write_bytes("noise.safetensors", b)) ? parsed : rejected)++;
    }
    INFO("parsed " << parsed << ", rejected " << rejected);
    CHECK(rejected > 1000);
}

TEST_CASE("safetensors: sharded directory with index.json", "[safetensors]") {
    const std::string dir = tmp_dir() + "/sharded";
    ::mkdir(dir.c_str(), 0755);
    std::vector<float> x(8, 1.5f), y(4, -2.0f), z(2, 3.0f);
    SafetensorsWriter s1, s2;
    s1.add_tensor("x", {2, 4}, "F32", x.data());
    s1.add_tensor("y", {4}, "BF16", y.data());
    s2.add_tensor("z", {2}, "F16", z.data());
    s1.write(dir + "/model-00001-of-00002.safetensors");
    s2.write(dir + "/model-00002-of-00002.safetensors");
    const std::string index = dir + "/model.safetensors.index.json";
    write_text(index, R"({"metadata": {"total_size": 44}, "weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00001-of-00002.safetensors",
        "z": "model-00002-of-00002.safetensors"}})");
    SafetensorsModel m(dir);
    CHECK(m.names() == std::vector<std::string>{"x", "y", "z"});
    CHECK(m.files().size() == 2);
    CHECK(m.read_f32("x") == x);
    CHECK(m.read_f32("y") == y);
    CHECK(m.read_f32("z") == z);
    CHECK_THAT(m.file_of("z").path(), Catch::EndsWith("model-00002-of-00002.safetensors"));
    CHECK_THROWS_AS(m.info("w"), Error);

    // A tensor mapped to the wrong shard, a missing shard, a bad weight_map.
    write_text(index, R"({"weight_map": {"z": "model-00001-of-00002.safetensors"}})");
    try {
        SafetensorsModel bad(dir);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("'z'") && Catch::Contains("index.json"));
    }
    write_text(index, R"({"weight_map": {"z": "model-00003-of-00002.safetensors"}})");
    CHECK_THROWS_AS(SafetensorsModel(dir), Error);
    write_text(index, R"({"weight_map": {"z": "../../etc/passwd"}})");
    CHECK_THROWS_AS(SafetensorsModel(dir), Error);
    write_text(index, R"({"metadata": {}})");
    try {
        SafetensorsModel bad(dir);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("weight_map"));
    }
    write_text(index, "{not json");
    CHECK_THROWS_AS(SafetensorsModel(dir), Error);
    const std::string empty_dir = tmp_dir() + "/empty";
    ::mkdir(empty_dir.c_str(), 0755);
    try {
        SafetensorsModel bad(empty_dir);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("model.safetensors"));
    }
}
