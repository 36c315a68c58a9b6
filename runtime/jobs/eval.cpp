// job = "eval": LongBench-style QA over a JSONL file (docs/design.md §9). Each sample's `context` is
// split into passages (the request's documents), its `input` is the question, the instruction is
// LongBench's (request.template = longbench, the paper's); `full` runs first as the reference,
// then method.name. Answers are scored with LongBench's QA F1 (best over `answers`); rows also
// carry first-token agreement and KL against `full`. A sample longer than the model's positions
// loses passages from the middle (LongBench truncates in the middle), and the row says how many.
// Not here: LongBench's non-QA metrics (ROUGE, classification, code) — eval.task is recorded.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "comm/communicator.h"
#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/progress.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/qa_metrics.h"
#include "runtime/jobs/session.h"
#include "runtime/jobs/stats.h"

namespace infoflow {
namespace {

using json = nlohmann::json;

struct LabelStats : RunTotals {
    double f1 = 0.0;
    std::vector<double> f1_values;  // per sample, in sample order
};

// Drops passages from the middle until the counted tokens fit `budget`; returns how many went.
int truncate_middle(std::vector<std::string>& passages, std::vector<int>& counts, int budget) {
    int total = 0;
    for (int c : counts) total += c;
    int dropped = 0;
    while (total > budget && !passages.empty()) {
        const size_t mid = passages.size() / 2;
        total -= counts[mid];
        passages.erase(passages.begin() + long(mid));
        counts.erase(counts.begin() + long(mid));
        ++dropped;
    }
    return dropped;
}

// The sample's request: its passages as documents, its input as the question; passages
// dropped from the middle until it fits the model's `n_ctx` positions with the answer.
PreparedRequest fit_request(const EvalSample& sample, const Config& cfg, const Tokenizer& tok,
                            const ChatTemplate& chat, int n_ctx, int* n_passages, int* dropped) {
    const InstructionText ins = instruction_text(cfg.request.prompt_template);
    RequestText text{cfg.request.system, split_passages(sample.context), sample.input};
    *n_passages = int(text.documents.size());
    // Positions left for the documents once chunk 0, the suffix and the answer are placed.
    const PreparedRequest skeleton =
        prepare_request(tok, chat, RequestText{text.system, {}, text.question}, cfg);
    const int budget = n_ctx - int(skeleton.chunks[0].size()) - int(skeleton.suffix.size()) -
                       cfg.decode.max_new_tokens;
    std::vector<int> counts;
    for (const auto& d : text.documents) {
        counts.push_back(int(chat.text(d + ins.doc_separator).size()));
    }
    *dropped = truncate_middle(text.documents, counts, budget);
    IF_CHECK(!text.documents.empty(), cfg.eval.data_file << ":" << sample.line
                                                         << ": no passage fits the model's "
                                                         << n_ctx << " positions");
    return prepare_request(tok, chat, text, cfg);
}

}  // namespace

std::vector<EvalSample> read_eval_samples(const std::string& path, int max_samples) {
    IF_CHECK(!path.empty(), "eval.data_file is not set");
    const std::string text = read_file(path);
    std::vector<EvalSample> out;
    size_t pos = 0;
    int line_no = 0;
    while (pos < text.size() && (max_samples <= 0 || int(out.size()) < max_samples)) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(line_no);
        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception& e) {
            IF_FAIL(where << ": not a JSON object: " << e.what());
        }
        IF_CHECK(j.is_object(), where << ": expected a JSON object");
        IF_CHECK(j.contains("context") && j["context"].is_string(),
                 where << ": missing string field \"context\"");
        IF_CHECK(j.contains("input") && j["input"].is_string(),
                 where << ": missing string field \"input\"");
        IF_CHECK(j.contains("answers") && j["answers"].is_array(),
                 where << ": missing list field \"answers\"");
        EvalSample s;
        s.line = line_no;
        s.context = j["context"].get<std::string>();
        s.input = j["input"].get<std::string>();
        for (const auto& a : j["answers"]) {
            IF_CHECK(a.is_string(), where << ": \"answers\" must hold strings");
            s.answers.push_back(a.get<std::string>());
        }
        if (j.contains("_id") && !j["_id"].is_null()) {
            s.id = j["_id"].is_string() ? j["_id"].get<std::string>() : j["_id"].dump();
        }
        if (j.contains("length") && j["length"].is_number()) s.length = j["length"].get<long>();
        out.push_back(std::move(s));
    }
    return out;
}

