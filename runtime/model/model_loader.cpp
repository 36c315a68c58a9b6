// Model loading: GGUF (dequantized, llama Q/K rows un-permuted), Hugging Face directories
// (config.json + safetensors), synthetic random models; plus the matching writers. Every tensor
// is checked against the config before it is read; errors name the file and tensor or key.
#include "runtime/model/model_loader.h"

#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/cpu/quant_dot.h"
#include "kernels/random_init.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/formats/dequant.h"
#include "runtime/formats/safetensors.h"
#include "runtime/formats/safetensors_writer.h"

namespace infoflow {

namespace {

using json = nlohmann::json;

// One weight tensor: its names in both formats, PyTorch shape, destination, and (for llama
// Q/K weights and biases) the head count its rows are permuted over in GGUF.
struct TensorSlot {
    std::string hf;
    std::string gguf;
    std::vector<int64_t> shape;
    std::vector<float>* dst;
    int qk_heads = 0;
    StoredMatrix* stored = nullptr;  // matrices: where model.weights = "native" keeps them
};

// The tensors the config calls for. Writers pass a const_cast model: they only read.
std::vector<TensorSlot> tensor_slots(const ModelConfig& c, ModelWeights& w) {
    const int64_t E = c.n_embd, F = c.n_ff, V = c.n_vocab, D = c.head_dim;
    const int64_t Q = int64_t(c.n_head) * D, KV = int64_t(c.n_head_kv) * D;
    std::vector<TensorSlot> s;
    s.push_back({"model.embed_tokens.weight",
                 "token_embd.weight",
                 {V, E},
                 &w.tok_embd,
                 0,
                 &w.tok_embd_stored});
    w.layers.resize(size_t(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) {
        LayerWeights& L = w.layers[size_t(l)];
        const std::string h = "model.layers." + std::to_string(l) + ".";
        const std::string g = "blk." + std::to_string(l) + ".";
        s.push_back({h + "input_layernorm.weight", g + "attn_norm.weight", {E}, &L.attn_norm});
        s.push_back({h + "self_attn.q_proj.weight",
                     g + "attn_q.weight",
                     {Q, E},
                     &L.wq,
                     c.n_head,
                     &L.stored.wq});
        s.push_back({h + "self_attn.k_proj.weight",
                     g + "attn_k.weight",
                     {KV, E},
                     &L.wk,
                     c.n_head_kv,
                     &L.stored.wk});
        s.push_back(
            {h + "self_attn.v_proj.weight", g + "attn_v.weight", {KV, E}, &L.wv, 0, &L.stored.wv});
        s.push_back({h + "self_attn.o_proj.weight",
                     g + "attn_output.weight",
                     {E, Q},
                     &L.wo,
                     0,
                     &L.stored.wo});
        if (c.has_qkv_bias) {
            s.push_back({h + "self_attn.q_proj.bias", g + "attn_q.bias", {Q}, &L.bq, c.n_head});
            s.push_back({h + "self_attn.k_proj.bias", g + "attn_k.bias", {KV}, &L.bk, c.n_head_kv});
            s.push_back({h + "self_attn.v_proj.bias", g + "attn_v.bias", {KV}, &L.bv});
        }
        if (c.has_qk_norm) {
            s.push_back({h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {D}, &L.q_norm});
            s.push_back({h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {D}, &L.k_norm});
        }
        s.push_back(
            {h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {E}, &L.ffn_norm});
        s.push_back({h + "mlp.gate_proj.weight",
                     g + "ffn_gate.weight",
                     {F, E},
                     &L.w_gate,
                     0,
                     &L.stored.w_gate});
        s.push_back(
            {h + "mlp.up_proj.weight", g + "ffn_up.weight", {F, E}, &L.w_up, 0, &L.stored.w_up});
        s.push_back({h + "mlp.down_proj.weight",
                     g + "ffn_down.weight",
                     {E, F},
                     &L.w_down,
                     0,
                     &L.stored.w_down});
    }
    s.push_back({"model.norm.weight", "output_norm.weight", {E}, &w.output_norm});
    if (!c.tied_embeddings)
        s.push_back({"lm_head.weight", "output.weight", {V, E}, &w.output, 0, &w.output_stored});
    return s;
}

int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << "]";
    return os.str();
}

std::string ne_str(const std::vector<uint64_t>& ne) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < ne.size(); ++i) os << (i ? ", " : "") << ne[i];
    os << "]";
    return os.str();
}

bool is_dir(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_gguf_file(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string parent_dir(const std::string& p) {
    const size_t k = p.find_last_of('/');
    if (k == std::string::npos) return ".";
    return k == 0 ? "/" : p.substr(0, k);
}

void check_memory(size_t need, const std::string& what) {
    const size_t avail = available_memory_bytes();
    IF_CHECK(need <= avail, what << ": the fp32 weights need " << need / (1 << 20)
                                 << " MiB but only " << avail / (1 << 20)
                                 << " MiB of memory are available");
}

// ---- fast stable hash (XXH64-style lanes; only needs to be stable, not compatible) ---------

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full,
                   kP3 = 0x165667B19E3779F9ull, kP4 = 0x85EBCA77C2B2AE63ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t hround(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }

uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t seed) {
    uint64_t v[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        std::memcpy(w, p + i, 32);
        for (int k = 0; k < 4; ++k) v[k] = hround(v[k], w[k]);
    }
    uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    for (int k = 0; k < 4; ++k) h = (h ^ hround(0, v[k])) * kP1 + kP4;
    h += uint64_t(n);
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = rotl(h ^ hround(0, w), 27) * kP1 + kP4;
    }
    for (; i < n; ++i) h = rotl(h ^ (uint64_t(p[i]) * kP3), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
}

// Shortest decimal that reads back as the same float (1e-05, not 9.999999747378752e-06).
double float_for_json(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, double(f));
        if (std::strtof(buf, nullptr) == f) break;
    }
    return std::strtod(buf, nullptr);
}

// ---- config.json ---------------------------------------------------------------------------

struct JsonReader {
    const json& j;
    std::string source;
    std::string prefix;  // "rope_scaling." for nested objects

