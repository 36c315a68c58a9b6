// Job `niah`: the haystack builder (length, needle depth, determinism) with a word counter and
// with the real SmolLM2 tokenizer, the method variants, and an end-to-end sweep on the real
// model at 512 tokens (report structure; `full` agrees with itself).
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>

#include "runtime/core/fs.h"
#include "runtime/jobs/haystack.h"
#include "runtime/jobs/job_report.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"

using namespace infoflow;
namespace fs = std::filesystem;

namespace {

const std::string k_needle = "The pass key is 71432. Remember it. 71432 is the pass key.";
const std::string k_filler = std::string(INFOFLOW_SOURCE_DIR) + "/configs/data/filler.txt";

int count_words(const std::string& s) {
    int n = 0;
    bool in_word = false;
    for (char c : s) {
        const bool space = c == ' ' || c == '\n' || c == '\t';
        if (!space && !in_word) ++n;
        in_word = !space;
    }
    return n;
}

std::string model_path() {
    const std::string p = INFOFLOW_MODEL_PATH;
    if (!fs::exists(p)) FAIL("real model " << p << " is missing: run launch/setup.sh");
    return p;
}

// The real model, loaded once for the tests of this file.
Session& smollm2() {
    static std::unique_ptr<Session> s;
    if (!s) {
        Config cfg;
        cfg.model.path = model_path();
        cfg.model.threads = 2;
        s = open_session(cfg);
    }
    return *s;
}

Config niah_config() {
    Config cfg;
    cfg.job = Config::Job::niah;
    cfg.model.path = model_path();
    cfg.model.threads = 2;
    cfg.niah.lengths = {512};
    cfg.niah.depths = {0.25, 1.0};
    cfg.niah.methods = {Config::Method::full, Config::Method::infoflow};
    cfg.niah.layouts = {Config::Layout::global};
    cfg.niah.needle = k_needle;
    cfg.niah.question = "What is the pass key? Answer with the number only.";
    cfg.niah.answer = "71432";
    cfg.niah.filler_file = k_filler;
    cfg.decode.max_new_tokens = 12;
    return cfg;
}

}  // namespace

TEST_CASE("split_paragraphs and split_sentences", "[niah]") {
    const auto p = split_paragraphs("\n  First line\nwrapped.  \n\n\n Second. Two!\n \nThird");
    REQUIRE(p.size() == 3);
    CHECK(p[0] == "First line wrapped.");
    CHECK(p[1] == "Second. Two!");
    CHECK(p[2] == "Third");
    const auto s = split_sentences("One. Two? \"Three!\" Four (five.) Six e.g.seven end");
    REQUIRE(s.size() == 5);
    CHECK(s[0] == "One.");
    CHECK(s[1] == "Two?");
    CHECK(s[2] == "\"Three!\"");
    CHECK(s[3] == "Four (five.)");
    CHECK(s[4] == "Six e.g.seven end");
    CHECK(split_sentences("").empty());
    CHECK(split_paragraphs(builtin_filler()).size() >= 5);
}

