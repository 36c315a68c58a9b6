// Writes the seed corpora of the fuzz targets with the project's own writers (GgufWriter,
// model_gguf_writer, SafetensorsWriter, the config files in configs/):
//   gen_corpus OUT_DIR REPO_DIR
// creates OUT_DIR/{gguf,safetensors,tokenizer_json,tokenizer_encode,config}/. The committed
// corpora in tests/fuzz/corpus/ were made by this program; rerun it after a format change.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/fs.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf_writer.h"
#include "runtime/formats/safetensors_writer.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the rest to U+0100...
std::string byte_token(int b) {
    auto printable = [](int c) {
        return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    };
    int cp = b;
    if (!printable(b)) {
        int n = 0;
        for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * (float(i % 17) - 8.0f);
    return v;
}

// A tiny byte-level vocabulary: 256 byte tokens, "he", "ll", "hell", "hello", 3 specials.
void add_tokenizer(GgufWriter& g) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b));
    for (const char* t : {"he", "ll", "hell", "hello"}) tokens.push_back(t);
    std::vector<int32_t> types(tokens.size(), 1);
    for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        tokens.push_back(t);
        types.push_back(3);
    }
    g.set_string("tokenizer.ggml.model", "gpt2");
    g.set_string("tokenizer.ggml.pre", "smollm");
    g.set_string_array("tokenizer.ggml.tokens", tokens);
    g.set_i32_array("tokenizer.ggml.token_type", types);
    g.set_string_array("tokenizer.ggml.merges", {"h e", "l l", "he ll", "hell o"});
    g.set_u32("tokenizer.ggml.bos_token_id", 260);
    g.set_u32("tokenizer.ggml.eos_token_id", 260);
    g.set_bool("tokenizer.ggml.add_bos_token", false);
    g.set_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    write_file_atomic(path, std::string(b.begin(), b.end()));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s OUT_DIR REPO_DIR\n", argv[0]);
        return 2;
    }
    const std::string out = argv[1], repo = argv[2];
    for (const char* d : {"gguf", "safetensors", "tokenizer_json", "tokenizer_encode", "config"}) {
        fs::create_directories(out + "/" + d);
    }

    // GGUF: every metadata type and small tensors of several types.
    {
        GgufWriter g;
        g.set_u8("t.u8", 7);
        g.set_i8("t.i8", -7);
        g.set_u16("t.u16", 700);
        g.set_i16("t.i16", -700);
        g.set_u32("t.u32", 70000);
        g.set_i32("t.i32", -70000);
        g.set_u64("t.u64", 1ull << 40);
        g.set_i64("t.i64", -(1ll << 40));
        g.set_f32("t.f32", 1.5f);
        g.set_f64("t.f64", -2.25);
        g.set_bool("t.bool", true);
        g.set_string("t.str", "caf\xc3\xa9");
        g.set_string_array("t.strs", {"a", "", "bc"});
        g.set_f32_array("t.f32s", {1.0f, 2.0f});
        g.set_i64_array("t.i64s", {-1, 0, 1});
        for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0}) {
            const std::vector<float> v = ramp(64, 0.1f);
            g.add_tensor(std::string("w.") + ggml_type_name(uint32_t(t)), {32, 2}, uint32_t(t),
                         v.data());
        }
        write_bytes(out + "/gguf/types.gguf", g.to_bytes());
        GgufWriter t;
        add_tokenizer(t);
        write_bytes(out + "/gguf/tokenizer.gguf", t.to_bytes());
    }
    // GGUF: a tiny llama model (2 layers, 32-wide, vocab 263) with the tokenizer above.
    {
        ModelConfig c = random_model_config("tiny");
        c.n_layer = 1;
        c.n_embd = 32;
        c.n_head = 2;
        c.n_head_kv = 1;
        c.head_dim = 16;
        c.n_ff = 32;
        c.n_vocab = 263;
        const ModelWeights w = make_random_weights(c, 5);
        GgufWriter g = model_gguf_writer(w, uint32_t(GgmlType::Q8_0));
        add_tokenizer(g);
        write_bytes(out + "/gguf/tiny_model.gguf", g.to_bytes());
    }
    // safetensors: every dtype, a scalar, an empty tensor, metadata.
    {
        SafetensorsWriter w;
        w.set_metadata("format", "pt");
        const std::vector<float> v = ramp(12, 0.25f);
        w.add_tensor("a.f32", {3, 4}, "F32", v.data());
        w.add_tensor("b.f16", {12}, "F16", v.data());
        w.add_tensor("c.bf16", {2, 2, 3}, "BF16", v.data());
        w.add_tensor("scalar", {}, "F32", v.data());
        w.add_tensor("empty", {0, 3}, "F32", v.data());
        write_bytes(out + "/safetensors/sample.safetensors", w.to_bytes());
    }
    // tokenizer.json: the same tiny byte-level vocabulary, string merges and pair merges.
    {
        json vocab = json::object();
        for (int b = 0; b < 256; ++b) vocab[byte_token(b)] = b;
        vocab["he"] = 256;
        vocab["ll"] = 257;
        json added = json::array({{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}});
        json pre = {
            {"type", "Sequence"},
            {"pretokenizers",
             json::array(
                 {{{"type", "Digits"}, {"individual_digits", true}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
        json root = {{"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", pre},
                     {"post_processor", nullptr},
                     {"model",
                      {{"type", "BPE"},
                       {"vocab", vocab},
                       {"merges", json::array({"h e", "l l"})},
                       {"ignore_merges", false}}}};
        write_file_atomic(out + "/tokenizer_json/strings.json", root.dump());
        root["model"]["merges"] = json::array({json::array({"h", "e"}), json::array({"l", "l"})});
        root["normalizer"] = {{"type", "NFC"}};
        write_file_atomic(out + "/tokenizer_json/pairs_nfc.json", root.dump());
    }
    // Text for the SmolLM2 tokenizer (first byte: parse_special flag).
    {
        const std::vector<std::string> texts = {
            std::string("\x00", 1) + "Hello, world! The year 2024 has 366 days.",
            "\x01<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
            std::string("\x00", 1) +
                "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82  "
                "tabs\tand\nnewlines",
            std::string("\x00", 1) + "    indented code:\n\tif (x) { return 42; }\n",
            std::string("\x00", 1) + "\xff\xfe invalid \xc3 bytes",
        };
        for (size_t i = 0; i < texts.size(); ++i) {
            write_file_atomic(out + "/tokenizer_encode/text" + std::to_string(i) + ".bin",
                              texts[i]);
        }
    }
    // Configs: the repository's own files, and one with --set lines.
    for (const char* name : {"demo.toml", "full.toml"}) {
        const std::string p = repo + "/configs/" + name;
        if (file_exists(p)) write_file_atomic(out + "/config/" + name, read_file(p));
    }
    write_file_atomic(out + "/config/sets.toml",
                      "job = \"niah\"\n[niah]\nlengths = [128, 256]\ndepths = [0.5]\n\n%%\n"
                      "method.ratio=0.3\nscoring.layers=[1, 2]\nrequest.documents=[a, b]\n"
                      "decode.max_new_tokens=2147483647\nparallel.timeout_s=5\n");
    std::printf("corpora written to %s\n", out.c_str());
    return 0;
}