nlohmann::json run_eval(const Config& cfg_in, Session& s) {
    const auto t_start = std::chrono::steady_clock::now();
    Config cfg = cfg_in;
    cfg.request.prompt_template = Config::Template::longbench;
    const Tokenizer& tok = s.tok();
    const ChatTemplate& chat = s.chat_template();
    const std::vector<EvalSample> samples =
        read_eval_samples(cfg.eval.data_file, cfg.eval.max_samples);
    IF_CHECK(!samples.empty(), "eval.data_file '" << cfg.eval.data_file << "' has no samples");
    const std::vector<MethodVariant> variants = eval_variants(cfg);
    const int n_ctx = s.model->config().n_ctx_train;

    std::printf("eval       : %s, %zu samples, task '%s', metric qa_f1\n",
                cfg.eval.data_file.c_str(), samples.size(), cfg.eval.task.c_str());
    std::printf("model      : %s (%s, %d threads), ratio %.3f\n", s.weights->source.c_str(),
                s.backend->device().c_str(), cfg.model.threads, cfg.method.ratio);
    std::printf("variants   :");
    for (const auto& v : variants) std::printf(" %s", v.label.c_str());
    std::printf("  (reference: full)\n");
    std::fflush(stdout);

    json rows = json::array();
    std::map<std::string, LabelStats> stats;
    const int n_runs = int(samples.size() * variants.size());
    int done = 0;
    // Each finished row goes to <out>.jsonl at once; per-phase progress lines would drown the
    // per-case lines, so the sweep reports cases (done/total, ETA) instead.
    // Rank 0 only (a session without a communicator is a single process).
    RowLog row_log(!s.comm || s.comm->rank() == 0 ? jsonl_path(cfg) : std::string());
    if (!row_log.path().empty()) {
        std::printf("rows       : %s (one line per finished run)\n", row_log.path().c_str());
    }
    progress::set_phase_lines(false);
    progress::Sweep sweep("", n_runs);
    for (size_t si = 0; si < samples.size(); ++si) {
        const EvalSample& sample = samples[si];
        int n_passages = 0, dropped = 0;
        const PreparedRequest req =
            fit_request(sample, cfg, tok, chat, n_ctx, &n_passages, &dropped);
        const int T = req.context_tokens();
        run_case(s, cfg, variants, req, rows, &row_log, [&](const CaseRun& run, json& row) {
            const double f1 = qa_f1_max(run.answer, sample.answers);
            row["index"] = si;
            row["id"] = sample.id;
            row["length"] = sample.length >= 0 ? json(sample.length) : json(nullptr);
            row["n_passages"] = n_passages;
            row["passages_dropped"] = dropped;
            row["answers"] = sample.answers;
            row["f1"] = f1;
            LabelStats& st = stats[run.variant->label];
            st.add(*run.result, run.cmp);
            st.f1 += f1;
            st.f1_values.push_back(f1);
            ++done;
            sweep.step();
            std::printf(
                "[eval %*d/%d] sample %zu (T %d%s) %-24s F1 %.3f  top1 %s  KL %.4f  "
                "TTFT %8.1f ms  ETA %s  answer \"%s\"\n",
                int(std::to_string(n_runs).size()), done, n_runs, si, T,
                dropped ? (", " + std::to_string(dropped) + " passages dropped").c_str() : "",
                run.variant->label.c_str(), f1, run.cmp.top1_agree ? "=" : "x", run.cmp.kl,
                run.result->ttft_ms, sweep.eta().c_str(), one_line(run.answer).c_str());
            std::fflush(stdout);
        });
    }

    JobSummary summary;
    for (const auto& v : variants) {
        const LabelStats& st = stats[v.label];
        const double n = std::max(1, st.runs);
        const Interval f1 = bootstrap_mean(st.f1_values);
        const PairedComparison vs_full =
            paired_comparison(st.f1_values, stats[variants[0].label].f1_values);
        json& row = summary.add(v, st,
                                {fmt("%.2f", 100.0 * f1.mean) + " [" + fmt("%.2f", 100.0 * f1.lo) +
                                 ", " + fmt("%.2f", 100.0 * f1.hi) + "]"},
                                {v.method == Config::Method::full ? "-" : vs_full.str("%+.3f")});
        row["mean_f1_ci"] = f1.json();
        row["f1_vs_full"] = vs_full.json();
        row["samples"] = st.runs;
        row["mean_f1"] = st.f1 / n;
        row["score"] = 100.0 * st.f1 / n;
    }
    json out =
        finish_report("eval", cfg, s, t_start, std::move(rows), std::move(summary),
                      summary_header("samples", {"F1 x100 [95% CI]"}, {"F1 - full [95% CI]"}),
                      {"index", "id", "context_tokens", "passages_dropped", "method", "reference",
                       "f1", "top1_agree", "kl", "exact_match", "selected_fraction", "ttft_ms",
                       "answer", "answers", "phases"});
    out["task"] = cfg.eval.task;
    out["metric"] = "qa_f1";
    out["data_file"] = cfg.eval.data_file;
    return out;
}

}  // namespace infoflow