    const json* find(const std::string& key) const {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) return nullptr;
        return &*it;
    }
    bool has(const std::string& key) const { return find(key) != nullptr; }

    int get_int(const std::string& key, bool required, int dflt, long long lo, long long hi) const {
        const json* v = find(key);
        if (!v) {
            IF_CHECK(!required, source << ": missing key '" << prefix << key << "'");
            return dflt;
        }
        long long x = 0;
        if (v->is_number_integer()) {
            x = v->is_number_unsigned()
                    ? (v->get<uint64_t>() > uint64_t(LLONG_MAX) ? LLONG_MAX
                                                                : (long long)v->get<uint64_t>())
                    : v->get<long long>();
        } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                   std::fabs(v->get<double>()) < 1e18) {
            x = (long long)v->get<double>();
        } else {
            IF_FAIL(source << ": key '" << prefix << key << "' must be an integer, got "
                           << v->dump());
        }
        IF_CHECK(x >= lo && x <= hi, source << ": key '" << prefix << key << "' = " << x
                                            << " is out of range [" << lo << ", " << hi << "]");
        return int(x);
    }

    float get_float(const std::string& key, bool required, float dflt, double lo, double hi) const {
        const json* v = find(key);
        if (!v) {
            IF_CHECK(!required, source << ": missing key '" << prefix << key << "'");
            return dflt;
        }
        IF_CHECK(v->is_number(),
                 source << ": key '" << prefix << key << "' must be a number, got " << v->dump());
        const double x = v->get<double>();
        IF_CHECK(std::isfinite(x) && x > lo && x <= hi,
                 source << ": key '" << prefix << key << "' = " << x << " is out of range (" << lo
                        << ", " << hi << "]");
        return float(x);
    }

    bool get_bool(const std::string& key, bool dflt) const {
        const json* v = find(key);
        if (!v) return dflt;
        IF_CHECK(v->is_boolean(), source << ": key '" << prefix << key
                                         << "' must be true or false, got " << v->dump());
        return v->get<bool>();
    }

    std::string get_string(const std::string& key, const std::string& dflt) const {
        const json* v = find(key);
        if (!v) return dflt;
        IF_CHECK(v->is_string(),
                 source << ": key '" << prefix << key << "' must be a string, got " << v->dump());
        return v->get<std::string>();
    }
};

// rope_scaling or rope_parameters object -> RopeScaling.
RopeScaling parse_rope_scaling(const json& obj, const std::string& source, const std::string& key) {
    IF_CHECK(obj.is_object(),
             source << ": key '" << key << "' must be an object or null, got " << obj.dump());
    JsonReader r{obj, source, key + "."};
    std::string type = r.get_string("rope_type", "");
    const std::string type_key = type.empty() ? "type" : "rope_type";
    if (type.empty()) type = r.get_string("type", "default");
    RopeScaling s;
    if (type == "default" || type == "none") return s;
    if (type == "linear") {
        s.type = "linear";
        s.factor = r.get_float("factor", true, 1.0f, 0.0, 1e6);
    } else if (type == "llama3") {
        s.type = "llama3";
        s.factor = r.get_float("factor", true, 1.0f, 0.0, 1e6);
        s.low_freq_factor = r.get_float("low_freq_factor", true, 1.0f, 0.0, 1e6);
        s.high_freq_factor = r.get_float("high_freq_factor", true, 4.0f, 0.0, 1e6);
        s.original_context = r.get_int("original_max_position_embeddings", true, 8192, 1, 1 << 30);
        IF_CHECK(s.high_freq_factor > s.low_freq_factor,
                 source << ": key '" << key << ".high_freq_factor' (" << s.high_freq_factor
                        << ") must exceed low_freq_factor (" << s.low_freq_factor << ")");
    } else {
        IF_FAIL(source << ": key '" << key << "." << type_key << "' = \"" << type
                       << "\" is not supported (default, linear, llama3)");
    }
    return s;
}

ModelConfig parse_hf_config_impl(const std::string& text, const std::string& source,
                                 bool* tie_given) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        IF_FAIL(source << ": not valid JSON: " << e.what());
    }
    IF_CHECK(j.is_object(), source << ": not a JSON object");
    JsonReader r{j, source, ""};
    ModelConfig c;

    std::string type = r.get_string("model_type", "");
    if (type.empty() && r.has("architectures")) {
        const json& a = *r.find("architectures");
        IF_CHECK(a.is_array() && !a.empty() && a[0].is_string(),
                 source << ": key 'architectures' must be a list of strings");
        const std::string cls = a[0].get<std::string>();
        if (cls == "LlamaForCausalLM" || cls == "MistralForCausalLM") type = "llama";
        if (cls == "Qwen2ForCausalLM") type = "qwen2";
        if (cls == "Qwen3ForCausalLM") type = "qwen3";
        IF_CHECK(!type.empty(), source << ": key 'architectures' = " << cls
                                       << " is not supported (llama, qwen2, qwen3)");
    }
    IF_CHECK(!type.empty(), source << ": missing key 'model_type'");
    if (type == "mistral") type = "llama";
    try {
        c.arch = arch_from_name(type);
    } catch (const Error& e) {
        IF_FAIL(source << ": key 'model_type' = \"" << type
                       << "\" is not supported (llama, qwen2, qwen3)");
    }
    c.name = r.get_string("_name_or_path", "");

    const std::string act = r.get_string("hidden_act", "silu");
    IF_CHECK(act == "silu",
             source << ": key 'hidden_act' = \"" << act << "\" is not supported (silu)");
    IF_CHECK(!r.get_bool("mlp_bias", false), source << ": key 'mlp_bias' = true is not supported");

    c.n_embd = r.get_int("hidden_size", true, 0, 1, 1 << 17);
    c.n_layer = r.get_int("num_hidden_layers", true, 0, 1, 4096);
    c.n_head = r.get_int("num_attention_heads", true, 0, 1, 4096);
    c.n_head_kv = r.get_int("num_key_value_heads", false, c.n_head, 1, 4096);
    c.n_ff = r.get_int("intermediate_size", true, 0, 1, 1 << 20);
    c.n_vocab = r.get_int("vocab_size", true, 0, 1, 1 << 24);
    IF_CHECK(c.n_head % c.n_head_kv == 0,
             source << ": key 'num_attention_heads' = " << c.n_head
                    << " is not a multiple of 'num_key_value_heads' = " << c.n_head_kv);
    if (r.has("head_dim")) {
        c.head_dim = r.get_int("head_dim", true, 0, 2, 4096);
    } else {
        IF_CHECK(c.n_embd % c.n_head == 0,
                 source << ": key 'hidden_size' = " << c.n_embd << " is not a multiple of "
                        << "'num_attention_heads' = " << c.n_head << " and 'head_dim' is absent");
        c.head_dim = c.n_embd / c.n_head;
    }
    IF_CHECK(c.head_dim % 2 == 0, source << ": head dimension " << c.head_dim << " is odd");
    c.rms_eps = r.get_float("rms_norm_eps", false, 1e-6f, 0.0, 0.5);
    c.n_ctx_train = r.get_int("max_position_embeddings", false, 2048, 1, 1 << 30);
    c.rope_theta = r.get_float("rope_theta", false, 10000.0f, 1.0, 1e12);
    if (r.has("rope_scaling"))
        c.rope_scaling = parse_rope_scaling(j["rope_scaling"], source, "rope_scaling");
    if (r.has("rope_parameters")) {
        const json& rp = j["rope_parameters"];
        c.rope_scaling = parse_rope_scaling(rp, source, "rope_parameters");
        JsonReader rr{rp, source, "rope_parameters."};
        c.rope_theta = rr.get_float("rope_theta", false, c.rope_theta, 1.0, 1e12);
    }
    *tie_given = r.has("tie_word_embeddings");
    c.tied_embeddings = r.get_bool("tie_word_embeddings", true);

    c.bos_id = r.get_int("bos_token_id", false, -1, 0, c.n_vocab - 1);
    if (const json* e = r.find("eos_token_id")) {
        if (e->is_array()) {
            for (size_t k = 0; k < e->size(); ++k) {
                const json one = json::object({{"eos_token_id", (*e)[k]}});
                JsonReader er{one, source, ""};
                c.eos_ids.push_back(er.get_int("eos_token_id", true, 0, 0, c.n_vocab - 1));
            }
        } else {
            c.eos_ids.push_back(r.get_int("eos_token_id", true, 0, 0, c.n_vocab - 1));
        }
    }
    return c;
}

