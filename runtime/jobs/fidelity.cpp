#include "runtime/jobs/fidelity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"

namespace infoflow {

Fidelity compare_teacher_forced(const std::vector<float>& full_rows, const std::vector<float>& rows,
                                const std::vector<int32_t>& ref, int n_vocab) {
    const size_t V = size_t(n_vocab);
    IF_CHECK(V > 0 && full_rows.size() == rows.size() && rows.size() % V == 0,
             "teacher forcing: " << full_rows.size() << " reference values against " << rows.size()
                                 << " (vocabulary " << n_vocab << ")");
    Fidelity f;
    f.steps = int(rows.size() / V);
    IF_CHECK(f.steps == std::max<int>(1, int(ref.size())),
             "teacher forcing: " << f.steps << " rows for " << ref.size() << " reference tokens");
    int agree = 0, hit = 0;
    for (int t = 0; t < f.steps; ++t) {
        const float* fr = full_rows.data() + size_t(t) * V;
        const float* mr = rows.data() + size_t(t) * V;
        const std::vector<double> lp = log_softmax(fr, n_vocab);
        const std::vector<double> lq = log_softmax(mr, n_vocab);
        double kl = 0.0;
        for (size_t i = 0; i < V; ++i) {
            const double p = std::exp(lp[i]);
            if (p > 0.0) kl += p * (lp[i] - lq[i]);
        }
        kl = std::max(0.0, kl);  // rounding can leave -1e-17 for equal rows
        f.kl.push_back(kl);
        f.mean_kl += kl;
        f.max_kl = std::max(f.max_kl, kl);
        const int am = argmax(mr, n_vocab);
        if (am == argmax(fr, n_vocab)) {
            ++agree;
        } else if (f.first_miss < 0) {
            f.first_miss = t;
        }
        if (t < int(ref.size())) {
            const int32_t id = ref[size_t(t)];
            IF_CHECK(id >= 0 && size_t(id) < V,
                     "teacher forcing: reference token " << id << " is outside the vocabulary");
            f.ref_logprob += lq[size_t(id)];
            f.ref_logprob_full += lp[size_t(id)];
            hit += am == id;
        }
    }
    f.mean_kl /= f.steps;
    f.argmax_agree = double(agree) / f.steps;
    f.ref_hit = ref.empty() ? 0.0 : double(hit) / double(ref.size());
    f.all_hit = !ref.empty() && hit == int(ref.size());
    return f;
}

void write_logprobs_file(const std::string& path, const std::vector<float>& logits) {
    IF_CHECK(!path.empty(), "output.logits_file is empty");
    const std::vector<double> lp = log_softmax(logits.data(), int(logits.size()));
    std::string bytes(lp.size() * 4, '\0');
    for (size_t i = 0; i < lp.size(); ++i) {
        const float f = float(lp[i]);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = char((u >> (8 * b)) & 0xff);
    }
    write_file_atomic(path, bytes);
}

std::vector<float> read_logprobs_file(const std::string& path) {
    const std::string bytes = read_file(path);
    IF_CHECK(bytes.size() % 4 == 0, "logits file '" << path << "' has " << bytes.size()
                                                    << " bytes, not a whole number of float32");
    std::vector<float> out(bytes.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
        uint32_t u = 0;
        for (int b = 0; b < 4; ++b) u |= uint32_t(uint8_t(bytes[i * 4 + size_t(b)])) << (8 * b);
        std::memcpy(&out[i], &u, 4);
    }
    return out;
}

}  // namespace infoflow
