// job = "sweep" (docs/quality.md): config points x generated cases. Every point is a set of
// config overrides (sweep.key with sweep.values, and sweep.points); every case comes from the
// case generator (cases.h). Per case, what is the same for every point is done once: the case's
// `full` run (the reference: its answer, and its teacher-forced next-token distributions along
// the reference continuation, fidelity.h) and the chunk prefill of phase 1 (§3.1), which no
// point may change. Then every point runs phases 2-4 on those chunks and is scored against
// `full`: KL(full || point) per answer token, the reference's log-likelihood, argmax agreement
// along the answer, and whether the greedy answer contains the gold answer. The summary gives
// n, the mean and a 95 % bootstrap interval of every measure per point (stats.h), and paired
// comparisons on the same cases: each point's accuracy against `full`'s, and each point's
// accuracy and mean KL against the first point's. A point that sets store.path takes its chunks
// from that KV store instead (the case's documents cached one by one first, then loaded in the
// case's order): the store path against the fresh chunk prefill (docs/quality.md "The store").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/progress.h"
#include "runtime/core/timing_clock.h"
#include "runtime/jobs/cases.h"
#include "runtime/jobs/fidelity.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/jobs/stats.h"
#include "runtime/method/chunk_store.h"
#include "runtime/method/phases.h"
#include "runtime/model/sampling.h"
#include "runtime/parallel/emulate.h"
#include "runtime/parallel/ring.h"
#include "runtime/store/kv_store.h"

namespace infoflow {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Point {
    std::string label;
    Config cfg;
};

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    const size_t e = s.find_last_not_of(" \t\r\n");
    return s.substr(b, e - b + 1);
}

// Sections every point shares: they decide the cases, their tokens and the chunk prefill.
// A point may change [parallel] only in what a P-rank point is (parallel.virtual_ranks, the
// exchange and the balance), and [store] only in where its chunks come from (store.path,
// store.dtype, store.mode: a store point, below).
void check_shared(const Config& base, const Config& p, const std::string& where) {
    json a = base.to_json(), b = p.to_json();
    for (json* j : {&a, &b}) {
        for (const char* k : {"virtual_ranks", "exchange", "balance"}) (*j)["parallel"].erase(k);
        for (const char* k : {"path", "dtype", "mode"}) (*j)["store"].erase(k);
    }
    for (const char* sec :
         {"model", "request", "chunking", "decode", "sweep", "store", "parallel", "output"}) {
        IF_CHECK(
            a.at(sec) == b.at(sec),
            where << " changes [" << sec << "], which every point of a sweep shares"
                  << (std::string(sec) == "parallel"
                          ? " (points may set parallel.virtual_ranks, exchange, balance)"
                      : std::string(sec) == "store" ? " (points may set store.path, dtype, mode)"
                                                    : ""));
    }
    IF_CHECK(a.at("job") == b.at("job"), where << " changes job");
}

std::vector<Point> sweep_points(const Config& cfg) {
    std::vector<Point> out;
    auto add = [&](const std::string& label, const std::vector<std::string>& sets,
                   const std::string& where) {
        Point p{label, cfg};
        try {
            apply_overrides(p.cfg, sets);
        } catch (const Error& e) {
            IF_FAIL(where << " '" << label << "': " << e.what());
        }
        check_shared(cfg, p.cfg, where + " '" + label + "'");
        for (const Point& q : out) {
            IF_CHECK(q.label != label, where << ": point '" << label << "' is listed twice");
        }
        out.push_back(std::move(p));
    };
    IF_CHECK(cfg.sweep.key.empty() || !cfg.sweep.values.empty(),
             "sweep.key = '" << cfg.sweep.key << "' has no sweep.values");
    IF_CHECK(cfg.sweep.values.empty() || !cfg.sweep.key.empty(),
             "sweep.values is set but sweep.key is empty");
    for (size_t i = 0; i < cfg.sweep.values.size(); ++i) {
        const std::string set = cfg.sweep.key + "=" + cfg.sweep.values[i];
        add(set, {set}, "sweep.values[" + std::to_string(i) + "]");
    }
    for (size_t i = 0; i < cfg.sweep.points.size(); ++i) {
        std::vector<std::string> sets;
        std::string label;
        const std::string& text = cfg.sweep.points[i];
        size_t at = 0;
        while (at <= text.size()) {
            size_t semi = text.find(';', at);
            if (semi == std::string::npos) semi = text.size();
            const std::string one = trim(text.substr(at, semi - at));
            if (!one.empty()) {
                sets.push_back(one);
                label += (label.empty() ? "" : "; ") + one;
            }
            at = semi + 1;
        }
        IF_CHECK(!sets.empty(), "sweep.points[" << i << "] is empty");
        add(label, sets, "sweep.points[" + std::to_string(i) + "]");
    }
    IF_CHECK(!out.empty(),
             "job sweep has no points: set sweep.key and sweep.values, or "
             "sweep.points");
    return out;
}

