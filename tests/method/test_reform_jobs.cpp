// REFORM in the jobs, on the real SmolLM2 model: `niah` beyond the window (the session's model
// told it has 640 positions, so a 1024-token haystack is beyond it: `full` is reported as not
// fitting, reform / h2o / streamingllm answer), and `reform-heads` (every state ranked, the
// snippet written).
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>

#include "runtime/core/fs.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/model/model_loader.h"

using namespace infoflow;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Session> small_window_smollm2(int n_ctx) {
    const std::string p = INFOFLOW_MODEL_PATH;
    if (!fs::exists(p)) FAIL("real model " << p << " is missing: run launch/setup.sh");
    Config cfg;
    cfg.model.path = p;
    cfg.model.threads = 2;
    std::unique_ptr<Session> s = open_session(cfg);
    s->weights->config.n_ctx_train = n_ctx;  // the model reads its config through the weights
    return s;
}

}  // namespace

TEST_CASE("niah beyond the window: full does not fit, reform, h2o, streamingllm run",
          "[niah][model][reform][heavy]") {
    std::unique_ptr<Session> s = small_window_smollm2(640);
    REQUIRE(s->model->config().n_ctx_train == 640);
    Config cfg;
    cfg.job = Config::Job::niah;
    cfg.model.path = INFOFLOW_MODEL_PATH;
    cfg.niah.lengths = {1024};
    cfg.niah.depths = {0.5};
    cfg.niah.methods = {Config::Method::full, Config::Method::reform, Config::Method::h2o,
                        Config::Method::streamingllm};
    cfg.niah.needle = "The pass key is 71432. Remember it. 71432 is the pass key.";
    cfg.niah.question = "What is the pass key? Answer with the number only.";
    cfg.niah.answer = "71432";
    cfg.niah.filler_file = std::string(INFOFLOW_SOURCE_DIR) + "/configs/data/filler.txt";
    cfg.decode.max_new_tokens = 8;
    cfg.reform.chunk_size = 128;
    cfg.reform.budget = 256;
    cfg.reform.recent = 32;
    cfg.reform.pool = 33;
    cfg.reform.gather = 128;
    cfg.reform.keep_ends = 32;
    const nlohmann::json out = run_niah(cfg, *s);
    const auto& rows = out["rows"];
    REQUIRE(rows.size() == 4);
    CHECK(rows[0]["method"] == "full");
    CHECK(rows[0]["does_not_fit"] == true);
    CHECK(rows[0]["context_tokens"].get<int>() > 640);
    for (size_t i = 1; i < 4; ++i) {
        const auto& r = rows[i];
        CAPTURE(r.dump());
        CHECK(!r.contains("does_not_fit"));
        CHECK(r["phases"].contains("compress"));
        CHECK(r["ttft_ms"].get<double>() > 0.0);
        CHECK(r["answer_ids"].size() > 0);
    }
    CHECK(rows[1]["method"] == "reform");
    // The top 128 united with 2 x 32 ends (the needle's window may overlap an end).
    CHECK(rows[1]["selected"].get<int>() >= 128);
    CHECK(rows[1]["selected"].get<int>() <= 128 + 2 * 32);
    CHECK(rows[1]["phases"].contains("gather"));
    CHECK(rows[1]["phases"].contains("recompute"));
    CHECK(out["summary"][0]["method"] == "full");
}

TEST_CASE("reform-heads ranks every state and writes the snippet", "[model][reform]") {
    std::unique_ptr<Session> s = small_window_smollm2(8192);
    const ModelConfig& c = s->model->config();
    Config cfg;
    cfg.job = Config::Job::reform_heads;
    cfg.reform.tasks = 1;
    cfg.reform.task_tokens = 256;
    cfg.reform.top = 4;
    const std::string dir = (fs::temp_directory_path() / "infoflow_test_reform_heads").string();
    fs::create_directories(dir);
    cfg.output.path = dir + "/heads.json";
    const nlohmann::json out = run_reform_heads(cfg, *s);
    const auto& ranking = out["ranking"];
    REQUIRE(int(ranking.size()) == c.n_layer * (c.n_head + 2 * c.n_head_kv));
    double prev = -1.0;
    for (const auto& r : ranking) {
        const double m = r["mean_normalized_rank"].get<double>();
        CHECK(m >= prev);
        CHECK(m >= 0.0);
        CHECK(m <= 1.0);
        prev = m;
    }
    REQUIRE(out["heads"].size() == 4);
    CHECK(out["heads"][0][0] == ranking[0]["layer"]);
    const std::string snippet = read_file(dir + "/heads.toml");
    CHECK(snippet.find("[reform]") != std::string::npos);
    CHECK(snippet.find(out["snippet"].get<std::string>()) != std::string::npos);
    // The snippet is a valid config.
    const Config back = parse_config(snippet, "heads.toml");
    CHECK(int(back.reform.heads.size()) == 4);
}
