// job = "bench-ttft" (docs/design.md §10): time to first token for each context length and method
// on the job's ranks, in the layout of the paper's Table 5: single-rank full prefill (rank 0 alone,
// the other ranks idle), ring attention (zigzag and contiguous p2p; plus the all-gather variant
// when ring.exchange = "allgather"), InfoFlow ("kv" and
// "exact" exchange). Warm-up runs, then min / median / max of bench.runs (a row whose spread
// exceeds bench.spread_limit is flagged); bytes moved per rank per layer and the phase
// breakdown. Writes nothing unless output.path / --out / --results-dir asks (CSV next to it).
// Requests are synthetic token ids (speed does not depend on them); chunking follows [chunking]
// (fixed chunks of chunking.size, or one chunk per rank when unset).
#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/progress.h"
#include "runtime/core/timing_clock.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/parallel/emulate.h"
#include "runtime/parallel/run.h"

namespace infoflow {
namespace {

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

PreparedRequest synthetic_request(int tokens, int n_vocab, const Config& cfg, int ranks,
                                  uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto tok = [&]() { return int32_t(16 + rng() % uint64_t(n_vocab - 16)); };
    const int prefix = 32, suffix = 24;
    PreparedRequest r;
    r.chunks.emplace_back();
    for (int i = 0; i < prefix; ++i) r.chunks[0].push_back(tok());
    // `tokens` is the whole prompt (chat prefix + context + suffix), as the paper counts it.
    const int ctx = std::max(1, tokens - prefix - suffix);
    int size;
    if (cfg.chunking.mode == Config::ChunkMode::fixed && !cfg.chunking.size) {
        size = (ctx + ranks - 1) / ranks;  // one chunk per rank (docs/design.md §5.1)
    } else {
        size = cfg.chunking.size_or_default();
    }
    for (int at = 0; at < ctx; at += size) {
        r.chunks.emplace_back();
        for (int i = at; i < std::min(ctx, at + size); ++i) r.chunks.back().push_back(tok());
    }
    for (int i = 0; i < suffix; ++i) r.suffix.push_back(tok());
    r.question_begin = 4;
    r.question_end = suffix - 6;
    r.sink_id = cfg.chunking.sink == "none" ? -1 : 1;
    return r;
}

struct Variant {
    std::string label;
    Config cfg;
};

// bench.emulate_timing: which figures of a row are measured and which modelled, and the per-rank
// breakdown of the last timed run (runtime/parallel/emulate.h).
nlohmann::json timing_json(const EmulatedTiming& t) {
    using nlohmann::json;
    json per_rank = json::array();
    for (const auto& phases : t.per_rank) {
        json ranks = json::array();
        for (const PhaseTiming& p : phases) {
            if (p.phase == "other" && p.segments <= 1 && p.collectives == 0) continue;
            ranks.push_back({{"phase", p.phase},
                             {"compute_ms", p.compute_ms},
                             {"comm_ms", p.comm_ms},
                             {"wait_ms", p.wait_ms}});
        }
        per_rank.push_back(ranks);
    }
    return {{"mode", "emulated"},
            {"virtual_ranks", t.ranks},
            {"link", {{"alpha_us", t.link.alpha_us}, {"beta_gbs", t.link.beta_gbs}}},
            {"measured", t.ranks == 1 ? json::array({"ttft_ms", "phases_ms"})
                                      : json::array({"per_rank[].compute_ms"})},
            {"modelled", t.ranks == 1 ? json::array()
                                      : json::array({"ttft_ms", "phases_ms", "per_rank[].comm_ms",
                                                     "per_rank[].wait_ms"})},
            {"per_rank_last_run", per_rank}};
}

// The rows of bench.methods: `full` is "single", ring its zigzag and contiguous layouts (and
// the all-gather one when asked), a P-rank method its kv and exact exchanges and the configured
// parallel.exchange when it is another.
std::vector<Variant> make_variants(const Config& base, int P) {
    std::vector<Variant> variants;
    for (Config::Method m : base.bench.methods) {
        Config c = base;
        c.method.name = m;
        if (m == Config::Method::ring) {
            for (auto layout : {Config::RingLayout::zigzag, Config::RingLayout::contiguous}) {
                c.ring.layout = layout;
                c.ring.exchange = Config::RingExchange::p2p;
                variants.push_back({std::string("ring/") + to_string(layout), c});
            }
            if (base.ring.exchange == Config::RingExchange::allgather) {
                c.ring.layout = Config::RingLayout::zigzag;
                c.ring.exchange = Config::RingExchange::allgather;
                variants.push_back({"ring/allgather", c});
            }
        } else if (m == Config::Method::full) {
            variants.push_back({"single", c});
        } else if (P > 1) {
            // kv and exact, and the configured parallel.exchange (by default "auto", resolved
            // for P ranks) when it is neither.
            const Config::Exchange chosen = resolve_exchange(base.parallel.exchange, P);
            std::vector<Config::Exchange> exchanges = {Config::Exchange::kv,
                                                       Config::Exchange::exact};
            if (chosen != Config::Exchange::kv && chosen != Config::Exchange::exact) {
                exchanges.push_back(chosen);
            }
            for (auto ex : exchanges) {
                c.parallel.exchange = ex;
                variants.push_back({std::string(to_string(m)) + "/" + to_string(ex), c});
            }
        } else {
            variants.push_back({to_string(m), c});
        }
    }
    if (base.bench.rows.empty()) return variants;
    // bench.rows keeps the named rows, in their usual order; a name that is not a row is an error.
    std::vector<Variant> kept;
    std::string all;
    for (const Variant& v : variants) all += (all.empty() ? "" : ", ") + v.label;
    for (const std::string& want : base.bench.rows) {
        bool found = false;
        for (const Variant& v : variants) found = found || v.label == want;
        IF_CHECK(found, "bench.rows: '" << want << "' is not a row of bench.methods on " << P
                                        << " rank(s) (the rows: " << all << ")");
    }
    for (const Variant& v : variants) {
        for (const std::string& want : base.bench.rows) {
            if (v.label == want) kept.push_back(v);
        }
    }
    return kept;
}

// Where the job runs: P ranks of the communicator, or P virtual ranks (bench.emulate_timing)
// over the link model of bench.link_*.
struct Setup {
    bool emulate = false;
    int P = 1;
    LinkModel link;
};

Setup make_setup(const Config& cfg, const Communicator& comm) {
    Setup st;
    st.emulate = cfg.bench.emulate_timing;
    if (st.emulate) {
        IF_CHECK(comm.size() == 1,
                 "bench.emulate_timing runs parallel.emulate_ranks virtual ranks in "
                 "one process; start it without mpirun (this job has "
                     << comm.size() << " ranks)");
        IF_CHECK(cfg.parallel.emulate_ranks >= 1,
                 "bench.emulate_timing needs parallel.emulate_ranks >= 1 (the virtual ranks)");
    }
    st.link.alpha_us = cfg.bench.link_alpha_us;
    st.link.beta_gbs = cfg.bench.link_beta_gbs;
    st.P = st.emulate ? cfg.parallel.emulate_ranks : comm.size();
    return st;
}

// One run of a variant. Emulated: TTFT and phases are the modelled critical path, bytes the real
// accounting; `timing` receives the run's virtual timeline.
MethodResult run_once(Session& s, const PreparedRequest& req, const Variant& v, const Setup& st,
                      EmulatedTiming* timing) {
    if (!st.emulate) return run_request(*s.model, req, v.cfg, *s.comm, {});
    EmulatedRun er =
        run_emulated(*s.model, req, v.cfg, v.label == "single" ? 1 : st.P, st.link, {});
    MethodResult r = std::move(er.per_rank[0]);
    r.ttft_ms = er.timing.ttft_ms;
    r.phases.clear();
    for (const auto& p : er.timing.critical_path) {
        PhaseTime pt;
        pt.name = p.first;
        pt.ms = p.second;
        r.phases.push_back(pt);
    }
    *timing = std::move(er.timing);
    return r;
}

double max_over_mean(const std::vector<double>& x) {
    if (x.empty()) return 0.0;
    double hi = 0.0, sum = 0.0;
    for (double v : x) {
        hi = std::max(hi, v);
        sum += v;
    }
    return sum > 0 ? hi * double(x.size()) / sum : 0.0;
}

// What the timed runs of one variant leave for its row.
struct RunStats {
    std::vector<double> ttft;
    std::map<std::string, std::vector<double>> phase_ms;
    std::vector<std::string> phase_order;
    double bytes_per_layer = 0.0, bytes_per_layer_mean = 0.0;
    // The recompute against its balanced ideal: per run, its wall time over the mean of the
    // ranks' busy time (wall minus time waited in collectives); the plan's modelled loads
    // (max / mean), as planned and with every token on its owner.
    std::vector<double> rec_wall, rec_ideal, rec_ratio;
    std::vector<std::vector<double>> rec_busy;
    double model_planned = 0.0, model_owned = 0.0;
    int rec_moved = 0;
    nlohmann::json plan = nullptr;  // the last run's plan, modelled and measured
    // Distributed runs: each phase's time and time waited in collectives, per rank (the
    // straggler of one phase shows up as the others' wait at the next collective).
    std::map<std::string, std::vector<std::vector<double>>> rank_ms, rank_wait;
    EmulatedTiming timing;

