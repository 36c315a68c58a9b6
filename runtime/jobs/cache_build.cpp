// job = "cache-build" (docs/design.md §8): prefills every document once (§3.1: [sink] + document,
// the sink's K/V dropped, keys post-RoPE at local positions) and writes it into the KV store at
// store.path. Documents come from request.documents, request.documents_file (.jsonl / .txt) or
// a folder (request.documents_file = "DIR/"); they are cut into chunks exactly as a query
// would cut them (request.template's separators, chunking.mode), so a query over the same
// documents finds every chunk by its content key.
//
// On P ranks chunk i (1-based) is prefilled by rank (i - 1) mod P; each rank commits its own
// documents one at a time through the store's writer lock (writes serialize, prefills run in
// parallel), so the file is never written by two processes at once. Documents already in the
// store are skipped: re-running a killed build finishes it. Progress on rank 0 after every
// round of P documents (one all-reduce per round).
#include <chrono>
#include <cstdio>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

StoreBuild build_store_chunks(Session& s, const Config& cfg, const PreparedRequest& req,
                              KvStore& store, const std::function<void(const double*)>& on_round) {
    Communicator& comm = *s.comm;
    const int P = comm.size();
    const int rank = comm.rank();
    const int K = req.n_chunks() - 1;
    const std::string chunking = chunking_label(cfg);
    StoreBuild out;
    std::vector<int32_t> status(size_t(req.n_chunks()), 0);
    // Per rank: [chunks done, tokens prefilled, chunks added, chunks already present].
    double mine[4] = {0, 0, 0, 0};
    const int rounds = (K + P - 1) / P;
    for (int round = 0; round < rounds; ++round) {
        const int ci = 1 + round * P + rank;
        if (ci <= K) {
            const std::vector<int32_t>& tokens = req.chunks[ci];
            const std::string key = document_key(tokens, req.sink_id, chunking);
            if (store.contains(key)) {
                mine[3] += 1;
                status[size_t(ci)] = 1;
            } else {
                const ChunkKv kv = prefill_chunk(*s.model, tokens, req.sink_id);
                const StoredChunk host = to_stored(*s.model, kv, req.sink_id, key, chunking);
                const int added = store.add({&host});
                mine[2] += added;
                status[size_t(ci)] = added ? 2 : 1;  // 1: another writer committed it first
                mine[1] += double(tokens.size());
            }
            mine[0] += 1;
        }
        double all[4] = {mine[0], mine[1], mine[2], mine[3]};
        comm.all_reduce(all, 4, DType::f64, ReduceOp::sum);
        if (on_round) on_round(all);
    }
    double all[4] = {mine[0], mine[1], mine[2], mine[3]};
    comm.all_reduce(all, 4, DType::f64, ReduceOp::sum);
    comm.all_reduce(status.data(), status.size(), DType::i32, ReduceOp::max);
    out.status.assign(status.begin(), status.end());
    for (int i = 0; i < 4; ++i) out.totals[i] = all[i];
    return out;
}

nlohmann::json run_cache_build(const Config& cfg, Session& s) {
    Communicator& comm = *s.comm;
    const int P = comm.size();
    const int rank = comm.rank();
    IF_CHECK(!cfg.store.path.empty(), "job = \"cache-build\" needs store.path (the HDF5 file)");
    IF_CHECK(cfg.chunking.mode == Config::ChunkMode::passage || cfg.chunking.size,
             "job = \"cache-build\" with chunking.mode = \"fixed\" needs chunking.size (chunks "
             "of one chunk per rank depend on the query's rank count)");
    RequestText text = load_request_text(cfg.request);
    IF_CHECK(!text.documents.empty(),
             "job = \"cache-build\": no documents (set request.documents "
             "or request.documents_file)");
    if (text.question.empty()) text.question = "?";  // the question does not change the chunks
    const PreparedRequest req = prepare_request(s.tok(), s.chat_template(), text, cfg);
    const int K = req.n_chunks() - 1;
    const std::string chunking = chunking_label(cfg);

    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<KvStore> store = open_store_for(*s.model, req.tokenizer_hash, cfg, true);
    const bool root = rank == 0;
    if (root) {
        std::printf("cache-build: %d documents (%d chunks, %d tokens) -> %s (%s, %d rank%s)\n",
                    int(text.documents.size()), K, req.context_tokens() - int(req.chunks[0].size()),
                    cfg.store.path.c_str(), to_string(cfg.store.dtype), P, P > 1 ? "s" : "");
        std::fflush(stdout);
    }

    const StoreBuild built = build_store_chunks(s, cfg, req, *store, [&](const double* all) {
        if (!root) return;
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("  [%d/%d documents] %.0f tokens prefilled, %.1f tokens/s\n", int(all[0]), K,
                    all[1], sec > 0 ? all[1] / sec : 0.0);
        std::fflush(stdout);
    });
    const double* all = built.totals;
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!root) return nlohmann::json();

    // The store as committed by every rank.
    store = open_store_for(*s.model, req.tokenizer_hash, cfg, false);
    uint64_t bytes = 0, tokens = 0;
    for (int ci = 1; ci <= K; ++ci) {
        const std::string key = document_key(req.chunks[ci], req.sink_id, chunking);
        IF_CHECK(store->contains(key), "cache-build: document chunk "
                                           << ci << " (key " << key << ") is missing from '"
                                           << cfg.store.path << "' after the build");
        bytes += store->document_bytes(key);
        tokens += req.chunks[ci].size();
    }
    std::printf("store      : %s, %d documents in total, %d added, %d already present\n",
                cfg.store.path.c_str(), store->n_documents(), int(all[2]), int(all[3]));
    std::printf("size       : %.2f MB for %llu tokens (%.0f bytes/token, %s)\n", bytes / 1e6,
                (unsigned long long)tokens, tokens ? double(bytes) / double(tokens) : 0.0,
                to_string(cfg.store.dtype));
    std::printf("time       : %.2f s, %.1f tokens/s prefilled\n", sec, sec > 0 ? all[1] / sec : 0);
    std::fflush(stdout);
    nlohmann::json j;
    j["job"] = to_string(cfg.job);
    j["ranks"] = P;
    j["model"] = s.weights->source;
    j["store"] = cfg.store.path;
    j["dtype"] = to_string(cfg.store.dtype);
    j["chunks"] = K;
    j["documents_in_store"] = store->n_documents();
    j["added"] = int(all[2]);
    j["already_present"] = int(all[3]);
    j["tokens"] = tokens;
    j["tokens_prefilled"] = all[1];
    j["bytes"] = bytes;
    j["bytes_per_token"] = tokens ? double(bytes) / double(tokens) : 0.0;
    j["seconds"] = sec;
    j["config"] = cfg.to_json();
    return j;
}

}  // namespace infoflow