TEST_CASE("haystack with a word counter: exact length, depth, determinism", "[niah]") {
    const std::vector<std::string> paras = split_paragraphs(read_file(k_filler));
    REQUIRE(paras.size() >= 40);
    for (double depth : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) {
        for (int target : {300, 1000, 3000}) {
            HaystackSpec spec{target, depth, 7, k_needle, "\n\n"};
            const Haystack h = build_haystack(paras, spec, count_words);
            CAPTURE(depth, target);
            int total = 0;
            for (const auto& d : h.documents) total += count_words(d);
            CHECK(total == h.doc_tokens);
            CHECK(h.doc_tokens == target);  // words split exactly; the needle adds its words
            CHECK(h.needle_tokens == count_words(k_needle));
            // Sentences of the filler are < 60 words, so the nearest boundary is that close.
            CHECK(std::abs(h.actual_depth() - depth) <= 30.0 / (target - h.needle_tokens));
            REQUIRE(h.needle_doc >= 0);
            const std::string& doc = h.documents[size_t(h.needle_doc)];
            REQUIRE(doc.find(k_needle) != std::string::npos);
            // The needle is its own sentence(s) and sits after needle_offset words.
            int before = 0;
            for (int i = 0; i < h.needle_doc; ++i) before += count_words(h.documents[size_t(i)]);
            before += count_words(doc.substr(0, doc.find(k_needle)));
            CHECK(before == h.needle_offset);
            if (depth == 0.0) CHECK(h.needle_offset == 0);
            if (depth == 1.0) CHECK(h.needle_offset == h.doc_tokens - h.needle_tokens);
        }
    }
    // Determinism, and the seed picks where the filler starts.
    const HaystackSpec spec{800, 0.5, 3, k_needle, "\n\n"};
    const Haystack a = build_haystack(paras, spec, count_words);
    const Haystack b = build_haystack(paras, spec, count_words);
    CHECK(a.documents == b.documents);
    CHECK(a.needle_offset == b.needle_offset);
    HaystackSpec other = spec;
    other.seed = 4;
    const Haystack c = build_haystack(paras, other, count_words);
    CHECK(c.first_paragraph != a.first_paragraph);
    CHECK(c.documents != a.documents);
    // Cycling: a target longer than the whole filler repeats the paragraphs.
    int filler_words = 0;
    for (const auto& p : paras) filler_words += count_words(p);
    const Haystack big =
        build_haystack(paras, {filler_words + 500, 0.5, 0, k_needle, ""}, count_words);
    CHECK(big.doc_tokens == filler_words + 500);
    CHECK(big.documents.size() > paras.size());
    // Errors: no filler, or no room for the needle.
    CHECK_THROWS_WITH(build_haystack({}, spec, count_words), Catch::Contains("no paragraphs"));
    CHECK_THROWS_WITH(build_haystack(paras, {5, 0.5, 0, k_needle, ""}, count_words),
                      Catch::Contains("cannot hold the needle"));
}

TEST_CASE("haystack with the SmolLM2 tokenizer: request length and needle position",
          "[niah][model]") {
    Session& s = smollm2();
    const ChatTemplate& chat = s.chat_template();
    const Config cfg = niah_config();
    const std::vector<std::string> paras = split_paragraphs(read_file(k_filler));
    const TokenCounter count = [&](const std::string& t) { return int(chat.text(t).size()); };
    const std::string sep = instruction_text(cfg.request.prompt_template).doc_separator;
    const PreparedRequest skeleton =
        prepare_request(s.tok(), chat, RequestText{"", {}, cfg.niah.question}, cfg);
    const int prefix = int(skeleton.chunks[0].size());
    for (int L : {512, 1024}) {
        for (double depth : {0.0, 0.25, 0.5, 0.75, 1.0}) {
            CAPTURE(L, depth);
            const Haystack h = build_haystack(paras, {L - prefix, depth, 0, k_needle, sep}, count);
            const PreparedRequest req = prepare_request(
                s.tok(), chat, RequestText{"", h.documents, cfg.niah.question}, cfg);
            const int T = req.context_tokens();
            CHECK(T == prefix + h.doc_tokens);
            CHECK(std::abs(T - L) <= 4);
            CHECK(req.n_chunks() == int(h.documents.size()) + 1);
            CHECK(std::abs(h.actual_depth() - depth) <= 0.05);
            // Decoding the context around needle_offset finds the needle right there.
            const std::vector<int32_t> ctx = req.context_sequence();
            const auto at = ctx.begin() + prefix + h.needle_offset;
            const std::string head = s.tok().decode(std::vector<int32_t>(ctx.begin() + prefix, at));
            const std::string tail = s.tok().decode(std::vector<int32_t>(at, at + h.needle_tokens));
            CHECK(head.find("71432") == std::string::npos);
            CHECK(tail.find("The pass key is 71432") <= 1);
        }
    }
}

TEST_CASE("niah method variants and labels", "[niah]") {
    Config cfg;
    cfg.niah.methods = {Config::Method::none, Config::Method::infoflow, Config::Method::epic,
                        Config::Method::full};
    cfg.niah.layouts = {Config::Layout::global, Config::Layout::hl_hp};
    cfg.method.reorder = true;
    std::vector<std::string> labels;
    for (const auto& v : niah_variants(cfg)) labels.push_back(v.label);
    CHECK(labels == std::vector<std::string>{"full", "none", "infoflow/global", "infoflow/hl-hp",
                                             "infoflow+reorder/global", "epic"});
    const auto vs = niah_variants(cfg);
    const Config c = variant_config(cfg, vs[3]);
    CHECK(c.method.name == Config::Method::infoflow);
    CHECK(c.scoring.layout == Config::Layout::hl_hp);
    CHECK_FALSE(c.method.reorder);
    CHECK(variant_config(cfg, vs[4]).method.reorder);
    cfg.method.reorder = false;
    cfg.niah.methods = {Config::Method::cacheblend};
    labels.clear();
    for (const auto& v : niah_variants(cfg)) labels.push_back(v.label);
    CHECK(labels == std::vector<std::string>{"full", "cacheblend"});
}

