// Model loader (docs/formats.md §2, §4, §5): the same tiny llama saved as an HF directory and as a GGUF
// with the converter's Q/K permutation (written here, independently of the library) loads to
// identical fp32 weights, and skipping the un-permute does not (negative control); qwen2 biases
// and qwen3 q/k norms from HF dirs; sharded safetensors; config.json errors naming the key;
// RoPE frequencies incl. llama3 scaling; random models; the real SmolLM2 file.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/gguf_writer.h"
#include "runtime/model/model_loader.h"
#include "tests/test_util.h"

using namespace infoflow;

namespace {

const std::string& tmp_dir() { return test::shared_temp_dir("loader"); }

std::string read_text(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_text(const std::string& p, const std::string& text) {
    std::ofstream out(p, std::ios::trunc);
    out << text;
}

// docs/formats.md §4.1 written out directly: gguf_row[h*D + 2i] = hf_row[h*D + i],
// gguf_row[h*D + 2i + 1] = hf_row[h*D + i + D/2].
std::vector<float> converter_permute(const std::vector<float>& hf, int heads, int64_t row_len) {
    const int64_t rows = int64_t(hf.size()) / row_len, D = rows / heads;
    std::vector<float> out(hf.size());
    for (int h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
            for (int64_t c = 0; c < row_len; ++c) {
                out[size_t((h * D + 2 * i) * row_len + c)] = hf[size_t((h * D + i) * row_len + c)];
                out[size_t((h * D + 2 * i + 1) * row_len + c)] =
                    hf[size_t((h * D + i + D / 2) * row_len + c)];
            }
        }
    }
    return out;
}

std::vector<uint64_t> ne_of(std::vector<uint64_t> torch_shape) {
    return std::vector<uint64_t>(torch_shape.rbegin(), torch_shape.rend());
}

// A llama.cpp-style GGUF of `w`, built by hand: metadata keys, tensor names and the permutation
// are spelled out here so a mistake in the library's writer cannot hide one in its reader.
void write_llama_gguf_by_hand(const ModelWeights& w, const std::string& path, bool permute) {
    const ModelConfig& c = w.config;
    GgufWriter g;
    g.set_string("general.architecture", "llama");
    g.set_string("general.name", "hand-made");
    g.set_u32("llama.block_count", uint32_t(c.n_layer));
    g.set_u32("llama.context_length", uint32_t(c.n_ctx_train));
    g.set_u32("llama.embedding_length", uint32_t(c.n_embd));
    g.set_u32("llama.feed_forward_length", uint32_t(c.n_ff));
    g.set_u32("llama.attention.head_count", uint32_t(c.n_head));
    g.set_u32("llama.attention.head_count_kv", uint32_t(c.n_head_kv));
    g.set_f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
    g.set_f32("llama.rope.freq_base", c.rope_theta);
    g.set_u32("llama.rope.dimension_count", uint32_t(c.head_dim));
    g.set_u32("tokenizer.ggml.bos_token_id", 1);
    g.set_u32("tokenizer.ggml.eos_token_id", 2);
    const uint64_t E = uint64_t(c.n_embd), F = uint64_t(c.n_ff), V = uint64_t(c.n_vocab);
    const uint64_t Q = uint64_t(c.n_head * c.head_dim), KV = uint64_t(c.n_head_kv * c.head_dim);
    const uint32_t f32 = uint32_t(GgmlType::F32);
    g.add_tensor("token_embd.weight", ne_of({V, E}), f32, w.tok_embd.data());
    for (int l = 0; l < c.n_layer; ++l) {
        const LayerWeights& L = w.layers[size_t(l)];
        const std::string p = "blk." + std::to_string(l) + ".";
        g.add_tensor(p + "attn_norm.weight", {E}, f32, L.attn_norm.data());
        const auto wq = permute ? converter_permute(L.wq, c.n_head, c.n_embd) : L.wq;
        const auto wk = permute ? converter_permute(L.wk, c.n_head_kv, c.n_embd) : L.wk;
        g.add_tensor(p + "attn_q.weight", ne_of({Q, E}), f32, wq.data());
        g.add_tensor(p + "attn_k.weight", ne_of({KV, E}), f32, wk.data());
        g.add_tensor(p + "attn_v.weight", ne_of({KV, E}), f32, L.wv.data());
        g.add_tensor(p + "attn_output.weight", ne_of({E, Q}), f32, L.wo.data());
        g.add_tensor(p + "ffn_norm.weight", {E}, f32, L.ffn_norm.data());
        g.add_tensor(p + "ffn_gate.weight", ne_of({F, E}), f32, L.w_gate.data());
        g.add_tensor(p + "ffn_up.weight", ne_of({F, E}), f32, L.w_up.data());
        g.add_tensor(p + "ffn_down.weight", ne_of({E, F}), f32, L.w_down.data());
    }
    g.add_tensor("output_norm.weight", {E}, f32, w.output_norm.data());
    if (!c.tied_embeddings) g.add_tensor("output.weight", ne_of({V, E}), f32, w.output.data());
    g.write(path);
}

// Every tensor equal, bit for bit.
bool same_weights(const ModelWeights& a, const ModelWeights& b) {
    if (a.tok_embd != b.tok_embd || a.output_norm != b.output_norm || a.output != b.output ||
        a.layers.size() != b.layers.size()) {
        return false;
    }
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const LayerWeights &x = a.layers[l], &y = b.layers[l];
        if (x.attn_norm != y.attn_norm || x.wq != y.wq || x.wk != y.wk || x.wv != y.wv ||
            x.wo != y.wo || x.bq != y.bq || x.bk != y.bk || x.bv != y.bv || x.q_norm != y.q_norm ||
            x.k_norm != y.k_norm || x.ffn_norm != y.ffn_norm || x.w_gate != y.w_gate ||
            x.w_up != y.w_up || x.w_down != y.w_down) {
            return false;
        }
    }
    return true;
}

