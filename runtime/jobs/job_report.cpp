#include "runtime/jobs/job_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/jobs/qa_metrics.h"
#include "runtime/jobs/stats.h"

namespace infoflow {

std::string variant_label(Config::Method m, Config::Layout layout, bool reorder) {
    if (m != Config::Method::infoflow) return to_string(m);
    return std::string(reorder ? "infoflow+reorder/" : "infoflow/") + to_string(layout);
}

std::vector<MethodVariant> niah_variants(const Config& cfg) {
    using M = Config::Method;
    std::vector<MethodVariant> out;
    auto add = [&](M m, Config::Layout layout, bool reorder) {
        const std::string label = variant_label(m, layout, reorder);
        for (const auto& v : out) {
            if (v.label == label) return;
        }
        out.push_back({label, m, layout, reorder});
    };
    add(M::full, Config::Layout::global, false);
    for (M m : cfg.niah.methods) {
        if (m != M::infoflow) {
            // Carries the config's layout (unused by these methods); labelled by name alone.
            add(m, cfg.scoring.layout, false);
            continue;
        }
        for (Config::Layout l : cfg.niah.layouts) add(m, l, false);
        if (cfg.niah.layouts.empty()) add(m, cfg.scoring.layout, false);
        if (cfg.method.reorder) add(m, Config::Layout::global, true);
    }
    return out;
}

std::vector<MethodVariant> eval_variants(const Config& cfg) {
    std::vector<MethodVariant> out;
    out.push_back({"full", Config::Method::full, Config::Layout::global, false});
    if (cfg.method.name != Config::Method::full) {
        const bool reorder = cfg.method.name == Config::Method::infoflow && cfg.method.reorder;
        out.push_back({variant_label(cfg.method.name, cfg.scoring.layout, reorder), cfg.method.name,
                       cfg.scoring.layout, reorder});
    }
    return out;
}

Config variant_config(const Config& cfg, const MethodVariant& v) {
    Config c = cfg;
    c.method.name = v.method;
    c.scoring.layout = v.layout;
    c.method.reorder = v.reorder;
    return c;
}

nlohmann::json phases_json(const std::vector<PhaseTime>& phases) {
    nlohmann::json j = nlohmann::json::object();
    for (const PhaseTime& p : phases) j[p.name] = p.ms;
    return j;
}

namespace {

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) {
        if (c == '"') q += '"';
        q += c;
    }
    return q + "\"";
}

std::string csv_value(const nlohmann::json& v) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();
    return v.dump();
}

}  // namespace

std::string rows_to_csv(const nlohmann::json& rows, const std::vector<std::string>& columns) {
    // (column, sub-key) pairs; sub-key empty for plain columns.
    std::vector<std::pair<std::string, std::string>> cols;
    for (const std::string& c : columns) {
        std::vector<std::string> keys;
        bool object = false;
        for (const auto& r : rows) {
            if (!r.contains(c) || !r[c].is_object()) continue;
            object = true;
            for (const auto& kv : r[c].items()) {
                if (std::find(keys.begin(), keys.end(), kv.key()) == keys.end()) {
                    keys.push_back(kv.key());
                }
            }
        }
        if (!object) {
            cols.emplace_back(c, "");
        } else {
            for (const auto& k : keys) cols.emplace_back(c, k);
        }
    }
    std::string out;
    for (size_t i = 0; i < cols.size(); ++i) {
        out += (i ? "," : "") + csv_field(cols[i].second.empty()
                                              ? cols[i].first
                                              : cols[i].first + "." + cols[i].second);
    }
    out += "\n";
    for (const auto& r : rows) {
        for (size_t i = 0; i < cols.size(); ++i) {
            const auto& [c, k] = cols[i];
            std::string v;
            if (r.contains(c)) {
                if (k.empty()) {
                    v = csv_value(r[c]);
                } else if (r[c].is_object() && r[c].contains(k)) {
                    v = csv_value(r[c][k]);
                }
            }
            out += (i ? "," : "") + csv_field(v);
        }
        out += "\n";
    }
    return out;
}

std::string csv_path(const Config& cfg) {
    if (!cfg.output.csv.empty()) return cfg.output.csv;
    const std::string& p = cfg.output.path;
    if (p.empty()) return "";
    const size_t slash = p.find_last_of('/');
    const size_t dot = p.find_last_of('.');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) {
        return p.substr(0, dot) + ".csv";
    }
    return p + ".csv";
}

