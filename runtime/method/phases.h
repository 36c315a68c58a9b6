// The parts of the method's phases (docs/design.md §3, §5.2) that the single-rank pipeline and the
// distributed one share: the request's checks and result, the chunk prefill of phase 1 (or the
// load of its chunks from the KV store, docs/design.md §8), what phase 2 selects with, and the
// answer of phase 4 on one cache. What differs between the two pipelines stays in their own files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/core/progress.h"
#include "runtime/core/timing_clock.h"
#include "runtime/method/chunk_kv.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/pipeline.h"
#include "runtime/method/request.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "runtime/model/generate.h"

namespace infoflow {

// A result with the method and the request's sizes, after checking that the request fits the
// model's positions.
MethodResult start_result(const Model& model, const PreparedRequest& req, const Config& cfg,
                          int ranks);

// Throws unless context (T), suffix (Q) and the decode tokens fit the model's positions.
void check_positions(const Model& model, int T, int Q, int max_new);

// Throws unless cfg.method.name is none | infoflow | cacheblend | epic; `where` names the
// pipeline in the message ("single-rank", "sequence-parallel").
void check_recompute_method(const Config& cfg, const char* where);

// Phase 1 (§3.1): chunk 0 exact (no sink) and chunks [first, end) each as [sink] + chunk; every
// other chunk is a shadow (tokens and local positions, no K/V). With a store (source->uses_store())
// the chunks of [first, end) that it holds are loaded first, then `loaded` is called (the driver
// ends its "store_load" phase there), and only the others are prefilled.
std::vector<ChunkKv> prefill_context(Model& model, const PreparedRequest& req, int first, int end,
                                     ChunkSource* source = nullptr,
                                     const std::function<void()>& loaded = {});

// Phase 1's store accounting into the result; with store.mode = "read-write" first adds the
// chunks prefilled here (`chunks[i]` = chunk i of the request) to the store.
void save_to_store(ChunkSource& source, const std::vector<ChunkKv>& chunks, MethodResult& r);

// The chunk order 0, 1, .., n-1.
std::vector<int> identity_order(int n);

// Phase 2 (§3.3, §3.4): the scoring options of the config, the budget k = floor(ratio * T) and
// which context slots may be chosen (chunk 0 is exact and never is).
ScoreOptions score_options(const Config& cfg, int n_layer);
// InfoFlow's selection options of the config (scoring.span, chunk_decay, chunk_floor).
SelectOptions select_options(const Config& cfg);
struct SelectionInputs {
    int k_budget = 0;
    std::vector<uint8_t> eligible;  // [T]
};
SelectionInputs selection_inputs(const Config& cfg, const std::vector<int>& slot_chunk /*[T]*/);
// EPIC's selection (§4) with the config's mode, ratio and k.
std::vector<int> epic_select(const Config& cfg, const std::vector<int>& chunk_id,
                             const std::vector<int>& chunk_begin,
                             const std::vector<int>& chunk_size);

// `tokens` at `pos` appended to `cache` and run through every layer in row pieces of at most
// piece_rows() rows (one forward outside job serve; the same bits either way, pieces.h), each
// piece reported to piece_done; returns the logits after the last token ([n_vocab]).
std::vector<float> forward_in_pieces(Model& model, KvCache& cache,
                                     const std::vector<int32_t>& tokens,
                                     const std::vector<int32_t>& pos);

// Phase 4 on one cache (§3.6): the suffix at positions T.. (visibility group `group`, -1 none)
// over the finished cache; returns the first-token logits [n_vocab].
std::vector<float> prefill_suffix(Model& model, KvCache& cache, const PreparedRequest& req,
                                  int32_t group);
// Then the decode from r.first_logits; fills r.answer and r.stopped.
void decode_answer(Model& model, KvCache& cache, const GenerateOptions& gen, MethodResult& r);
GenerateOptions generate_options(const Config& cfg, const std::vector<int32_t>& stop_ids);

double sum_ms(const std::vector<PhaseTime>& phases);

// Time since the previous mark, per named phase (single-rank runs; SpClock adds the
// communication of a distributed one).
class PhaseClock {
  public:
    explicit PhaseClock(std::vector<PhaseTime>& out) : out_(out), t_(timing_now_ms()) {}
    void mark(const std::string& name) {
        const double t = timing_now_ms();
        out_.push_back({name, t - t_});
        progress::phase_end(name, out_.back().ms);
        t_ = t;
    }

  private:
    std::vector<PhaseTime>& out_;
    double t_;  // timing_clock.h: the wall clock unless a job chose the CPU time
};

}  // namespace infoflow