// Norm weights of a random model are all 1; make them distinct so a swap would show.
void vary_norms(ModelWeights& w) {
    float v = 0.5f;
    auto fill = [&](std::vector<float>& t) {
        for (float& x : t) x = (v += 0.001f);
    };
    fill(w.output_norm);
    for (auto& L : w.layers) {
        fill(L.attn_norm);
        fill(L.ffn_norm);
        fill(L.q_norm);
        fill(L.k_norm);
    }
}

std::string error_of_config(const std::string& dir, const std::string& config_text) {
    write_text(dir + "/config.json", config_text);
    try {
        load_model_weights(dir);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("loader: Q/K permutation helpers follow docs/formats.md §4.1/§4.2", "[loader]") {
    // One head, D = 4, row_len 1: HF [a0, a1, b0, b1] -> GGUF [a0, b0, a1, b1].
    std::vector<float> r = {10, 11, 20, 21};
    permute_qk_rows_hf_to_gguf(r.data(), 1, 4, 1);
    CHECK(r == std::vector<float>{10, 20, 11, 21});
    unpermute_qk_rows_gguf_to_hf(r.data(), 1, 4, 1);
    CHECK(r == std::vector<float>{10, 11, 20, 21});
    // Several heads and rows of 3, against the test's own implementation.
    std::vector<float> m(3 * 8 * 3);
    for (size_t i = 0; i < m.size(); ++i) m[i] = float(i);
    std::vector<float> p = m;
    permute_qk_rows_hf_to_gguf(p.data(), 3, 8, 3);
    CHECK(p == converter_permute(m, 3, 3));
    unpermute_qk_rows_gguf_to_hf(p.data(), 3, 8, 3);
    CHECK(p == m);
}

TEST_CASE("loader: tiny llama from HF safetensors and permuted GGUF agree", "[loader]") {
    ModelWeights w = make_random_weights(random_model_config("tiny"), 7);
    vary_norms(w);
    w.config.tied_embeddings = false;
    w.output = w.tok_embd;
    for (float& x : w.output) x = -x;
    const std::string hf = tmp_dir() + "/tiny_hf";
    save_model_hf(w, hf);
    const std::string gg = tmp_dir() + "/tiny.gguf";
    write_llama_gguf_by_hand(w, gg, true);

    const ModelWeights a = load_model_weights(hf);
    const ModelWeights b = load_model_weights(gg);
    CHECK(same_weights(a, w));
    CHECK(same_weights(b, w));
    CHECK(a.fingerprint == b.fingerprint);
    CHECK(a.fingerprint.size() == 16);
    CHECK(a.config.n_layer == 2);
    CHECK(b.config.head_dim == 16);
    CHECK_FALSE(b.config.tied_embeddings);
    CHECK(b.config.eos_ids == std::vector<int>{2});

    // Negative control: without the un-permute, Q and K differ and are exactly the permuted rows.
    LoadOptions raw;
    raw.unpermute_qk = false;
    const ModelWeights c = load_model_weights(gg, raw);
    CHECK_FALSE(same_weights(c, w));
    CHECK(c.layers[0].wq != w.layers[0].wq);
    CHECK(c.layers[1].wk != w.layers[1].wk);
    CHECK(c.layers[0].wq == converter_permute(w.layers[0].wq, 4, 64));
    CHECK(c.layers[0].wv == w.layers[0].wv);
    CHECK(c.fingerprint != a.fingerprint);

    // A GGUF written without the permutation, loaded with the un-permute, differs too.
    write_llama_gguf_by_hand(w, tmp_dir() + "/tiny_unpermuted.gguf", false);
    CHECK_FALSE(same_weights(load_model_weights(tmp_dir() + "/tiny_unpermuted.gguf"), w));

    // The library's own GGUF writer matches the hand-made file's tensors.
    save_model_gguf(w, tmp_dir() + "/tiny_lib.gguf");
    const ModelWeights d = load_model_weights(tmp_dir() + "/tiny_lib.gguf");
    CHECK(same_weights(d, w));
    GgufFile lib(tmp_dir() + "/tiny_lib.gguf"), hand(gg);
    for (const auto& t : hand.tensors()) {
        INFO(t.name);
        const GgufTensorInfo* u = lib.find_tensor(t.name);
        REQUIRE(u);
        CHECK(u->ne == t.ne);
        CHECK(
            std::equal(hand.tensor_data(t), hand.tensor_data(t) + t.n_bytes, lib.tensor_data(*u)));
    }

    // Quantized GGUF: loads, close to the fp32 weights.
    save_model_gguf(w, tmp_dir() + "/tiny_q8.gguf", uint32_t(GgmlType::Q8_0));
    const ModelWeights q = load_model_weights(tmp_dir() + "/tiny_q8.gguf");
    double err = 0;
    for (size_t i = 0; i < w.layers[0].wq.size(); ++i) {
        err = std::max(err, double(std::fabs(q.layers[0].wq[i] - w.layers[0].wq[i])));
    }
    CHECK(err < 0.001);
    CHECK(q.layers[0].attn_norm == w.layers[0].attn_norm);  // 1-D tensors stay F32
}

TEST_CASE("loader: qwen2 biases and qwen3 q/k norms from HF directories", "[loader]") {
    ModelWeights w2 = make_random_weights(random_model_config("tiny-qwen2"), 3);
    REQUIRE(w2.config.has_qkv_bias);
    REQUIRE(w2.layers[1].bq.size() == 64);
    const std::string d2 = tmp_dir() + "/qwen2_hf";
    save_model_hf(w2, d2);
    // config.json of Qwen2 has no attention_bias key: biases come from the tensors.
    CHECK(read_text(d2 + "/config.json").find("attention_bias") == std::string::npos);
    const ModelWeights a2 = load_model_weights(d2);
    CHECK(a2.config.arch == Arch::qwen2);
    CHECK(a2.config.has_qkv_bias);
    CHECK(same_weights(a2, w2));
    // GGUF qwen2: biases and Q/K rows are not permuted.
    save_model_gguf(w2, tmp_dir() + "/qwen2.gguf");
    GgufFile f2(tmp_dir() + "/qwen2.gguf");
    const GgufTensorInfo* bq = f2.find_tensor("blk.1.attn_q.bias");
    REQUIRE(bq);
    std::vector<float> raw(64);
    dequantize_row(bq->type, f2.tensor_data(*bq), raw.data(), 64);
    CHECK(raw == w2.layers[1].bq);
    CHECK(same_weights(load_model_weights(tmp_dir() + "/qwen2.gguf"), w2));

    ModelWeights w3 = make_random_weights(random_model_config("tiny-qwen3"), 4);
    vary_norms(w3);
    REQUIRE(w3.config.has_qk_norm);
    const std::string d3 = tmp_dir() + "/qwen3_hf";
    save_model_hf(w3, d3, "F32");
    const ModelWeights a3 = load_model_weights(d3);
    CHECK(a3.config.arch == Arch::qwen3);
    CHECK(a3.config.has_qk_norm);
    CHECK_FALSE(a3.config.has_qkv_bias);
    CHECK(a3.config.head_dim == 32);  // != n_embd / n_head = 16
    CHECK(a3.layers[0].wq.size() == size_t(4 * 32 * 64));
    CHECK_FALSE(a3.config.tied_embeddings);
    CHECK(same_weights(a3, w3));
    CHECK(a3.layers[1].k_norm == w3.layers[1].k_norm);
    save_model_gguf(w3, tmp_dir() + "/qwen3.gguf");
    const ModelWeights g3 = load_model_weights(tmp_dir() + "/qwen3.gguf");
    CHECK(g3.config.head_dim == 32);
    CHECK(same_weights(g3, w3));
}

TEST_CASE("loader: sharded safetensors and 16-bit dtypes", "[loader]") {
    ModelWeights w = make_random_weights(random_model_config("tiny"), 11);
    const std::string dir = tmp_dir() + "/tiny_sharded";
    save_model_hf(w, dir, "F32", 3);
    CHECK(access((dir + "/model.safetensors.index.json").c_str(), R_OK) == 0);
    CHECK(access((dir + "/model-00003-of-00003.safetensors").c_str(), R_OK) == 0);
    CHECK(access((dir + "/model.safetensors").c_str(), R_OK) != 0);
    const ModelWeights a = load_model_weights(dir);
    CHECK(same_weights(a, w));
    CHECK(a.fingerprint == w.fingerprint);

    const std::string bdir = tmp_dir() + "/tiny_bf16";
    save_model_hf(w, bdir, "BF16");
    const ModelWeights b = load_model_weights(bdir);
    CHECK_FALSE(same_weights(b, w));
    for (size_t i = 0; i < w.tok_embd.size(); ++i) {
        REQUIRE(std::fabs(b.tok_embd[i] - w.tok_embd[i]) <= std::fabs(w.tok_embd[i]) / 128);
    }
    // A model.safetensors file path works as well as its directory.
    const ModelWeights c = load_model_weights(bdir + "/model.safetensors");
    CHECK(same_weights(b, c));
}

TEST_CASE("loader: bad config.json values name the key", "[loader]") {
    ModelWeights w = make_random_weights(random_model_config("tiny"), 5);
    const std::string dir = tmp_dir() + "/tiny_bad";
    save_model_hf(w, dir);
    const std::string good = read_text(dir + "/config.json");
    REQUIRE(error_of_config(dir, good).empty());
    struct Case {
        const char* key;
        nlohmann::json value;  // null: remove the key
        const char* expect;
    };
    const std::vector<Case> cases = {
        {"num_attention_heads", "four", "'num_attention_heads' must be an integer"},
        {"num_attention_heads", 0, "'num_attention_heads' = 0 is out of range"},
        {"hidden_size", -64, "'hidden_size' = -64"},
        {"hidden_size", nullptr, "missing key 'hidden_size'"},
        {"num_key_value_heads", 3, "'num_key_value_heads'"},
        {"rms_norm_eps", "1e-5", "'rms_norm_eps' must be a number"},
        {"rms_norm_eps", -1.0, "'rms_norm_eps'"},
        {"rope_theta", 0, "'rope_theta'"},
        {"model_type", "gpt2", "'model_type' = \"gpt2\""},
        {"tie_word_embeddings", "yes", "'tie_word_embeddings'"},
        {"eos_token_id", nlohmann::json::array({2, "x"}), "'eos_token_id'"},
        {"eos_token_id", 99999, "'eos_token_id' = 99999"},
        {"rope_scaling", nlohmann::json({{"rope_type", "yarn"}, {"factor", 4.0}}),
         "'rope_scaling.rope_type' = \"yarn\""},
        {"rope_scaling", nlohmann::json({{"type", "llama3"}, {"factor", 8.0}}),
         "missing key 'rope_scaling.low_freq_factor'"},
        {"rope_scaling", 5, "'rope_scaling' must be an object"},
        {"head_dim", 15, "odd"},
        {"hidden_act", "gelu", "'hidden_act'"},
        {"intermediate_size", 256, "model.layers.0.mlp.gate_proj.weight"},
        {"num_hidden_layers", 3, "model.layers.2.input_layernorm.weight"},
    };
    for (const Case& c : cases) {
        nlohmann::json j = nlohmann::json::parse(good);
        if (c.value.is_null()) {
            j.erase(c.key);
        } else {
            j[c.key] = c.value;
        }
        INFO(c.key << " = " << c.value.dump());
        const std::string err = error_of_config(dir, j.dump());
        CHECK_THAT(err, Catch::Contains(c.expect));
        CHECK_THAT(err, Catch::Contains("tiny_bad"));
    }
    CHECK_THAT(error_of_config(dir, "{\"hidden_size\": "), Catch::Contains("not valid JSON"));
    write_text(dir + "/config.json", good);

    // Tensor problems name the tensor and the file.
    ModelWeights t = w;
    t.config.tied_embeddings = false;
    t.output = t.tok_embd;
    save_model_hf(t, dir);
    nlohmann::json j = nlohmann::json::parse(read_text(dir + "/config.json"));
    j["tie_word_embeddings"] = false;
    std::remove((dir + "/model.safetensors").c_str());
    save_model_hf(w, dir);  // tied: no lm_head.weight in the file
    CHECK_THAT(error_of_config(dir, j.dump()), Catch::Contains("lm_head.weight"));
    CHECK_THROWS_AS(load_model_weights(tmp_dir() + "/no_such_model"), Error);
}

TEST_CASE("loader: config.json variants", "[loader]") {
    const std::string base = R"({"model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 512)";
    ModelConfig c = parse_hf_config_json(base + "}", "cfg");
    CHECK(c.n_head_kv == 4);  // defaults to num_attention_heads
    CHECK(c.head_dim == 16);
    CHECK(c.eos_ids.empty());
    CHECK(c.bos_id == -1);
    c = parse_hf_config_json(base + R"(, "eos_token_id": [1, 5, 9], "bos_token_id": 3,
        "head_dim": null, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}})",
                             "cfg");
    CHECK(c.eos_ids == std::vector<int>{1, 5, 9});
    CHECK(c.bos_id == 3);
    CHECK(c.rope_theta == 500000.0f);
    CHECK(c.rope_scaling.type == "llama3");
    CHECK(c.rope_scaling.original_context == 8192);
    c = parse_hf_config_json(base + R"(, "rope_scaling": {"type": "linear", "factor": 2}})", "cfg");
    CHECK(c.rope_scaling.type == "linear");
    CHECK(c.rope_scaling.factor == 2.0f);
    c = parse_hf_config_json(base + R"(, "rope_scaling": {"rope_type": "default"}})", "cfg");
    CHECK(c.rope_scaling.type == "none");
}