// ---- GGUF ----------------------------------------------------------------------------------

int gguf_int(const GgufFile& f, const std::string& key, long long lo, long long hi) {
    const int64_t v = f.get_int(key);
    IF_CHECK(v >= lo && v <= hi, f.path() << ": metadata key '" << key << "' = " << v
                                          << " is out of range [" << lo << ", " << hi << "]");
    return int(v);
}

void check_gguf_shape(const GgufFile& f, const GgufTensorInfo& t,
                      const std::vector<int64_t>& shape) {
    bool ok = t.ne.size() >= shape.size();
    for (size_t d = 0; ok && d < t.ne.size(); ++d) {
        const uint64_t want = d < shape.size() ? uint64_t(shape[shape.size() - 1 - d]) : 1;
        ok = t.ne[d] == want;
    }
    IF_CHECK(ok, f.path() << ": tensor '" << t.name << "' has ne " << ne_str(t.ne)
                          << ", the config needs PyTorch shape " << shape_str(shape)
                          << " (ne reversed)");
    IF_CHECK(ggml_type_dequantizable(t.type),
             f.path() << ": tensor '" << t.name << "' has type " << ggml_type_name(t.type)
                      << ", which is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                      << "Q8_0, Q6_K)");
}

// The Q/K un-permutation (docs/formats.md §4.2) on whole stored rows: a row permutation, so it
// moves each row's blocks unchanged.
void unpermute_stored_rows(std::vector<uint8_t>& bytes, size_t row_bytes, int n_head,
                           int head_dim) {
    const int half = head_dim / 2;
    std::vector<uint8_t> tmp(size_t(head_dim) * row_bytes);
    for (int h = 0; h < n_head; ++h) {
        uint8_t* head = bytes.data() + size_t(h) * head_dim * row_bytes;
        for (int i = 0; i < half; ++i) {
            for (const int j : {0, 1}) {
                std::memcpy(&tmp[size_t(i + j * half) * row_bytes],
                            head + size_t(2 * i + j) * row_bytes, row_bytes);
            }
        }
        std::memcpy(head, tmp.data(), tmp.size());
    }
}

// wq, wk, wv of one stored type become one [(n_head + 2*n_head_kv)*head_dim, n_embd] matrix.
void fuse_stored_qkv(LayerWeights& L) {
    LayerWeights::Stored& s = L.stored;
    if (s.wq.empty() || s.wk.empty() || s.wv.empty()) return;
    if (s.wq.type != s.wk.type || s.wq.type != s.wv.type) return;
    StoredMatrix& f = s.wqkv;
    f.type = s.wq.type;
    f.rows = s.wq.rows + s.wk.rows + s.wv.rows;
    f.cols = s.wq.cols;
    f.bytes.reserve(s.wq.bytes.size() + s.wk.bytes.size() + s.wv.bytes.size());
    for (StoredMatrix* m : {&s.wq, &s.wk, &s.wv}) {
        f.bytes.insert(f.bytes.end(), m->bytes.begin(), m->bytes.end());
        *m = StoredMatrix();
    }
}

// Every stored matrix the CPU kernels can read in row groups is put in that layout (quant_dot.h).
// The fused wqkv is read in three row ranges (q, k, v), so each must start on a group.
void group_stored_rows(ModelWeights& w) {
    const int qd = w.config.n_head * w.config.head_dim;
    const int kd = w.config.n_head_kv * w.config.head_dim;
    auto group = [](StoredMatrix& m, bool allowed) {
        if (m.empty() || !allowed || !cpu::row_group_supported(m.type) ||
            m.rows % cpu::kRowGroup != 0)
            return;
        cpu::interleave_row_groups(m.type, m.bytes.data(), m.rows, m.cols);
        m.row_group = cpu::kRowGroup;
    };
    group(w.tok_embd_stored, true);
    group(w.output_stored, true);
    for (LayerWeights& L : w.layers) {
        LayerWeights::Stored& s = L.stored;
        for (StoredMatrix* m : {&s.wq, &s.wk, &s.wv, &s.wo, &s.w_gate, &s.w_up, &s.w_down})
            group(*m, true);
        group(s.wqkv, qd % cpu::kRowGroup == 0 && kd % cpu::kRowGroup == 0);
    }
}

// Every stored matrix into one huge-page arena (runtime/core/memory.h), one at a time, each
// loader copy freed as soon as it is copied so the peak stays near the model's size.
void pack_stored_weights(ModelWeights& w) {
    std::vector<StoredMatrix*> all = {&w.tok_embd_stored, &w.output_stored};
    for (LayerWeights& L : w.layers) {
        LayerWeights::Stored& s = L.stored;
        for (StoredMatrix* m :
             {&s.wq, &s.wk, &s.wv, &s.wqkv, &s.wo, &s.w_gate, &s.w_up, &s.w_down})
            all.push_back(m);
    }
    size_t total = 0;
    for (const StoredMatrix* m : all) total += (m->bytes.size() + 63) / 64 * 64;
    if (total == 0) return;
    w.arena = std::make_shared<HugePageArena>(total);
    for (StoredMatrix* m : all) {
        if (m->bytes.empty()) continue;
        uint8_t* p = w.arena->take(m->bytes.size());
        std::memcpy(p, m->bytes.data(), m->bytes.size());
        m->packed = p;
        m->packed_bytes = m->bytes.size();
        std::vector<uint8_t>().swap(m->bytes);
    }
}

std::string fingerprint_header(const ModelConfig& c);
uint64_t fingerprint_tensor(uint64_t h, const std::vector<float>& t, const std::string& hf_name);
void check_tensor_finite(const std::string& source, const TensorSlot& s,
                         const std::vector<float>& t);

// Matrix `s` kept in its stored `type`: a copy of its bytes at `src`.
StoredMatrix& keep_stored(const TensorSlot& s, uint32_t type, const uint8_t* src) {
    StoredMatrix& m = *s.stored;
    m.type = type;
    m.rows = s.shape[0];
    m.cols = s.shape[1];
    m.bytes.assign(src, src + ggml_row_bytes(type, numel(s.shape)));
    return m;
}

// The end of a native load: wq/wk/wv fused, rows grouped, every matrix packed into the arena;
// `h` is the fingerprint accumulated tensor by tensor (the fp32 load's).
void finish_native_load(ModelWeights& w, uint64_t h) {
    for (LayerWeights& L : w.layers) fuse_stored_qkv(L);
    group_stored_rows(w);
    pack_stored_weights(w);
    w.fingerprint = hex64(h);
}