// Per point: the per-case values of every measure, in case order.
struct PointValues {
    std::map<std::string, std::vector<double>> v;
    std::map<std::string, std::vector<double>> correct_by_kind;
};

const std::vector<std::string>& measures() {
    static const std::vector<std::string> m = {
        "correct", "mean_kl", "first_kl",          "max_kl",  "ref_logprob", "argmax_agree",
        "ref_hit", "exact",   "selected_fraction", "ttft_ms", "online_ms"};
    return m;
}

json case_json(const QualityCase& c) {
    std::string context;
    for (size_t i = 0; i < c.documents.size(); ++i) {
        context += (i ? "\n" : "") + std::string("Passage ") + std::to_string(i + 1) + ":\n" +
                   c.documents[i];
    }
    return {{"_id", "sweep-" + std::to_string(c.index)},
            {"kind", c.kind},
            {"relation", c.relation},
            {"context", context},
            {"documents", c.documents},
            {"input", c.question},
            {"answers", c.answers},
            {"evidence_docs", c.evidence_docs},
            {"depth", c.depth},
            {"document_tokens", c.document_tokens}};
}

// What the sweep keeps across its cases.
struct SweepState {
    SweepState(const Config& c, Session& ss)
        : cfg(c),
          s(ss),
          tok(ss.tok()),
          chat(ss.chat_template()),
          model(*ss.model),
          V(ss.model->config().n_vocab),
          spec(sweep_case_spec(c, instruction_text(c.request.prompt_template).doc_separator)),
          points(sweep_points(c)),
          full_cfg(c),
          row_log(jsonl_path(c)),
          vals(points.size()) {
        full_cfg.method.name = Config::Method::full;
    }
    const Config& cfg;
    Session& s;
    const Tokenizer& tok;
    const ChatTemplate& chat;
    Model& model;
    const int V;
    const CaseSpec spec;
    const std::vector<Point> points;
    Config full_cfg;
    json rows = json::array();
    RowLog row_log;
    std::string cases_text;
    PointValues full_vals;
    std::vector<PointValues> vals;
    int kept = 0, tried = 0;
    // Per kind/relation: cases generated and how many `full` answered correctly.
    std::map<std::string, std::pair<int, int>> by_relation;
};

// One case: its request, `full`'s run and its rows along the reference continuation, the chunk
// prefill every point shares, and the rows of the case (full, then the points in order).
struct CaseRun {
    QualityCase qc;
    PreparedRequest req;
    int T = 0, prompt = 0;
    std::vector<int32_t> ref;
    std::vector<float> full_rows;
    MethodResult full;
    std::string full_answer;
    bool full_correct = false;
    std::vector<ChunkKv> chunks;
    double chunk_ms = 0.0;
    std::vector<json> rows;
};

// What one point's run gives.
struct PointRun {
    MethodResult r;
    std::vector<float> rows_m;  // teacher-forced rows along the reference
    bool virtual_ranks = false;
    EmulatedTiming timing;
};