TEST_CASE("loader: RoPE inverse frequencies, plain and llama3-scaled", "[loader][rope]") {
    ModelConfig c = random_model_config("tiny");
    std::vector<float> inv = rope_inv_freq(c);
    REQUIRE(inv.size() == 8);
    for (int i = 0; i < 8; ++i)
        CHECK(inv[i] == Approx(std::pow(10000.0, -2.0 * i / 16)).epsilon(1e-6));

    // llama3 scaling on a tiny head: L = 64 puts frequencies in all three bands.
    c.rope_theta = 500000.0f;
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.0f;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_context = 64;
    inv = rope_inv_freq(c);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 8; ++i) {
        const double f = std::pow(500000.0, -2.0 * i / 16), wl = 2 * M_PI / f;
        double want;
        if (wl < 64.0 / 4) {
            want = f;
            bands[0]++;
        } else if (wl > 64.0 / 1) {
            want = f / 8;
            bands[2]++;
        } else {
            const double s = (64.0 / wl - 1) / (4 - 1);
            want = (1 - s) * f / 8 + s * f;
            bands[1]++;
        }
        INFO("i " << i);
        CHECK(inv[i] == Approx(want).epsilon(1e-5));
    }
    CHECK(bands[0] > 0);
    CHECK(bands[1] > 0);
    CHECK(bands[2] > 0);

    // The same model as GGUF carries rope_freqs.weight; its frequencies match.
    ModelWeights w = make_random_weights(c, 9);
    save_model_gguf(w, tmp_dir() + "/llama3.gguf");
    GgufFile f(tmp_dir() + "/llama3.gguf");
    REQUIRE(f.find_tensor("rope_freqs.weight"));
    const ModelConfig g = load_model_config(tmp_dir() + "/llama3.gguf");
    REQUIRE(g.rope_freq_factors.size() == 8);
    CHECK(g.rope_freq_factors[0] == 1.0f);
    CHECK(g.rope_freq_factors[7] == 8.0f);
    const std::vector<float> ginv = rope_inv_freq(g);
    for (int i = 0; i < 8; ++i) CHECK(ginv[i] == Approx(inv[i]).epsilon(1e-6));
    // And the HF directory round-trips the rope_scaling block.
    save_model_hf(w, tmp_dir() + "/llama3_hf");
    const ModelConfig h = load_model_config(tmp_dir() + "/llama3_hf");
    CHECK(h.rope_scaling.type == "llama3");
    CHECK(h.rope_scaling.original_context == 64);
    CHECK(rope_inv_freq(h) == inv);
}

