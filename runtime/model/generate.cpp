#include "runtime/model/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/model/batch_decode.h"

namespace infoflow {

std::vector<float> decode_step(Model& model, KvCache& cache, int32_t token, int32_t pos,
                               int32_t group) {
    const Model::DecodeScope decoding(model);
    std::vector<int32_t> tok{token}, p{pos}, g{group};
    return model.forward(cache, tok, p, false, group >= 0 ? &g : nullptr);
}

GenerateResult generate(Model& model, KvCache& cache, const std::vector<float>& first_logits,
                        int32_t next_pos, const GenerateOptions& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    Generator g(model, first_logits, next_pos, opt);
    const Model::DecodeScope decoding(model);
    while (g.sample()) {
        const std::vector<float> logits = decode_step(model, cache, g.token(), g.pos(), opt.group);
        g.set_logits(logits.data());
    }
    GenerateResult r = g.result();
    r.decode_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

std::vector<float> teacher_forced_logits(Model& model, KvCache& cache, int prompt,
                                         const std::vector<float>& first_logits,
                                         const std::vector<int32_t>& ref, int32_t group,
                                         int slots) {
    const int V = model.config().n_vocab;
    IF_CHECK(int(first_logits.size()) == V, "teacher forcing: first logits have "
                                                << first_logits.size() << " values, the model "
                                                << V);
    if (slots < 0) slots = prompt;
    IF_CHECK(cache.size() >= slots,
             "teacher forcing: the cache holds " << cache.size() << " slots, the prompt " << slots);
    const int fed = std::max(0, int(ref.size()) - 1);
    IF_CHECK(slots + fed <= cache.capacity(),
             "teacher forcing: " << fed << " reference tokens after a prompt of " << slots
                                 << " slots do not fit the cache (" << cache.capacity()
                                 << " slots)");
    cache.truncate(slots);
    std::vector<float> rows(first_logits);
    if (fed > 0) {
        const std::vector<int32_t> toks(ref.begin(), ref.begin() + fed);
        std::vector<int32_t> pos(static_cast<size_t>(fed));
        std::iota(pos.begin(), pos.end(), prompt);
        const std::vector<int32_t> groups(size_t(fed), group);
        const std::vector<float> more =
            model.forward(cache, toks, pos, true, group >= 0 ? &groups : nullptr);
        rows.insert(rows.end(), more.begin(), more.end());
        cache.truncate(slots);
    }
    return rows;
}

}  // namespace infoflow