ModelWeights load_gguf(const std::string& path, const LoadOptions& opt) {
    GgufFile f(path);
    ModelWeights w;
    w.config = model_config_from_gguf(f);
    w.source = path;
    const bool native = opt.native_weights;
    if (!native) check_memory(model_weight_bytes(w.config), path);
    // model.weights = "native": every matrix stored in a non-F32 type keeps its blocks; each
    // tensor is still dequantized once, here, into a scratch vector for the finiteness check and
    // the fingerprint (the same fingerprint as the fp32 load of the file).
    uint64_t h = native ? fnv1a64(fingerprint_header(w.config)) : 0;
    std::vector<float> scratch;
    for (const TensorSlot& s : tensor_slots(w.config, w)) {
        const GgufTensorInfo* t = f.find_tensor(s.gguf);
        IF_CHECK(t, path << ": missing tensor '" << s.gguf << "'");
        check_gguf_shape(f, *t, s.shape);
        const bool keep = native && s.stored != nullptr && t->type != uint32_t(GgmlType::F32) &&
                          cpu::native_type_supported(t->type);
        std::vector<float>& dst = keep ? scratch : *s.dst;
        dst.resize(size_t(numel(s.shape)));
        dequantize_row(t->type, f.tensor_data(*t), dst.data(), numel(s.shape));
        const bool unpermute = s.qk_heads > 0 && w.config.arch == Arch::llama && opt.unpermute_qk;
        if (unpermute) {
            const int64_t row_len = s.shape.size() == 2 ? s.shape[1] : 1;
            unpermute_qk_rows_gguf_to_hf(dst.data(), s.qk_heads, w.config.head_dim, row_len);
        }
        if (native) {
            if (opt.check_finite) check_tensor_finite(path, s, dst);
            h = fingerprint_tensor(h, dst, s.hf);
        }
        if (keep) {
            StoredMatrix& m = keep_stored(s, t->type, f.tensor_data(*t));
            if (unpermute)
                unpermute_stored_rows(m.bytes, m.row_bytes(), s.qk_heads, w.config.head_dim);
            std::vector<float>().swap(scratch);
        }
    }
    if (native) finish_native_load(w, h);
    return w;
}

// ---- HF directories ------------------------------------------------------------------------

ModelConfig config_from_hf(const std::string& path, const SafetensorsModel& st) {
    const std::string dir = is_dir(path) ? path : parent_dir(path);
    const std::string cfg_path = dir + "/config.json";
    bool tie_given = false;
    ModelConfig c = parse_hf_config_impl(read_file(cfg_path), cfg_path, &tie_given);
    if (c.name.empty()) c.name = dir;

    const std::string embd = "model.embed_tokens.weight";
    IF_CHECK(st.has(embd), path << ": missing tensor '" << embd << "'");
    const SafetensorsTensorInfo& e = st.info(embd);
    IF_CHECK(
        e.shape.size() == 2 && e.shape[1] == c.n_embd && e.shape[0] >= 1 && e.shape[0] <= (1 << 24),
        st.file_of(embd).path() << ": tensor '" << embd << "' has shape " << shape_str(e.shape)
                                << ", expected [n_vocab, " << c.n_embd << "]");
    c.n_vocab = int(e.shape[0]);  // the embedding sizes the logits (docs/formats.md §5.3)
    c.has_qkv_bias = st.has("model.layers.0.self_attn.q_proj.bias");
    c.has_qk_norm = st.has("model.layers.0.self_attn.q_norm.weight");
    IF_CHECK(c.arch != Arch::qwen3 || c.has_qk_norm,
             path << ": qwen3 checkpoint lacks tensor 'model.layers.0.self_attn.q_norm.weight'");
    const bool has_head = st.has("lm_head.weight");
    if (!tie_given) c.tied_embeddings = !has_head;
    IF_CHECK(c.tied_embeddings || has_head,
             path << ": missing tensor 'lm_head.weight' (config.json sets tie_word_embeddings "
                  << "false)");
    c.validate(cfg_path);
    return c;
}

// The GGUF type id of a safetensors dtype the CPU backend can keep as stored (F16, BF16:
// the same IEEE half / bfloat16 bytes, little-endian); 0 (F32) otherwise.
uint32_t stored_type_of_safetensors(const std::string& dtype) {
    if (dtype == "F16") return cpu::ggml_id::f16;
    if (dtype == "BF16") return cpu::ggml_id::bf16;
    return cpu::ggml_id::f32;
}

ModelWeights load_hf(const std::string& path, const LoadOptions& opt) {
    SafetensorsModel st(path);
    ModelWeights w;
    w.config = config_from_hf(path, st);
    w.source = path;
    const bool native = opt.native_weights;
    if (!native) check_memory(model_weight_bytes(w.config), path);
    // model.weights = "native": every matrix stored as F16 or BF16 keeps its bytes, as for GGUF
    // (load_gguf); each is still converted once into a scratch vector for the finiteness check
    // and the fingerprint, which equals the fp32 load's.
    uint64_t h = native ? fnv1a64(fingerprint_header(w.config)) : 0;
    std::vector<float> scratch;
    for (const TensorSlot& s : tensor_slots(w.config, w)) {
        IF_CHECK(st.has(s.hf), path << ": missing tensor '" << s.hf << "'");
        const SafetensorsTensorInfo& t = st.info(s.hf);
        IF_CHECK(t.shape == s.shape, st.file_of(s.hf).path()
                                         << ": tensor '" << s.hf << "' has shape "
                                         << shape_str(t.shape) << ", the config needs "
                                         << shape_str(s.shape));
        const uint32_t type = stored_type_of_safetensors(t.dtype);
        const bool keep = native && s.stored != nullptr && type != cpu::ggml_id::f32 &&
                          cpu::native_type_supported(type);
        std::vector<float>& dst = keep ? scratch : *s.dst;
        dst.resize(size_t(numel(s.shape)));
        st.read_f32(s.hf, dst.data());
        if (native) {
            if (opt.check_finite) check_tensor_finite(st.file_of(s.hf).path(), s, dst);
            h = fingerprint_tensor(h, dst, s.hf);
        }
        if (keep) {
            keep_stored(s, type, st.file_of(s.hf).tensor_data(t));
            std::vector<float>().swap(scratch);
        }
    }
    if (native) finish_native_load(w, h);
    return w;
}

// ---- random models -------------------------------------------------------------------------

bool parse_random(const std::string& path, std::string* shape, uint64_t* seed) {
    if (path.rfind("random:", 0) != 0) return false;
    std::string rest = path.substr(7);
    *seed = 1234;
    const size_t colon = rest.find(':');
    if (colon != std::string::npos) {
        const std::string s = rest.substr(colon + 1);
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        IF_CHECK(!s.empty() && s[0] != '-' && end && *end == 0 && errno == 0,
                 path << ": seed '" << s << "' is not a non-negative integer");
        *seed = v;
        rest = rest.substr(0, colon);
    }
    *shape = rest;
    return true;
}

}  // namespace