    void add(const MethodResult& r, double t, bool emulate, int n_layer);

  private:
    void add_bytes(const MethodResult& r, int n_layer);
    void add_per_rank(const MethodResult& r);
    void add_recompute(const MethodResult& r);
};

void RunStats::add(const MethodResult& r, double t, bool emulate, int n_layer) {
    ttft.push_back(t);
    for (const PhaseTime& p : r.phases) {
        if (!phase_ms.count(p.name)) phase_order.push_back(p.name);
        phase_ms[p.name].push_back(p.ms);
    }
    add_bytes(r, n_layer);
    if (!emulate && r.ranks > 1) add_per_rank(r);
    if (!emulate) add_recompute(r);
    model_planned = max_over_mean(r.recompute_load);
    model_owned = max_over_mean(r.recompute_load_owned);
    rec_moved = r.recompute_moved;
    plan = recompute_plan_json(r);
}

// Bytes a rank sends per layer up to the first token: the busiest rank, and the mean over ranks.
void RunStats::add_bytes(const MethodResult& r, int n_layer) {
    double most = 0.0, all = 0.0;
    for (int q = 0; q < int(r.ranks); ++q) {
        double sent = 0.0;
        for (const auto& per_rank : r.phases_per_rank) {
            if (q < int(per_rank.size()) && per_rank[q].name != "decode") {
                sent += double(per_rank[q].bytes_sent);
            }
        }
        most = std::max(most, sent);
        all += sent;
    }
    bytes_per_layer = most / n_layer;
    bytes_per_layer_mean = r.ranks > 0 ? all / r.ranks / n_layer : 0.0;
}

void RunStats::add_per_rank(const MethodResult& r) {
    for (const auto& per_rank : r.phases_per_rank) {
        if (per_rank.empty()) continue;
        auto& ms = rank_ms[per_rank[0].name];
        auto& wait = rank_wait[per_rank[0].name];
        ms.resize(per_rank.size());
        wait.resize(per_rank.size());
        for (size_t q = 0; q < per_rank.size(); ++q) {
            ms[q].push_back(per_rank[q].ms);
            wait[q].push_back(per_rank[q].wait_ms);
        }
    }
}

void RunStats::add_recompute(const MethodResult& r) {
    for (const auto& per_rank : r.phases_per_rank) {
        if (per_rank.size() < 2 || per_rank[0].name != "recompute") continue;
        double wall = 0.0, sum = 0.0;
        std::vector<double> busy;
        for (const PhaseTime& p : per_rank) {
            wall = std::max(wall, p.ms);
            busy.push_back(std::max(0.0, p.ms - p.wait_ms));
            sum += busy.back();
        }
        const double ideal = sum / double(per_rank.size());
        rec_wall.push_back(wall);
        rec_ideal.push_back(ideal);
        rec_ratio.push_back(ideal > 0 ? wall / ideal : 0.0);
        rec_busy.push_back(busy);
    }
}

// The per-rank phase medians and the recompute's median run, added to a row.
void add_detail(nlohmann::json& row, const RunStats& rs) {
    using nlohmann::json;
    if (!rs.plan.is_null()) row["recompute_plan"] = rs.plan;
    if (!rs.rank_ms.empty()) {
        json per_rank = json::array();  // in phase order
        for (const auto& name : rs.phase_order) {
            if (!rs.rank_ms.count(name)) continue;
            json ms = json::array(), wait = json::array();
            for (const auto& x : rs.rank_ms.at(name)) ms.push_back(median(x));
            for (const auto& x : rs.rank_wait.at(name)) wait.push_back(median(x));
            per_rank.push_back({{"phase", name}, {"ms", ms}, {"wait_ms", wait}});
        }
        row["phases_per_rank"] = per_rank;
    }
    if (!rs.rec_ratio.empty()) {
        // The run with the median ratio, whole (its busy times belong to it).
        std::vector<size_t> idx(rs.rec_ratio.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::sort(idx.begin(), idx.end(),
                  [&](size_t a, size_t b) { return rs.rec_ratio[a] < rs.rec_ratio[b]; });
        const size_t mid = idx[idx.size() / 2];
        row["recompute"] = {{"wall_ms", rs.rec_wall[mid]},
                            {"busy_ms_per_rank", rs.rec_busy[mid]},
                            {"ideal_ms", rs.rec_ideal[mid]},
                            {"vs_ideal", rs.rec_ratio[mid]},
                            {"vs_ideal_runs", rs.rec_ratio},
                            {"model_max_over_mean", rs.model_planned},
                            {"model_max_over_mean_owned", rs.model_owned},
                            {"tokens_moved", rs.rec_moved}};
    }
}

// One variant's row: the TTFT statistics, speedups against the single and zigzag-ring rows of
// the same length measured so far (this one included), bytes and phases.
nlohmann::json make_row(const Session& s, const PreparedRequest& req, const Variant& v,
                        const Setup& st, int threads, const Config& base, const RunStats& rs,
                        double single_ms, double ring_ms) {
    using nlohmann::json;
    const std::vector<double>& ttft = rs.ttft;
    const double med = median(ttft);
    const double lo = ttft.empty() ? 0.0 : *std::min_element(ttft.begin(), ttft.end());
    const double hi = ttft.empty() ? 0.0 : *std::max_element(ttft.begin(), ttft.end());
    const double spread = med > 0 ? (hi - lo) / med : 0.0;
    json row = {
        {"bench", "ttft"},
        {"model", s.weights->source},
        {"tokens", req.context_tokens() + int(req.suffix.size())},
        {"context_tokens", req.context_tokens()},
        {"method", v.label},
        {"ranks", v.label == "single" ? 1 : st.P},
        {"threads_per_rank", threads},
        {"runs", base.bench.runs},
        {"ttft_ms", med},
        {"ttft_min_ms", lo},
        {"ttft_max_ms", hi},
        {"ttft_runs_ms", ttft},
        {"spread", spread},
        {"noisy", spread > base.bench.spread_limit},
        // Positions beyond the model's trained window (model.positions): the row is timing only.
        {"past_window", req.context_tokens() + int(req.suffix.size()) > s.trained_positions},
        {"speedup_vs_single", single_ms > 0 ? json(single_ms / med) : json(nullptr)},
        {"speedup_vs_ring", ring_ms > 0 ? json(ring_ms / med) : json(nullptr)},
        {"bytes_per_rank_per_layer", rs.bytes_per_layer},
        {"bytes_per_rank_per_layer_mean", rs.bytes_per_layer_mean}};
    json phases = json::object();
    for (const auto& name : rs.phase_order) phases[name] = median(rs.phase_ms.at(name));
    row["phases_ms"] = phases;
    add_detail(row, rs);
    if (st.emulate) row["timing"] = timing_json(rs.timing);
    return row;
}

// Warm-up and timed runs of one variant (every rank runs; rank 0's TTFT is the row's).
RunStats measure(Session& s, const PreparedRequest& req, const Variant& v, const Setup& st,
                 const Config& base) {
    RunStats rs;
    for (int run = 0; run < base.bench.warmup + base.bench.runs; ++run) {
        s.comm->barrier();
        const MethodResult r = run_once(s, req, v, st, &rs.timing);
        double t = r.ttft_ms;
        s.comm->broadcast(&t, sizeof(t), 0);
        if (run >= base.bench.warmup) rs.add(r, t, st.emulate, s.model->config().n_layer);
    }
    return rs;
}

std::string ratio_text(const nlohmann::json& x) {
    char buf[32];
    if (x.is_null()) return "-";
    std::snprintf(buf, sizeof buf, "%.2fx", x.get<double>());
    return buf;
}

// The human table (rank 0): one line per row, then the noisy-row warning.
void print_table(const nlohmann::json& rows, const Session& s, const Setup& st, int threads,
                 const Config& base) {
    std::printf(
        "\nTTFT (%s, %d rank%s, %d thread%s per rank, ratio %.2f, %d runs: min / median / "
        "max)\n",
        s.weights->source.c_str(), st.P, st.P > 1 ? "s" : "", threads, threads > 1 ? "s" : "",
        base.method.ratio, base.bench.runs);
    if (st.emulate) {
        std::printf(
            "emulated: %d virtual ranks taking turns on one %s backend; compute measured per "
            "segment, collectives modelled (alpha %.1f us, beta %.0f GB/s per direction)\n",
            st.P, s.backend->name().c_str(), st.link.alpha_us, st.link.beta_gbs);
    }
    if (st.P > 1) {
        std::printf(
            "exchange: parallel.exchange = \"%s\" runs \"%s\" on %d ranks (its row below)\n",
            to_string(base.parallel.exchange),
            to_string(resolve_exchange(base.parallel.exchange, st.P)), st.P);
    }
    std::printf("%7s  %-16s %5s %9s %9s %9s %7s %9s %9s %14s  %s\n", "tokens", "method", "ranks",
                "min ms", "median ms", "max ms", "spread", "vs single", "vs ring",
                "bytes/rk/layer", "phases (median ms)");
    for (const nlohmann::json& row : rows) {
        std::string ph;
        for (auto it = row["phases_ms"].begin(); it != row["phases_ms"].end(); ++it) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "%s %.0f; ", it.key().c_str(), it->get<double>());
            ph += buf;
        }
        std::printf("%6d%s  %-16s %5d %9.1f %9.1f %9.1f %6.0f%%%s %9s %9s %14.0f  %s\n",
                    row["tokens"].get<int>(), row["past_window"].get<bool>() ? "*" : " ",
                    row["method"].get<std::string>().c_str(),
                    row["ranks"].get<int>(), row["ttft_min_ms"].get<double>(),
                    row["ttft_ms"].get<double>(), row["ttft_max_ms"].get<double>(),
                    100.0 * row["spread"].get<double>(), row["noisy"].get<bool>() ? "!" : " ",
                    ratio_text(row["speedup_vs_single"]).c_str(),
                    ratio_text(row["speedup_vs_ring"]).c_str(),
                    row["bytes_per_rank_per_layer"].get<double>(), ph.c_str());
    }
    for (const nlohmann::json& row : rows) {
        if (row["past_window"].get<bool>()) {
            std::printf("* past the model's window of %d positions (model.positions): timing only\n",
                        s.trained_positions);
            break;
        }
    }
}

// The recompute against its ideal, per row that has one.
void print_recompute(const nlohmann::json& rows) {
    for (const nlohmann::json& row : rows) {
        if (!row.contains("recompute")) continue;
        const nlohmann::json& rc = row["recompute"];
        std::string busy;
        for (const auto& b : rc["busy_ms_per_rank"]) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%s%.0f", busy.empty() ? "" : " ", b.get<double>());
            busy += buf;
        }
        std::string model = "no balance plan (the exact exchange)";
        if (rc["model_max_over_mean_owned"].get<double>() > 0) {
            char buf[160];
            std::snprintf(buf, sizeof buf,
                          "model max/mean %.3f (owners only %.3f), %d tokens moved",
                          rc["model_max_over_mean"].get<double>(),
                          rc["model_max_over_mean_owned"].get<double>(),
                          rc["tokens_moved"].get<int>());
            model = buf;
        }
        std::printf(
            "recompute %6d %-16s wall %.0f ms, busy per rank [%s] ms, ideal (mean busy) "
            "%.0f ms: %.2fx ideal; %s\n",
            row["tokens"].get<int>(), row["method"].get<std::string>().c_str(),
            rc["wall_ms"].get<double>(), busy.c_str(), rc["ideal_ms"].get<double>(),
            rc["vs_ideal"].get<double>(), model.c_str());
    }
}