void check_sweep_config(const Config& cfg, const Session& s) {
    IF_CHECK(!s.comm || s.comm->size() == 1,
             "job sweep runs on one rank (its points use the single-rank pipeline), got "
                 << s.comm->size());
    IF_CHECK(cfg.parallel.emulate_ranks <= 1, "job sweep needs parallel.emulate_ranks = 0");
    IF_CHECK(cfg.decode.temperature == 0.0,
             "job sweep needs greedy decoding (decode.temperature = 0): the reference is full's "
             "greedy answer");
    IF_CHECK(cfg.decode.max_new_tokens >= 1, "job sweep needs decode.max_new_tokens >= 1");
    IF_CHECK(cfg.store.path.empty(),
             "job sweep: store.path is set per point (sweep.points: \"store.path=...\"), not for "
             "the whole sweep");
    IF_CHECK(cfg.sweep.clock == Config::SweepClock::wall || cfg.model.threads == 1,
             "sweep.clock = \"cpu\" needs model.threads = 1 (the process's CPU time counts "
             "every thread), got model.threads = "
                 << cfg.model.threads);
}

void print_header(const SweepState& st) {
    const Config& cfg = st.cfg;
    std::string kinds;
    for (const auto& x : cfg.sweep.kinds) kinds += (kinds.empty() ? "" : "+") + x;
    std::printf(
        "sweep      : %s (%s, %d threads), %zu points x %d cases (%s), reference %s, %s clock\n",
        st.s.weights->source.c_str(), st.s.backend->device().c_str(), cfg.model.threads,
        st.points.size(), cfg.sweep.cases, kinds.c_str(), cfg.sweep.reference.c_str(),
        to_string(cfg.sweep.clock));
    std::printf(
        "cases      : ~%d context tokens in %d documents, %s layout, seed %llu, from case "
        "%d%s\n",
        cfg.sweep.context_tokens, cfg.sweep.documents, st.spec.long_layout() ? "long" : "original",
        static_cast<unsigned long long>(cfg.sweep.seed), cfg.sweep.first_case,
        cfg.sweep.full_correct_only ? ", only cases full answers correctly" : "");
    std::printf("points     :");
    for (const Point& p : st.points) std::printf(" [%s]", p.label.c_str());
    std::printf("\n");
    if (!st.row_log.path().empty()) {
        std::printf("rows       : %s (one line per finished run)\n", st.row_log.path().c_str());
    }
    std::fflush(stdout);
}

// `full`'s run of the case, its greedy answer and its rows along the reference continuation
// (the gold answer, or full's own answer and stop token).
void run_full_reference(SweepState& st, CaseRun& c) {
    const Config& cfg = st.cfg;
    if (cfg.sweep.reference == "gold") {
        c.ref = st.tok.encode(c.qc.answers[0]);
        if (int(c.ref.size()) > cfg.decode.max_new_tokens)
            c.ref.resize(size_t(cfg.decode.max_new_tokens));
    }
    RunHooks hooks;
    hooks.after_decode = [&](KvCache& cache, MethodResult& r) {
        if (cfg.sweep.reference == "full") {
            // The greedy answer and, when it stopped, its stop token: the token after the
            // answer, i.e. the argmax of the row after it (any id stands in while it is fed).
            c.ref = r.answer;
            if (r.stopped) c.ref.push_back(0);
        }
        c.full_rows = teacher_forced_logits(st.model, cache, c.prompt, r.first_logits, c.ref);
        if (cfg.sweep.reference == "full" && r.stopped) {
            c.ref.back() = argmax(c.full_rows.data() + (c.ref.size() - 1) * size_t(st.V), st.V);
        }
    };
    c.full = run_method(st.model, c.req, st.full_cfg, st.tok.stop_ids(), hooks);
    c.full_answer = st.tok.decode(c.full.answer);
    c.full_correct = case_correct(c.qc, c.full_answer);
}

