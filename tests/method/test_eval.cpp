// Job `eval` and the metrics of the comparison jobs: LongBench QA F1 and normalize_answer on
// hand-computed cases, passage splitting, KL of first-token distributions, CSV output, and an
// end-to-end eval of a two-sample JSONL on the real SmolLM2 model.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "runtime/core/fs.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/qa_metrics.h"
#include "runtime/jobs/session.h"

using namespace infoflow;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
    const fs::path p = fs::temp_directory_path() / ("infoflow_test_" + name);
    fs::create_directories(p);
    return p.string();
}

}  // namespace

TEST_CASE("normalize_answer follows LongBench", "[eval]") {
    CHECK(normalize_answer("The Cat sat.") == "cat sat");
    CHECK(normalize_answer("  An apple,  a PEAR; the plum!  ") == "apple pear plum");
    // Articles only as whole words; punctuation removed before article removal.
    CHECK(normalize_answer("theatre another anthem") == "theatre another anthem");
    CHECK(normalize_answer("the-end") == "theend");
    CHECK(normalize_answer("a.b") == "ab");
    CHECK(normalize_answer("A") == "");
    CHECK(normalize_answer("Tom's  dog\n\tran") == "toms dog ran");
    // Unicode: lower-cased, non-ASCII punctuation kept, non-breaking space is whitespace.
    CHECK(normalize_answer("\xC3\x89"
                           "COLE\xC2\xA0the caf\xC3\xA9") ==
          "\xC3\xA9"
          "cole caf\xC3\xA9");
    CHECK(normalize_answer("the\xE2\x80\x99s") == "\xE2\x80\x99s");
}

TEST_CASE("qa_f1 matches hand-computed LongBench scores", "[eval]") {
    CHECK(qa_f1("The Cat sat.", "cat sat") == Approx(1.0));
    CHECK(qa_f1("cat", "cat sat") == Approx(2.0 * 1.0 * 0.5 / 1.5));  // p 1, r 1/2 -> 2/3
    // prediction {paris, capital, france} vs reference {paris}: p 1/3, r 1 -> 0.5
    CHECK(qa_f1("Paris capital France", "Paris") == Approx(0.5));
    // "capital of france" keeps "of": {paris, capital, of, france} vs {paris}: p 1/4 -> 0.4
    CHECK(qa_f1("Paris, the capital of France", "Paris") == Approx(0.4));
    // Multiset overlap: common {red, blue} = 2 of 3 on each side -> 2/3.
    CHECK(qa_f1("red red blue", "red blue blue") == Approx(2.0 / 3.0));
    CHECK(qa_f1("nothing shared", "other words") == 0.0);
    CHECK(qa_f1("", "something") == 0.0);
    CHECK(qa_f1("the", "a") == 0.0);  // both normalize to nothing
    CHECK(qa_f1_max("Barack Obama", {"Obama", "Barack Obama", "President Obama"}) == Approx(1.0));
    CHECK(qa_f1_max("Obama", {"Barack Obama", "George Bush"}) == Approx(2.0 / 3.0));
    CHECK(qa_f1_max("anything", {}) == 0.0);
}

TEST_CASE("split_passages cuts a LongBench context at each newline-Passage marker", "[eval]") {
    const std::string ctx =
        "Passage 1:\nAlpha\nfirst text\nPassage 2:\nBeta\nsecond text\n\nPassage 3:\nGamma";
    const std::vector<std::string> p = split_passages(ctx);
    REQUIRE(p.size() == 3);
    CHECK(p[0] == "Passage 1:\nAlpha\nfirst text");
    CHECK(p[1] == "Passage 2:\nBeta\nsecond text");
    CHECK(p[2] == "Passage 3:\nGamma");
    // Leading text without a "Passage" header is kept as the first piece; empty pieces dropped.
    const std::vector<std::string> q = split_passages("intro\nPassage \nPassage 1: x\n");
    REQUIRE(q.size() == 2);
    CHECK(q[0] == "intro");
    CHECK(q[1] == "Passage 1: x");
    CHECK(split_passages("").empty());
    CHECK(split_passages("just one document") == std::vector<std::string>{"just one document"});
}

