// Regression tests of the parser findings (docs/design.md §11), each built from its reproducer: a
// tokenizer.json token id used to size an allocation (id 4e9: bare std::bad_alloc; id 5e7: minutes
// of allocating); a field of the wrong JSON type escaped as a JSON library exception naming
// neither the file nor the key; empty tensors passed null pointers to memcpy (undefined
// behaviour, reported by the UBSan build of the test suite).
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/safetensors.h"
#include "runtime/formats/safetensors_writer.h"
#include "runtime/formats/tokenizer.h"
#include "tests/test_util.h"

using namespace infoflow;
using Catch::Contains;
using json = nlohmann::json;

namespace {

// A small valid byte-level tokenizer.json: "a".."z" as ids 0..25, one merge.
json small_tokenizer() {
    json vocab = json::object();
    for (int i = 0; i < 26; ++i) vocab[std::string(1, char('a' + i))] = i;
    vocab["ab"] = 26;
    return {{"added_tokens", json::array()},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

std::string write_json(const std::string& name, const json& j) {
    const std::string p = test::shared_temp_dir("parser_faults") + "/" + name;
    write_file_atomic(p, j.dump());
    return p;
}

}  // namespace

TEST_CASE("a huge tokenizer.json token id is an error naming the file, at once",
          "[tokenizer][faults]") {
    CHECK_NOTHROW(Tokenizer::from_hf_json(write_json("ok.json", small_tokenizer())));
    for (int64_t id : {int64_t(4000000000), int64_t(50000000), int64_t(70000)}) {
        CAPTURE(id);
        json j = small_tokenizer();
        j["added_tokens"] = json::array({{{"id", id}, {"content", "<x>"}, {"special", true}}});
        const std::string p = write_json("big_added.json", j);
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_THROWS_WITH(Tokenizer::from_hf_json(p), Contains(p) && Contains("token id"));
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
        json k = small_tokenizer();
        k["model"]["vocab"]["zz"] = id;
        const std::string q = write_json("big_vocab.json", k);
        CHECK_THROWS_WITH(Tokenizer::from_hf_json(q), Contains(q) && Contains("token id"));
    }
}

TEST_CASE("tokenizer.json fields of the wrong JSON type are errors naming the file",
          "[tokenizer][faults]") {
    std::vector<json> bad;
    json a = small_tokenizer();
    a["model"]["type"] = 5;
    bad.push_back(a);
    json b = small_tokenizer();
    b["added_tokens"] = json::array({{{"id", 27}, {"content", "<x>"}, {"special", "yes"}}});
    bad.push_back(b);
    json c = small_tokenizer();
    c["pre_tokenizer"]["type"] = json::array();
    bad.push_back(c);
    json d = small_tokenizer();
    d["model"]["byte_fallback"] = "no";
    bad.push_back(d);
    for (size_t i = 0; i < bad.size(); ++i) {
        CAPTURE(i);
        const std::string p = write_json("bad_type.json", bad[i]);
        try {
            Tokenizer::from_hf_json(p);
            FAIL("accepted");
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Contains(p));
        } catch (const std::exception& e) {
            FAIL("escaped as a non-infoflow exception: " << e.what());
        }
    }
}

TEST_CASE("empty tensors never pass null pointers to memcpy", "[dequant][safetensors][faults]") {
    // Run under UBSan (launch/test-sanitizers.sh) these calls used to report "null pointer passed
    // as argument declared to never be null".
    dequantize_row_f32(nullptr, nullptr, 0);
    quantize_row(uint32_t(GgmlType::F32), nullptr, nullptr, 0);
    SafetensorsWriter w;
    w.add_tensor("empty", {0, 4}, "F32", nullptr);
    w.add_tensor("one", {1}, "F32", std::vector<float>{3.0f}.data());
    const std::string p = test::shared_temp_dir("parser_faults") + "/empty.safetensors";
    w.write(p);
    SafetensorsFile f(p);
    CHECK(f.read_f32("empty").empty());
    CHECK(f.read_f32("one") == std::vector<float>{3.0f});
}