// A point that loads its chunks from its own store (store.path) instead of sharing the fresh
// chunk prefill: the case's documents are cached one by one first, in a shuffled order (each a
// commit of its own, as POST /v1/documents or cache-build add them; those already there are
// kept), then the point's run loads every one from the store in the case's order.
bool is_store_point(const Point& p) { return !p.cfg.store.path.empty(); }

void cache_documents(SweepState& st, CaseRun& c, const Point& p) {
    std::unique_ptr<KvStore> store =
        open_store_for(st.model, c.req.tokenizer_hash, p.cfg, /*writable=*/true);
    const std::string chunking = chunking_label(p.cfg);
    std::vector<int> order;
    for (int ci = 1; ci < c.req.n_chunks(); ++ci) order.push_back(ci);
    std::mt19937 rng(uint32_t(c.qc.index));
    std::shuffle(order.begin(), order.end(), rng);
    for (int ci : order) {
        const std::string key = document_key(c.req.chunks[size_t(ci)], c.req.sink_id, chunking);
        if (c.req.chunks[size_t(ci)].empty() || store->contains(key)) continue;
        const StoredChunk sc =
            to_stored(st.model, c.chunks[size_t(ci)], c.req.sink_id, key, chunking);
        store->add({&sc});
    }
}

// Whether greedy decoding would give exactly full's answer: teacher forcing along full's answer
// and its stop token hit every step's argmax (then the decode is skipped: exact, no estimate).
bool needs_decode(const SweepState& st, const CaseRun& c, const std::vector<float>& rows_m) {
    return !(st.cfg.sweep.reference == "full" &&
             compare_teacher_forced(c.full_rows, rows_m, c.ref, st.V).all_hit);
}

// One point's run over the case: on the shared chunks (or its store's), one rank or P virtual
// ranks, teacher-forced along the reference; full's answer stands where the decode was skipped.
PointRun run_point(SweepState& st, CaseRun& c, const Point& p) {
    PointRun out;
    bool decoded = true;
    const int P = p.cfg.parallel.virtual_ranks;
    if (P > 1) {
        IF_CHECK(!is_store_point(p), "sweep point '" << p.label << "': store.path with "
                                                     << "parallel.virtual_ranks is not "
                                                        "implemented yet");
        // P virtual ranks: every rank copies its chunks from `chunks`; rank 0's
        // teacher-forced rows come back through on_forced.
        RunHooks hooks;
        hooks.chunks = &c.chunks;
        hooks.forced_ref = &c.ref;
        hooks.on_forced = [&](const std::vector<float>& rows, MethodResult&) {
            out.rows_m = rows;
            return decoded = needs_decode(st, c, out.rows_m);
        };
        const EmulatedRun er =
            run_emulated(st.model, c.req, p.cfg, P, LinkModel(), st.tok.stop_ids(), hooks);
        out.r = er.per_rank[0];
        out.timing = er.timing;
        out.virtual_ranks = true;
    } else {
        RunHooks hooks;
        Config pcfg = p.cfg;
        if (is_store_point(p)) {
            cache_documents(st, c, p);
            pcfg.store.mode = Config::StoreMode::read;  // phase 1 loads every chunk
        } else {
            hooks.chunks = &c.chunks;
        }
        hooks.before_decode = [&](KvCache& cache, MethodResult& r) {
            out.rows_m = teacher_forced_logits(st.model, cache, c.prompt, r.first_logits, c.ref);
            return decoded = needs_decode(st, c, out.rows_m);
        };
        out.r = run_method(st.model, c.req, pcfg, st.tok.stop_ids(), hooks);
    }
    if (!decoded) {
        out.r.answer = c.full.answer;
        out.r.stopped = c.full.stopped;
    }
    return out;
}

