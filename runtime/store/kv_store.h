// The document KV store (docs/design.md §8): each document's chunk prefill (§3.1) written once into HDF5
// and loaded at query time instead of being prefilled again. This header is plain C++; the HDF5
// code lives in kv_store_hdf5.cpp, compiled only when CMake found HDF5 (`open_kv_store` says
// "not available in this build" otherwise). The layout is documented in docs/store.md:
//
//   PATH              index file: identity attributes, /documents/<key> = an external link to
//   PATH.d/<key>.h5   one document: tokens, local positions, layer_NNN/{k,v} [n_tok, n_head_kv,
//                     head_dim] (f16 | bf16 | f32, chunked, Fletcher-32), its own attributes
//   PATH.lock         the writers' lock
//
// Writes are atomic: a document file is written under a temp name and renamed, then the index
// is rewritten under a temp name and renamed, both while holding PATH.lock (so writers
// serialize). A reader sees the index before or after a commit, never a half-written document;
// a killed writer leaves at most an unreferenced temp file, removed by the next writer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model/model_config.h"

namespace infoflow {

enum class StoreDType { f16, bf16, f32 };
const char* store_dtype_name(StoreDType t);  // "f16" | "bf16" | "f32"

// What a store was written for; a store whose identity differs is refused (the error names the
// file and the attribute).
struct StoreIdentity {
    std::string model_fingerprint;  // ModelWeights::fingerprint (config + every weight byte)
    std::string tokenizer_hash;     // 16 hex digits of Tokenizer::fingerprint, "none" without one
    Arch arch = Arch::llama;
    int n_layer = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    StoreDType dtype = StoreDType::f16;
};
StoreIdentity store_identity(const ModelConfig& c, const std::string& model_fingerprint,
                             const std::string& tokenizer_hash, StoreDType dtype);

// One document's prefill, on the host: the ChunkKv of chunk_kv.h without backend buffers.
struct StoredChunk {
    std::string key;                 // document_key(tokens, sink_id, chunking)
    std::vector<int32_t> tokens;     // [n] without the sink
    std::vector<int32_t> local_pos;  // [n] positions at prefill (1.. after a sink)
    int32_t sink_id = -1;
    std::string chunking;  // chunking settings it was cut with, e.g. "passage", "fixed/2048"
    // Per layer, [n, n_head_kv, head_dim]; keys post-RoPE at local_pos.
    std::vector<std::vector<float>> k, v;
    int size() const { return int(tokens.size()); }
};

// The content key of a document: 16 hex digits of a hash of the format version, the chunking
// settings, the sink and the token ids.
std::string document_key(const std::vector<int32_t>& tokens, int32_t sink_id,
                         const std::string& chunking);

struct StoreOptions {
    std::string path;  // the index file
    bool writable = false;
    int compression = 0;            // 0 = none, 1..9 = shuffle + deflate level
    double lock_timeout_s = 600.0;  // a writer waiting longer for PATH.lock fails cleanly
};

class KvStore {
  public:
    virtual ~KvStore() = default;
    virtual const std::string& path() const = 0;
    virtual const StoreIdentity& identity() const = 0;
    // Keys of the committed documents (as of open or the last add).
    virtual bool contains(const std::string& key) const = 0;
    virtual int n_documents() const = 0;
    // Loads a committed document. `tokens` must equal the stored ones (else an error: a key
    // collision or a tampered file). Checksum failures name the document and the dataset.
    virtual StoredChunk load(const std::string& key, const std::vector<int32_t>& tokens) const = 0;
    // Adds documents in one commit (absent keys only; present ones are skipped). Returns how
    // many were added. Needs a writable store.
    virtual int add(const std::vector<const StoredChunk*>& chunks) = 0;
    // Bytes on disk of one committed document's file.
    virtual uint64_t document_bytes(const std::string& key) const = 0;
};

// Opens (or, when writable and absent, creates) the store at opt.path for `id`. A read-only
// open of a missing file is an error naming it; an existing store with another identity or
// format version is refused naming the file and the attribute.
std::unique_ptr<KvStore> open_kv_store(const StoreOptions& opt, const StoreIdentity& id);

// Whether this build can open stores (HDF5 found at configure time).
bool kv_store_available();

}  // namespace infoflow
