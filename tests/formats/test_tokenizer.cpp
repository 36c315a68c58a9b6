// Tokenizer tests: agreement with llama.cpp on the real SmolLM2 GGUF (fixture from
// tests/fixtures/gen_oracle.py), docs/formats.md §8.5 vectors, special-token parsing, round trips,
// streaming decode, the tokenizer.json reader (both merge encodings, bad files) and the
// llama-bpe / qwen2 pre-tokenizers on a synthetic byte-level vocabulary.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"

using namespace infoflow;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string k_fixtures = std::string(INFOFLOW_SOURCE_DIR) + "/tests/fixtures/";

std::string real_model_path() {
    std::string p = INFOFLOW_MODEL_PATH;
    if (!fs::exists(p)) {
        FAIL("real model " << p << " is missing: run launch/setup.sh to fetch it");
    }
    return p;
}

const Tokenizer& smollm2() {
    static std::unique_ptr<Tokenizer> tok;
    if (!tok) {
        GgufFile f(real_model_path());
        tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
    }
    return *tok;
}

json read_json(const std::string& path) {
    std::ifstream in(path);
    if (!in) FAIL("cannot open " << path);
    return json::parse(in);
}

std::vector<std::string> corpus() {
    return read_json(k_fixtures + "tokenizer_corpus.json").get<std::vector<std::string>>();
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::ostringstream os;
    for (int32_t i : ids) os << i << ' ';
    return os.str();
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
    fs::path path;
    TempDir() {
        std::random_device rd;
        path = fs::temp_directory_path() / ("infoflow_tok_" + std::to_string(rd()));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// Random valid UTF-8 weighted toward what tokenizers find hard: whitespace runs, digits,
// combining marks, CJK, emoji with ZWJ, and arbitrary code points.
std::string random_utf8(std::mt19937& rng) {
    std::uniform_int_distribution<int> len_d(0, 40), cls_d(0, 19);
    auto in = [&](uint32_t lo, uint32_t hi) {
        return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    };
    const uint32_t spaces[] = {' ', ' ', ' ', '\n', '\t', '\r', 0xA0, 0x3000, 0x85, 0x2003};
    std::string s;
    int n = len_d(rng);
    for (int i = 0; i < n; ++i) {
        int c = cls_d(rng);
        uint32_t cp;
        if (c < 7) {
            cp = in(0x20, 0x7E);
        } else if (c < 9) {
            cp = spaces[in(0, 9)];
        } else if (c < 11) {
            cp = in('0', '9');
        } else if (c < 12) {
            cp = in(0xC0, 0x24F);
        } else if (c < 13) {
            cp = in(0x4E00, 0x9FFF);
        } else if (c < 14) {
            const uint32_t e[] = {0x1F600, 0x1F44D, 0x1F3FD, 0x200D, 0xFE0F, 0x2764, 0x1F1EB};
            cp = e[in(0, 6)];
        } else if (c < 15) {
            cp = in(0, 1) ? in(0x400, 0x4FF) : in(0x600, 0x6FF);
        } else if (c < 16) {
            cp = in(0x300, 0x36F);
        } else if (c < 17) {
            s += "<|im_end|>";
            continue;
        } else {
            do {
                cp = in(1, 0x10FFFF);
            } while (cp >= 0xD800 && cp <= 0xDFFF);
        }
        append_utf8(s, cp);
    }
    return s;
}

// tokenizer.json for the GGUF vocabulary: merges as "a b" strings or as ["a", "b"] pairs.
json hf_json_from_gguf(const GgufFile& f, bool pair_merges) {
    std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
    std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
    json vocab = json::object();
    json added = json::array();
    for (size_t i = 0; i < tokens.size(); ++i) {
        vocab[tokens[i]] = i;
        if (types[i] == 3) {
            added.push_back({{"id", i},
                             {"content", tokens[i]},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", false},
                             {"special", true}});
        }
    }
    json jm = json::array();
    for (const std::string& m : merges) {
        if (pair_merges) {
            size_t sp = m.find(' ', 1);
            jm.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
        } else {
            jm.push_back(m);
        }
    }
    json pre = {{"type", "Sequence"},
                {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                               {{"type", "ByteLevel"},
                                                {"add_prefix_space", false},
                                                {"trim_offsets", true},
                                                {"use_regex", true}}})}};
    return {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre},
            {"post_processor",
             {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", false},
              {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", jm}}}};
}

// GPT-2 byte map (docs/formats.md §7.2), written independently of the tokenizer's own.
std::string mapped_byte(int b) {
    static std::vector<std::string> table = [] {
        std::vector<std::string> t(256);
        uint32_t n = 0;
        for (int i = 0; i < 256; ++i) {
            bool same = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
            append_utf8(t[i], same ? i : 256 + n++);
        }
        return t;
    }();
    return table[b];
}

std::string mapped(const std::string& s) {
    std::string out;
    for (unsigned char c : s) out += mapped_byte(c);
    return out;
}

// A synthetic byte-level tokenizer.json: 256 byte tokens (id = byte), then the given merges.
json synthetic_json(const std::vector<std::pair<std::string, std::string>>& merges,
                    const json& pre_tokenizer, const json& normalizer, bool ignore_merges) {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[mapped_byte(b)] = b;
    json jm = json::array();
    int next = 256;
    for (const auto& m : merges) {
        std::string a = mapped(m.first), b = mapped(m.second);
        if (!vocab.contains(a + b)) vocab[a + b] = next++;
        jm.push_back(json::array({a, b}));
    }
    return {
        {"added_tokens", json::array()},
        {"normalizer", normalizer},
        {"pre_tokenizer", pre_tokenizer},
        {"model",
         {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", jm}}}};
}

// Bytes the vocabulary has no token for are dropped by encode (llama.cpp and HF do the same).
std::string drop_untokenizable(const Tokenizer& tok, const std::string& s) {
    std::string kept;
    for (unsigned char c : s) {
        if (tok.token_id(mapped_byte(c)) >= 0) kept += static_cast<char>(c);
    }
    return kept;
}

json split_pre(const std::string& regex) {
    return {{"type", "Sequence"},
            {"pretokenizers", json::array({{{"type", "Split"},
                                            {"pattern", {{"Regex", regex}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                           {{"type", "ByteLevel"},
                                            {"add_prefix_space", false},
                                            {"trim_offsets", false},
                                            {"use_regex", false}}})}};
}

const char* const k_hf_llama3_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const k_hf_qwen2_regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)"
                                     R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The decoded pieces of an encoding, for readable pre-tokenizer checks.
std::vector<std::string> pieces(const Tokenizer& tok, const std::string& s) {
    std::vector<std::string> out;
    for (int32_t id : tok.encode(s)) out.push_back(tok.token_to_piece(id));
    return out;
}

}  // namespace

TEST_CASE("SmolLM2 GGUF tokenizer metadata", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    CHECK(tok.n_vocab() == 49152);
    CHECK(tok.pre_name() == "smollm");
    CHECK(tok.bos_id() == 1);
    CHECK(tok.eos_id() == 2);
    CHECK(tok.eot_id() == 2);
    CHECK_FALSE(tok.add_bos());
    CHECK(tok.stop_ids() == std::vector<int32_t>{0, 2});
    CHECK(tok.is_stop(2));
    CHECK_FALSE(tok.is_stop(1));
    CHECK(tok.token_text(1) == "<|im_start|>");
    CHECK(tok.token_id("<|im_end|>") == 2);
    CHECK(tok.token_id("no such token") == -1);
    for (int32_t id = 0; id <= 16; ++id) CHECK(tok.is_control(id));
    CHECK(tok.token_type(17) == TokenType::normal);
    CHECK(tok.chat_template().find("<|im_start|>") != std::string::npos);
    CHECK_THROWS_AS(tok.token_text(49152), Error);
    CHECK_THROWS_AS(tok.decode({-1}), Error);
}

TEST_CASE("docs/formats.md 8.5 vectors, confirmed against the vocabulary", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    // The vocabulary itself says what the ids are.
    CHECK(tok.token_text(19556) == "Hello");
    CHECK(tok.token_text(28) == ",");
    CHECK(tok.token_text(392) == "Ġwe");
    CHECK(tok.token_text(198) == "Ċ");
    CHECK(tok.token_text(216) == "Ġ");
    CHECK(tok.token_text(256) == "ĠĠ");
    CHECK(tok.token_text(2701) == "Ġmultiple");
    CHECK(tok.token_text(5600) == "Ġspaces");
    CHECK(tok.token_text(33) == "1");
    CHECK(tok.encode("Hello, we can use") == std::vector<int32_t>{19556, 28, 392, 416, 722});
    CHECK(tok.encode("The capital of France is") ==
          std::vector<int32_t>{504, 3575, 282, 4649, 314});
    CHECK(tok.encode("\n") == std::vector<int32_t>{198});
    CHECK(tok.encode("Hello world! 123") == std::vector<int32_t>{19556, 905, 17, 216, 33, 34, 35});
    CHECK(tok.encode("  multiple   spaces") == std::vector<int32_t>{216, 2701, 256, 5600});
    CHECK(tok.encode("").empty());
}

TEST_CASE("SmolLM2 tokenizer agrees with llama.cpp on the whole corpus", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    json fx = read_json(k_fixtures + "smollm2_tokens.json");
    REQUIRE(fx["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf");
    REQUIRE_FALSE(fx["add_bos"].get<bool>());
    const json& entries = fx["entries"];
    REQUIRE(entries.size() == corpus().size());
    size_t agree = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        std::string text = entries[i]["text"];
        auto want = entries[i]["ids"].get<std::vector<int32_t>>();
        auto got = tok.encode(text, false);
        INFO("entry " << i << " text '" << text << "'\n llama.cpp: " << ids_str(want)
                      << "\n infoflow:  " << ids_str(got));
        CHECK(got == want);
        agree += got == want;
        CHECK(tok.decode(got) == drop_untokenizable(tok, text));
    }
    CHECK(agree == entries.size());
    for (const json& e : fx["special_entries"]) {
        std::string text = e["text"];
        auto want = e["ids"].get<std::vector<int32_t>>();
        auto got = tok.encode(text, true);
        INFO("special entry '" << text << "'\n llama.cpp: " << ids_str(want)
                               << "\n infoflow:  " << ids_str(got));
        CHECK(got == want);
    }
}

TEST_CASE("oracle_text.txt tokenizes to the ids of the logits fixture", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    json fx = read_json(k_fixtures + "smollm2_logits.json");
    std::ifstream in(k_fixtures + "oracle_text.txt", std::ios::binary);
    REQUIRE(in);
    std::stringstream text;
    text << in.rdbuf();
    auto want = fx["tokens"].get<std::vector<int32_t>>();
    CHECK(want.size() >= 600);
    CHECK(tok.encode(text.str()) == want);
}

TEST_CASE("Special tokens are parsed only on request", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    const std::string s = "<|im_start|>user\nhi<|im_end|>";
    auto plain = tok.encode(s, false);
    for (int32_t id : plain) CHECK_FALSE(tok.is_control(id));
    CHECK(tok.decode(plain) == s);

    auto special = tok.encode(s, true);
    REQUIRE(special.size() >= 3);
    CHECK(special.front() == 1);
    CHECK(special.back() == 2);
    auto body = tok.encode("user\nhi", false);
    CHECK(std::vector<int32_t>(special.begin() + 1, special.end() - 1) == body);
    CHECK(tok.decode(special) == "user\nhi");
    CHECK(tok.decode(special, false) == s);
    CHECK(tok.token_to_piece(2) == "");
    CHECK(tok.token_to_piece(2, false) == "<|im_end|>");
    // Adjacent and repeated specials, text on both sides.
    CHECK(tok.encode("a<|im_end|><|im_end|>b", true) ==
          std::vector<int32_t>{tok.encode("a")[0], 2, 2, tok.encode("b")[0]});
}

TEST_CASE("decode(encode(s)) == s on random UTF-8, streaming decode agrees", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    std::mt19937 rng(20240607);
    for (int iter = 0; iter < 3000; ++iter) {
        std::string s = random_utf8(rng);
        auto ids = tok.encode(s);
        INFO("iteration " << iter << " (seed 20240607) text '" << s << "' ids " << ids_str(ids));
        std::string kept = drop_untokenizable(tok, s);
        REQUIRE(tok.decode(ids) == kept);
        REQUIRE(tok.encode(s) == ids);  // deterministic, also through the piece cache
        TokenStreamDecoder stream(tok);
        std::string streamed;
        for (int32_t id : ids) {
            std::string out = stream.push(id);
            REQUIRE(utf8_complete_prefix(out) == out.size());
            streamed += out;
        }
        streamed += stream.flush();
        REQUIRE(streamed == kept);
    }
}

TEST_CASE("Invalid UTF-8 still round-trips through byte tokens", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    for (std::string s : {std::string("\x80\x81 abc"), std::string("caf\xc3"),
                          std::string("x\xe2\x82 y"), std::string("\xf0\x9f\x98", 3)}) {
        INFO("bytes '" << s << "'");
        CHECK(tok.decode(tok.encode(s)) == s);
    }
    // SmolLM2 has no token for bytes 0x04, 0xFF, ...: they are dropped, nothing else is.
    REQUIRE(tok.token_id(mapped_byte(0xFF)) == -1);
    CHECK(tok.decode(tok.encode("a\x04"
                                "b\xff c")) == "ab c");
}

TEST_CASE("Streaming decoder holds split UTF-8 sequences", "[tokenizer]") {
    const Tokenizer& tok = smollm2();
    const std::string s = "\xF0\x9F\xA7\x8C";  // a 4-byte emoji that SmolLM2 splits into bytes
    auto ids = tok.encode(s);
    REQUIRE(ids.size() >= 2);
    TokenStreamDecoder stream(tok);
    std::string out;
    for (size_t i = 0; i + 1 < ids.size(); ++i) out += stream.push(ids[i]);
    CHECK(out.empty());
    out += stream.push(ids.back());
    CHECK(out == s);
    CHECK(stream.flush().empty());
    CHECK(utf8_complete_prefix("ab\xE2\x82") == 2);
    CHECK(utf8_complete_prefix("ab\xE2\x82\xAC") == 5);
    CHECK(utf8_complete_prefix("\x80\x80") == 2);
}

TEST_CASE("tokenizer.json with string or pair merges equals the GGUF tokenizer", "[tokenizer]") {
    const Tokenizer& ref = smollm2();
    GgufFile f(real_model_path());
    std::vector<std::string> texts = corpus();
    texts.push_back("<|im_start|>user\nHello<|im_end|>\n");
    for (bool pairs : {false, true}) {
        INFO((pairs ? "pair merges [[a, b]]" : "string merges \"a b\""));
        TempDir dir;
        write_file(dir.file("tokenizer.json"), hf_json_from_gguf(f, pairs).dump());
        json cfg = {{"add_bos_token", false},
                    {"bos_token", "<|im_start|>"},
                    {"eos_token", "<|im_end|>"},
                    {"chat_template", ref.chat_template()}};
        write_file(dir.file("tokenizer_config.json"), cfg.dump());
        Tokenizer hf = Tokenizer::from_hf_dir(dir.path.string());
        CHECK(hf.n_vocab() == ref.n_vocab());
        CHECK(hf.pre_name() == "smollm");
        CHECK(hf.fingerprint() == ref.fingerprint());
        CHECK(hf.bos_id() == 1);
        CHECK(hf.eos_id() == 2);
        CHECK_FALSE(hf.add_bos());
        CHECK(hf.stop_ids() == ref.stop_ids());
        CHECK(hf.chat_template() == ref.chat_template());
        for (const std::string& t : texts) {
            INFO("text '" << t << "'");
            CHECK(hf.encode(t) == ref.encode(t));
            CHECK(hf.encode(t, true) == ref.encode(t, true));
        }
    }
}

TEST_CASE("Bad tokenizer.json files give errors naming the file and key", "[tokenizer]") {
    using Catch::Matchers::Contains;
    TempDir dir;
    const std::string path = dir.file("tokenizer.json");
    json good =
        synthetic_json({{"a", "b"}}, {{"type", "ByteLevel"}, {"use_regex", true}}, nullptr, false);

    json no_vocab = good;
    no_vocab["model"].erase("vocab");
    write_file(path, no_vocab.dump());
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_json(path), Contains(path) && Contains("model.vocab"));

    json bad_merge = good;
    bad_merge["model"]["merges"].push_back(json::array({"a", "zzz"}));
    write_file(path, bad_merge.dump());
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_json(path),
                        Contains(path) && Contains("model.merges[1]") && Contains("'zzz'"));

    json bad_string_merge = good;
    bad_string_merge["model"]["merges"] = json::array({"a qq"});
    write_file(path, bad_string_merge.dump());
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_json(path),
                        Contains(path) && Contains("model.merges[0]") && Contains("'qq'"));

    json bad_pre = good;
    bad_pre["pre_tokenizer"] = {{"type", "Metaspace"}};
    write_file(path, bad_pre.dump());
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_json(path),
                        Contains(path) && Contains("pre_tokenizer") && Contains("Metaspace"));

    write_file(path, "{ not json");
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_json(path), Contains(path));
    REQUIRE_THROWS_WITH(Tokenizer::from_hf_dir(dir.file("absent")), Contains("tokenizer.json"));

    write_file(path, good.dump());
    Tokenizer ok = Tokenizer::from_hf_json(path);
    CHECK(ok.pre_name() == "gpt2");
    CHECK(ok.encode("ab") == std::vector<int32_t>{256});
}

TEST_CASE("llama-bpe and qwen2 pre-tokenizers on a synthetic vocabulary", "[tokenizer]") {
    TempDir dir;
    const std::string path = dir.file("tokenizer.json");
    // Merges that build "123", "45", " world", "é" (C3 A9) and "\n\n".
    std::vector<std::pair<std::string, std::string>> merges = {
        {"1", "2"},  {"12", "3"},  {"4", "5"},     {" ", "w"},       {"o", "r"},
        {"or", "l"}, {"orl", "d"}, {" w", "orld"}, {"\xC3", "\xA9"}, {"\n", "\n"}};

    SECTION("llama-bpe: digits in threes, contractions any case, newline runs") {
        write_file(path,
                   synthetic_json(merges, split_pre(k_hf_llama3_regex), nullptr, true).dump());
        Tokenizer tok = Tokenizer::from_hf_json(path);
        CHECK(tok.pre_name() == "llama-bpe");
        CHECK(pieces(tok, "12345") == std::vector<std::string>{"123", "45"});
        CHECK(pieces(tok, "x world") == std::vector<std::string>{"x", " world"});
        // ignore_merges: "\n\n" is in the vocabulary, so the whole piece is one token.
        CHECK(tok.encode("a\n\n").size() == 2);
        std::string s = "I'LL go\n\n  now 2024! e\xCC\x81";
        CHECK(tok.decode(tok.encode(s)) == s);  // no normalizer: combining mark kept
    }
    SECTION("qwen2: NFC, then single digits") {
        json nfc = {{"type", "NFC"}};
        write_file(path, synthetic_json(merges, split_pre(k_hf_qwen2_regex), nfc, false).dump());
        Tokenizer tok = Tokenizer::from_hf_json(path);
        CHECK(tok.pre_name() == "qwen2");
        CHECK(pieces(tok, "12345") == std::vector<std::string>{"1", "2", "3", "4", "5"});
        // "e" + U+0301 normalizes to U+00E9, which the merge turns into one token.
        auto ids = tok.encode("e\xCC\x81");
        CHECK(ids.size() == 1);
        CHECK(tok.decode(ids) == "\xC3\xA9");
    }
    SECTION("smollm: every digit alone, GPT-2 pattern") {
        json pre = {
            {"type", "Sequence"},
            {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                           {{"type", "ByteLevel"}, {"use_regex", true}}})}};
        write_file(path, synthetic_json(merges, pre, nullptr, false).dump());
        Tokenizer tok = Tokenizer::from_hf_json(path);
        CHECK(tok.pre_name() == "smollm");
        CHECK(pieces(tok, "12345") == std::vector<std::string>{"1", "2", "3", "4", "5"});
        CHECK(pieces(tok, "a   world") == std::vector<std::string>{"a", " ", " ", " world"});
    }
}

