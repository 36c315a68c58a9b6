// GGUF reader and writer: a tiny file with every metadata type and tensor type read back,
// corrupted header fields, every truncation, seeded mutation fuzzing (must throw
// infoflow::Error, never crash), and the real SmolLM2 file against docs/formats.md §8.3.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/gguf_writer.h"
#include "tests/test_util.h"

using namespace infoflow;

namespace {

const std::string& tmp_dir() { return test::shared_temp_dir("gguf"); }

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
    const std::string p = tmp_dir() + "/" + name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    return p;
}

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.1f);
    return v;
}

constexpr uint32_t T(GgmlType t) { return uint32_t(t); }

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1};

GgufWriter full_writer(uint32_t alignment = 32) {
    GgufWriter w(alignment);
    w.set_u8("t.u8", 200);
    w.set_i8("t.i8", -100);
    w.set_u16("t.u16", 60000);
    w.set_i16("t.i16", -30000);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_u64("t.u64", 0xFFFFFFFFFFFFFFFFull);
    w.set_i64("t.i64", -9000000000000000000ll);
    w.set_f32("t.f32", 1e-5f);
    w.set_f64("t.f64", 3.141592653589793);
    w.set_bool("t.bool", true);
    w.set_string("t.str", "héllo\nworld");
    w.set_string("t.empty", "");
    w.set_string_array("t.strs", {"a", "", "Ġthe"});
    w.set_i32_array("t.i32s", {1, -2, 3});
    w.set_f32_array("t.f32s", {0.5f, -1.5f});
    w.set_u32_array("t.u32s", {7});
    w.set_i64_array("t.i64s", {});
    GgufValue inner;
    inner.type = 9;
    inner.elem_type = 0;
    for (int k = 0; k < 3; ++k) {
        GgufValue e;
        e.type = 0;
        e.u = uint64_t(k + 1);
        inner.array.push_back(e);
    }
    GgufValue outer;
    outer.type = 9;
    outer.elem_type = 9;
    outer.array = {inner, inner};
    outer.array[1].array.pop_back();
    w.set_value("t.nested", outer);
    int k = 0;
    for (GgmlType t : kTypes) {
        const std::vector<float> x = ramp(64 * 3, 0.5f + k);
        w.add_tensor(std::string("w.") + ggml_type_name(T(t)), {64, 3}, T(t), x.data());
        ++k;
    }
    const std::vector<float> v = ramp(5, 1.0f);
    w.add_tensor("vec", {5}, T(GgmlType::F32), v.data());
    const std::vector<float> v4 = ramp(2 * 3 * 4 * 32, 1.0f);
    w.add_tensor("four_d", {32, 4, 3, 2}, T(GgmlType::Q8_0), v4.data());
    return w;
}

// A minimal file with known field offsets: kv "a" = u32 7; tensor "t" F32 ne [32].
//   0 magic | 4 version | 8 n_tensors | 16 n_kv | 24 key len | 32 "a" | 33 type | 37 value |
//   41 name len | 49 "t" | 50 n_dims | 54 ne[0] | 62 type | 66 offset | 74..96 pad | 96 data
std::vector<uint8_t> minimal_file() {
    GgufWriter w;
    w.set_u32("a", 7);
    const std::vector<float> x = ramp(32, 1.0f);
    w.add_tensor("t", {32}, T(GgmlType::F32), x.data());
    return w.to_bytes();
}

template <typename V>
void poke(std::vector<uint8_t>& b, size_t at, V v) {
    std::memcpy(&b[at], &v, sizeof v);
}

