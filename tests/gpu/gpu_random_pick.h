// Which generated tensors "[gpu_random] cuda random weights: device generator equals the host
// generator" compares element by element, and how many that is for a model: layer 1's seven
// matrices (q, k, v, o, gate, up, down) and the LM head where the model has its own (untied).
// Plain C++, no device: tests/model/test_generated.cpp checks the count for the paper's shapes on
// the CPU, so a wrong expectation cannot wait for a GPU to be found out.
#pragma once

#include <string>

#include "runtime/model/model_config.h"
#include "runtime/model/model_loader.h"

namespace infoflow::gpu_test {

inline bool gpu_random_pick(const WeightTensor& t) {
    return t.cols > 0 &&
           (t.name.find("layers.1.") != std::string::npos || t.name == "lm_head.weight");
}

inline int gpu_random_expected(const ModelConfig& c) { return 7 + (c.tied_embeddings ? 0 : 1); }

}  // namespace infoflow::gpu_test
