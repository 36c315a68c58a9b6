// The store's plain parts (names, identity, content keys) and its factory: the one place that
// knows whether HDF5 was compiled in (docs/style.md point 3).
#include "runtime/store/kv_store.h"

#include <cstdio>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

namespace infoflow {

#if INFOFLOW_HAVE_HDF5
std::unique_ptr<KvStore> open_hdf5_kv_store(const StoreOptions& opt, const StoreIdentity& id);
#endif

const char* store_dtype_name(StoreDType t) {
    switch (t) {
        case StoreDType::f16:
            return "f16";
        case StoreDType::bf16:
            return "bf16";
        case StoreDType::f32:
            return "f32";
    }
    return "?";
}

StoreIdentity store_identity(const ModelConfig& c, const std::string& model_fingerprint,
                             const std::string& tokenizer_hash, StoreDType dtype) {
    StoreIdentity id;
    id.model_fingerprint = model_fingerprint;
    id.tokenizer_hash = tokenizer_hash.empty() ? "none" : tokenizer_hash;
    id.arch = c.arch;
    id.n_layer = c.n_layer;
    id.n_head_kv = c.n_head_kv;
    id.head_dim = c.head_dim;
    id.dtype = dtype;
    return id;
}

std::string document_key(const std::vector<int32_t>& tokens, int32_t sink_id,
                         const std::string& chunking) {
    // Format version 1; the sink decides the local positions (1.. after a sink, else 0..).
    char head[64];
    std::snprintf(head, sizeof(head), "ifkv1|sink=%d|", int(sink_id));
    uint64_t h = fnv1a64(head);
    h = fnv1a64(chunking + "|", h);
    h = fnv1a64(std::string_view(reinterpret_cast<const char*>(tokens.data()),
                                 tokens.size() * sizeof(int32_t)),
                h);
    return hex64(h);
}

bool kv_store_available() {
#if INFOFLOW_HAVE_HDF5
    return true;
#else
    return false;
#endif
}

std::unique_ptr<KvStore> open_kv_store(const StoreOptions& opt, const StoreIdentity& id) {
    IF_CHECK(!opt.path.empty(), "store.path is empty");
#if INFOFLOW_HAVE_HDF5
    return open_hdf5_kv_store(opt, id);
#else
    (void)id;
    IF_FAIL("store.path = '" << opt.path
                             << "': the KV store needs HDF5, which this build was configured "
                                "without (install libhdf5-dev and re-run CMake)");
#endif
}

}  // namespace infoflow