std::string error_of(const std::vector<uint8_t>& b, const std::string& name) {
    const std::string p = write_bytes(name, b);
    try {
        GgufFile f(p);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Opens a file and touches everything a loader would; returns false when it threw Error.
bool parse_and_touch(const std::string& p) {
    try {
        GgufFile f(p);
        for (const auto& [k, v] : f.metadata()) (void)v.array.size();
        for (const auto& t : f.tensors()) {
            if (!ggml_type_dequantizable(t.type) || t.n_elements() > (1u << 20)) continue;
            std::vector<float> y(size_t(t.n_elements()));
            dequantize_row(t.type, f.tensor_data(t), y.data(), int64_t(y.size()));
        }
        return true;
    } catch (const Error&) {
        return false;
    }
}

}  // namespace

TEST_CASE("GGUF: write and read back every metadata and tensor type", "[gguf]") {
    for (uint32_t alignment : {32u, 64u}) {
        INFO("alignment " << alignment);
        const std::string p = tmp_dir() + "/full.gguf";
        full_writer(alignment).write(p);
        GgufFile f(p);
        CHECK(f.version() == 3);
        CHECK(f.data_start() % alignment == 0);
        CHECK(f.get_int("t.u8") == 200);
        CHECK(f.get_int("t.i8") == -100);
        CHECK(f.get_int("t.u16") == 60000);
        CHECK(f.get_int("t.i16") == -30000);
        CHECK(f.get_int("t.u32") == 4000000000ll);
        CHECK(f.get_int("t.i32") == -2000000000);
        CHECK(f.value("t.u64").u == 0xFFFFFFFFFFFFFFFFull);
        CHECK_THROWS_AS(f.get_int("t.u64"), Error);  // does not fit int64
        CHECK(f.get_int("t.i64") == -9000000000000000000ll);
        CHECK(f.get_float("t.f32") == double(1e-5f));
        CHECK(f.get_float("t.f64") == 3.141592653589793);
        CHECK(f.get_bool("t.bool"));
        CHECK(f.get_string("t.str") == "héllo\nworld");
        CHECK(f.get_string("t.empty").empty());
        CHECK(f.get_string_array("t.strs") == std::vector<std::string>{"a", "", "Ġthe"});
        CHECK(f.get_int_array("t.i32s") == std::vector<int64_t>{1, -2, 3});
        CHECK(f.get_float_array("t.f32s") == std::vector<double>{0.5, -1.5});
        CHECK(f.get_int_array("t.u32s") == std::vector<int64_t>{7});
        CHECK(f.get_int_array("t.i64s").empty());
        const GgufValue& n = f.value("t.nested");
        REQUIRE(n.array.size() == 2);
        CHECK(n.elem_type == 9);
        REQUIRE(n.array[0].array.size() == 3);
        CHECK(n.array[0].array[2].u == 3);
        CHECK(n.array[1].array.size() == 2);
        CHECK(f.get_int_or("missing", 5) == 5);
        CHECK(f.get_string_or("missing", "x") == "x");
        CHECK(f.get_bool_or("missing", true));
        CHECK(f.get_float_or("t.f64", 0) == 3.141592653589793);
        if (alignment != 32) CHECK(f.get_int("general.alignment") == alignment);

        // Wrong types and missing keys name the key.
        try {
            f.get_int("t.str");
            FAIL("no error");
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Catch::Contains("t.str") && Catch::Contains("string"));
        }
        try {
            f.get_string("nope.key");
            FAIL("no error");
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Catch::Contains("nope.key") && Catch::Contains("full.gguf"));
        }
        CHECK_THROWS_AS(f.get_bool("t.u8"), Error);
        CHECK_THROWS_AS(f.get_string_array("t.i32s"), Error);
        CHECK_THROWS_AS(f.get_float("t.str"), Error);

        REQUIRE(f.tensors().size() == 10);
        int k = 0;
        for (GgmlType t : kTypes) {
            const std::string name = std::string("w.") + ggml_type_name(T(t));
            INFO(name);
            const GgufTensorInfo* ti = f.find_tensor(name);
            REQUIRE(ti);
            CHECK(ti->type == T(t));
            CHECK(ti->ne == std::vector<uint64_t>{64, 3});
            CHECK(ti->n_elements() == 192);
            CHECK(ti->offset % alignment == 0);
            CHECK(ti->n_bytes == ggml_row_bytes(T(t), 64) * 3);
            const std::vector<float> x = ramp(192, 0.5f + k);
            std::vector<uint8_t> q(ti->n_bytes);
            quantize_row(T(t), x.data(), q.data(), 192);
            CHECK(std::memcmp(f.tensor_data(*ti), q.data(), q.size()) == 0);
            std::vector<float> y(192);
            dequantize_row(ti->type, f.tensor_data(*ti), y.data(), 192);
            if (t == GgmlType::F32) CHECK(y == x);
            for (int i = 0; i < 192; ++i) CHECK(std::fabs(y[i] - x[i]) <= 0.2f * (0.5f + k));
            ++k;
        }
        const GgufTensorInfo* d4 = f.find_tensor("four_d");
        REQUIRE(d4);
        CHECK(d4->ne == std::vector<uint64_t>{32, 4, 3, 2});
        CHECK(f.find_tensor("absent") == nullptr);
        CHECK(f.file_size() >= f.data_start() + d4->offset + d4->n_bytes);
    }
}

