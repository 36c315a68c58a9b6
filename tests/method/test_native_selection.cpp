// The one-rank selection with the default native (Q4_1) weights against the selection with the
// same weights loaded as fp32 (model.weights = "f32"), on the near-tie request of the §6.4 tests
// (docs/design.md §6). Both loads hold the same fp32 weight values (the stored blocks
// dequantized), and fp32 weights take the products stored ones take (F32 rows through the exact
// pass, or the tiles on amx), so the scores are the same bits and so is the selection. Before,
// fp32 weights went through a BLAS GEMM (scores ~1e-6 of the largest apart, the sets equal up
// to near-ties at the cut), and before the exact pass calls of <= 16 rows took 8-bit activations
// (~1e-2 apart).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <iterator>

#include "runtime/formats/chat_template.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/method/phases.h"
#include "runtime/method/scoring.h"
#include "runtime/method/selection.h"
#include "tests/method/method_fixture.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

struct Scored {
    std::vector<double> score;  // [T]
    std::vector<int> selected;  // slots, sorted
    std::vector<int32_t> pipeline_selected;
};

Scored score_request(const ModelWeights& w, const PreparedRequest& req, const Config& cfg) {
    auto be = make_cpu_backend(2);
    Model m(*be, w);
    const std::vector<ChunkKv> chunks = prefill_chunks(m, req.chunks, req.sink_id);
    const std::vector<int> order = identity_order(int(chunks.size()));
    Scored s;
    s.score = score_context(m, chunks, order, scoring_rows(req, cfg.scoring.query),
                            score_options(cfg, m.config().n_layer));
    const int T = req.context_tokens(), c0 = int(req.chunks[0].size());
    std::vector<int32_t> pos(T);
    std::vector<uint8_t> eligible(T, 1);
    for (int i = 0; i < T; ++i) pos[i] = i;
    for (int i = 0; i < c0; ++i) eligible[i] = 0;
    s.selected = select_top_k(s.score, pos, eligible, recompute_budget(cfg.method.ratio, T));
    s.pipeline_selected = run_method(m, req, cfg, {}).selected_positions;
    return s;
}

}  // namespace

TEST_CASE("native weights select what fp32 weights select, with the same scores [6.4]",
          "[method][real][heavy]") {
    Config cfg = courier_config(INFOFLOW_MODEL_PATH);
    GgufFile gguf(INFOFLOW_MODEL_PATH);
    const Tokenizer tok = Tokenizer::from_gguf(gguf);
    const ChatTemplate chat(tok, "auto");
    const PreparedRequest req = prepare_request(tok, chat, load_request_text(cfg.request), cfg);
    LoadOptions native;
    native.native_weights = true;
    const Scored a = score_request(load_model_weights(INFOFLOW_MODEL_PATH, native), req, cfg);
    const Scored b = score_request(load_model_weights(INFOFLOW_MODEL_PATH), req, cfg);
    REQUIRE(a.score.size() == b.score.size());
    std::vector<int> differ;
    std::set_symmetric_difference(a.selected.begin(), a.selected.end(), b.selected.begin(),
                                  b.selected.end(), std::back_inserter(differ));
    std::printf("native vs fp32 weights: %zu of %zu selected tokens differ\n", differ.size(),
                b.selected.size());
    CHECK(a.score == b.score);
    CHECK(differ.empty());
    // The pipeline selects what its scores select (positions = slots: identity order, T from 0).
    CHECK(a.pipeline_selected == std::vector<int32_t>(a.selected.begin(), a.selected.end()));
    CHECK(b.pipeline_selected == std::vector<int32_t>(b.selected.begin(), b.selected.end()));
}
