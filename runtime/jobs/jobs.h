// Jobs (docs/design.md §9): each reads the effective config, runs, prints a human summary on rank 0 and
// returns its machine-readable result.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/config/config.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

struct Session;
class Communicator;

// Dispatches on cfg.job; writes the JSON result to cfg.output.path when set (atomically).
nlohmann::json run_job(const Config& cfg, Communicator& comm);

nlohmann::json run_answer(const Config& cfg, Session& s);
nlohmann::json run_bench_ttft(const Config& cfg, Session& s);
// job = "niah": needle-in-a-haystack sweep over niah.lengths x niah.depths x method variants,
// each compared with `full`; also writes the rows as CSV (output.csv, or next to output.path).
nlohmann::json run_niah(const Config& cfg, Session& s);
// job = "eval": LongBench-style QA F1 of method.name and `full` over eval.data_file; CSV as niah.
nlohmann::json run_eval(const Config& cfg, Session& s);
// job = "sweep": config points x generated cases, each point scored by teacher-forced fidelity to
// `full` and by answer accuracy, with bootstrap intervals and paired comparisons (docs/quality.md).
nlohmann::json run_sweep(const Config& cfg, Session& s);
// job = "cache-build": prefills every document once into the KV store (store.path).
nlohmann::json run_cache_build(const Config& cfg, Session& s);
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