// ---- public API ----------------------------------------------------------------------------

namespace {

// Each head's rows between the two RoPE layouts: GGUF interleaves the halves of HF's,
// gguf[2i] = hf[i] and gguf[2i+1] = hf[i + D/2]; `to_gguf` picks the direction.
void permute_head_rows(float* rows, int n_head, int head_dim, int64_t row_len, bool to_gguf) {
    IF_CHECK(n_head > 0 && head_dim > 0 && head_dim % 2 == 0 && row_len > 0,
             (to_gguf ? "Q/K permutation" : "Q/K un-permutation")
                 << ": bad n_head " << n_head << " / head_dim " << head_dim);
    const int half = head_dim / 2;
    const size_t bytes = size_t(row_len) * 4;
    std::vector<float> tmp(size_t(head_dim) * size_t(row_len));
    for (int h = 0; h < n_head; ++h) {
        float* head = rows + int64_t(h) * head_dim * row_len;
        for (int i = 0; i < half; ++i) {
            for (const int j : {0, 1}) {
                const int64_t hf = i + j * half, gguf = 2 * i + j;
                const int64_t dst = to_gguf ? gguf : hf, src = to_gguf ? hf : gguf;
                std::memcpy(&tmp[size_t(dst * row_len)], head + src * row_len, bytes);
            }
        }
        std::memcpy(head, tmp.data(), tmp.size() * 4);
    }
}

}  // namespace

void permute_qk_rows_hf_to_gguf(float* rows, int n_head, int head_dim, int64_t row_len) {
    permute_head_rows(rows, n_head, head_dim, row_len, true);
}

void unpermute_qk_rows_gguf_to_hf(float* rows, int n_head, int head_dim, int64_t row_len) {
    permute_head_rows(rows, n_head, head_dim, row_len, false);
}

ModelConfig model_config_from_gguf(const GgufFile& f) {
    const std::string& src = f.path();
    ModelConfig c;
    const std::string arch = f.get_string("general.architecture");
    try {
        c.arch = arch_from_name(arch);
    } catch (const Error&) {
        IF_FAIL(src << ": general.architecture = \"" << arch
                    << "\" is not supported (llama, qwen2, qwen3)");
    }
    const std::string a = arch + ".";
    c.name = f.get_string_or("general.name", "");
    c.n_layer = gguf_int(f, a + "block_count", 1, 4096);
    c.n_embd = gguf_int(f, a + "embedding_length", 1, 1 << 17);
    c.n_ff = gguf_int(f, a + "feed_forward_length", 1, 1 << 20);
    c.n_head = gguf_int(f, a + "attention.head_count", 1, 4096);
    c.n_head_kv = f.has(a + "attention.head_count_kv")
                      ? gguf_int(f, a + "attention.head_count_kv", 1, 4096)
                      : c.n_head;
    c.n_ctx_train = gguf_int(f, a + "context_length", 1, 1 << 30);
    if (f.has(a + "attention.key_length")) {
        c.head_dim = gguf_int(f, a + "attention.key_length", 2, 4096);
    } else {
        IF_CHECK(c.n_embd % c.n_head == 0, src << ": " << a << "embedding_length " << c.n_embd
                                               << " is not a multiple of " << a
                                               << "attention.head_count " << c.n_head << " and "
                                               << a << "attention.key_length is absent");
        c.head_dim = c.n_embd / c.n_head;
    }
    if (f.has(a + "attention.value_length")) {
        const int vl = gguf_int(f, a + "attention.value_length", 1, 4096);
        IF_CHECK(vl == c.head_dim, src << ": " << a << "attention.value_length " << vl
                                       << " differs from the key length " << c.head_dim
                                       << " (not supported)");
    }
    if (f.has(a + "rope.dimension_count")) {
        const int rd = gguf_int(f, a + "rope.dimension_count", 1, 4096);
        IF_CHECK(rd == c.head_dim, src << ": " << a << "rope.dimension_count " << rd
                                       << " differs from the head dimension " << c.head_dim
                                       << " (partial rotary is not supported)");
    }
    c.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon"));
    c.rope_theta = float(f.get_float_or(a + "rope.freq_base", 10000.0));
    const std::string st = f.get_string_or(a + "rope.scaling.type", "none");
    if (st == "linear") {
        c.rope_scaling.type = "linear";
        c.rope_scaling.factor = float(f.get_float(a + "rope.scaling.factor"));
    } else if (st != "none") {
        IF_FAIL(src << ": " << a << "rope.scaling.type = \"" << st
                    << "\" is not supported (none, linear)");
    }
    if (st == "none" && f.has(a + "rope.scale_linear")) {
        const double s = f.get_float(a + "rope.scale_linear");
        if (s != 1.0) {
            c.rope_scaling.type = "linear";
            c.rope_scaling.factor = float(s);
        }
    }

    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    IF_CHECK(embd, src << ": missing tensor 'token_embd.weight'");
    IF_CHECK(embd->ne.size() >= 2 && embd->ne[0] == uint64_t(c.n_embd) && embd->ne[1] >= 1 &&
                 embd->ne[1] <= (1u << 24),
             src << ": tensor 'token_embd.weight' has ne " << ne_str(embd->ne) << ", expected ["
                 << c.n_embd << ", n_vocab]");
    c.n_vocab = int(embd->ne[1]);
    c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
    c.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.has_qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
    IF_CHECK(c.arch != Arch::qwen3 || c.has_qk_norm,
             src << ": qwen3 file lacks tensor 'blk.0.attn_q_norm.weight'");
    if (const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
        IF_CHECK(rf->n_elements() == uint64_t(c.head_dim / 2) && ggml_type_dequantizable(rf->type),
                 src << ": tensor 'rope_freqs.weight' has ne " << ne_str(rf->ne) << " and type "
                     << ggml_type_name(rf->type) << ", expected " << c.head_dim / 2 << " floats");
        c.rope_freq_factors.resize(size_t(c.head_dim / 2));
        dequantize_row(rf->type, f.tensor_data(*rf), c.rope_freq_factors.data(),
                       int64_t(c.rope_freq_factors.size()));
    }
    c.bos_id = int(f.get_int_or("tokenizer.ggml.bos_token_id", -1));
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
        if (!f.has(k)) continue;
        const int id = gguf_int(f, k, 0, c.n_vocab - 1);
        if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) {
            c.eos_ids.push_back(id);
        }
    }
    IF_CHECK(c.bos_id >= -1 && c.bos_id < c.n_vocab,
             src << ": tokenizer.ggml.bos_token_id " << c.bos_id << " is out of range");
    c.validate(src);
    return c;
}

ModelConfig parse_hf_config_json(const std::string& text, const std::string& source) {
    bool tie_given = false;
    ModelConfig c = parse_hf_config_impl(text, source, &tie_given);
    c.validate(source);
    return c;
}

ModelConfig model_config_from_hf(const std::string& dir) {
    SafetensorsModel st(dir);
    return config_from_hf(dir, st);
}

