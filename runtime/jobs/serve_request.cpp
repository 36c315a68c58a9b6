// Turning an API request into what the ranks run, and the `infoflow` object (serve_request.h).
#include "runtime/jobs/serve_request.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

using nlohmann::json;
using serve::ApiError;

namespace {

// One override through the config loader (its enum names and ranges), as a 400 on failure.
void set_key(Config& cfg, const std::string& key, const std::string& value,
             const std::string& param) {
    try {
        apply_overrides(cfg, {key + "=" + value});
    } catch (const Error& e) {
        serve::bad_field(param, e.what());
    }
}

RequestText chat_text(const serve::CompletionRequest& req) {
    RequestText text;
    const size_t n = req.messages.size();
    const bool only_system = n == 2 && req.messages[0].role == "system";
    if (only_system) {
        text.system = req.messages[0].content;  // exactly the `answer` job's request.system
    } else {
        for (size_t i = 0; i + 1 < n; ++i) {
            text.history.push_back({req.messages[i].role, req.messages[i].content});
        }
    }
    text.question = req.messages.back().content;
    return text;
}

void apply_request_overrides(const serve::CompletionRequest& req, Config& cfg) {
    cfg.decode.max_new_tokens = req.max_tokens.value_or(cfg.serve.max_tokens);
    if (req.temperature) cfg.decode.temperature = *req.temperature;
    if (req.top_p) cfg.decode.top_p = *req.top_p;
    if (req.seed) cfg.decode.seed = *req.seed;
    cfg.decode.logit_bias.clear();
    for (const auto& [id, b] : req.logit_bias) cfg.decode.logit_bias.emplace_back(id, double(b));
    if (req.method) set_key(cfg, "method.name", *req.method, "infoflow.method");
    if (req.ratio) set_key(cfg, "method.ratio", json(*req.ratio).dump(), "infoflow.ratio");
    if (req.exchange) set_key(cfg, "parallel.exchange", *req.exchange, "infoflow.exchange");
}

void check_fits(const PlannedRequest& p, const Session& s, const serve::CompletionRequest& req) {
    const int window = s.model->config().n_ctx_train;
    const int T = p.prepared.context_tokens();
    const int Q = int(p.prepared.suffix.size());
    const int M = p.cfg.decode.max_new_tokens;
    const std::string param = p.n_documents > 0                       ? "documents"
                              : req.endpoint == serve::Endpoint::chat ? "messages"
                                                                      : "prompt";
    if (T + Q > window) {
        throw ApiError(400,
                       param + ": the context (" + std::to_string(T) + " tokens) and the prompt (" +
                           std::to_string(Q) + " tokens) add up to " + std::to_string(T + Q) +
                           " tokens, more than the model's window of " + std::to_string(window),
                       param, "context_length_exceeded");
    }
    if (T + Q + M > window) {
        throw ApiError(
            400,
            "max_tokens: the context (" + std::to_string(T) + " tokens) and the prompt (" +
                std::to_string(Q) + " tokens) leave " + std::to_string(window - T - Q) +
                " of the model's " + std::to_string(window) +
                " positions for the answer, fewer than max_tokens = " + std::to_string(M),
            "max_tokens", "context_length_exceeded");
    }
    for (const auto& [id, b] : p.cfg.decode.logit_bias) {
        if (id >= s.model->config().n_vocab) {
            serve::bad_field("logit_bias." + std::to_string(id),
                             "is not a token id of this model (vocabulary of " +
                                 std::to_string(s.model->config().n_vocab) + ")");
        }
    }
}

json prepared_json(const PreparedRequest& r) {
    return {{"chunks", r.chunks},
            {"suffix", r.suffix},
            {"question_begin", r.question_begin},
            {"question_end", r.question_end},
            {"sink_id", r.sink_id},
            {"tokenizer_hash", r.tokenizer_hash}};
}

}  // namespace

PlannedRequest plan_completion(const Config& base, const Session& s, const ChatTemplate& raw_chat,
                               const serve::CompletionRequest& req) {
    PlannedRequest p;
    p.cfg = base;
    p.cfg.job = Config::Job::answer;
    apply_request_overrides(req, p.cfg);
    RequestText text;
    const ChatTemplate* chat = &s.chat_template();
    if (req.endpoint == serve::Endpoint::chat) {
        text = chat_text(req);
    } else {
        text.question = req.prompt;
        chat = &raw_chat;
        p.cfg.request.prompt_template = Config::Template::raw;
    }
    text.documents = req.documents;
    p.n_documents = int(req.documents.size());
    if (text.documents.empty()) {
        // A plain prompt: no instruction wording, and nothing for a method to approximate.
        p.cfg.request.prompt_template = Config::Template::raw;
        p.cfg.method.name = Config::Method::full;
    }
    try {
        p.prepared = prepare_request(s.tok(), *chat, text, p.cfg);
    } catch (const Error& e) {
        throw ApiError(400, std::string("the request cannot be tokenized: ") + e.what(), "",
                       "invalid_request");
    }
    p.documents_are_chunks = p.cfg.chunking.mode == Config::ChunkMode::passage &&
                             p.prepared.n_chunks() == p.n_documents + 1;
    check_fits(p, s, req);
    return p;
}

