// Jobs (docs/design.md §9): each reads the effective config, runs, prints a human summary on rank 0
// and returns its machine-readable result.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "runtime/config/config.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

struct Session;
class Communicator;
class KvStore;

// Dispatches on cfg.job; writes the JSON result to cfg.output.path when set (atomically).
nlohmann::json run_job(const Config& cfg, Communicator& comm);

nlohmann::json run_answer(const Config& cfg, Session& s);
// The core of job answer, reused per request by job serve: one prepared request through
// cfg.method on the session's ranks (progress lines on rank 0, then run_request with `hooks`).
MethodResult answer_request(const Config& cfg, Session& s, const PreparedRequest& req,
                            const RunHooks& hooks = {});
// job = "serve" (docs/serve.md): rank 0 serves the OpenAI HTTP API (listening before the model
// is loaded, so /health says 503 meanwhile), every rank loads the model once and runs the
// requests one at a time. Owns the session (opens it itself, unlike the other jobs).
nlohmann::json run_serve(const Config& cfg, Communicator& comm);
// The session every job runs on: the model loaded on every rank, the same model checked across
// ranks (check_same_model ends the watchdog's start-up period), the placement gathered.
std::unique_ptr<Session> open_job_session(const Config& cfg, Communicator& comm);
nlohmann::json run_bench_ttft(const Config& cfg, Session& s);
// job = "niah": needle-in-a-haystack sweep over niah.lengths x niah.depths x method variants,
// each compared with `full`; also writes the rows as CSV (output.csv, or next to output.path).
nlohmann::json run_niah(const Config& cfg, Session& s);
// job = "eval": LongBench-style QA F1 of method.name and `full` over eval.data_file; CSV as niah.
nlohmann::json run_eval(const Config& cfg, Session& s);
// job = "sweep": config points x generated cases, each point scored by teacher-forced fidelity to
// `full` and by answer accuracy, with bootstrap intervals and paired comparisons (docs/quality.md).
nlohmann::json run_sweep(const Config& cfg, Session& s);
// The case generator's spec of a sweep config ([sweep]; the filler file read here), documents
// joined by `separator` (the request template's).
struct CaseSpec;
CaseSpec sweep_case_spec(const Config& cfg, const std::string& separator);
// job = "cache-build": prefills every document once into the KV store (store.path).
nlohmann::json run_cache_build(const Config& cfg, Session& s);
// The core of cache-build, reused by job serve's POST /v1/documents. Collective: context chunk i
// (1-based) of `req` is prefilled by rank (i - 1) mod P unless `store` holds it, and each rank
// commits its own chunks (the store's lock serializes the writers). `on_round` sees the totals
// after every round of P chunks. Returns on every rank each chunk's status ([n_chunks]: 1 =
// already in the store, 2 = added here; entry 0 unused) and the totals [chunks done, tokens
// prefilled, chunks added, chunks already present].
struct StoreBuild {
    std::vector<int> status;
    double totals[4] = {0, 0, 0, 0};
};
StoreBuild build_store_chunks(Session& s, const Config& cfg, const PreparedRequest& req,
                              KvStore& store,
                              const std::function<void(const double*)>& on_round = {});
// job = "reform-heads": ranks the model's (layer, head, q|k|v) states as REFORM retrieval
// embeddings on synthetic tasks and writes the best as a config snippet (reform_heads.cpp).
nlohmann::json run_reform_heads(const Config& cfg, Session& s);

// True when `answer` contains the non-empty `reference`, ignoring case (request.reference).
bool answer_matches(const std::string& answer, const std::string& reference);

// The "kv" recompute's plan with its model and measured figures (null where none was made).
nlohmann::json recompute_plan_json(const MethodResult& r);
// The JSON form of one method run (docs/design.md §9, job "answer").
nlohmann::json method_result_json(const MethodResult& r, const Session& s, const Config& cfg,
                                  int ranks);

}  // namespace infoflow