namespace {

// The synthetic model shapes: the dimensions of real models (and tiny ones for tests).
struct RandomShape {
    const char* name;
    Arch arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rms_eps, rope_theta;
    bool tied_embeddings, has_qkv_bias, has_qk_norm;
    bool llama3_rope;  // Llama-3.1's rope scaling: factor 8, bands 1..4, 8192 original positions
    int bos_id;
    std::vector<int> eos_ids;
};

const std::vector<RandomShape>& random_shapes() {
    // One model per two lines, the fields in the order of RandomShape.
    // clang-format off
    static const std::vector<RandomShape> shapes = {
        // name          arch         layers embd heads kv hd   ff     vocab   positions
        //     eps    theta       tied   qkv_bias qk_norm llama3 bos     eos
        {"tiny",         Arch::llama, 2,  64,   4,  2,  16,  128,   512,    1024,
             1e-5f, 10000.0f,   true,  false,   false,  false, 1,      {2}},
        {"tiny-qwen2",   Arch::qwen2, 2,  64,   4,  2,  16,  128,   512,    1024,
             1e-6f, 1000000.0f, true,  true,    false,  false, 1,      {2}},
        {"tiny-qwen3",   Arch::qwen3, 2,  64,   4,  2,  32,  128,   512,    1024,
             1e-6f, 1000000.0f, false, false,   true,   false, 1,      {2}},
        {"smollm2-135m", Arch::llama, 30, 576,  9,  3,  64,  1536,  49152,  8192,
             1e-5f, 100000.0f,  true,  false,   false,  false, 1,      {2}},
        {"llama-3.1-8b", Arch::llama, 32, 4096, 32, 8,  128, 14336, 128256, 131072,
             1e-5f, 500000.0f,  false, false,   false,  true,  128000, {128001, 128008, 128009}},
        {"qwen3-14b",    Arch::qwen3, 40, 5120, 40, 8,  128, 17408, 151936, 40960,
             1e-6f, 1000000.0f, false, false,   true,   false, 151643, {151645}},
    };
    // clang-format on
    return shapes;
}

}  // namespace

std::vector<std::string> random_model_shapes() {
    std::vector<std::string> names;
    for (const RandomShape& s : random_shapes()) names.push_back(s.name);
    return names;
}

ModelConfig random_model_config(const std::string& shape) {
    const auto& shapes = random_shapes();
    const auto it = std::find_if(shapes.begin(), shapes.end(),
                                 [&](const RandomShape& s) { return shape == s.name; });
    if (it == shapes.end()) {
        std::string all;
        for (const auto& s : random_model_shapes()) all += (all.empty() ? "" : ", ") + s;
        IF_FAIL("random:" << shape << ": unknown model shape '" << shape << "' (known: " << all
                          << ")");
    }
    ModelConfig c;
    c.name = "random:" + shape;
    c.arch = it->arch;
    c.n_layer = it->n_layer;
    c.n_embd = it->n_embd;
    c.n_head = it->n_head;
    c.n_head_kv = it->n_head_kv;
    c.head_dim = it->head_dim;
    c.n_ff = it->n_ff;
    c.n_vocab = it->n_vocab;
    c.n_ctx_train = it->n_ctx_train;
    c.rms_eps = it->rms_eps;
    c.rope_theta = it->rope_theta;
    c.tied_embeddings = it->tied_embeddings;
    c.has_qkv_bias = it->has_qkv_bias;
    c.has_qk_norm = it->has_qk_norm;
    if (it->llama3_rope) {
        c.rope_scaling.type = "llama3";
        c.rope_scaling.factor = 8.0f;
        c.rope_scaling.low_freq_factor = 1.0f;
        c.rope_scaling.high_freq_factor = 4.0f;
        c.rope_scaling.original_context = 8192;
    }
    c.bos_id = it->bos_id;
    c.eos_ids = it->eos_ids;
    c.validate(c.name);
    return c;
}

uint64_t random_tensor_key(uint64_t seed, const std::string& hf_name) {
    return seed ^ fnv1a64(hf_name);
}

// Irwin-Hall: the sum of 4 uniforms on [0, 65536) has variance 65536^2/3; scale to 0.02 std.
float random_weight_scale() { return 0.02f * std::sqrt(3.0f) / 65536.0f; }

std::vector<float> random_host_tensor(uint64_t seed, const std::string& hf_name, size_t n) {
    std::vector<float> t(n);
    if (hf_name.find("norm") != std::string::npos) {
        std::fill(t.begin(), t.end(), 1.0f);
        return t;
    }
    const uint64_t key = random_tensor_key(seed, hf_name);
    const float scale = random_weight_scale();
    for (size_t i = 0; i < n; ++i) t[i] = random_weight(key, i, scale);
    return t;
}

std::vector<WeightTensor> weight_tensors(const ModelWeights& w) {
    IF_CHECK(w.layers.size() == size_t(w.config.n_layer), w.source << ": " << w.layers.size()
                                                                   << " layers, the config needs "
                                                                   << w.config.n_layer);
    std::vector<WeightTensor> out;
    // tensor_slots only resizes the layer list, which already has the config's size.
    for (const TensorSlot& s : tensor_slots(w.config, const_cast<ModelWeights&>(w))) {
        WeightTensor t;
        t.name = s.hf;
        t.rows = s.shape[0];
        t.cols = s.shape.size() == 2 ? s.shape[1] : 0;
        t.data = s.dst;
        t.is_norm = s.hf.find("norm") != std::string::npos;
        out.push_back(t);
    }
    return out;
}

ModelWeights make_generated_weights(const ModelConfig& c, uint64_t seed) {
    c.validate(c.name.empty() ? "random model" : c.name);
    ModelWeights w;
    w.config = c;
    w.source = c.name + ":" + std::to_string(seed);
    w.generated = true;
    w.seed = seed;
    w.layers.resize(size_t(c.n_layer));
    w.validate();
    w.fingerprint = model_fingerprint(w);
    return w;
}

ModelWeights make_random_weights(const ModelConfig& c, uint64_t seed) {
    c.validate(c.name.empty() ? "random model" : c.name);
    check_memory(model_weight_bytes(c), c.name.empty() ? "random model" : c.name);
    ModelWeights w;
    w.config = c;
    w.source = c.name + ":" + std::to_string(seed);
    for (const TensorSlot& s : tensor_slots(c, w)) {
        std::vector<float>& t = *s.dst;
        t = random_host_tensor(seed, s.hf, size_t(numel(s.shape)));
    }
    w.validate();
    w.fingerprint = model_fingerprint(w);
    return w;
}

size_t model_weight_bytes(const ModelConfig& c) {
    const size_t E = size_t(c.n_embd), F = size_t(c.n_ff), V = size_t(c.n_vocab);
    const size_t Q = size_t(c.n_head) * size_t(c.head_dim);
    const size_t KV = size_t(c.n_head_kv) * size_t(c.head_dim);
    size_t per_layer = 2 * E + 2 * Q * E + 2 * KV * E + 3 * F * E;
    if (c.has_qkv_bias) per_layer += Q + 2 * KV;
    if (c.has_qk_norm) per_layer += 2 * size_t(c.head_dim);
    size_t n = V * E + E + size_t(c.n_layer) * per_layer;
    if (!c.tied_embeddings) n += V * E;
    return n * sizeof(float);
}