// Each phase's time and wait per rank, per distributed row.
void print_per_rank(const nlohmann::json& rows) {
    for (const nlohmann::json& row : rows) {
        if (!row.contains("phases_per_rank")) continue;
        std::string line;
        for (const nlohmann::json& ph : row["phases_per_rank"]) {
            const std::string name = ph["phase"].get<std::string>();
            if (name == "decode") continue;  // not part of the TTFT
            line += name + " [";
            const nlohmann::json& ms = ph["ms"];
            const nlohmann::json& wait = ph["wait_ms"];
            for (size_t q = 0; q < ms.size(); ++q) {
                char buf[64];
                std::snprintf(buf, sizeof buf, "%s%.0f/%.0f", q ? " " : "", ms[q].get<double>(),
                              wait[q].get<double>());
                line += buf;
            }
            line += "]; ";
        }
        std::printf("per rank  %6d %-16s phase [ms/waited ms, rank 0 1 ...]: %s\n",
                    row["tokens"].get<int>(), row["method"].get<std::string>().c_str(),
                    line.c_str());
    }
}

void print_noisy(const nlohmann::json& rows, double spread_limit) {
    int n_noisy = 0;
    for (const nlohmann::json& row : rows) n_noisy += row["noisy"].get<bool>();
    if (n_noisy == 0) return;
    std::printf(
        "! %d row%s with spread > %.0f%% (bench.spread_limit): the machine was "
        "busy or the runs are too few; speedups from these rows are unreliable\n",
        n_noisy, n_noisy > 1 ? "s" : "", 100.0 * spread_limit);
}