TEST_CASE("niah end to end on SmolLM2 at 512 tokens", "[niah][model][heavy]") {
    Session& s = smollm2();
    Config cfg = niah_config();
    const std::string dir = (fs::temp_directory_path() / "infoflow_test_niah").string();
    fs::create_directories(dir);
    cfg.output.csv = dir + "/niah.csv";
    const nlohmann::json out = run_niah(cfg, s);

    CHECK(out["job"] == "niah");
    CHECK(out["reference"] == "full");
    CHECK(out["config"]["niah"]["lengths"] == nlohmann::json::array({512}));
    const auto& rows = out["rows"];
    REQUIRE(rows.size() == 4);  // 2 depths x (full, infoflow/global)
    for (size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        CAPTURE(r.dump());
        CHECK(r["length_target"] == 512);
        CHECK(std::abs(r["context_tokens"].get<int>() - 512) <= 4);
        CHECK(r["depth"] == (i < 2 ? 0.25 : 1.0));
        CHECK(r["correct"].get<bool>() ==
              (r["answer"].get<std::string>().find("71432") != std::string::npos));
        CHECK(r["ttft_ms"].get<double>() > 0.0);
        CHECK(r["phases"].is_object());
        if (i % 2 == 0) {
            CHECK(r["method"] == "full");
            CHECK(r["reference"] == true);
            CHECK(r["top1_agree"] == true);
            CHECK(r["kl"].get<double>() == 0.0);
            CHECK(r["exact_match"] == true);
            CHECK(r["selected_fraction"].get<double>() == 0.0);
            CHECK(r["needle_recall"].get<double>() == 0.0);
            CHECK(r["phases"].contains("prefill"));
        } else {
            CHECK(r["method"] == "infoflow/global");
            CHECK(r["reference"] == false);
            CHECK(r["layout"] == "global");
            CHECK(r["kl"].get<double>() >= 0.0);
            const double sel = r["selected_fraction"].get<double>();
            CHECK(sel > 0.1);
            CHECK(sel <= 0.15);
            CHECK(r["needle_recall"].get<double>() >= 0.0);
            CHECK(r["needle_recall"].get<double>() <= 1.0);
            CHECK(r["phases"].contains("scoring"));
        }
    }
    const auto& summary = out["summary"];
    REQUIRE(summary.size() == 2);
    CHECK(summary[0]["method"] == "full");
    CHECK(summary[0]["runs"] == 2);
    CHECK(summary[0]["top1_agreement"].get<double>() == 1.0);
    CHECK(summary[0]["mean_kl"].get<double>() == 0.0);
    CHECK(summary[0]["exact_match"].get<double>() == 1.0);
    CHECK(summary[1]["method"] == "infoflow/global");
    for (const char* k : {"accuracy", "top1_agreement", "mean_kl", "exact_match",
                          "mean_selected_fraction", "mean_needle_recall", "mean_ttft_ms"}) {
        CHECK(summary[1].contains(k));
    }
    const std::string csv = read_file(cfg.output.csv);
    CHECK(csv.rfind("length_target,context_tokens,depth,actual_depth,method,reference,does_not_fit,"
                    "correct,",
                    0) == 0);

    // Bad inputs fail before any run, naming the key.
    Config too_long = cfg;
    too_long.niah.lengths = {8192};
    CHECK_THROWS_WITH(run_niah(too_long, s),
                      Catch::Contains("niah.lengths") && Catch::Contains("8192 positions"));
    const std::string bad_filler = dir + "/bad_filler.txt";
    write_file_atomic(bad_filler, "Some text.\n\nThe number 71432 is here.\n");
    Config leaky = cfg;
    leaky.niah.filler_file = bad_filler;
    CHECK_THROWS_WITH(run_niah(leaky, s), Catch::Contains("contains the answer"));
}