size_t available_memory_bytes() {
    size_t avail = std::numeric_limits<size_t>::max();
    {
        std::ifstream in("/proc/meminfo");
        std::string key;
        unsigned long long kb = 0;
        std::string unit;
        while (in >> key >> kb >> unit) {
            if (key == "MemAvailable:") {
                avail = size_t(kb) * 1024;
                break;
            }
        }
    }
    std::ifstream mx("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
    std::string max_s;
    unsigned long long used = 0;
    if (mx >> max_s && max_s != "max" && cur >> used) {
        const unsigned long long lim = std::strtoull(max_s.c_str(), nullptr, 10);
        if (lim > used) avail = std::min(avail, size_t(lim - used));
    }
    return avail;
}

namespace {

std::string fingerprint_header(const ModelConfig& c) {
    std::ostringstream os;
    auto bits = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return u;
    };
    os << "infoflow-weights-v1;" << arch_name(c.arch) << ";" << c.n_layer << ";" << c.n_embd << ";"
       << c.n_head << ";" << c.n_head_kv << ";" << c.head_dim << ";" << c.n_ff << ";" << c.n_vocab
       << ";" << bits(c.rms_eps) << ";" << bits(c.rope_theta) << ";" << c.rope_scaling.type << ";"
       << bits(c.rope_scaling.factor) << ";" << bits(c.rope_scaling.low_freq_factor) << ";"
       << bits(c.rope_scaling.high_freq_factor) << ";" << c.rope_scaling.original_context << ";"
       << c.tied_embeddings << ";" << c.has_qkv_bias << ";" << c.has_qk_norm << ";";
    for (float f : c.rope_freq_factors) os << bits(f) << ",";
    return os.str();
}

uint64_t fingerprint_tensor(uint64_t h, const std::vector<float>& t, const std::string& hf_name) {
    h = hash_bytes(reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4, h);
    return hround(h, fnv1a64(hf_name));
}

void check_tensor_finite(const std::string& source, const TensorSlot& s,
                         const std::vector<float>& t) {
    for (size_t i = 0; i < t.size(); ++i) {
        if (!std::isfinite(t[i])) {
            IF_FAIL(source << ": tensor '" << s.hf << "' (GGUF '" << s.gguf << "') has a "
                           << (std::isnan(t[i]) ? "NaN" : "infinite value") << " at element " << i
                           << " of " << t.size()
                           << " (a corrupt file; set model.check_finite = false to load it "
                              "anyway)");
        }
    }
}

}  // namespace

std::string model_fingerprint(const ModelWeights& w) {
    const ModelConfig& c = w.config;
    const std::string header = fingerprint_header(c);
    // Generated weights are a function of the config and the seed alone.
    if (w.generated) return hex64(fnv1a64("generated;" + std::to_string(w.seed) + ";" + header));
    // Stored-type weights were fingerprinted from their fp32 values when they were loaded.
    if (w.has_stored()) {
        IF_CHECK(!w.fingerprint.empty(), w.source << ": stored-type weights without a fingerprint");
        return w.fingerprint;
    }
    uint64_t h = fnv1a64(header);
    ModelWeights& mw = const_cast<ModelWeights&>(w);  // tensor_slots only reads it here
    IF_CHECK(w.layers.size() == size_t(c.n_layer), w.source << ": fingerprint of a model with "
                                                            << w.layers.size() << " layers, config "
                                                            << c.n_layer);
    for (const TensorSlot& s : tensor_slots(c, mw)) h = fingerprint_tensor(h, *s.dst, s.hf);
    return hex64(h);
}