TEST_CASE("KL of first-token distributions", "[eval][niah]") {
    const std::vector<double> p = {std::log(0.5), std::log(0.5)};
    const std::vector<double> q = {std::log(0.25), std::log(0.75)};
    CHECK(kl_divergence(p, p) == 0.0);
    // 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln 2 + 0.5 ln(2/3)
    CHECK(kl_divergence(p, q) == Approx(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)));
    // A zero-probability term of p contributes nothing.
    const std::vector<double> one_hot = {0.0, -INFINITY};
    CHECK(kl_divergence(one_hot, q) == Approx(-std::log(0.25)));

    // From logits: softmax([0, ln 3]) = [0.25, 0.75]; equal logits give [0.5, 0.5].
    const std::vector<float> ref = {1.0f, 1.0f};
    const std::vector<float> m = {0.0f, float(std::log(3.0))};
    FirstTokenComparison c = compare_first_token(ref, m);
    CHECK(c.kl == Approx(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)).epsilon(1e-6));
    CHECK(c.ref_top1 == 0);  // tie -> lower id
    CHECK(c.top1 == 1);
    CHECK_FALSE(c.top1_agree);
    c = compare_first_token(m, m);
    CHECK(c.kl == 0.0);
    CHECK(c.top1_agree);
    // Shifting logits by a constant leaves the distribution unchanged.
    CHECK(compare_first_token(m, {5.0f, 5.0f + float(std::log(3.0))}).kl ==
          Approx(0.0).margin(1e-9));
}

TEST_CASE("rows_to_csv expands objects and quotes fields", "[eval][niah]") {
    nlohmann::json rows = nlohmann::json::array();
    rows.push_back({{"a", 1}, {"s", "x,y"}, {"phases", {{"prefill", 2.5}}}});
    rows.push_back({{"a", 2}, {"s", "say \"hi\""}, {"phases", {{"prefill", 1.0}, {"decode", 3}}}});
    const std::string csv = rows_to_csv(rows, {"a", "s", "phases", "missing"});
    CHECK(csv ==
          "a,s,phases.prefill,phases.decode,missing\n"
          "1,\"x,y\",2.5,,\n"
          "2,\"say \"\"hi\"\"\",1.0,3,\n");
    Config c;
    CHECK(csv_path(c).empty());
    c.output.path = "out/run.json";
    CHECK(csv_path(c) == "out/run.csv");
    c.output.path = "out.d/run";
    CHECK(csv_path(c) == "out.d/run.csv");
    c.output.csv = "x.csv";
    CHECK(csv_path(c) == "x.csv");
}

TEST_CASE("read_eval_samples reads LongBench JSONL and names bad lines", "[eval]") {
    const std::string dir = temp_dir("eval_read");
    const std::string path = dir + "/d.jsonl";
    write_file_atomic(path,
                      "{\"context\": \"c1\", \"input\": \"q1\", \"answers\": [\"a\"], \"_id\": "
                      "\"x1\", \"length\": 12}\n\n"
                      "{\"context\": \"c2\", \"input\": \"q2\", \"answers\": [\"b\", \"c\"]}\n");
    const std::vector<EvalSample> s = read_eval_samples(path, 0);
    REQUIRE(s.size() == 2);
    CHECK(s[0].id == "x1");
    CHECK(s[0].length == 12);
    CHECK(s[1].line == 3);
    CHECK(s[1].answers == std::vector<std::string>{"b", "c"});
    CHECK(read_eval_samples(path, 1).size() == 1);
    write_file_atomic(path, "{\"context\": \"c\", \"input\": \"q\"}\n");
    CHECK_THROWS_WITH(read_eval_samples(path, 0),
                      Catch::Contains(path + ":1") && Catch::Contains("answers"));
}