// The busiest rank's bytes of ring attention (zigzag, p2p) over the same prompt on P ranks: the
// reference of the exchanges' bytes (docs/quality.md, "P ranks").
uint64_t ring_reference_bytes(Model& model, int n_tokens, int P) {
    const KvCache one = model.make_cache(1);
    const std::vector<uint64_t> b =
        ring_prefill_bytes(n_tokens, P, true, one.row_bytes(), model.config().n_layer);
    return *std::max_element(b.begin(), b.end());
}

// A P-rank point's communication up to the first token (every phase before the decode): each
// rank's bytes sent + received, the busiest rank's, and the ring's reference.
void add_bytes(json& row, const MethodResult& r, uint64_t ring_max) {
    std::vector<uint64_t> per_rank;
    for (const auto& phase : r.phases_per_rank) {
        if (phase.empty() || phase[0].name == "decode") continue;
        per_rank.resize(phase.size(), 0);
        for (size_t q = 0; q < phase.size(); ++q) {
            per_rank[q] += phase[q].bytes_sent + phase[q].bytes_recv;
        }
    }
    row["bytes_ranks"] = per_rank;
    row["bytes_max"] = per_rank.empty() ? 0 : *std::max_element(per_rank.begin(), per_rank.end());
    row["ring_bytes_max"] = ring_max;
}

// The time to the first token a point would have: the shared chunk prefill plus its own
// online work (a store point loads its chunks itself; virtual ranks: the modelled critical path
// after the shard prefill, which copies the shared chunks; emulate.h).
double online_ms(const PointRun& pr) {
    if (!pr.virtual_ranks) return pr.r.ttft_ms;
    double online = 0.0;
    for (const auto& [name, ms] : pr.timing.critical_path) {
        if (name != "shard_prefill" && name != "store_load") online += ms;
    }
    return online;
}

json point_row(const SweepState& st, const CaseRun& c, const std::string& label, const PointRun& pr,
               bool is_full, bool from_store, const Config& pcfg) {
    const MethodResult& r = pr.r;
    const Fidelity f = compare_teacher_forced(c.full_rows, pr.rows_m, c.ref, st.V);
    const std::string answer = st.tok.decode(r.answer);
    const double online = online_ms(pr);
    const bool shared = !is_full && !from_store;
    json row = {{"case", c.qc.index},
                {"kind", c.qc.kind},
                {"relation", c.qc.relation},
                {"depth", c.qc.depth},
                {"documents", c.qc.documents.size()},
                {"evidence_docs", c.qc.evidence_docs},
                {"point", label},
                {"method", r.method},
                {"context_tokens", c.T},
                {"suffix_tokens", r.suffix_tokens},
                {"reference_tokens", c.ref.size()},
                {"answer", answer},
                {"answers", c.qc.answers},
                {"correct", case_correct(c.qc, answer)},
                {"first_kl", f.kl.empty() ? 0.0 : f.kl[0]},
                {"mean_kl", f.mean_kl},
                {"max_kl", f.max_kl},
                {"ref_logprob", f.ref_logprob},
                {"ref_logprob_full", f.ref_logprob_full},
                {"argmax_agree", f.argmax_agree},
                {"ref_hit", f.ref_hit},
                {"exact", f.all_hit},
                {"first_miss", f.first_miss},
                {"selected_fraction", c.T ? double(r.selected_positions.size()) / c.T : 0.0},
                {"chunk_prefill_ms", shared ? c.chunk_ms : 0.0},
                {"online_ms", online},
                {"ttft_ms", shared    ? c.chunk_ms + online
                            : is_full ? r.ttft_ms
                                      : online},
                {"phases", phases_json(r.phases)},
                {"ranks", pr.virtual_ranks ? pr.timing.ranks : 1}};
    if (from_store) {
        row["store"] = {{"dtype", to_string(pcfg.store.dtype)}, {"chunks_loaded", r.store_chunks}};
    }
    if (pr.virtual_ranks) {
        json cp = json::array();
        for (const auto& [name, ms] : pr.timing.critical_path) cp.push_back({{name, ms}});
        row["critical_path"] = cp;
        row["exchange"] = to_string(resolve_exchange(pcfg.parallel.exchange, pr.timing.ranks));
        row["softmax"] = to_string(pcfg.scoring.softmax);
        add_bytes(row, r, ring_reference_bytes(st.model, c.T + r.suffix_tokens, pr.timing.ranks));
    }
    return row;
}