GgufWriter model_gguf_writer(const ModelWeights& w, uint32_t type) {
    const ModelConfig& c = w.config;
    w.validate();
    IF_CHECK(ggml_type_quantizable(type),
             "cannot save a model as GGUF type " << ggml_type_name(type));
    GgufWriter g;
    const std::string a = std::string(arch_name(c.arch)) + ".";
    g.set_string("general.architecture", arch_name(c.arch));
    g.set_string("general.name", c.name);
    g.set_u32("general.file_type", 0);
    g.set_u32(a + "block_count", uint32_t(c.n_layer));
    g.set_u32(a + "context_length", uint32_t(c.n_ctx_train));
    g.set_u32(a + "embedding_length", uint32_t(c.n_embd));
    g.set_u32(a + "feed_forward_length", uint32_t(c.n_ff));
    g.set_u32(a + "attention.head_count", uint32_t(c.n_head));
    g.set_u32(a + "attention.head_count_kv", uint32_t(c.n_head_kv));
    g.set_u32(a + "attention.key_length", uint32_t(c.head_dim));
    g.set_u32(a + "attention.value_length", uint32_t(c.head_dim));
    g.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    g.set_u32(a + "rope.dimension_count", uint32_t(c.head_dim));
    g.set_f32(a + "rope.freq_base", c.rope_theta);
    g.set_u32(a + "vocab_size", uint32_t(c.n_vocab));
    if (c.rope_freq_factors.empty() && c.rope_scaling.type == "linear") {
        g.set_string(a + "rope.scaling.type", "linear");
        g.set_f32(a + "rope.scaling.factor", c.rope_scaling.factor);
    }
    if (c.bos_id >= 0) g.set_u32("tokenizer.ggml.bos_token_id", uint32_t(c.bos_id));
    if (!c.eos_ids.empty()) g.set_u32("tokenizer.ggml.eos_token_id", uint32_t(c.eos_ids[0]));

    ModelWeights& mw = const_cast<ModelWeights&>(w);
    for (const TensorSlot& s : tensor_slots(c, mw)) {
        std::vector<uint64_t> ne(s.shape.rbegin(), s.shape.rend());
        const uint32_t t = s.shape.size() == 1 ? uint32_t(GgmlType::F32) : type;
        IF_CHECK(int64_t(ne[0]) % ggml_block_elems(t) == 0,
                 "cannot save tensor '" << s.gguf << "' as " << ggml_type_name(t) << ": row length "
                                        << ne[0] << " is not a multiple of the block size");
        if (s.qk_heads > 0 && c.arch == Arch::llama) {
            std::vector<float> p = *s.dst;
            permute_qk_rows_hf_to_gguf(p.data(), s.qk_heads, c.head_dim,
                                       s.shape.size() == 2 ? s.shape[1] : 1);
            g.add_tensor(s.gguf, ne, t, p.data());
        } else {
            g.add_tensor(s.gguf, ne, t, s.dst->data());
        }
    }
    std::vector<float> freqs = c.rope_freq_factors;
    if (freqs.empty() && c.rope_scaling.type == "llama3") {
        // docs/formats.md §4.5, the rope_freqs.weight column.
        const RopeScaling& r = c.rope_scaling;
        const double L = r.original_context;
        for (int i = 0; i < c.head_dim / 2; ++i) {
            const double inv = std::pow(double(c.rope_theta), -2.0 * i / c.head_dim);
            const double wavelen = 2.0 * M_PI / inv;
            if (wavelen < L / r.high_freq_factor) {
                freqs.push_back(1.0f);
            } else if (wavelen > L / r.low_freq_factor) {
                freqs.push_back(r.factor);
            } else {
                const double s =
                    (L / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
                freqs.push_back(float(1.0 / ((1.0 - s) / r.factor + s)));
            }
        }
    }
    if (!freqs.empty()) {
        g.add_tensor("rope_freqs.weight", {uint64_t(freqs.size())}, uint32_t(GgmlType::F32),
                     freqs.data());
    }
    return g;
}

void save_model_gguf(const ModelWeights& w, const std::string& path, uint32_t type) {
    model_gguf_writer(w, type).write(path);
}

void save_model_hf(const ModelWeights& w, const std::string& dir, const std::string& dtype,
                   int n_shards) {
    const ModelConfig& c = w.config;
    w.validate();
    IF_CHECK(c.rope_freq_factors.empty(),
             dir << ": rope_freqs factors cannot be expressed in config.json");
    IF_CHECK(dtype == "F32" || dtype == "F16" || dtype == "BF16",
             dir << ": cannot save weights as dtype " << dtype);
    IF_CHECK(n_shards >= 1 && n_shards <= 99999, dir << ": bad shard count " << n_shards);
    if (!is_dir(dir)) {
        IF_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST,
                 dir << ": cannot create directory: " << std::strerror(errno));
    }

    nlohmann::ordered_json j;
    const char* cls = c.arch == Arch::llama   ? "LlamaForCausalLM"
                      : c.arch == Arch::qwen2 ? "Qwen2ForCausalLM"
                                              : "Qwen3ForCausalLM";
    j["architectures"] = {cls};
    j["model_type"] = arch_name(c.arch);
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.n_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_head_kv;
    j["head_dim"] = c.head_dim;
    j["vocab_size"] = c.n_vocab;
    j["max_position_embeddings"] = c.n_ctx_train;
    j["rms_norm_eps"] = float_for_json(c.rms_eps);
    j["rope_theta"] = float_for_json(c.rope_theta);
    if (c.rope_scaling.type == "none") {
        j["rope_scaling"] = nullptr;
    } else if (c.rope_scaling.type == "linear") {
        j["rope_scaling"] = {{"rope_type", "linear"},
                             {"factor", float_for_json(c.rope_scaling.factor)}};
    } else {
        j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                             {"factor", float_for_json(c.rope_scaling.factor)},
                             {"low_freq_factor", float_for_json(c.rope_scaling.low_freq_factor)},
                             {"high_freq_factor", float_for_json(c.rope_scaling.high_freq_factor)},
                             {"original_max_position_embeddings", c.rope_scaling.original_context}};
    }
    j["tie_word_embeddings"] = c.tied_embeddings;
    if (c.arch != Arch::qwen2) j["attention_bias"] = c.has_qkv_bias;
    j["hidden_act"] = "silu";
    if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
    if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids[0];
    if (c.eos_ids.size() > 1) j["eos_token_id"] = c.eos_ids;
    j["torch_dtype"] = dtype == "F32" ? "float32" : dtype == "F16" ? "float16" : "bfloat16";
    write_file_atomic(dir + "/config.json", j.dump(2) + "\n");

    ModelWeights& mw = const_cast<ModelWeights&>(w);
    const std::vector<TensorSlot> slots = tensor_slots(c, mw);
    if (n_shards == 1) {
        SafetensorsWriter sw;
        sw.set_metadata("format", "pt");
        for (const TensorSlot& s : slots) sw.add_tensor(s.hf, s.shape, dtype, s.dst->data());
        sw.write(dir + "/model.safetensors");
        return;
    }
    size_t total = 0;
    for (const TensorSlot& s : slots) total += s.dst->size();
    const size_t per_shard = (total + size_t(n_shards) - 1) / size_t(n_shards);
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    size_t k = 0, bytes_total = 0;
    for (int shard = 0; shard < n_shards; ++shard) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
        SafetensorsWriter sw;
        sw.set_metadata("format", "pt");
        size_t in_shard = 0;
        while (k < slots.size() && (in_shard < per_shard || shard == n_shards - 1)) {
            const TensorSlot& s = slots[k++];
            sw.add_tensor(s.hf, s.shape, dtype, s.dst->data());
            weight_map[s.hf] = name;
            in_shard += s.dst->size();
        }
        bytes_total += sw.data_bytes();
        sw.write(dir + "/" + name);
    }
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", bytes_total}};
    index["weight_map"] = weight_map;
    write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

ModelConfig load_model_config(const std::string& path) {
    std::string shape;
    uint64_t seed = 0;
    if (parse_random(path, &shape, &seed)) return random_model_config(shape);
    struct stat st;
    IF_CHECK(::stat(path.c_str(), &st) == 0,
             path << ": cannot open model: " << std::strerror(errno));
    if (S_ISDIR(st.st_mode) || ends_with(path, ".safetensors")) return model_config_from_hf(path);
    IF_CHECK(is_gguf_file(path), path << ": not a GGUF file, a Hugging Face directory or "
                                      << "random:<shape>");
    GgufFile f(path);
    return model_config_from_gguf(f);
}

ModelWeights load_model_weights(const std::string& path, const LoadOptions& opt) {
    std::string shape;
    uint64_t seed = 0;
    if (parse_random(path, &shape, &seed)) {
        ModelWeights w = opt.generate_on_backend
                             ? make_generated_weights(random_model_config(shape), seed)
                             : make_random_weights(random_model_config(shape), seed);
        w.source = path;
        return w;
    }
    struct stat st;
    IF_CHECK(::stat(path.c_str(), &st) == 0,
             path << ": cannot open model: " << std::strerror(errno));
    ModelWeights w;
    if (S_ISDIR(st.st_mode) || ends_with(path, ".safetensors")) {
        w = load_hf(path, opt);
    } else {
        IF_CHECK(is_gguf_file(path), path << ": not a GGUF file, a Hugging Face directory or "
                                          << "random:<shape>");
        w = load_gguf(path, opt);
    }
    w.validate();
    // A native load checked and fingerprinted every tensor while loading (whether or not any
    // was kept as stored); an fp32 load does both here.
    if (w.fingerprint.empty()) {
        if (opt.check_finite) check_weights_finite(w);
        w.fingerprint = model_fingerprint(w);
    }
    return w;
}

void check_weights_finite(const ModelWeights& w) {
    ModelWeights& mw = const_cast<ModelWeights&>(w);  // tensor_slots only reads it here
    for (const TensorSlot& s : tensor_slots(w.config, mw)) check_tensor_finite(w.source, s, *s.dst);
}

}  // namespace infoflow
