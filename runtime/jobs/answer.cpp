// job = "answer": one request through one method; prints the answer, per-phase times and the
// selected fraction; returns the docs/design.md §9 JSON.
#include <cctype>
#include <cmath>
#include <cstdio>

#include "kernels/cpu/cpu_features.h"
#include "runtime/core/error.h"
#include "runtime/core/progress.h"
#include "runtime/jobs/fidelity.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/model/sampling.h"
#include "runtime/parallel/run.h"

namespace infoflow {

namespace {

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

nlohmann::json recompute_plan_json(const MethodResult& r) {
    const RecomputePlanReport& p = r.recompute_plan;
    if (!p.planned) return nullptr;
    // Measured: the recompute phase, the slowest rank's time and the busiest rank's bytes.
    double ms = 0.0, bytes = 0.0;
    for (size_t i = 0; i < r.phases.size(); ++i) {
        if (r.phases[i].name != "recompute") continue;
        const auto& per = i < r.phases_per_rank.size() ? r.phases_per_rank[i]
                                                       : std::vector<PhaseTime>{r.phases[i]};
        for (const PhaseTime& t : per) {
            ms = std::max(ms, t.ms);
            bytes = std::max(bytes, double(t.bytes_sent + t.bytes_recv));
        }
    }
    auto busiest = [](const std::vector<double>& a, const std::vector<double>& b) {
        double m = 0.0;
        for (size_t q = 0; q < a.size(); ++q) m = std::max(m, a[q] + b[q]);
        return m;
    };
    return {{"mode", p.mode},
            {"balanced", r.recompute_moved > 0},
            {"moved", r.recompute_moved},
            {"link", {{"kind", p.link}, {"alpha_us", p.alpha_us}, {"beta_gbs", p.beta_gbs}}},
            {"compute_gmacs", p.gmacs},
            {"model_ms", p.model_ms},
            {"owned_model_ms", p.owned_model_ms},
            {"measured_ms", ms},
            {"bytes_sent", p.sent},
            {"bytes_recv", p.recv},
            {"owned_bytes_sent", p.owned_sent},
            {"owned_bytes_recv", p.owned_recv},
            {"max_bytes", busiest(p.sent, p.recv)},
            {"owned_max_bytes", busiest(p.owned_sent, p.owned_recv)},
            {"measured_max_bytes", bytes}};
}

bool answer_matches(const std::string& answer, const std::string& reference) {
    return !reference.empty() && lower(answer).find(lower(reference)) != std::string::npos;
}

nlohmann::json method_result_json(const MethodResult& r, const Session& s, const Config& cfg,
                                  int ranks) {
    using nlohmann::json;
    json j;
    j["job"] = to_string(cfg.job);
    j["method"] = r.method;
    j["ranks"] = ranks;
    j["model"] = s.weights->source;
    j["context_tokens"] = r.context_tokens;
    j["suffix_tokens"] = r.suffix_tokens;
    json ans;
    ans["text"] = s.tokenizer ? s.tokenizer->decode(r.answer) : std::string();
    ans["token_ids"] = r.answer;
    ans["stopped"] = r.stopped;
    j["answer"] = ans;
    json top = json::array();
    for (const auto& [id, logit] :
         top_logits(r.first_logits.data(), int(r.first_logits.size()), 20)) {
        top.push_back({{"id", id}, {"logit", logit}});
    }
    j["first_token_top"] = top;
    j["first_token_logprobs_full_vocab_file"] = nullptr;
    j["selected_positions"] = r.selected_positions;
    j["selected_fraction"] =
        r.context_tokens ? double(r.selected_positions.size()) / r.context_tokens : 0.0;
    j["chunk_order"] = r.chunk_order;
    j["ttft_ms"] = r.ttft_ms;
    j["peak_rss_mib"] = r.peak_rss_mib;
    j["shard_tokens"] = r.shard_tokens;
    j["recompute_plan"] = recompute_plan_json(r);
    j["store"] = {{"path", cfg.store.path},
                  {"tokens", r.store_tokens},
                  {"chunks", r.store_chunks},
                  {"bytes", r.store_bytes},
                  {"added", r.store_added}};
    json phases = json::array();
    for (size_t i = 0; i < r.phases.size(); ++i) {
        json ms = json::array(), sent = json::array(), recv = json::array(), wait = json::array();
        if (i < r.phases_per_rank.size()) {
            for (const PhaseTime& p : r.phases_per_rank[i]) {
                ms.push_back(p.ms);
                sent.push_back(p.bytes_sent);
                recv.push_back(p.bytes_recv);
                wait.push_back(p.wait_ms);
            }
        } else {
            ms.push_back(r.phases[i].ms);
            sent.push_back(r.phases[i].bytes_sent);
            recv.push_back(r.phases[i].bytes_recv);
            wait.push_back(r.phases[i].wait_ms);
        }
        phases.push_back({{"name", r.phases[i].name},
                          {"ms", ms},
                          {"bytes_sent", sent},
                          {"bytes_recv", recv},
                          {"wait_ms", wait}});
    }
    j["phases"] = phases;
    j["config"] = cfg.to_json();
    return j;
}

MethodResult answer_request(const Config& cfg, Session& s, const PreparedRequest& req,
                            const RunHooks& hooks) {
    const Config::Method m = cfg.method.name;
    const bool selects = m == Config::Method::infoflow || m == Config::Method::cacheblend;
    const int T = req.context_tokens();
    progress::set_tokens(T, int(req.suffix.size()),
                         selects ? int(std::floor(cfg.method.ratio * T)) : 0);
    progress::note(std::string("method ") + to_string(m) + ": " + std::to_string(T) +
                   " context tokens in " + std::to_string(req.n_chunks()) + " chunks, " +
                   std::to_string(req.suffix.size()) + " suffix tokens");
    if (!s.prefix_cache || hooks.prefix_cache) {
        return run_request(*s.model, req, cfg, *s.comm, s.tok().stop_ids(), hooks);
    }
    RunHooks with_cache = hooks;  // the session keeps chunk 0 across its requests
    with_cache.prefix_cache = s.prefix_cache.get();
    return run_request(*s.model, req, cfg, *s.comm, s.tok().stop_ids(), with_cache);
}

namespace {

// The summary's "shards" line: each rank's context tokens and how they were placed.
void print_shards(const Config& cfg, const PreparedRequest& req, const MethodResult& r) {
    if (r.shard_tokens.empty()) return;
    std::string shards;
    for (size_t q = 0; q < r.shard_tokens.size(); ++q) {
        shards += (q ? ", " : "") + std::string("rank ") + std::to_string(q) + " " +
                  std::to_string(r.shard_tokens[q]);
    }
    std::string how = std::string("placement ") + to_string(cfg.parallel.placement);
    const int n_used = int(r.chunk_order.size());
    if (n_used > req.n_chunks()) how += ", " + std::to_string(n_used) + " chunks after the cuts";
    std::printf("shards     : %s tokens (%s)\n", shards.c_str(), how.c_str());
}

// The summary's "balance" line: the recompute plan of the kv exchange, when one was made.
void print_balance(const MethodResult& r) {
    if (!r.recompute_plan.planned) return;
    const nlohmann::json p = recompute_plan_json(r);
    std::printf(
        "balance    : %s (%s): %d tokens moved; modelled %.1f ms, %.2f MB on the busiest "
        "rank (all on their owners: %.1f ms, %.2f MB); link %s (%.0f us, %.1f GB/s), "
        "%.0f GMAC/s per rank\n",
        r.recompute_plan.mode.c_str(), r.recompute_moved > 0 ? "balanced" : "unbalanced",
        r.recompute_moved, r.recompute_plan.model_ms, p["max_bytes"].get<double>() / 1e6,
        r.recompute_plan.owned_model_ms, p["owned_max_bytes"].get<double>() / 1e6,
        r.recompute_plan.link.c_str(), r.recompute_plan.alpha_us, r.recompute_plan.beta_gbs,
        r.recompute_plan.gmacs);
}

}  // namespace

nlohmann::json run_answer(const Config& cfg, Session& s) {
    const RequestText text = load_request_text(cfg.request);
    const PreparedRequest req = prepare_request(s.tok(), s.chat_template(), text, cfg);
    const MethodResult r = answer_request(cfg, s, req);
    if (s.comm->rank() != 0) return nlohmann::json();
    const std::string answer = s.tok().decode(r.answer);

    std::printf("model      : %s (%s, %d threads, %d rank%s, exchange %s)\n",
                s.weights->source.c_str(), s.backend->name().c_str(), cfg.model.threads, r.ranks,
                r.ranks > 1 ? "s" : "",
                to_string(resolve_exchange(cfg.parallel.exchange, r.ranks)));
    std::printf("device     : %s\n", devices_summary(s.devices).c_str());
    if (s.backend->name() == "cpu")
        std::printf("products   : %s\n", cpu::cpu_products_summary().c_str());
    std::printf("placement  : %s\n", placement_summary(s.placement).c_str());
    std::printf("method     : %s  ratio %.3f  layout %s%s\n", r.method.c_str(), cfg.method.ratio,
                to_string(cfg.scoring.layout), cfg.method.reorder ? "  reorder" : "");
    std::printf("context    : %d tokens in %d chunks, suffix %d tokens\n", r.context_tokens,
                req.n_chunks(), r.suffix_tokens);
    print_shards(cfg, req, r);
    if (cfg.method.name != Config::Method::full) {
        std::printf(
            "recomputed : %zu tokens (%.1f%% of the context)\n", r.selected_positions.size(),
            r.context_tokens ? 100.0 * r.selected_positions.size() / r.context_tokens : 0.0);
    }
    print_balance(r);
    if (!cfg.store.path.empty()) {
        std::printf(
            "store      : %d chunks, %d context tokens loaded from %s (%.2f MB), %d added\n",
            r.store_chunks, r.store_tokens, cfg.store.path.c_str(), r.store_bytes / 1e6,
            r.store_added);
    }
    std::printf("phases     :");
    for (const PhaseTime& p : r.phases) std::printf(" %s %.1f ms;", p.name.c_str(), p.ms);
    uint64_t sent = 0, recv = 0;
    for (const auto& per_rank : r.phases_per_rank) {
        for (const PhaseTime& p : per_rank) {
            sent += p.bytes_sent;
            recv += p.bytes_recv;
        }
    }
    std::printf("\nmoved      : %.3f MB sent, %.3f MB received (all ranks)\n", sent / 1e6,
                recv / 1e6);
    std::printf("TTFT       : %.1f ms\n", r.ttft_ms);
    if (!r.peak_rss_mib.empty()) {
        std::printf("memory     : peak resident");
        for (size_t q = 0; q < r.peak_rss_mib.size(); ++q) {
            std::printf("%s %.0f MiB", q ? "," : "", r.peak_rss_mib[q]);
        }
        if (r.peak_rss_mib.size() > 1) std::printf(" (ranks 0..%zu)", r.peak_rss_mib.size() - 1);
        std::printf("\n");
    }
    for (const PhaseTime& p : r.phases) {
        if (p.name == "decode" && r.answer.size() > 1 && p.ms > 0) {
            // The first answer token comes with the suffix prefill; decode makes the rest.
            std::printf("decode     : %zu tokens, %.1f tok/s\n", r.answer.size() - 1,
                        (r.answer.size() - 1) / (p.ms / 1000.0));
        }
    }
    std::printf("question   : %s\n", text.question.c_str());
    std::printf("answer     : %s\n", answer.c_str());
    const std::string& ref = cfg.request.reference;
    if (!ref.empty()) {
        std::printf("reference  : %s  (%s)\n", ref.c_str(),
                    answer_matches(answer, ref) ? "match: the answer contains it"
                                                : "NO MATCH: the answer does not contain it");
    }
    std::fflush(stdout);
    nlohmann::json j = method_result_json(r, s, cfg, r.ranks);
    if (!cfg.output.logits_file.empty()) {
        write_logprobs_file(cfg.output.logits_file, r.first_logits);
        j["first_token_logprobs_full_vocab_file"] = cfg.output.logits_file;
        std::printf("logits     : %s (%zu float32 log-probs)\n", cfg.output.logits_file.c_str(),
                    r.first_logits.size());
    }
    j["reference"] = ref.empty()
                         ? nlohmann::json(nullptr)
                         : nlohmann::json{{"text", ref}, {"match", answer_matches(answer, ref)}};
    return j;
}

}  // namespace infoflow