// Files a finished row under its point (slot 0: full) and returns whether it was correct.
bool record(const CaseRun& c, PointValues& pv, json row, json& slot) {
    for (const std::string& m : measures()) {
        const json& x = row[m];
        pv.v[m].push_back(x.is_boolean() ? double(x.get<bool>()) : x.get<double>());
    }
    const bool correct = row["correct"].get<bool>();
    pv.correct_by_kind[c.qc.kind].push_back(correct);
    slot = std::move(row);
    return correct;
}

// Every point over the case, in an order rotated by one per case, so that whatever the first
// run after the chunk prefill pays (fresh pages of its caches) falls on every point alike;
// their rows are written in point order. Returns the points' mean accuracy and mean KL.
std::pair<double, double> run_points(SweepState& st, CaseRun& c) {
    double acc_sum = 0.0, kl_sum = 0.0;
    const size_t n = st.points.size();
    for (size_t step = 0; step < n; ++step) {
        const size_t pi = (step + size_t(st.kept - 1)) % n;
        const Point& p = st.points[pi];
        if (p.cfg.method.name == Config::Method::full) {
            PointRun full{c.full, c.full_rows, false, {}};
            acc_sum += record(c, st.vals[pi], point_row(st, c, p.label, full, true, false, p.cfg),
                              c.rows[pi + 1]);
            continue;
        }
        const PointRun pr = run_point(st, c, p);
        acc_sum +=
            record(c, st.vals[pi], point_row(st, c, p.label, pr, false, is_store_point(p), p.cfg),
                   c.rows[pi + 1]);
        kl_sum += st.vals[pi].v["mean_kl"].back();
    }
    return {acc_sum / double(n), kl_sum / double(n)};
}

// Case `idx`: full's run, then (unless sweep.full_correct_only drops it) the shared chunk
// prefill and every point. Returns whether it was kept.
bool run_case(SweepState& st, int idx, progress::Sweep& sweep) {
    const Config& cfg = st.cfg;
    ++st.tried;
    CaseRun c;
    const TokenCounter count = [&](const std::string& t) { return int(st.chat.text(t).size()); };
    c.qc = make_case(st.spec, idx, count);
    c.req = prepare_request(st.tok, st.chat,
                            RequestText{cfg.request.system, c.qc.documents, c.qc.question}, cfg);
    c.T = c.req.context_tokens();
    c.prompt = c.T + int(c.req.suffix.size());
    run_full_reference(st, c);
    auto& tally = st.by_relation[c.qc.kind + "/" + c.qc.relation];
    ++tally.first;
    tally.second += c.full_correct;
    if (cfg.sweep.full_correct_only && !c.full_correct) return false;
    ++st.kept;
    if (!cfg.sweep.cases_file.empty()) st.cases_text += case_json(c.qc).dump() + "\n";
    const double t_chunks = timing_now_ms();
    c.chunks = prefill_context(st.model, c.req, 1, c.req.n_chunks());  // phase 1, once
    c.chunk_ms = timing_now_ms() - t_chunks;
    c.rows.resize(st.points.size() + 1);
    PointRun full{c.full, c.full_rows, false, {}};
    record(c, st.full_vals, point_row(st, c, "full", full, true, false, st.full_cfg), c.rows[0]);
    const auto [acc, kl] = run_points(st, c);
    for (json& row : c.rows) {
        st.row_log.append(row);
        st.rows.push_back(std::move(row));
    }
    sweep.step();
    std::printf(
        "[sweep %*d/%d] case %d %-8s %-16s T %4d  full %s \"%s\"  points: acc %.2f "
        "KL %.4f  ETA %s\n",
        int(std::to_string(cfg.sweep.cases).size()), st.kept, cfg.sweep.cases, idx,
        c.qc.kind.c_str(), c.qc.relation.c_str(), c.T, c.full_correct ? "ok  " : "MISS",
        one_line(c.full_answer).c_str(), acc, kl, sweep.eta().c_str());
    std::fflush(stdout);
    return true;
}