TEST_CASE("GGUF: version 2 files read", "[gguf]") {
    GgufWriter w;
    w.set_version(2);
    w.set_string("general.architecture", "llama");
    const std::string p = tmp_dir() + "/v2.gguf";
    w.write(p);
    GgufFile f(p);
    CHECK(f.version() == 2);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.tensors().empty());
}

TEST_CASE("GGUF: corrupted header fields give named errors", "[gguf]") {
    const std::vector<uint8_t> good = minimal_file();
    REQUIRE(good.size() == 96 + 128);
    {
        GgufFile f(write_bytes("min.gguf", good));
        REQUIRE(f.get_int("a") == 7);
        REQUIRE(f.find_tensor("t"));
        REQUIRE(f.data_start() == 96);
    }
    struct Mut {
        const char* what;
        size_t at;
        uint64_t value;
        int width;
        const char* expect;
    };
    const Mut muts[] = {
        {"magic", 0, 0x46554748, 4, "magic"},
        {"version 1", 4, 1, 4, "version 1"},
        {"version 4", 4, 4, 4, "version 4"},
        {"big-endian", 4, 0x03000000, 4, "big-endian"},
        {"tensor count", 8, 1ull << 40, 8, "tensor count"},
        {"kv count", 16, 1ull << 40, 8, "metadata count"},
        {"key length", 24, 1ull << 62, 8, "truncated"},
        {"value type", 33, 13, 4, "unknown value type 13"},
        {"name length", 41, 1000, 8, "truncated"},
        {"n_dims 5", 50, 5, 4, "5 dimensions"},
        {"n_dims 0", 50, 0, 4, "0 dimensions"},
        {"ne[0] not a block multiple", 62, T(GgmlType::Q6_K), 4, "block size"},
        {"retired type", 62, 4, 4, "unknown ggml type"},
        {"unknown type", 62, 17, 4, "type 17"},
        {"misaligned offset", 66, 4, 8, "alignment"},
        {"offset past the end", 66, 1ull << 20, 8, "past the end"},
        {"ne too big", 54, 1ull << 50, 8, "impossible shape"},
    };
    for (const Mut& m : muts) {
        INFO(m.what);
        std::vector<uint8_t> b = good;
        if (m.width == 4) poke<uint32_t>(b, m.at, uint32_t(m.value));
        if (m.width == 8) poke<uint64_t>(b, m.at, m.value);
        const std::string err = error_of(b, "mut.gguf");
        CHECK_THAT(err, Catch::Contains(m.expect));
        CHECK_THAT(err, Catch::Contains("mut.gguf"));
    }
    // Errors name the tensor at fault.
    std::vector<uint8_t> b = good;
    poke<uint32_t>(b, 50, 9);
    CHECK_THAT(error_of(b, "mut.gguf"), Catch::Contains("tensor 't'"));

    // Bad values that need a writer: bad alignment, bool 2, deep nesting, overlap, duplicates.
    {
        GgufWriter w;
        w.set_u32("general.alignment", 33);
        CHECK_THAT(error_of(w.to_bytes(), "align.gguf"), Catch::Contains("power of two"));
        GgufWriter w2;
        w2.set_u32("general.alignment", 0);
        CHECK_THAT(error_of(w2.to_bytes(), "align.gguf"), Catch::Contains("power of two"));
        GgufWriter w3;
        w3.set_string("general.alignment", "32");
        CHECK_THAT(error_of(w3.to_bytes(), "align.gguf"), Catch::Contains("general.alignment"));
    }
    {
        GgufWriter w;
        w.set_bool("flag", true);
        std::vector<uint8_t> bb = w.to_bytes();
        // header 24 + key len 8 + "flag" 4 + type 4 -> value at 40
        REQUIRE(bb[40] == 1);
        bb[40] = 2;
        CHECK_THAT(error_of(bb, "bool.gguf"), Catch::Contains("flag"));
    }
    {
        GgufValue v;
        v.type = 9;
        v.elem_type = 9;
        GgufValue* cur = &v;
        for (int d = 0; d < 20; ++d) {
            cur->array.resize(1);
            cur = &cur->array[0];
            cur->type = 9;
            cur->elem_type = d == 19 ? 0 : 9;
        }
        GgufWriter w;
        w.set_value("deep", v);
        CHECK_THAT(error_of(w.to_bytes(), "deep.gguf"), Catch::Contains("nested deeper"));
    }
    {
        // Two tensors at the same offset overlap.
        GgufWriter w;
        const std::vector<float> x = ramp(32, 1.0f);
        w.add_tensor("a", {32}, T(GgmlType::F32), x.data());
        w.add_tensor("b", {32}, T(GgmlType::F32), x.data());
        std::vector<uint8_t> bb = w.to_bytes();
        // tensor infos start at 24; "a": 8 + 1 + 4 + 8 + 4 = 25 bytes then the 8-byte offset.
        poke<uint64_t>(bb, 24 + 25 + 8 + 25, 0);
        CHECK_THAT(error_of(bb, "overlap.gguf"), Catch::Contains("overlap"));
        // Rename "b" to "a": duplicate tensor name.
        bb = w.to_bytes();
        bb[24 + 33 + 8] = 'a';
        CHECK_THAT(error_of(bb, "dup.gguf"), Catch::Contains("duplicate tensor"));
    }
    {
        GgufWriter w;
        w.set_u32("k1", 1);
        w.set_u32("k2", 2);
        std::vector<uint8_t> bb = w.to_bytes();
        bb[24 + 8 + 2 + 4 + 4 + 8 + 1] = '1';  // second key "k2" -> "k1"
        CHECK_THAT(error_of(bb, "dupkey.gguf"), Catch::Contains("duplicate metadata key"));
    }
    CHECK_THROWS_AS(GgufFile(tmp_dir() + "/does-not-exist.gguf"), Error);
    CHECK_THROWS_AS(GgufFile(tmp_dir()), Error);  // a directory
}