TEST_CASE("loader: random models", "[loader][random]") {
    const ModelWeights a = load_model_weights("random:tiny");
    const ModelWeights b = load_model_weights("random:tiny:1234");
    const ModelWeights c = load_model_weights("random:tiny:99");
    CHECK(same_weights(a, b));
    CHECK(a.fingerprint == b.fingerprint);
    CHECK(a.fingerprint != c.fingerprint);
    CHECK(a.layers[0].attn_norm == std::vector<float>(64, 1.0f));
    double sum = 0, sq = 0;
    for (float x : a.tok_embd) {
        sum += x;
        sq += x * x;
    }
    const double n = double(a.tok_embd.size());
    CHECK(std::fabs(sum / n) < 0.001);
    CHECK(std::sqrt(sq / n) == Approx(0.02).epsilon(0.02));

    const ModelConfig s = load_model_config("random:smollm2-135m");
    CHECK(s.n_layer == 30);
    CHECK(s.n_embd == 576);
    CHECK(s.n_head == 9);
    CHECK(s.n_head_kv == 3);
    CHECK(s.head_dim == 64);
    CHECK(s.n_ff == 1536);
    CHECK(s.n_vocab == 49152);
    CHECK(s.rope_theta == 100000.0f);
    CHECK(s.tied_embeddings);
    const ModelConfig l = load_model_config("random:llama-3.1-8b");
    CHECK(l.n_layer == 32);
    CHECK(l.n_vocab == 128256);
    CHECK(l.rope_scaling.type == "llama3");
    CHECK(l.eos_ids == std::vector<int>{128001, 128008, 128009});
    const ModelConfig q = load_model_config("random:qwen3-14b");
    CHECK(q.arch == Arch::qwen3);
    CHECK(q.n_embd == 5120);
    CHECK(q.head_dim == 128);
    CHECK(q.has_qk_norm);
    CHECK(model_weight_bytes(q) > size_t(50) << 30);
    for (const char* big : {"random:llama-3.1-8b", "random:qwen3-14b"}) {
        if (model_weight_bytes(load_model_config(big)) > available_memory_bytes()) {
            try {
                load_model_weights(big);
                FAIL("no error");
            } catch (const Error& e) {
                CHECK_THAT(e.what(), Catch::Contains(big) && Catch::Contains("memory"));
            }
        }
    }
    CHECK_THROWS_WITH(load_model_config("random:huge"), Catch::Contains("unknown model shape"));
    CHECK_THROWS_WITH(load_model_config("random:tiny:x1"), Catch::Contains("seed"));
}

