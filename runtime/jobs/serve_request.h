// The model side of one request of job `serve` (docs/serve.md): a parsed CompletionRequest
// turned into the config and the tokens every rank runs, checked against the model first (a
// request the ranks could not run is a 400 here, never an error on a rank); the wire form that
// carries them to the other ranks; and the `infoflow` object of the response.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/method/pipeline.h"
#include "runtime/method/request.h"
#include "runtime/serve/api.h"

namespace infoflow {

struct Session;
class ChatTemplate;

struct PlannedRequest {
    Config cfg;                // the server's config with the request's overrides
    PreparedRequest prepared;  // what the `answer` job would run for the same text and config
    int n_documents = 0;
    bool documents_are_chunks = false;  // chunk i (>= 1) is document i - 1 (passage chunking)
};

// The request's text, sampling and extension fields applied to `base` and tokenized as the
// `answer` job does (chat: the system turn and earlier turns in chunk 0, the last user message
// the question; completions: the raw prompt, no chat template). Without documents the prompt
// has no instruction wording and runs `full` (there is no context to approximate). Throws
// serve::ApiError 400 naming both numbers when context + prompt + max_tokens exceed the model's
// positions, and for anything else the model cannot take.
PlannedRequest plan_completion(const Config& base, const Session& s, const ChatTemplate& raw_chat,
                               const serve::CompletionRequest& req);

// The documents of POST /v1/documents cut into chunks exactly as a question over them would
// cut them (the same key per document).
PlannedRequest plan_documents(const Config& base, const Session& s,
                              const std::vector<std::string>& documents);

// Whether the request's decode runs on one cache on rank 0 -- one rank, `full`, or the "kv"
// exchange -- so that job serve takes that cache and decodes it in its batch (RunHooks::
// take_cache). Ring attention and the "exact" exchange decode across the ranks: such a request
// decodes inside its pipeline, one at a time, the batch stepping between its tokens.
bool decodes_on_rank0(const Config& cfg, int ranks);

// The KV memory the request holds on rank 0 at its peak, for serve.kv_budget_mb: its cache
// (context + prompt + max_tokens slots, and on P ranks the room kept for the selected tokens)
// and, while its context work runs, the chunks' K/V held besides (a scoring cache too for a
// scoring layout other than "global"); a documents request, its chunks and their prefill.
uint64_t kv_need_bytes(const PlannedRequest& p, const Model& model, int ranks,
                       bool documents = false);
// Bytes of a cache as allocated (every slot of its capacity, K and V of every layer).
uint64_t kv_cache_bytes(const KvCache& cache);

// Wire form of a request for the other ranks (msgpack of the config's JSON and the tokens).
std::vector<uint8_t> encode_work(const Config& cfg, const PreparedRequest& req);
void decode_work(const std::vector<uint8_t>& bytes, Config* cfg, PreparedRequest* req);

// The response's `infoflow` object: the `answer` job's result fields for this run (method,
// answer token ids, selected_positions, first_token_top, ttft_ms, phases per rank, store use)
// plus what the server adds (queue and server-side TTFT, recomputed tokens, bytes moved, a
// hash of the whole first-token logits row, which documents came from the store).
nlohmann::json infoflow_object(const MethodResult& r, const Session& s, const PlannedRequest& p,
                               double queue_ms, double server_ttft_ms);

}  // namespace infoflow