TEST_CASE("GGUF: every truncation throws", "[gguf]") {
    const std::vector<uint8_t> good = full_writer().to_bytes();
    const std::string p = write_bytes("whole.gguf", good);
    uint64_t data_end = 0;
    {
        GgufFile f(p);
        for (const auto& t : f.tensors()) {
            data_end = std::max<uint64_t>(data_end, f.data_start() + t.offset + t.n_bytes);
        }
    }
    size_t thrown = 0, ok = 0;
    for (size_t len = 0; len < good.size(); ++len) {
        const std::vector<uint8_t> cut(good.begin(), good.begin() + long(len));
        const bool parsed = parse_and_touch(write_bytes("cut.gguf", cut));
        if (len < data_end) {
            INFO("prefix length " << len << " of " << good.size());
            CHECK_FALSE(parsed);
        }
        (parsed ? ok : thrown)++;
    }
    CHECK(thrown >= data_end);
}

TEST_CASE("GGUF: seeded mutation fuzzing never crashes", "[gguf][fuzz]") {
    const std::vector<uint8_t> good = full_writer().to_bytes();
    std::mt19937_64 rng(20240607);
    int parsed = 0, rejected = 0;
    const int n_iter = 4000;
    for (int it = 0; it < n_iter; ++it) {
        std::vector<uint8_t> b = good;
        const int kind = int(rng() % 6);
        const size_t header_end = 1200;  // mutations concentrate on the header
        auto pos = [&](size_t limit) { return size_t(rng() % std::min(limit, b.size())); };
        if (kind == 0) {
            const int n = 1 + int(rng() % 4);
            for (int k = 0; k < n; ++k) b[pos(header_end)] ^= uint8_t(1u << (rng() % 8));
        } else if (kind == 1) {
            b[pos(header_end)] = uint8_t(rng());
        } else if (kind == 2) {
            // Overwrite 8 bytes with a "length-like" value.
            const size_t at = pos(header_end);
            const uint64_t vals[] = {0,          1,          0xFFFFFFFFFFFFFFFFull,
                                     1ull << 32, 1ull << 63, uint64_t(rng() % 4096)};
            const uint64_t v = vals[rng() % 6];
            for (int k = 0; k < 8 && at + k < b.size(); ++k) b[at + k] = uint8_t(v >> (8 * k));
        } else if (kind == 3) {
            b.resize(pos(b.size()));
        } else if (kind == 4) {
            const size_t at = pos(header_end);
            b.insert(b.begin() + long(at), uint8_t(rng()));
        } else {
            const size_t at = pos(header_end);
            b.erase(b.begin() + long(at));
        }
        (parse_and_touch(write_bytes("fuzz.gguf", b)) ? parsed : rejected)++;
    }
    // Random files: pure noise, and noise behind a valid magic + version.
    for (int it = 0; it < 500; ++it) {
        std::vector<uint8_t> b(size_t(rng() % 512));
        for (auto& c : b) c = uint8_t(rng());
        if (it % 2 && b.size() >= 8) {
            std::memcpy(b.data(), "GGUF", 4);
            b[4] = 3;
            b[5] = b[6] = b[7] = 0;
        }
        (parse_and_touch(write_bytes("noise.gguf", b)) ? parsed : rejected)++;
    }
    INFO("parsed " << parsed << ", rejected " << rejected);
    CHECK(rejected > n_iter / 4);
    CHECK(parsed + rejected == n_iter + 500);
}

