// Shared parts of the comparison jobs (`niah`, `eval`): which method variants run and how they
// are labelled, the eval data file, the CSV twin of the JSON result and the summary table.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/jobs/session.h"
#include "runtime/method/pipeline.h"

namespace infoflow {

// One method run of a comparison: a method with its scoring layout and reorder flag.
struct MethodVariant {
    std::string label;  // "full", "none", "cacheblend", "epic", "infoflow/global",
                        // "infoflow+reorder/global"
    Config::Method method = Config::Method::full;
    Config::Layout layout = Config::Layout::global;
    bool reorder = false;
};

std::string variant_label(Config::Method m, Config::Layout layout, bool reorder);

// The variants of job `niah`, `full` (the reference) first and once: every method of
// niah.methods; for `infoflow` one variant per layout of niah.layouts, plus
// `infoflow+reorder/global` when method.reorder is true.
std::vector<MethodVariant> niah_variants(const Config& cfg);
// The variants of job `eval`: `full` (the reference), then method.name with scoring.layout and
// method.reorder, unless it is `full`.
std::vector<MethodVariant> eval_variants(const Config& cfg);

// `cfg` with method.name, scoring.layout and method.reorder of the variant.
Config variant_config(const Config& cfg, const MethodVariant& v);

// The phases of a run as {"name": ms, ...}.
nlohmann::json phases_json(const std::vector<PhaseTime>& phases);

// Report text helpers: `s` on one line (newlines and tabs as spaces); printf of one number.
std::string one_line(std::string s);
std::string fmt(const char* format, double x);

// A run compared with the reference run of its case: the fields every niah/eval row carries
// (top1_id, top1_agree, kl, exact_match, selected, selected_fraction, ttft_ms, phases) and their
// running totals per method label.
struct RunComparison {
    int top1_id = -1;
    bool top1_agree = false;
    double kl = 0.0;
    bool exact = false;  // greedy answer ids equal to the reference's
    double selected_fraction = 0.0;
};
RunComparison compare_runs(const MethodResult& ref, const MethodResult& r, int context_tokens);
void put_comparison(nlohmann::json& row, const MethodResult& r, const RunComparison& c);
struct RunTotals {
    int runs = 0, top1 = 0, exact = 0;
    double kl = 0.0, selected = 0.0, ttft = 0.0;
    std::vector<double> kl_values, exact_values;  // per run, in case order (intervals, stats.h)
    void add(const MethodResult& r, const RunComparison& c);
    // The summary fields every job reports for a method label (means over its runs, and the
    // 95 % bootstrap intervals of mean KL and exact match: "mean_kl_ci", "exact_match_ci").
    nlohmann::json summary(const std::string& label, bool reference) const;
};

// Rows as CSV: a header, then one line per row. `columns` come first in the given order; object
// values (e.g. "phases") become one column per key, "<key>.<name>", over the union of the rows'
// keys; arrays are written as JSON text. Fields are quoted when they need it (RFC 4180).
std::string rows_to_csv(const nlohmann::json& rows, const std::vector<std::string>& columns);

// Where the CSV goes: output.csv when set, else output.path with its extension replaced by
// ".csv" (appended when it has none); "" when neither is set.
std::string csv_path(const Config& cfg);

// Where a sweep's rows go as they finish: output.path with its extension replaced by ".jsonl"
// (appended when it has none); "" when output.path is not set.
std::string jsonl_path(const Config& cfg);

// Appends one JSON row per line to a file as each case finishes (flushed and fsync'ed, so a
// sweep that is interrupted keeps every finished row; a row is never half-written unless the
// machine itself fails mid-line). The file is started empty. An empty path logs nothing.
class RowLog {
  public:
    explicit RowLog(std::string path);
    ~RowLog();
    RowLog(const RowLog&) = delete;
    RowLog& operator=(const RowLog&) = delete;
    void append(const nlohmann::json& row);
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    int fd_ = -1;
};

// One sample of an eval JSONL file: `context`, `input`, `answers` (list of strings), optional
// `_id` and `length`.
struct EvalSample {
    int line = 0;  // 1-based line in the file
    std::string id;
    std::string context;
    std::string input;
    std::vector<std::string> answers;
    long length = -1;  // the dataset's own length field; -1 when absent
};
// Samples of a JSONL file (blank lines skipped), at most `max_samples` (0 = all). Errors name
// FILE:LINE.
std::vector<EvalSample> read_eval_samples(const std::string& path, int max_samples);

// The per-case loop of a comparison job: every variant on one request, variants[0] (`full`)
// first as the reference. Each run's row starts with the fields every job reports
// (context_tokens, suffix_tokens, method, reference, answer, answer_ids, and the comparison);
// `visit` adds the job's own fields to it, keeps the job's totals and prints its progress line;
// then the row goes to `rows` and, when given, to `row_log` (the sweep's JSONL file).
struct CaseRun {
    size_t index = 0;  // into the variants; 0 is the reference
    const MethodVariant* variant = nullptr;
    const MethodResult* result = nullptr;
    RunComparison cmp;
    std::string answer;  // decoded
};
using CaseVisitor = std::function<void(const CaseRun& run, nlohmann::json& row)>;
void run_case(Session& s, const Config& cfg, const std::vector<MethodVariant>& variants,
              const PreparedRequest& req, nlohmann::json& rows, RowLog* row_log,
              const CaseVisitor& visit);

// The per-variant summary of a comparison job: JSON rows and the lines of the table.
struct JobSummary {
    nlohmann::json rows = nlohmann::json::array();
    std::vector<std::vector<std::string>> table;
    // Adds variant `v`: its table line is the label ("(ref)" on `full`), the run count, the job's
    // `lead` cells, the shared means (top1 agree, mean KL, exact match, selected), the job's
    // `tail` cells and the mean TTFT; returns its JSON row (RunTotals::summary) for the job's
    // own fields.
    nlohmann::json& add(const MethodVariant& v, const RunTotals& st,
                        const std::vector<std::string>& lead, const std::vector<std::string>& tail);
};
// The table header that goes with JobSummary::add.
std::vector<std::string> summary_header(const std::string& runs,
                                        const std::vector<std::string>& lead,
                                        const std::vector<std::string>& tail);

// The end of a comparison job: prints the summary table and the wall time since `t_start`,
// writes the rows as CSV (csv_path, `csv_columns` first) and returns the JSON result with the
// fields every job reports (job, model, backend, ranks, reference, wall_s, rows, summary,
// config); the job adds its own.
nlohmann::json finish_report(const std::string& job, const Config& cfg, const Session& s,
                             std::chrono::steady_clock::time_point t_start, nlohmann::json rows,
                             JobSummary summary, const std::vector<std::string>& header,
                             const std::vector<std::string>& csv_columns);

// Prints a fixed-width table: a header line, a rule, then the rows.
void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);

}  // namespace infoflow
