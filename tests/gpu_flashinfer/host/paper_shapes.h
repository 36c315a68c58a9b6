// The paper's two model shapes as the launch-plan tests need them (plain numbers: tests_attn_host
// does not link the model code). tests/model/test_generated.cpp checks that they equal
// random_model_config("llama-3.1-8b") and random_model_config("qwen3-14b").
#pragma once

namespace infoflow::test {

struct PaperShape {
    const char* name;
    int n_head, n_head_kv, head_dim, n_embd, n_ff, n_vocab;
};

constexpr PaperShape kPaperShapes[] = {
    {"llama-3.1-8b", 32, 8, 128, 4096, 14336, 128256},
    {"qwen3-14b", 40, 8, 128, 5120, 17408, 151936},
};

}  // namespace infoflow::test
