// Model loading (docs/design.md §7, docs/formats.md §2, §4, §5): a GGUF file, a Hugging Face directory
// (config.json + model.safetensors or shards), or a synthetic "random:<shape>[:seed]" model,
// to fp32 weights (or, LoadOptions::native_weights, the file's stored matrices) in PyTorch layout
// with Q/K rows in HF half-split order. Also the
// reverse direction (save a model as GGUF or as an HF directory) for tests and tools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/formats/gguf.h"
#include "runtime/formats/gguf_writer.h"
#include "runtime/model/weights.h"

namespace infoflow {

struct LoadOptions {
    // Undo the llama GGUF Q/K row permutation (docs/formats.md §4.2). Tests turn it off as a negative
    // control; nothing else should.
    bool unpermute_qk = true;
    // random: models only: return the config and seed without tensor data
    // (make_generated_weights); the backend generates each tensor where it is used.
    bool generate_on_backend = false;
    // Reject NaN/Inf in any loaded tensor of a file, naming the file, the tensor and the first
    // bad element (docs/design.md §11; config model.check_finite). Synthetic models are always finite.
    bool check_finite = true;
    // Keep every matrix the file stores in a quantized or 16-bit type in that type (StoredMatrix,
    // model.weights = "native"; the CPU backend multiplies them as stored) instead of converting
    // it to fp32: GGUF quantized, F16 and BF16 matrices, safetensors F16 and BF16 ones. F32
    // matrices and random: models load fp32 either way.
    bool native_weights = false;
};

// The config alone (cheap: reads metadata, config.json and tensor headers, no weight data).
ModelConfig load_model_config(const std::string& path);
// `path`: a .gguf file, an HF directory (or a .safetensors file inside one), or
// "random:<shape>[:seed]". Throws infoflow::Error naming the file and key or tensor at fault,
// and refuses models whose fp32 weights exceed the available memory.
ModelWeights load_model_weights(const std::string& path, const LoadOptions& opt = {});

// Parts of the above, exposed for tests and tools.
ModelConfig model_config_from_gguf(const GgufFile& f);
ModelConfig model_config_from_hf(const std::string& dir);  // config.json + safetensors headers
// config.json text alone (tensor-dependent fields: has_qkv_bias/has_qk_norm false, n_vocab
// from vocab_size, tied from tie_word_embeddings or true when absent). `source` names the file.
ModelConfig parse_hf_config_json(const std::string& text, const std::string& source);

// Synthetic models. Shapes: "tiny" (llama: 2 layers, n_embd 64, 4 heads, 2 kv heads,
// head_dim 16, n_ff 128, vocab 512, 1024 positions, tied), "tiny-qwen2" (tiny + q/k/v biases),
// "tiny-qwen3" (tiny + q/k norm, head_dim 32 != n_embd/n_head), "smollm2-135m",
// "llama-3.1-8b", "qwen3-14b" (docs/formats.md §5, §8.1). Default seed 1234.
std::vector<std::string> random_model_shapes();
ModelConfig random_model_config(const std::string& shape);
// Seeded, deterministic: matrices and biases ~ approximately normal (Irwin-Hall of 4 uniforms)
// times 0.02, norms 1. Refuses (error) when the fp32 weights would not fit in memory.
ModelWeights make_random_weights(const ModelConfig& c, uint64_t seed);
// The same model without host data (ModelWeights::generated): tensors empty, layers sized to
// the config. Nothing is allocated, whatever the model's size.
ModelWeights make_generated_weights(const ModelConfig& c, uint64_t seed);
// The generator behind both (kernels/random_init.h): tensor `hf_name` has key
// random_tensor_key(seed, hf_name) and element i = random_weight(key, i, random_weight_scale());
// norms are 1 (names containing "norm").
uint64_t random_tensor_key(uint64_t seed, const std::string& hf_name);
float random_weight_scale();
std::vector<float> random_host_tensor(uint64_t seed, const std::string& hf_name, size_t n);

// Every tensor the config calls for, with its Hugging Face name and PyTorch shape, pointing
// into `w` (whose layer list must have the config's size).
struct WeightTensor {
    std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
    int64_t rows = 0;  // [rows, cols] for a matrix, [rows] for a vector (cols = 0)
    int64_t cols = 0;
    const std::vector<float>* data = nullptr;
    bool is_norm = false;
};
std::vector<WeightTensor> weight_tensors(const ModelWeights& w);

// llama GGUF Q/K row order, in place. rows: [n_head*head_dim, row_len] (row_len 1 for biases).
// hf_to_gguf is the converter's permutation (§4.1); gguf_to_hf its exact inverse (§4.2).
void permute_qk_rows_hf_to_gguf(float* rows, int n_head, int head_dim, int64_t row_len);
void unpermute_qk_rows_gguf_to_hf(float* rows, int n_head, int head_dim, int64_t row_len);

// Throws infoflow::Error naming `w.source`, the tensor and the element index of the first NaN or
// Inf in any weight tensor.
void check_weights_finite(const ModelWeights& w);

// Stable 64-bit hash (16 hex digits) of the config's numeric fields and every weight byte; the
// same fp32 weights and config give the same fingerprint whatever file they came from.
std::string model_fingerprint(const ModelWeights& w);

size_t model_weight_bytes(const ModelConfig& c);  // fp32 bytes of all weights
size_t available_memory_bytes();                  // MemAvailable, capped by the cgroup limit if any

// GGUF writer holding the model as llama.cpp would (arch keys, Q/K permuted for llama, 2-D
// matrices in `type`, 1-D tensors F32, llama3 scaling as rope_freqs.weight); callers may add
// metadata (e.g. a tokenizer) before write().
GgufWriter model_gguf_writer(const ModelWeights& w, uint32_t type);
void save_model_gguf(const ModelWeights& w, const std::string& path,
                     uint32_t type = uint32_t(GgmlType::F32));
// HF directory: config.json + model.safetensors (n_shards 1) or n_shards shards + index.json.
// dtype: "F32", "F16" or "BF16". Creates `dir` if missing.
void save_model_hf(const ModelWeights& w, const std::string& dir, const std::string& dtype = "F32",
                   int n_shards = 1);

}  // namespace infoflow
