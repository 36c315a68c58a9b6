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
// accuracy and mean KL against the first point's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

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
#include "runtime/method/phases.h"
#include "runtime/model/sampling.h"
#include "runtime/parallel/emulate.h"
#include "runtime/parallel/ring.h"

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
// exchange and the balance).
void check_shared(const Config& base, const Config& p, const std::string& where) {
    json a = base.to_json(), b = p.to_json();
    for (json* j : {&a, &b}) {
        for (const char* k : {"virtual_ranks", "exchange", "balance"}) (*j)["parallel"].erase(k);
    }
    for (const char* sec :
         {"model", "request", "chunking", "decode", "sweep", "store", "parallel", "output"}) {
        IF_CHECK(a.at(sec) == b.at(sec),
                 where << " changes [" << sec << "], which every point of a sweep shares"
                       << (std::string(sec) == "parallel"
                               ? " (points may set parallel.virtual_ranks, exchange, balance)"
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

// The generator's spec from [sweep] (the filler file's sentences read here).
CaseSpec case_spec(const Config& cfg, const std::string& separator) {
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

}  // namespace

nlohmann::json run_sweep(const Config& cfg, Session& s) {
    const auto t_start = Clock::now();
    const Tokenizer& tok = s.tok();
    const ChatTemplate& chat = s.chat_template();
    IF_CHECK(!s.comm || s.comm->size() == 1,
             "job sweep runs on one rank (its points use the single-rank pipeline), got "
                 << s.comm->size());
    IF_CHECK(cfg.parallel.emulate_ranks <= 1, "job sweep needs parallel.emulate_ranks = 0");
    IF_CHECK(cfg.decode.temperature == 0.0,
             "job sweep needs greedy decoding (decode.temperature = 0): the reference is full's "
             "greedy answer");
    IF_CHECK(cfg.decode.max_new_tokens >= 1, "job sweep needs decode.max_new_tokens >= 1");
    IF_CHECK(cfg.sweep.clock == Config::SweepClock::wall || cfg.model.threads == 1,
             "sweep.clock = \"cpu\" needs model.threads = 1 (the process's CPU time counts "
             "every thread), got model.threads = "
                 << cfg.model.threads);
    const ScopedTimingClock timing(cfg.sweep.clock == Config::SweepClock::cpu ? TimingClock::cpu
                                                                              : TimingClock::wall);
    const CaseSpec spec =
        case_spec(cfg, instruction_text(cfg.request.prompt_template).doc_separator);
    const std::vector<Point> points = sweep_points(cfg);
    Model& model = *s.model;
    const int V = model.config().n_vocab;

    const TokenCounter count = [&](const std::string& t) { return int(chat.text(t).size()); };
    Config full_cfg = cfg;
    full_cfg.method.name = Config::Method::full;

    std::printf(
        "sweep      : %s (%s, %d threads), %zu points x %d cases (%s), reference %s, %s "
        "clock\n",
        s.weights->source.c_str(), s.backend->device().c_str(), cfg.model.threads, points.size(),
        cfg.sweep.cases,
        [&] {
            std::string k;
            for (const auto& x : cfg.sweep.kinds) k += (k.empty() ? "" : "+") + x;
            return k;
        }()
            .c_str(),
        cfg.sweep.reference.c_str(), to_string(cfg.sweep.clock));
    std::printf(
        "cases      : ~%d context tokens in %d documents, %s layout, seed %llu, from case "
        "%d%s\n",
        cfg.sweep.context_tokens, cfg.sweep.documents, spec.long_layout() ? "long" : "original",
        static_cast<unsigned long long>(cfg.sweep.seed), cfg.sweep.first_case,
        cfg.sweep.full_correct_only ? ", only cases full answers correctly" : "");
    std::printf("points     :");
    for (const Point& p : points) std::printf(" [%s]", p.label.c_str());
    std::printf("\n");
    std::fflush(stdout);

    json rows = json::array();
    RowLog row_log(jsonl_path(cfg));
    if (!row_log.path().empty()) {
        std::printf("rows       : %s (one line per finished run)\n", row_log.path().c_str());
    }
    std::string cases_text;
    progress::set_phase_lines(false);
    progress::Sweep sweep("", cfg.sweep.cases);
    PointValues full_vals;
    std::vector<PointValues> vals(points.size());
    const int max_tries = cfg.sweep.full_correct_only ? 4 * cfg.sweep.cases : cfg.sweep.cases;
    int kept = 0, tried = 0;
    // Per kind/relation: cases generated and how many `full` answered correctly.
    std::map<std::string, std::pair<int, int>> by_relation;
    const int first = cfg.sweep.first_case;
    for (int idx = first; kept < cfg.sweep.cases && idx < first + max_tries; ++idx) {
        ++tried;
        const QualityCase qc = make_case(spec, idx, count);
        const PreparedRequest req = prepare_request(
            tok, chat, RequestText{cfg.request.system, qc.documents, qc.question}, cfg);
        const int T = req.context_tokens();
        const int prompt = T + int(req.suffix.size());
        // The reference continuation and `full`'s rows along it.
        std::vector<int32_t> ref;
        if (cfg.sweep.reference == "gold") {
            ref = tok.encode(qc.answers[0]);
            if (int(ref.size()) > cfg.decode.max_new_tokens)
                ref.resize(size_t(cfg.decode.max_new_tokens));
        }
        std::vector<float> full_rows;
        RunHooks full_hooks;
        full_hooks.after_decode = [&](KvCache& cache, MethodResult& r) {
            if (cfg.sweep.reference == "full") {
                // The greedy answer and, when it stopped, its stop token: the token after the
                // answer, i.e. the argmax of the row after it (any id stands in while it is fed).
                ref = r.answer;
                if (r.stopped) ref.push_back(0);
            }
            full_rows = teacher_forced_logits(model, cache, prompt, r.first_logits, ref);
            if (cfg.sweep.reference == "full" && r.stopped) {
                ref.back() = argmax(full_rows.data() + (ref.size() - 1) * size_t(V), V);
            }
        };
        const MethodResult full = run_method(model, req, full_cfg, tok.stop_ids(), full_hooks);
        const std::string full_answer = tok.decode(full.answer);
        const bool full_correct = case_correct(qc, full_answer);
        auto& tally = by_relation[qc.kind + "/" + qc.relation];
        ++tally.first;
        tally.second += full_correct;
        if (cfg.sweep.full_correct_only && !full_correct) continue;
        ++kept;
        if (!cfg.sweep.cases_file.empty()) cases_text += case_json(qc).dump() + "\n";
        // Phase 1 once for every point.
        const double t_chunks = timing_now_ms();
        const std::vector<ChunkKv> chunks = prefill_context(model, req, 1, req.n_chunks());
        const double chunk_ms = timing_now_ms() - t_chunks;

        std::vector<json> case_rows(points.size() + 1);  // full, then the points in order
        auto record = [&](PointValues& pv, const std::string& label, const MethodResult& r,
                          const std::vector<float>& rows_m, bool is_full, const Config& pcfg,
                          const EmulatedTiming* vt) {
            const Fidelity f = compare_teacher_forced(full_rows, rows_m, ref, V);
            const std::string answer = tok.decode(r.answer);
            const bool correct = case_correct(qc, answer);
            const double sel = T ? double(r.selected_positions.size()) / T : 0.0;
            // Virtual ranks: the modelled critical path after the shard prefill (which copies
            // the shared chunks), the ranks' compute measured alone (emulate.h).
            double online = r.ttft_ms;
            if (vt) {
                online = 0.0;
                for (const auto& [name, ms] : vt->critical_path) {
                    if (name != "shard_prefill" && name != "store_load") online += ms;
                }
            }
            const double ttft = is_full ? r.ttft_ms : chunk_ms + online;
            json row;
            row["case"] = qc.index;
            row["kind"] = qc.kind;
            row["relation"] = qc.relation;
            row["depth"] = qc.depth;
            row["documents"] = qc.documents.size();
            row["evidence_docs"] = qc.evidence_docs;
            row["point"] = label;
            row["method"] = r.method;
            row["context_tokens"] = T;
            row["suffix_tokens"] = r.suffix_tokens;
            row["reference_tokens"] = ref.size();
            row["answer"] = answer;
            row["answers"] = qc.answers;
            row["correct"] = correct;
            row["first_kl"] = f.kl.empty() ? 0.0 : f.kl[0];
            row["mean_kl"] = f.mean_kl;
            row["max_kl"] = f.max_kl;
            row["ref_logprob"] = f.ref_logprob;
            row["ref_logprob_full"] = f.ref_logprob_full;
            row["argmax_agree"] = f.argmax_agree;
            row["ref_hit"] = f.ref_hit;
            row["exact"] = f.all_hit;
            row["first_miss"] = f.first_miss;
            row["selected_fraction"] = sel;
            row["chunk_prefill_ms"] = is_full ? 0.0 : chunk_ms;
            row["online_ms"] = online;
            row["ttft_ms"] = ttft;
            row["phases"] = phases_json(r.phases);
            row["ranks"] = vt ? vt->ranks : 1;
            if (vt) {
                json cp = json::array();
                for (const auto& [name, ms] : vt->critical_path) cp.push_back({{name, ms}});
                row["critical_path"] = cp;
                row["exchange"] = to_string(pcfg.parallel.exchange);
                row["softmax"] = to_string(pcfg.scoring.softmax);
                add_bytes(row, r, ring_reference_bytes(model, T + r.suffix_tokens, vt->ranks));
            }
            for (const std::string& m : measures()) {
                const json& x = row[m];
                pv.v[m].push_back(x.is_boolean() ? double(x.get<bool>()) : x.get<double>());
            }
            pv.correct_by_kind[qc.kind].push_back(correct);
            case_rows[&pv == &full_vals ? 0 : size_t(&pv - vals.data()) + 1] = std::move(row);
            return correct;
        };
        record(full_vals, "full", full, full_rows, true, full_cfg, nullptr);
        double acc_sum = 0.0, kl_sum = 0.0;
        // The points run in an order rotated by one per case, so that whatever the first run
        // after the chunk prefill pays (fresh pages of its caches) falls on every point alike;
        // their rows are written in point order.
        for (size_t step = 0; step < points.size(); ++step) {
            const size_t pi = (step + size_t(kept - 1)) % points.size();
            const Point& p = points[pi];
            if (p.cfg.method.name == Config::Method::full) {
                acc_sum += record(vals[pi], p.label, full, full_rows, true, p.cfg, nullptr);
                continue;
            }
            std::vector<float> rows_m;
            EmulatedTiming virtual_timing;
            RunHooks hooks;
            hooks.chunks = &chunks;
            bool decoded = true;
            hooks.before_decode = [&](KvCache& cache, MethodResult& r) {
                rows_m = teacher_forced_logits(model, cache, prompt, r.first_logits, ref);
                // Teacher forcing along full's greedy answer and its stop token: when every
                // step's argmax is the reference token, greedy decoding would produce exactly
                // full's answer, so the decode is skipped (exact, not an estimate).
                decoded = !(cfg.sweep.reference == "full" &&
                            compare_teacher_forced(full_rows, rows_m, ref, V).all_hit);
                return decoded;
            };
            const int P = p.cfg.parallel.virtual_ranks;
            MethodResult r;
            if (P > 1) {
                // P virtual ranks: every rank copies its chunks from `chunks`; rank 0's
                // teacher-forced rows come back through on_forced.
                RunHooks sp_hooks;
                sp_hooks.chunks = &chunks;
                sp_hooks.forced_ref = &ref;
                sp_hooks.on_forced = [&](const std::vector<float>& rows, MethodResult&) {
                    rows_m = rows;
                    decoded = !(cfg.sweep.reference == "full" &&
                                compare_teacher_forced(full_rows, rows_m, ref, V).all_hit);
                    return decoded;
                };
                const EmulatedRun er =
                    run_emulated(model, req, p.cfg, P, LinkModel(), tok.stop_ids(), sp_hooks);
                r = er.per_rank[0];
                virtual_timing = er.timing;
            } else {
                r = run_method(model, req, p.cfg, tok.stop_ids(), hooks);
            }
            if (!decoded) {
                r.answer = full.answer;
                r.stopped = full.stopped;
            }
            acc_sum += record(vals[pi], p.label, r, rows_m, false, p.cfg,
                              P > 1 ? &virtual_timing : nullptr);
            kl_sum += vals[pi].v["mean_kl"].back();
        }
        for (json& row : case_rows) {
            row_log.append(row);
            rows.push_back(std::move(row));
        }
        sweep.step();
        std::printf(
            "[sweep %*d/%d] case %d %-8s %-16s T %4d  full %s \"%s\"  points: acc %.2f "
            "KL %.4f  ETA %s\n",
            int(std::to_string(cfg.sweep.cases).size()), kept, cfg.sweep.cases, idx,
            qc.kind.c_str(), qc.relation.c_str(), T, full_correct ? "ok  " : "MISS",
            one_line(full_answer).c_str(), acc_sum / double(points.size()),
            kl_sum / double(points.size()), sweep.eta().c_str());
        std::fflush(stdout);
    }
    IF_CHECK(kept > 0, "job sweep: no case kept (full answered none of the "
                           << tried << " generated cases correctly)");

    // Summary: per point, every measure's interval, and the paired comparisons.
    auto iv = [](const PointValues& pv, const std::string& m) {
        return bootstrap_mean(pv.v.at(m));
    };
    json summary = json::array();
    std::vector<std::vector<std::string>> table;
    auto add_point = [&](const std::string& label, const PointValues& pv, bool is_full) {
        json row;
        row["point"] = label;
        row["reference"] = is_full;
        for (const std::string& m : measures()) row[m] = iv(pv, m).json();
        json kinds = json::object();
        for (const auto& [k, v] : pv.correct_by_kind) kinds[k] = bootstrap_mean(v).json();
        row["correct_by_kind"] = kinds;
        const PairedComparison vs_full =
            paired_comparison(pv.v.at("correct"), full_vals.v.at("correct"));
        row["correct_vs_full"] = vs_full.json();
        const PointValues& first = vals[0];
        const PairedComparison acc_first =
            paired_comparison(pv.v.at("correct"), first.v.at("correct"));
        const PairedComparison kl_first =
            paired_comparison(pv.v.at("mean_kl"), first.v.at("mean_kl"));
        row["correct_vs_first"] = acc_first.json();
        row["mean_kl_vs_first"] = kl_first.json();
        summary.push_back(row);
        table.push_back({label + (is_full ? " (ref)" : ""), std::to_string(iv(pv, "correct").n),
                         iv(pv, "correct").str("%.2f"), is_full ? "-" : vs_full.str("%+.2f"),
                         iv(pv, "mean_kl").str("%.4f"),
                         is_full || &pv == &vals[0] ? "-" : kl_first.str("%+.4f"),
                         iv(pv, "first_kl").str("%.4f"), fmt("%.3f", iv(pv, "argmax_agree").mean),
                         fmt("%.2f", iv(pv, "exact").mean), fmt("%.3f", iv(pv, "ref_logprob").mean),
                         fmt("%.3f", iv(pv, "selected_fraction").mean),
                         fmt("%.1f", iv(pv, "ttft_ms").mean),
                         fmt("%.1f", iv(pv, "online_ms").mean)});
    };
    add_point("full", full_vals, true);
    for (size_t pi = 0; pi < points.size(); ++pi) add_point(points[pi].label, vals[pi], false);

    const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
    std::printf("\n");
    print_table(
        {"point", "n", "accuracy [95% CI]", "acc - full", "mean KL [95% CI]", "KL - first point",
         "first-token KL", "argmax agree", "exact", "ref logp", "selected", "TTFT ms", "online ms"},
        table);
    std::printf("cases      : %d kept of %d generated; full correct by kind/relation:", kept,
                tried);
    json full_by_relation = json::object();
    for (const auto& [k, t] : by_relation) {
        std::printf(" %s %d/%d", k.c_str(), t.second, t.first);
        full_by_relation[k] = {{"generated", t.first}, {"full_correct", t.second}};
    }
    std::printf("\n");
    std::printf("wall time  : %.1f s\n", wall_s);
    const std::string csv = csv_path(cfg);
    if (!csv.empty()) {
        write_file_atomic(
            csv, rows_to_csv(rows, {"case", "kind", "relation", "point", "method", "context_tokens",
                                    "correct", "mean_kl", "first_kl", "max_kl", "ref_logprob",
                                    "argmax_agree", "ref_hit", "exact", "selected_fraction",
                                    "ttft_ms", "online_ms", "answer", "phases"}));
        std::printf("csv        : %s\n", csv.c_str());
    }
    if (!cfg.sweep.cases_file.empty()) {
        write_file_atomic(cfg.sweep.cases_file, cases_text);
        std::printf("cases file : %s\n", cfg.sweep.cases_file.c_str());
    }
    std::fflush(stdout);
    json out;
    out["job"] = "sweep";
    out["model"] = s.weights->source;
    out["backend"] = s.backend->name();
    out["ranks"] = 1;
    out["reference"] = "full";
    out["teacher_forced_reference"] = cfg.sweep.reference;
    out["case_spec"] = case_spec_json(spec);
    out["case_spec"]["first_case"] = cfg.sweep.first_case;
    out["cases_kept"] = kept;
    out["cases_generated"] = tried;
    out["full_correct_by_relation"] = full_by_relation;
    out["bootstrap"] = {
        {"resamples", k_bootstrap_resamples}, {"seed", k_bootstrap_seed}, {"level", 0.95}};
    json pts = json::array();
    for (const Point& p : points) pts.push_back(p.label);
    out["points"] = pts;
    out["wall_s"] = wall_s;
    out["clock"] = to_string(cfg.sweep.clock);
    out["rows"] = std::move(rows);
    out["summary"] = std::move(summary);
    out["config"] = cfg.to_json();
    return out;
}

}  // namespace infoflow
