// job = "niah": passkey-style needle in a haystack (docs/design.md §9). For every length × depth
// the haystack (haystack.h) becomes one request; `full` runs first as the reference, then every
// method variant (job_report.h) on the same tokens. A row per length × depth × variant records
// correctness (the answer contains niah.answer), first-token top-1 agreement and KL against
// `full`, greedy exact match with `full`, the selected fraction, the share of the needle's
// tokens that were recomputed, and the timings. Progress lines
// as cases finish, a per-variant summary table at the end; JSON rows + summary + effective
// config, and the rows as CSV.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/progress.h"
#include "runtime/jobs/haystack.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/qa_metrics.h"
#include "runtime/jobs/session.h"
#include "runtime/jobs/stats.h"
#include "runtime/method/reform.h"

namespace infoflow {
namespace {

using json = nlohmann::json;

struct LabelStats : RunTotals {
    int correct = 0;
    double needle = 0.0;
    std::vector<double> correct_values;  // per case, in case order
};

// Fraction of the needle's tokens (context positions [begin, end) in the original chunk order)
// that the run recomputed; a reordered run moved them with their chunk.
double needle_recall(const PreparedRequest& req, const MethodResult& r, int begin, int end) {
    if (end <= begin || r.selected_positions.empty()) return 0.0;
    const std::vector<int> offsets = req.chunk_offsets();
    std::vector<int> moved(offsets.size(), 0);  // chunk -> its offset in the run's order
    int acc = 0;
    for (int c : r.chunk_order) {
        moved[size_t(c)] = acc;
        acc += int(req.chunks[size_t(c)].size());
    }
    int hit = 0;
    for (int p = begin; p < end; ++p) {
        const int c =
            int(std::upper_bound(offsets.begin(), offsets.end(), p) - offsets.begin()) - 1;
        const int q = (r.chunk_order.empty() ? offsets[size_t(c)] : moved[size_t(c)]) + p -
                      offsets[size_t(c)];
        hit += std::binary_search(r.selected_positions.begin(), r.selected_positions.end(), q);
    }
    return double(hit) / double(end - begin);
}

// The filler's paragraphs; it must have text and must not contain the answer.
std::vector<std::string> filler_paragraphs(const Config::NiahSection& nc,
                                           const std::string& filler_name) {
    const std::string filler =
        nc.filler_file.empty() ? builtin_filler() : read_file(nc.filler_file);
    IF_CHECK(filler.find(nc.answer) == std::string::npos,
             "niah.filler_file '" << filler_name << "' contains the answer '" << nc.answer
                                  << "': the needle must be the only place it appears");
    std::vector<std::string> paragraphs = split_paragraphs(filler);
    IF_CHECK(!paragraphs.empty(), "niah.filler_file '" << filler_name << "' has no text");
    return paragraphs;
}

// Every niah.lengths entry holds the prompt prefix and the needle, and fits the model's
// positions with the suffix and the answer.
void check_lengths(const Config& cfg, const Session& s, int prefix_tokens, int suffix_tokens) {
    const Config::NiahSection& nc = cfg.niah;
    const int n_ctx = s.model->config().n_ctx_train;
    bool long_only = true;
    for (Config::Method m : nc.methods) {
        long_only = long_only && (m == Config::Method::full || is_long_context_method(m));
    }
    for (int L : nc.lengths) {
        IF_CHECK(L > prefix_tokens + 2 * int(s.tok().encode(nc.needle).size()),
                 "niah.lengths: " << L << " tokens is too short for the prompt prefix ("
                                  << prefix_tokens << " tokens) and the needle");
        // Only reform, h2o and streamingllm read beyond the window; `full` then reports
        // "does not fit" (run_case).
        if (long_only) continue;
        IF_CHECK(L + suffix_tokens + cfg.decode.max_new_tokens <= n_ctx,
                 "niah.lengths: " << L << " context tokens + suffix " << suffix_tokens
                                  << " + decode.max_new_tokens " << cfg.decode.max_new_tokens
                                  << " exceed the " << n_ctx << " positions of the model ("
                                  << s.weights->source << ")");
    }
}

}  // namespace

nlohmann::json run_niah(const Config& cfg, Session& s) {
    const auto t_start = std::chrono::steady_clock::now();
    const Config::NiahSection& nc = cfg.niah;
    const Tokenizer& tok = s.tok();
    const ChatTemplate& chat = s.chat_template();
    IF_CHECK(!nc.lengths.empty(), "niah.lengths is empty");
    IF_CHECK(!nc.depths.empty(), "niah.depths is empty");
    IF_CHECK(!nc.methods.empty(), "niah.methods is empty");

    const std::string filler_name =
        nc.filler_file.empty() ? std::string("<built-in filler>") : nc.filler_file;
    const std::vector<std::string> paragraphs = filler_paragraphs(nc, filler_name);

    // Token budget of the documents: the chat prefix and instruction intro (chunk 0) count
    // towards the length; the suffix and the answer must fit the model's positions too.
    const InstructionText ins = instruction_text(cfg.request.prompt_template);
    const PreparedRequest skeleton =
        prepare_request(tok, chat, RequestText{cfg.request.system, {}, nc.question}, cfg);
    const int prefix_tokens = int(skeleton.chunks[0].size());
    check_lengths(cfg, s, prefix_tokens, int(skeleton.suffix.size()));
    const TokenCounter count = [&](const std::string& t) { return int(chat.text(t).size()); };

    const std::vector<MethodVariant> variants = niah_variants(cfg);
    const int n_cases = int(nc.lengths.size() * nc.depths.size() * variants.size());
    std::printf("niah       : %s (%s, %d threads), ratio %.3f, filler %s\n",
                s.weights->source.c_str(), s.backend->device().c_str(), cfg.model.threads,
                cfg.method.ratio, filler_name.c_str());
    std::printf("cases      : %zu lengths x %zu depths x %zu variants =", nc.lengths.size(),
                nc.depths.size(), variants.size());
    std::printf(" %d runs; reference: full\n", n_cases);
    std::printf("variants   :");
    for (const auto& v : variants) std::printf(" %s", v.label.c_str());
    std::printf("\n");
    std::fflush(stdout);

    json rows = json::array();
    // Each finished row goes to <out>.jsonl at once; per-phase progress lines would drown the
    // per-case lines, so the sweep reports cases (done/total, ETA) instead.
    // Rank 0 only (a session without a communicator is a single process).
    RowLog row_log(!s.comm || s.comm->rank() == 0 ? jsonl_path(cfg) : std::string());
    if (!row_log.path().empty()) {
        std::printf("rows       : %s (one line per finished run)\n", row_log.path().c_str());
    }
    progress::set_phase_lines(false);
    progress::Sweep sweep("", n_cases);
    std::map<std::string, LabelStats> stats;
    int done = 0;
    for (int L : nc.lengths) {
        for (double depth : nc.depths) {
            HaystackSpec spec;
            spec.target_tokens = L - prefix_tokens;
            spec.depth = depth;
            spec.seed = nc.seed;
            spec.needle = nc.needle;
            spec.separator = ins.doc_separator;
            const Haystack h = build_haystack(paragraphs, spec, count);
            const PreparedRequest req = prepare_request(
                tok, chat, RequestText{cfg.request.system, h.documents, nc.question}, cfg);
            const int T = req.context_tokens();
            const int needle_begin = prefix_tokens + h.needle_offset;
            run_case(s, cfg, variants, req, rows, &row_log, [&](const CaseRun& run, json& row) {
                const MethodVariant& v = *run.variant;
                const bool correct = run.answer.find(nc.answer) != std::string::npos;
                const double recall =
                    needle_recall(req, *run.result, needle_begin, needle_begin + h.needle_tokens);
                row["length_target"] = L;
                row["depth"] = depth;
                row["actual_depth"] = h.actual_depth();
                row["needle_doc"] = h.needle_doc;
                row["n_chunks"] = req.n_chunks();
                row["method_name"] = to_string(v.method);
                row["layout"] = v.method == Config::Method::infoflow ? json(to_string(v.layout))
                                                                     : json(nullptr);
                row["reorder"] = v.reorder;
                row["correct"] = correct;
                row["needle_recall"] = recall;
                LabelStats& st = stats[v.label];
                st.add(*run.result, run.cmp);
                st.correct += correct;
                st.correct_values.push_back(correct);
                st.needle += recall;
                ++done;
                sweep.step();
                std::printf(
                    "[niah %*d/%d] L %d (T %d) depth %.2f  %-24s %s  top1 %s  KL %.4f  "
                    "sel %5.1f%% (needle %3.0f%%)  TTFT %8.1f ms  ETA %s  answer \"%s\"\n",
                    int(std::to_string(n_cases).size()), done, n_cases, L, T, depth,
                    v.label.c_str(), correct ? "ok  " : "MISS", run.cmp.top1_agree ? "=" : "x",
                    run.cmp.kl, 100.0 * run.cmp.selected_fraction, 100.0 * recall,
                    run.result->ttft_ms, sweep.eta().c_str(), one_line(run.answer).c_str());
                std::fflush(stdout);
            });
        }
    }

    JobSummary summary;
    for (const auto& v : variants) {
        const LabelStats& st = stats[v.label];
        const double n = std::max(1, st.runs);
        const Interval acc = bootstrap_mean(st.correct_values);
        // Paired on the same cases: this variant's correctness minus full's (not when full
        // does not fit the model's window and was not run).
        const std::vector<double>& full_values = stats[variants[0].label].correct_values;
        const bool full_ran = full_values.size() == st.correct_values.size() &&
                              !full_values.empty() && variants[0].method == Config::Method::full;
        const PairedComparison vs_full =
            full_ran ? paired_comparison(st.correct_values, full_values) : PairedComparison{};
        const std::string acc_text = st.runs == 0 && v.method == Config::Method::full
                                         ? std::string("does not fit")
                                         : acc.str("%.2f");
        json& row = summary.add(
            v, st, {acc_text},
            {fmt("%.3f", st.needle / n),
             v.method == Config::Method::full || !full_ran ? "-" : vs_full.str("%+.2f")});
        row["runs"] = st.runs;
        row["accuracy"] = st.correct / n;
        row["accuracy_ci"] = acc.json();
        row["accuracy_vs_full"] = vs_full.json();
        row["mean_needle_recall"] = st.needle / n;
    }
    json out = finish_report(
        "niah", cfg, s, t_start, std::move(rows), std::move(summary),
        summary_header("runs", {"accuracy [95% CI]"}, {"needle sel", "acc - full [95% CI]"}),
        {"length_target", "context_tokens", "depth", "actual_depth", "method", "reference",
         "does_not_fit", "correct", "top1_agree", "kl", "exact_match", "selected_fraction",
         "needle_recall", "ttft_ms", "answer", "phases"});
    out["filler"] = filler_name;
    out["prefix_tokens"] = prefix_tokens;
    return out;
}

}  // namespace infoflow