std::string jsonl_path(const Config& cfg) {
    const std::string& p = cfg.output.path;
    if (p.empty()) return "";
    const size_t slash = p.find_last_of('/');
    const size_t dot = p.find_last_of('.');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash + 1)) {
        return p.substr(0, dot) + ".jsonl";
    }
    return p + ".jsonl";
}

RowLog::RowLog(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    IF_CHECK(fd_ >= 0, "cannot write rows to '" << path_ << "': " << std::strerror(errno));
}

RowLog::~RowLog() {
    if (fd_ >= 0) ::close(fd_);
}

void RowLog::append(const nlohmann::json& row) {
    if (fd_ < 0) return;
    // One write per row: with O_APPEND the line lands whole or not at all on a local disk.
    const std::string line = row.dump() + "\n";
    size_t done = 0;
    while (done < line.size()) {
        const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        IF_CHECK(n > 0, "cannot write rows to '" << path_ << "': " << std::strerror(errno));
        done += size_t(n);
    }
    ::fsync(fd_);
}

void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> w(header.size());
    for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
    for (const auto& r : rows) {
        for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t i = 0; i < w.size(); ++i) {
            const std::string c = i < cells.size() ? cells[i] : "";
            // First column left-aligned (labels), the others right-aligned (numbers).
            const std::string pad(w[i] - c.size(), ' ');
            s += (i ? "  " : "") + (i == 0 ? c + pad : pad + c);
        }
        std::printf("%s\n", s.c_str());
    };
    line(header);
    size_t total = 0;
    for (size_t x : w) total += x;
    std::printf("%s\n", std::string(total + 2 * (w.empty() ? 0 : w.size() - 1), '-').c_str());
    for (const auto& r : rows) line(r);
    std::fflush(stdout);
}

RunComparison compare_runs(const MethodResult& ref, const MethodResult& r, int context_tokens) {
    const FirstTokenComparison cmp = compare_first_token(ref.first_logits, r.first_logits);
    RunComparison c;
    c.top1_id = cmp.top1;
    c.top1_agree = cmp.top1_agree;
    c.kl = cmp.kl;
    c.exact = r.answer == ref.answer;
    c.selected_fraction =
        context_tokens ? double(r.selected_positions.size()) / context_tokens : 0.0;
    return c;
}

void put_comparison(nlohmann::json& row, const MethodResult& r, const RunComparison& c) {
    row["top1_id"] = c.top1_id;
    row["top1_agree"] = c.top1_agree;
    row["kl"] = c.kl;
    row["exact_match"] = c.exact;
    row["selected"] = r.selected_positions.size();
    row["selected_fraction"] = c.selected_fraction;
    row["ttft_ms"] = r.ttft_ms;
    row["phases"] = phases_json(r.phases);
}

void RunTotals::add(const MethodResult& r, const RunComparison& c) {
    ++runs;
    top1 += c.top1_agree;
    exact += c.exact;
    kl += c.kl;
    selected += c.selected_fraction;
    ttft += r.ttft_ms;
    kl_values.push_back(c.kl);
    exact_values.push_back(c.exact);
}

nlohmann::json RunTotals::summary(const std::string& label, bool reference) const {
    const double n = std::max(1, runs);
    return {{"method", label},
            {"reference", reference},
            {"top1_agreement", top1 / n},
            {"mean_kl", kl / n},
            {"exact_match", exact / n},
            {"mean_selected_fraction", selected / n},
            {"mean_ttft_ms", ttft / n},
            {"mean_kl_ci", bootstrap_mean(kl_values).json()},
            {"exact_match_ci", bootstrap_mean(exact_values).json()}};
}

std::string one_line(std::string s) {
    for (char& c : s) {
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    }
    return s;
}

std::string fmt(const char* format, double x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), format, x);
    return buf;
}