TEST_CASE("GGUF: the real SmolLM2-135M-Instruct Q4_1 file", "[gguf][model]") {
    const std::string path = INFOFLOW_MODEL_PATH;
    if (access(path.c_str(), R_OK) != 0) {
        WARN("real model not found at " << path << ", skipping");
        return;
    }
    GgufFile f(path);
    CHECK(f.file_size() == 98362432);
    CHECK(f.version() == 3);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("general.file_type") == 3);
    CHECK(f.get_int("general.quantization_version") == 2);
    CHECK(f.get_int("llama.block_count") == 30);
    CHECK(f.get_int("llama.context_length") == 8192);
    CHECK(f.get_int("llama.embedding_length") == 576);
    CHECK(f.get_int("llama.feed_forward_length") == 1536);
    CHECK(f.get_int("llama.attention.head_count") == 9);
    CHECK(f.get_int("llama.attention.head_count_kv") == 3);
    CHECK(f.get_int("llama.rope.dimension_count") == 64);
    CHECK(f.get_int("llama.vocab_size") == 49152);
    CHECK(f.value("llama.rope.freq_base").type == 6);  // f32
    CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
    CHECK(float(f.get_float("llama.attention.layer_norm_rms_epsilon")) == 1e-5f);
    CHECK(f.value("llama.block_count").type == 4);  // u32
    CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
    CHECK(f.get_string("tokenizer.ggml.pre") == "smollm");
    CHECK(f.get_string_array("tokenizer.ggml.tokens").size() == 49152);
    CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == 49152);
    CHECK(f.value("tokenizer.ggml.token_type").elem_type == 5);  // i32
    CHECK(f.get_string_array("tokenizer.ggml.merges").size() == 48900);
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f.get_int("tokenizer.ggml.unknown_token_id") == 0);
    CHECK(f.get_int("tokenizer.ggml.padding_token_id") == 2);
    CHECK_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
    CHECK_THAT(f.get_string("tokenizer.chat_template"),
               Catch::StartsWith("{% for message in messages %}"));

    CHECK(f.tensors().size() == 272);
    int n_q41 = 0, n_f32 = 0, n_q80 = 0;
    uint64_t total = 0;
    for (const auto& t : f.tensors()) {
        total += t.n_bytes;
        n_q41 += t.type == T(GgmlType::Q4_1);
        n_f32 += t.type == T(GgmlType::F32);
        n_q80 += t.type == T(GgmlType::Q8_0);
        if (t.type == T(GgmlType::F32)) {
            CHECK(t.ne == std::vector<uint64_t>{576});
        }
    }
    CHECK(n_q41 == 210);
    CHECK(n_f32 == 61);
    CHECK(n_q80 == 1);
    CHECK(total == 96576768);
    CHECK(f.file_size() == f.data_start() + 96576768);
    CHECK(f.find_tensor("output.weight") == nullptr);
    const GgufTensorInfo* e = f.find_tensor("token_embd.weight");
    REQUIRE(e);
    CHECK(e->type == T(GgmlType::Q8_0));
    CHECK(e->ne == std::vector<uint64_t>{576, 49152});
    const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
    REQUIRE(q);
    CHECK(q->type == T(GgmlType::Q4_1));
    CHECK(q->ne == std::vector<uint64_t>{576, 576});
    CHECK(f.find_tensor("blk.29.ffn_down.weight")->ne == std::vector<uint64_t>{1536, 576});
    CHECK(f.find_tensor("blk.0.attn_k.weight")->ne == std::vector<uint64_t>{576, 192});

    // Plausible values: embedding row and a norm decode to finite, modest numbers.
    std::vector<float> row(576);
    dequantize_row(e->type, f.tensor_data(*e) + 612 * 100, row.data(), 576);
    double ss = 0;
    for (float v : row) {
        REQUIRE(std::isfinite(v));
        ss += v * v;
    }
    CHECK(ss > 0.0);
    CHECK(std::sqrt(ss / 576) < 1.0);
}