// The CSV beside output.path (csv_path), when there is one.
void write_csv(const nlohmann::json& rows, const Config& base) {
    const std::string csv_file = csv_path(base);
    if (csv_file.empty()) return;
    std::string csv =
        "tokens,method,ranks,threads_per_rank,ttft_ms,speedup_vs_single,speedup_vs_ring,"
        "bytes_per_rank_per_layer,ttft_min_ms,ttft_max_ms,spread,noisy\n";
    auto num = [](const nlohmann::json& x) {
        return x.is_null() ? std::string() : std::to_string(x.get<double>());
    };
    for (const nlohmann::json& row : rows) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "%d,%s,%d,%d,%.3f,%s,%s,%.0f", row["tokens"].get<int>(),
                      row["method"].get<std::string>().c_str(), row["ranks"].get<int>(),
                      row["threads_per_rank"].get<int>(), row["ttft_ms"].get<double>(),
                      num(row["speedup_vs_single"]).c_str(), num(row["speedup_vs_ring"]).c_str(),
                      row["bytes_per_rank_per_layer"].get<double>());
        std::string line = buf;
        std::snprintf(buf, sizeof buf, ",%.3f,%.3f,%.4f,%s\n", row["ttft_min_ms"].get<double>(),
                      row["ttft_max_ms"].get<double>(), row["spread"].get<double>(),
                      row["noisy"].get<bool>() ? "true" : "false");
        csv += line + buf;
    }
    write_file_atomic(csv_file, csv);
    std::printf("csv        : %s\n", csv_file.c_str());
}

}  // namespace