void run_case(Session& s, const Config& cfg, const std::vector<MethodVariant>& variants,
              const PreparedRequest& req, nlohmann::json& rows, RowLog* row_log,
              const CaseVisitor& visit) {
    const Tokenizer& tok = s.tok();
    const int T = req.context_tokens();
    // Beyond the model's window (reform, h2o, streamingllm) `full` does not fit: its row says
    // so, and the other runs are compared with nothing.
    const int64_t need =
        int64_t(T) + int64_t(req.suffix.size()) + std::max(0, cfg.decode.max_new_tokens - 1);
    const bool ref_fits = need <= s.model->config().n_ctx_train;
    MethodResult ref;
    for (size_t vi = 0; vi < variants.size(); ++vi) {
        const MethodVariant& v = variants[vi];
        if (vi == 0 && !ref_fits) {
            nlohmann::json row;
            row["context_tokens"] = T;
            row["suffix_tokens"] = int(req.suffix.size());
            row["method"] = v.label;
            row["reference"] = true;
            row["does_not_fit"] = true;
            // The fields every row carries, empty: nothing ran.
            row["answer"] = "";
            row["answer_ids"] = nlohmann::json::array();
            put_comparison(row, MethodResult(), RunComparison());
            std::printf("[case] T %d: full does not fit (%lld positions > %d of the model)\n", T,
                        static_cast<long long>(need), s.model->config().n_ctx_train);
            rows.push_back(row);
            if (row_log) row_log->append(row);
            continue;
        }
        const MethodResult r = run_method(*s.model, req, variant_config(cfg, v), tok.stop_ids());
        if (vi == 0) ref = r;  // variants[0] is full
        CaseRun run;
        run.index = vi;
        run.variant = &v;
        run.result = &r;
        if (ref_fits) {
            run.cmp = compare_runs(ref, r, T);
        } else {
            run.cmp.top1_id =
                r.first_logits.empty()
                    ? -1
                    : int(std::max_element(r.first_logits.begin(), r.first_logits.end()) -
                          r.first_logits.begin());
            run.cmp.selected_fraction = T ? double(r.selected_positions.size()) / T : 0.0;
        }
        run.answer = tok.decode(r.answer);
        nlohmann::json row;
        row["context_tokens"] = T;
        row["suffix_tokens"] = r.suffix_tokens;
        row["method"] = v.label;
        row["reference"] = vi == 0;
        row["answer"] = run.answer;
        row["answer_ids"] = r.answer;
        put_comparison(row, r, run.cmp);
        visit(run, row);
        rows.push_back(row);
        if (row_log) row_log->append(row);
    }
}

nlohmann::json& JobSummary::add(const MethodVariant& v, const RunTotals& st,
                                const std::vector<std::string>& lead,
                                const std::vector<std::string>& tail) {
    const double n = std::max(1, st.runs);
    const bool ref = v.method == Config::Method::full;
    std::vector<std::string> cells = {v.label + (ref ? " (ref)" : ""), std::to_string(st.runs)};
    cells.insert(cells.end(), lead.begin(), lead.end());
    for (const std::string& x :
         {fmt("%.3f", st.top1 / n), bootstrap_mean(st.kl_values).str("%.4f"),
          bootstrap_mean(st.exact_values).str("%.2f"), fmt("%.3f", st.selected / n)}) {
        cells.push_back(x);
    }
    cells.insert(cells.end(), tail.begin(), tail.end());
    cells.push_back(fmt("%.1f", st.ttft / n));
    table.push_back(cells);
    rows.push_back(st.summary(v.label, ref));
    return rows.back();
}

std::vector<std::string> summary_header(const std::string& runs,
                                        const std::vector<std::string>& lead,
                                        const std::vector<std::string>& tail) {
    std::vector<std::string> h = {"method", runs};
    h.insert(h.end(), lead.begin(), lead.end());
    for (const char* x : {"top1 agree", "mean KL [95% CI]", "exact match [95% CI]", "selected"}) {
        h.push_back(x);
    }
    h.insert(h.end(), tail.begin(), tail.end());
    h.push_back("TTFT ms");
    return h;
}

nlohmann::json finish_report(const std::string& job, const Config& cfg, const Session& s,
                             std::chrono::steady_clock::time_point t_start, nlohmann::json rows,
                             JobSummary summary, const std::vector<std::string>& header,
                             const std::vector<std::string>& csv_columns) {
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    std::printf("\n");
    print_table(header, summary.table);
    std::printf("wall time  : %.1f s\n", wall_s);
    const std::string csv = csv_path(cfg);
    if (!csv.empty()) {
        write_file_atomic(csv, rows_to_csv(rows, csv_columns));
        std::printf("csv        : %s\n", csv.c_str());
    }
    std::fflush(stdout);
    nlohmann::json out;
    out["job"] = job;
    out["model"] = s.weights->source;
    out["backend"] = s.backend->name();
    out["ranks"] = 1;
    out["reference"] = "full";
    out["wall_s"] = wall_s;
    out["rows"] = std::move(rows);
    out["summary"] = std::move(summary.rows);
    out["config"] = cfg.to_json();
    return out;
}

}  // namespace infoflow