// One point's summary: every measure's interval and the paired comparisons (against full,
// and against the first point), as JSON and as a row of the printed table.
json summary_row(const SweepState& st, const std::string& label, const PointValues& pv,
                 bool is_full, std::vector<std::string>* table_row) {
    auto iv = [&](const std::string& m) { return bootstrap_mean(pv.v.at(m)); };
    json row = {{"point", label}, {"reference", is_full}};
    for (const std::string& m : measures()) row[m] = iv(m).json();
    json kinds = json::object();
    for (const auto& [k, v] : pv.correct_by_kind) kinds[k] = bootstrap_mean(v).json();
    row["correct_by_kind"] = kinds;
    const PairedComparison vs_full =
        paired_comparison(pv.v.at("correct"), st.full_vals.v.at("correct"));
    const PointValues& first = st.vals[0];
    const PairedComparison acc_first = paired_comparison(pv.v.at("correct"), first.v.at("correct"));
    const PairedComparison kl_first = paired_comparison(pv.v.at("mean_kl"), first.v.at("mean_kl"));
    row["correct_vs_full"] = vs_full.json();
    row["correct_vs_first"] = acc_first.json();
    row["mean_kl_vs_first"] = kl_first.json();
    *table_row = {label + (is_full ? " (ref)" : ""),
                  std::to_string(iv("correct").n),
                  iv("correct").str("%.2f"),
                  is_full ? "-" : vs_full.str("%+.2f"),
                  iv("mean_kl").str("%.4f"),
                  is_full || &pv == &st.vals[0] ? "-" : kl_first.str("%+.4f"),
                  iv("first_kl").str("%.4f"),
                  fmt("%.3f", iv("argmax_agree").mean),
                  fmt("%.2f", iv("exact").mean),
                  fmt("%.3f", iv("ref_logprob").mean),
                  fmt("%.3f", iv("selected_fraction").mean),
                  fmt("%.1f", iv("ttft_ms").mean),
                  fmt("%.1f", iv("online_ms").mean)};
    return row;
}

// Prints the summary table and the case tallies; returns the summary and full's tallies.
std::pair<json, json> print_summary(const SweepState& st, double wall_s) {
    json summary = json::array();
    std::vector<std::vector<std::string>> table(st.points.size() + 1);
    summary.push_back(summary_row(st, "full", st.full_vals, true, &table[0]));
    for (size_t pi = 0; pi < st.points.size(); ++pi) {
        summary.push_back(summary_row(st, st.points[pi].label, st.vals[pi], false, &table[pi + 1]));
    }
    std::printf("\n");
    print_table(
        {"point", "n", "accuracy [95% CI]", "acc - full", "mean KL [95% CI]", "KL - first point",
         "first-token KL", "argmax agree", "exact", "ref logp", "selected", "TTFT ms", "online ms"},
        table);
    std::printf("cases      : %d kept of %d generated; full correct by kind/relation:", st.kept,
                st.tried);
    json full_by_relation = json::object();
    for (const auto& [k, t] : st.by_relation) {
        std::printf(" %s %d/%d", k.c_str(), t.second, t.first);
        full_by_relation[k] = {{"generated", t.first}, {"full_correct", t.second}};
    }
    std::printf("\nwall time  : %.1f s\n", wall_s);
    return {summary, full_by_relation};
}