nlohmann::json run_bench_ttft(const Config& cfg_in, Session& s) {
    using nlohmann::json;
    const Setup st = make_setup(cfg_in, *s.comm);
    const bool root = s.comm->rank() == 0;
    Config base = cfg_in;
    base.decode.max_new_tokens = 1;  // TTFT: the first answer token only
    const int threads = base.bench.threads > 0 ? base.bench.threads : base.model.threads;
    const bool cpu_clock = base.bench.clock == Config::SweepClock::cpu;
    IF_CHECK(!cpu_clock || (s.comm->size() == 1 && threads == 1),
             "bench.clock = \"cpu\" needs one process with one thread (real ranks wait for each "
             "other, which CPU time does not count), got "
                 << s.comm->size() << " ranks and " << threads << " threads");
    const ScopedTimingClock timing(cpu_clock ? TimingClock::cpu : TimingClock::wall);
    s.backend->set_threads(threads);
    const std::vector<Variant> variants = make_variants(base, st.P);

    json rows = json::array();
    progress::set_phase_lines(false);
    progress::Sweep sweep("bench-ttft measurements",
                          int(base.bench.lengths.size() * variants.size()));
    for (int tokens : base.bench.lengths) {
        const PreparedRequest req =
            synthetic_request(tokens, s.model->config().n_vocab, base, st.P, 1234 + tokens);
        double single_ms = 0.0, ring_ms = 0.0;
        for (const Variant& v : variants) {
            const RunStats rs = measure(s, req, v, st, base);
            const double med = median(rs.ttft);
            if (v.label == "single") single_ms = med;  // a row's speedups include its own
            if (v.label == "ring/zigzag") ring_ms = med;
            json row = make_row(s, req, v, st, threads, base, rs, single_ms, ring_ms);
            sweep.step();
            if (root) {
                std::printf("  %6d tokens  %-16s %10.1f ms (min %.1f, max %.1f)%s\n",
                            row["tokens"].get<int>(), v.label.c_str(), med,
                            row["ttft_min_ms"].get<double>(), row["ttft_max_ms"].get<double>(),
                            row["noisy"].get<bool>() ? "  ! noisy" : "");
                std::fflush(stdout);
            }
            rows.push_back(std::move(row));
        }
    }
    if (root) {
        print_table(rows, s, st, threads, base);
        print_recompute(rows);
        print_per_rank(rows);
        print_noisy(rows, base.bench.spread_limit);
        for (const json& row : rows) std::printf("%s\n", row.dump().c_str());
        write_csv(rows, base);
    }
    return {{"job", "bench-ttft"},
            {"clock", to_string(base.bench.clock)},
            {"default_exchange", to_string(resolve_exchange(base.parallel.exchange, st.P))},
            {"rows", rows},
            {"config", cfg_in.to_json()}};
}

}  // namespace infoflow
