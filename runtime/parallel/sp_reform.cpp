#include "runtime/parallel/sp_reform.h"

#include "runtime/core/error.h"
#include "runtime/method/phases.h"
#include "runtime/method/reform.h"
#include "runtime/parallel/phase_clock.h"
#include "runtime/parallel/sp_pipeline.h"

namespace infoflow {

MethodResult run_reform_sp(Model& model, const PreparedRequest& req, const Config& cfg,
                           Communicator& comm, const std::vector<int32_t>& stop_ids) {
    IF_CHECK(cfg.method.name == Config::Method::reform,
             "run_reform_sp: method " << to_string(cfg.method.name));
    IF_CHECK(cfg.parallel.emulate_ranks <= 1, "parallel.emulate_ranks is for single-rank runs (got "
                                                  << cfg.parallel.emulate_ranks << " on "
                                                  << comm.size() << " ranks)");
    const int P = comm.size(), rank = comm.rank();
    MethodResult r;
    r.method = to_string(cfg.method.name);
    r.ranks = P;
    r.context_tokens = req.context_tokens();
    r.suffix_tokens = int(req.suffix.size());
    r.chunk_order = identity_order(req.n_chunks());
    const RecurrentSpec spec = recurrent_spec(cfg, model.config());  // same checks on all ranks
    const int T = r.context_tokens;
    const std::vector<int> bounds = shard_bounds(T, P);
    const int shard = P - 1 - rank;  // rank 0 holds the last shard, next to the suffix
    const int begin = bounds[size_t(shard)], end = bounds[size_t(shard) + 1];
    SpClock clock(comm, r.phases);

    // 1. compress, no messages
    clock.begin("compress");
    Embeddings question;
    const Embeddings ctx =
        reform_compress(model, req, spec, begin, end, rank == 0 ? &question : nullptr);
    clock.end();

    // 2. gather: the question's embeddings from rank 0, the score slices to every rank
    clock.begin("gather");
    int nq = rank == 0 ? question.size() : 0;
    comm.broadcast(&nq, sizeof(int), 0);
    if (rank != 0) {
        question = Embeddings{ctx.heads, ctx.head_dim, {}};
        question.data.resize(size_t(nq) * ctx.dim());
    }
    comm.broadcast(question.data.data(), question.data.size() * sizeof(float), 0);
    const std::vector<float> mine = retrieval_scores(ctx, question);
    // Shard s lives on rank P-1-s: rank q's slice is shard P-1-q, so the slices arrive in rank
    // order and are put back in position order.
    std::vector<size_t> recv_bytes(static_cast<size_t>(P));
    for (int q = 0; q < P; ++q) {
        const int s = P - 1 - q;
        recv_bytes[size_t(q)] = size_t(bounds[size_t(s) + 1] - bounds[size_t(s)]) * sizeof(float);
    }
    std::vector<float> by_rank(static_cast<size_t>(T));
    comm.all_gather_v(mine.data(), mine.size() * sizeof(float), by_rank.data(), recv_bytes);
    std::vector<float> score(static_cast<size_t>(T));
    size_t at = 0;
    for (int q = 0; q < P; ++q) {
        const int s = P - 1 - q;
        const int n = bounds[size_t(s) + 1] - bounds[size_t(s)];
        std::copy_n(by_rank.begin() + long(at), n, score.begin() + bounds[size_t(s)]);
        at += size_t(n);
    }
    const std::vector<int> gathered =
        gather_indices(max_pool(score, cfg.reform.pool), cfg.reform.gather, cfg.reform.keep_ends);
    r.selected_positions.assign(gathered.begin(), gathered.end());
    clock.end();

    // 3. recompute, suffix and decode on rank 0 (its own phase clock), the answer broadcast.
    clock.begin("answer");
    std::vector<PhaseTime> answer_phases;
    if (rank == 0) {
        MethodResult a;
        reform_answer(model, req, cfg, stop_ids, gathered, a);
        r.first_logits = std::move(a.first_logits);
        r.answer = std::move(a.answer);
        r.stopped = a.stopped;
        answer_phases = std::move(a.phases);
    }
    int n_answer = int(r.answer.size());
    comm.broadcast(&n_answer, sizeof(int), 0);
    r.answer.resize(size_t(n_answer));
    comm.broadcast(r.answer.data(), r.answer.size() * sizeof(int32_t), 0);
    clock.end();
    // Rank 0's own split of phase 3 (recompute, suffix_prefill, decode) goes next to it; the
    // other ranks list the same names with zero time so every rank has the same phases.
    std::vector<PhaseTime> split = {{"recompute"}, {"suffix_prefill"}, {"decode"}};
    for (PhaseTime& p : split) {
        for (const PhaseTime& q : answer_phases) {
            if (q.name == p.name) p.ms = q.ms;
        }
    }
    r.phases.insert(r.phases.end(), split.begin(), split.end());
    r.ttft_ms = 0.0;
    for (const PhaseTime& p : r.phases) {
        if (p.name == "compress" || p.name == "gather" || p.name == "recompute" ||
            p.name == "suffix_prefill") {
            r.ttft_ms += p.ms;
        }
    }
    gather_phases(comm, r);
    return r;
}

}  // namespace infoflow