void write_side_files(const SweepState& st) {
    const std::string csv = csv_path(st.cfg);
    if (!csv.empty()) {
        write_file_atomic(
            csv,
            rows_to_csv(st.rows, {"case", "kind", "relation", "point", "method", "context_tokens",
                                  "correct", "mean_kl", "first_kl", "max_kl", "ref_logprob",
                                  "argmax_agree", "ref_hit", "exact", "selected_fraction",
                                  "ttft_ms", "online_ms", "answer", "phases"}));
        std::printf("csv        : %s\n", csv.c_str());
    }
    if (!st.cfg.sweep.cases_file.empty()) {
        write_file_atomic(st.cfg.sweep.cases_file, st.cases_text);
        std::printf("cases file : %s\n", st.cfg.sweep.cases_file.c_str());
    }
    std::fflush(stdout);
}

json sweep_json(SweepState& st, json summary, json full_by_relation, double wall_s) {
    const Config& cfg = st.cfg;
    json out = {
        {"job", "sweep"},
        {"model", st.s.weights->source},
        {"backend", st.s.backend->name()},
        {"ranks", 1},
        {"reference", "full"},
        {"teacher_forced_reference", cfg.sweep.reference},
        {"case_spec", case_spec_json(st.spec)},
        {"cases_kept", st.kept},
        {"cases_generated", st.tried},
        {"full_correct_by_relation", full_by_relation},
        {"bootstrap",
         {{"resamples", k_bootstrap_resamples}, {"seed", k_bootstrap_seed}, {"level", 0.95}}}};
    out["case_spec"]["first_case"] = cfg.sweep.first_case;
    json pts = json::array();
    for (const Point& p : st.points) pts.push_back(p.label);
    out["points"] = pts;
    out["wall_s"] = wall_s;
    out["clock"] = to_string(cfg.sweep.clock);
    out["rows"] = std::move(st.rows);
    out["summary"] = std::move(summary);
    out["config"] = cfg.to_json();
    return out;
}

}  // namespace

// The generator's spec from [sweep] (the filler file's sentences read here).
CaseSpec sweep_case_spec(const Config& cfg, const std::string& separator) {
    CaseSpec spec;
    spec.kinds = cfg.sweep.kinds;
    spec.documents = cfg.sweep.documents;
    spec.context_tokens = cfg.sweep.context_tokens;
    spec.seed = cfg.sweep.seed;
    spec.separator = separator;
    spec.document_tokens = cfg.sweep.document_tokens;
    spec.depths = cfg.sweep.depths;
    spec.distractors = cfg.sweep.distractors;
    if (!cfg.sweep.filler_file.empty()) {
        for (const std::string& p : split_paragraphs(read_file(cfg.sweep.filler_file))) {
            for (std::string& x : split_sentences(p)) spec.filler.push_back(std::move(x));
        }
        IF_CHECK(!spec.filler.empty(),
                 "sweep.filler_file = '" << cfg.sweep.filler_file << "' holds no text");
    }
    check_case_spec(spec);
    return spec;
}

nlohmann::json run_sweep(const Config& cfg, Session& s) {
    const auto t_start = Clock::now();
    check_sweep_config(cfg, s);
    const ScopedTimingClock timing(cfg.sweep.clock == Config::SweepClock::cpu ? TimingClock::cpu
                                                                              : TimingClock::wall);
    SweepState st(cfg, s);
    print_header(st);
    progress::set_phase_lines(false);
    progress::Sweep sweep("", cfg.sweep.cases);
    const int max_tries = cfg.sweep.full_correct_only ? 4 * cfg.sweep.cases : cfg.sweep.cases;
    const int first = cfg.sweep.first_case;
    for (int idx = first; st.kept < cfg.sweep.cases && idx < first + max_tries; ++idx) {
        run_case(st, idx, sweep);
    }
    IF_CHECK(st.kept > 0, "job sweep: no case kept (full answered none of the "
                              << st.tried << " generated cases correctly)");
    const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
    auto [summary, full_by_relation] = print_summary(st, wall_s);
    write_side_files(st);
    return sweep_json(st, std::move(summary), std::move(full_by_relation), wall_s);
}

}  // namespace infoflow
