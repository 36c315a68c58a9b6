// job = "niah": passkey-style needle in a haystack (DESIGN §9). For every length × depth the
// haystack (haystack.h) becomes one request; `full` runs first as the reference, then every
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

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/jobs/haystack.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/qa_metrics.h"
#include "runtime/jobs/session.h"

namespace infoflow {
namespace {

using json = nlohmann::json;

struct LabelStats : RunTotals {
    int correct = 0;
    double needle = 0.0;
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
    const std::string filler =
        nc.filler_file.empty() ? builtin_filler() : read_file(nc.filler_file);
    IF_CHECK(filler.find(nc.answer) == std::string::npos,
             "niah.filler_file '" << filler_name << "' contains the answer '" << nc.answer
                                  << "': the needle must be the only place it appears");
    const std::vector<std::string> paragraphs = split_paragraphs(filler);
    IF_CHECK(!paragraphs.empty(), "niah.filler_file '" << filler_name << "' has no text");

    // Token budget of the documents: the chat prefix and instruction intro (chunk 0) count
    // towards the length; the suffix and the answer must fit the model's positions too.
    const InstructionText ins = instruction_text(cfg.request.prompt_template);
    const PreparedRequest skeleton =
        prepare_request(tok, chat, RequestText{cfg.request.system, {}, nc.question}, cfg);
    const int prefix_tokens = int(skeleton.chunks[0].size());
    const int suffix_tokens = int(skeleton.suffix.size());
    const int n_ctx = s.model->config().n_ctx_train;
    for (int L : nc.lengths) {
        IF_CHECK(L > prefix_tokens + 2 * int(tok.encode(nc.needle).size()),
                 "niah.lengths: " << L << " tokens is too short for the prompt prefix ("
                                  << prefix_tokens << " tokens) and the needle");
        IF_CHECK(L + suffix_tokens + cfg.decode.max_new_tokens <= n_ctx,
                 "niah.lengths: " << L << " context tokens + suffix " << suffix_tokens
                                  << " + decode.max_new_tokens " << cfg.decode.max_new_tokens
                                  << " exceed the " << n_ctx << " positions of the model ("
                                  << s.weights->source << ")");
    }
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
            MethodResult ref;
            for (size_t vi = 0; vi < variants.size(); ++vi) {
                const MethodVariant& v = variants[vi];
                MethodResult r = run_method(*s.model, req, variant_config(cfg, v), tok.stop_ids());
                if (vi == 0) ref = r;  // variants[0] is full
                const RunComparison cmp = compare_runs(ref, r, T);
                const std::string answer = tok.decode(r.answer);
                const bool correct = answer.find(nc.answer) != std::string::npos;
                const double sel = cmp.selected_fraction;
                const int needle_begin = prefix_tokens + h.needle_offset;
                const double recall =
                    needle_recall(req, r, needle_begin, needle_begin + h.needle_tokens);

                json row;
                row["length_target"] = L;
                row["context_tokens"] = T;
                row["suffix_tokens"] = r.suffix_tokens;
                row["depth"] = depth;
                row["actual_depth"] = h.actual_depth();
                row["needle_doc"] = h.needle_doc;
                row["n_chunks"] = req.n_chunks();
                row["method"] = v.label;
                row["method_name"] = to_string(v.method);
                row["layout"] = v.method == Config::Method::infoflow ? json(to_string(v.layout))
                                                                     : json(nullptr);
                row["reorder"] = v.reorder;
                row["reference"] = vi == 0;
                row["answer"] = answer;
                row["answer_ids"] = r.answer;
                row["correct"] = correct;
                put_comparison(row, r, cmp);
                row["needle_recall"] = recall;
                rows.push_back(row);

                LabelStats& st = stats[v.label];
                st.add(r, cmp);
                st.correct += correct;
                st.needle += recall;

                ++done;
                std::printf(
                    "[niah %*d/%d] L %d (T %d) depth %.2f  %-24s %s  top1 %s  KL %.4f  "
                    "sel %5.1f%% (needle %3.0f%%)  TTFT %8.1f ms  answer \"%s\"\n",
                    int(std::to_string(n_cases).size()), done, n_cases, L, T, depth,
                    v.label.c_str(), correct ? "ok  " : "MISS", cmp.top1_agree ? "=" : "x", cmp.kl,
                    100.0 * sel, 100.0 * recall, r.ttft_ms, one_line(answer).c_str());
                std::fflush(stdout);
            }
        }
    }

    json summary = json::array();
    std::vector<std::vector<std::string>> table;
    for (const auto& v : variants) {
        const LabelStats& st = stats[v.label];
        const double n = std::max(1, st.runs);
        json row = st.summary(v.label, v.method == Config::Method::full);
        row["runs"] = st.runs;
        row["accuracy"] = st.correct / n;
        row["mean_needle_recall"] = st.needle / n;
        summary.push_back(row);
        table.push_back({v.label + (v.method == Config::Method::full ? " (ref)" : ""),
                         std::to_string(st.runs), fmt("%.3f", st.correct / n),
                         fmt("%.3f", st.top1 / n), fmt("%.4f", st.kl / n),
                         fmt("%.3f", st.exact / n), fmt("%.3f", st.selected / n),
                         fmt("%.3f", st.needle / n), fmt("%.1f", st.ttft / n)});
    }
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    std::printf("\n");
    print_table({"method", "runs", "accuracy", "top1 agree", "mean KL", "exact match", "selected",
                 "needle sel", "TTFT ms"},
                table);
    std::printf("wall time  : %.1f s\n", wall_s);

    json out;
    out["job"] = "niah";
    out["model"] = s.weights->source;
    out["backend"] = s.backend->name();
    out["ranks"] = 1;
    out["reference"] = "full";
    out["filler"] = filler_name;
    out["prefix_tokens"] = prefix_tokens;
    out["wall_s"] = wall_s;
    out["rows"] = rows;
    out["summary"] = summary;
    out["config"] = cfg.to_json();

    const std::string csv = csv_path(cfg);
    if (!csv.empty()) {
        write_file_atomic(
            csv, rows_to_csv(
                     rows, {"length_target", "context_tokens", "depth", "actual_depth", "method",
                            "reference", "correct", "top1_agree", "kl", "exact_match",
                            "selected_fraction", "needle_recall", "ttft_ms", "answer", "phases"}));
        std::printf("csv        : %s\n", csv.c_str());
    }
    std::fflush(stdout);
    return out;
}

}  // namespace infoflow