PlannedRequest plan_documents(const Config& base, const Session& s,
                              const std::vector<std::string>& documents) {
    PlannedRequest p;
    p.cfg = base;
    RequestText text;
    text.documents = documents;
    text.question = "?";  // the question does not change the chunks
    p.n_documents = int(documents.size());
    p.prepared = prepare_request(s.tok(), s.chat_template(), text, p.cfg);
    p.documents_are_chunks = p.cfg.chunking.mode == Config::ChunkMode::passage &&
                             p.prepared.n_chunks() == p.n_documents + 1;
    const int window = s.model->config().n_ctx_train;
    for (int ci = 1; ci < p.prepared.n_chunks(); ++ci) {
        const int n = int(p.prepared.chunks[size_t(ci)].size());
        if (n + 1 > window) {
            serve::bad_field("documents[" + std::to_string(ci - 1) + "]",
                             "is " + std::to_string(n) +
                                 " tokens, more than the model's window of " +
                                 std::to_string(window),
                             "context_length_exceeded");
        }
    }
    return p;
}

bool decodes_on_rank0(const Config& cfg, int ranks) {
    const Config::Method m = cfg.method.name;
    if (m == Config::Method::ring) return false;
    return ranks == 1 || m == Config::Method::full ||
           exchange_answer_on_rank0(resolve_exchange(cfg.parallel.exchange, ranks));
}

uint64_t kv_need_bytes(const PlannedRequest& p, const Model& model, int ranks, bool documents) {
    const ModelConfig& c = model.config();
    const uint64_t slot = 2ull * uint64_t(c.n_layer) * uint64_t(c.n_head_kv) *
                          uint64_t(c.head_dim) * kv_dtype_size(model.kv_dtype());
    const uint64_t T = uint64_t(p.prepared.context_tokens());
    const uint64_t Q = p.prepared.suffix.size();
    const uint64_t M = uint64_t(std::max(0, p.cfg.decode.max_new_tokens));
    if (documents) return slot * 2 * T;  // the chunks' K/V and their prefill
    if (p.cfg.method.name == Config::Method::full) return slot * (T + Q + M);
    uint64_t slots = T + Q + M + T;  // the cache, and the chunks until they are assembled
    if (ranks > 1) slots += T;       // rank 0's cache keeps room for the selected tokens
    if (p.cfg.scoring.layout != Config::Layout::global) slots += T;  // a scoring cache
    if (p.cfg.method.reorder) slots += T;                            // reorder's scoring cache
    return slot * slots;
}

uint64_t kv_cache_bytes(const KvCache& cache) {
    return 2ull * uint64_t(cache.n_layer()) * uint64_t(cache.capacity()) * cache.row_bytes();
}

std::vector<uint8_t> encode_work(const Config& cfg, const PreparedRequest& req) {
    return json::to_msgpack(json{{"config", cfg.to_json()}, {"request", prepared_json(req)}});
}

void decode_work(const std::vector<uint8_t>& bytes, Config* cfg, PreparedRequest* req) {
    const json j = json::from_msgpack(bytes);
    *cfg = Config::from_json(j.at("config"), "the request from rank 0");
    const json& r = j.at("request");
    req->chunks = r.at("chunks").get<std::vector<std::vector<int32_t>>>();
    req->suffix = r.at("suffix").get<std::vector<int32_t>>();
    req->question_begin = r.at("question_begin").get<int>();
    req->question_end = r.at("question_end").get<int>();
    req->sink_id = r.at("sink_id").get<int32_t>();
    req->tokenizer_hash = r.at("tokenizer_hash").get<std::string>();
}

json infoflow_object(const MethodResult& r, const Session& s, const PlannedRequest& p,
                     double queue_ms, double server_ttft_ms) {
    json j = method_result_json(r, s, p.cfg, r.ranks);
    j.erase("config");
    j.erase("job");
    j.erase("model");
    j["ratio"] = p.cfg.method.ratio;
    j["exchange"] = to_string(resolve_exchange(p.cfg.parallel.exchange, r.ranks));
    j["queue_ms"] = queue_ms;
    j["server_ttft_ms"] = server_ttft_ms;
    j["recomputed_tokens"] = r.selected_positions.size();
    uint64_t sent = 0, recv = 0;
    for (const auto& per_rank : r.phases_per_rank) {
        for (const PhaseTime& ph : per_rank) {
            sent += ph.bytes_sent;
            recv += ph.bytes_recv;
        }
    }
    j["bytes_moved"] = {{"sent", sent}, {"received", recv}};
    // The whole first-token row, as raw float32 bytes: equal hashes = bit-identical logits.
    j["first_token_logits_fnv1a64"] =
        fnv1a64_hex(std::string_view(reinterpret_cast<const char*>(r.first_logits.data()),
                                     r.first_logits.size() * sizeof(float)));
    if (!p.cfg.store.path.empty()) {
        json& st = j["store"];
        const int K = p.prepared.n_chunks() - 1;
        st["hits"] = r.store_chunks;
        st["misses"] = p.cfg.method.name == Config::Method::full ? 0 : K - r.store_chunks;
        json docs = json::array();
        if (p.documents_are_chunks && p.cfg.method.name != Config::Method::full) {
            const std::string chunking = chunking_label(p.cfg);
            for (int ci = 1; ci <= K; ++ci) {
                const auto& loaded = r.store_loaded_chunks;
                docs.push_back(
                    {{"index", ci - 1},
                     {"key",
                      document_key(p.prepared.chunks[size_t(ci)], p.prepared.sink_id, chunking)},
                     {"tokens", p.prepared.chunks[size_t(ci)].size()},
                     {"from_store", std::find(loaded.begin(), loaded.end(), ci) != loaded.end()}});
            }
        }
        st["documents"] = docs;
    }
    return j;
}

}  // namespace infoflow