TEST_CASE("Added tokens: user-defined always matched, lstrip/rstrip absorb spaces", "[tokenizer]") {
    TempDir dir;
    const std::string path = dir.file("tokenizer.json");
    json j = synthetic_json({}, {{"type", "ByteLevel"}, {"use_regex", true}}, nullptr, false);
    j["added_tokens"] = json::array({{{"id", 300},
                                      {"content", "<tool>"},
                                      {"special", false},
                                      {"lstrip", false},
                                      {"rstrip", false}},
                                     {{"id", 301},
                                      {"content", "<mask>"},
                                      {"special", true},
                                      {"lstrip", true},
                                      {"rstrip", true}}});
    write_file(path, j.dump());
    Tokenizer tok = Tokenizer::from_hf_json(path);
    CHECK(tok.n_vocab() == 302);
    CHECK(tok.token_type(300) == TokenType::user_defined);
    CHECK(tok.token_type(301) == TokenType::control);
    CHECK(tok.token_type(299) == TokenType::unused);
    auto ids = tok.encode("a<tool>b", false);
    CHECK(ids == std::vector<int32_t>{'a', 300, 'b'});
    CHECK(tok.decode(ids) == "a<tool>b");
    CHECK(tok.encode("a  <mask>  b", true) == std::vector<int32_t>{'a', 301, 'b'});
    CHECK(tok.encode("a <mask>", false).size() == 8);  // control text stays plain bytes
}
