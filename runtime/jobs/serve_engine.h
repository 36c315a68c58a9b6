// Rank 0's worker of job serve (docs/serve.md "Batching"): the only thread that computes or talks
// to the other ranks. It serves until a drain, each turn either admitting the oldest waiting
// request (runtime/serve/scheduler.h) or advancing the running ones by one decode step:
//   - an admitted request's context work (store look-up, shard prefill on every rank, scoring,
//     recompute, suffix) runs through its pipeline, as job `answer` runs it, in pieces
//     (runtime/core/pieces.h): after every serve.prefill_chunk tokens of work, one decode step
//     of the running requests -- while ranks > 0 go on with their shards;
//   - then, where its decode runs on one cache on rank 0 (decodes_on_rank0), the request joins
//     the batch: each decode step is one forward over the next token of every running request,
//     each over its own cache (decode_batch, bit-identical to the request alone); ring attention
//     and the "exact" exchange decode inside their pipeline, the batch stepping between tokens;
//   - a request whose client went away or whose deadline passed leaves at the next step.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/core/pieces.h"
#include "runtime/jobs/serve_state.h"

namespace infoflow {

class ServeEngine {
  public:
    explicit ServeEngine(ServeState& st);
    ~ServeEngine();
    ServeEngine(const ServeEngine&) = delete;
    ServeEngine& operator=(const ServeEngine&) = delete;

    // Serves until a signal (or another rank's drain flag): then finishes every running
    // request, answers the queued ones 503 and stops every rank. Returns the job's result.
    nlohmann::json run();

  private:
    struct Running;

    void handle(const std::shared_ptr<serve::Task>& t);
    void run_completion(const std::shared_ptr<serve::Task>& t);
    MethodResult run_pipeline(Running& run);
    void start_decode(std::unique_ptr<Running> run);
    void run_documents(DocumentsTask& t);
    void decode_step();
    // Pieces are cut only while requests decode (nothing else waits for the steps).
    void pause_pieces_if_idle();
    void drop_leavers();
    void finish(Running& run);
    void respond(Running& run);
    void report(Running& run);
    void report_left(const Running& run);
    void command(int64_t c, std::vector<uint8_t> payload);
    void heartbeat_if_due();
    void begin_drain();

    ServeState& st_;
    std::unique_ptr<PieceScope> pieces_;  // while serving: context work between decode steps
    std::vector<std::unique_ptr<Running>>
        batch_;                     // requests decoding on rank 0, in admission order
    bool in_context_work_ = false;  // a request's pipeline is running
    std::deque<serve::Clock::time_point> step_starts_;  // of the last decode steps
    bool draining_ = false;
    uint64_t served_ = 0;
    serve::Clock::time_point last_heartbeat_;
};

}  // namespace infoflow