TEST_CASE("eval end to end on SmolLM2: two short samples, full and infoflow", "[eval][model][heavy]") {
    const std::string model = INFOFLOW_MODEL_PATH;
    if (!fs::exists(model)) FAIL("real model " << model << " is missing: run launch/setup.sh");
    const std::string dir = temp_dir("eval_e2e");
    const std::string data = dir + "/samples.jsonl";
    nlohmann::json s1 = {
        {"_id", "s1"},
        {"input", "Which city is the capital of Norland?"},
        {"answers", {"Valmora"}},
        {"context",
         "Passage 1:\nNorland\nNorland is a small country in the north. Its capital city is "
         "Valmora, a port on the cold sea.\nPassage 2:\nRiver Tessel\nThe Tessel is a river that "
         "runs through green hills to the sea."}};
    nlohmann::json s2 = {
        {"_id", "s2"},
        {"input", "What colour is the door of the lighthouse?"},
        {"answers", {"red", "bright red"}},
        {"context",
         "Passage 1:\nHarbour\nThe harbour holds fishing boats and a small ferry.\nPassage 2:\n"
         "Lighthouse\nThe lighthouse stands on the rocks. Its door is painted bright red."}};
    write_file_atomic(data, s1.dump() + "\n" + s2.dump() + "\n");

    Config cfg;
    cfg.job = Config::Job::eval;
    cfg.model.path = model;
    cfg.model.threads = 2;
    cfg.method.name = Config::Method::infoflow;
    cfg.decode.max_new_tokens = 8;
    cfg.eval.data_file = data;
    cfg.eval.task = "fixture";
    cfg.output.csv = dir + "/eval.csv";
    std::unique_ptr<Session> session = open_session(cfg);
    const nlohmann::json out = run_eval(cfg, *session);

    CHECK(out["job"] == "eval");
    CHECK(out["config"]["request"]["template"] == "longbench");
    const auto& rows = out["rows"];
    REQUIRE(rows.size() == 4);  // 2 samples x (full, infoflow/global)
    for (const auto& r : rows) {
        CAPTURE(r.dump());
        CHECK(r["f1"].get<double>() >= 0.0);
        CHECK(r["f1"].get<double>() <= 1.0);
        CHECK(r["context_tokens"].get<int>() > 0);
        CHECK(r["passages_dropped"] == 0);
        if (r["method"] == "full") {
            CHECK(r["reference"] == true);
            CHECK(r["top1_agree"] == true);
            CHECK(r["kl"].get<double>() == 0.0);
            CHECK(r["exact_match"] == true);
            CHECK(r["selected"] == 0);
        } else {
            CHECK(r["method"] == "infoflow/global");
            CHECK(r["selected_fraction"].get<double>() > 0.0);
            CHECK(r["selected_fraction"].get<double>() <= 0.15 + 1e-9);
        }
    }
    CHECK(rows[0]["id"] == "s1");
    CHECK(rows[0]["n_passages"] == 2);
    // The F1 of a row is the LongBench score of its answer text.
    for (const auto& r : rows) {
        CHECK(r["f1"].get<double>() ==
              Approx(qa_f1_max(r["answer"].get<std::string>(),
                               r["answers"].get<std::vector<std::string>>())));
    }
    const auto& summary = out["summary"];
    REQUIRE(summary.size() == 2);
    CHECK(summary[0]["method"] == "full");
    CHECK(summary[0]["top1_agreement"].get<double>() == 1.0);
    CHECK(summary[0]["mean_kl"].get<double>() == 0.0);
    CHECK(summary[1]["samples"] == 2);
    const std::string csv = read_file(cfg.output.csv);
    CHECK(csv.rfind("index,id,context_tokens,passages_dropped,method,reference,f1,", 0) == 0);
    CHECK(std::count(csv.begin(), csv.end(), '\n') >= 5);
}