TEST_CASE("loader: the real SmolLM2-135M-Instruct Q4_1 file", "[loader][model]") {
    const std::string path = INFOFLOW_MODEL_PATH;
    if (access(path.c_str(), R_OK) != 0) {
        WARN("real model not found at " << path << ", skipping");
        return;
    }
    const ModelConfig c = load_model_config(path);
    CHECK(c.arch == Arch::llama);
    CHECK(c.n_layer == 30);
    CHECK(c.n_embd == 576);
    CHECK(c.n_head == 9);
    CHECK(c.n_head_kv == 3);
    CHECK(c.head_dim == 64);
    CHECK(c.n_ff == 1536);
    CHECK(c.n_vocab == 49152);
    CHECK(c.n_ctx_train == 8192);
    CHECK(c.rope_theta == 100000.0f);
    CHECK(c.rms_eps == 1e-5f);
    CHECK(c.tied_embeddings);
    CHECK(c.bos_id == 1);
    CHECK(c.eos_ids == std::vector<int>{2});
    CHECK(c.rope_freq_factors.empty());

    const auto t0 = std::chrono::steady_clock::now();
    const ModelWeights w = load_model_weights(path);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WARN("SmolLM2 load + dequant + fingerprint: " << secs << " s, fingerprint " << w.fingerprint);
    CHECK(w.output.empty());
    CHECK(w.lm_head().size() == size_t(49152) * 576);
    CHECK(w.layers.size() == 30);
    CHECK(w.fingerprint.size() == 16);
    for (float x : w.layers[29].ffn_norm) REQUIRE(std::isfinite(x));
    // The un-permute moves whole rows: permuting the loaded Q back gives the file's rows.
    GgufFile f(path);
    const GgufTensorInfo* q = f.find_tensor("blk.3.attn_q.weight");
    REQUIRE(q);
    std::vector<float> gq(size_t(q->n_elements()));
    dequantize_row(q->type, f.tensor_data(*q), gq.data(), int64_t(gq.size()));
    CHECK(gq != w.layers[3].wq);
    std::vector<float> back = w.layers[3].wq;
    permute_qk_rows_hf_to_gguf(back.data(), 9, 64, 576);
    CHECK(gq == back);
}
