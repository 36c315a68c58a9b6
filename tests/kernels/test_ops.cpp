// Every op of the CPU backend checked against the float64 references of ref_ops.h on seeded
// random inputs. Each check compares a whole output array and reports its worst element with
// the case parameters (INFO), so a failure names the seed and shape needed to rerun it.
//
// Tolerances are written next to each check, as bounds on fp32 error (u = 2^-24, the unit
// roundoff) with headroom; they are far below the change a wrong mask, pairing or missing
// term would cause, and the sensitivity of the sharpest ones is itself asserted.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/cpu_features.h"
#include "ref_ops.h"
#include "runtime/core/half.h"

using infoflow::AttnParams;
using infoflow::Backend;
using infoflow::Buffer;
using infoflow::KvDtype;
using infoflow::ScoreParams;
using infoflow::cpu::CpuIsa;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, fp32 unit roundoff
const double kInf = std::numeric_limits<double>::infinity();

// Portable seeded generator (std distributions differ between standard libraries).
class Rng {
  public:
    explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform(double lo, double hi) { return lo + (hi - lo) * ((next() >> 11) * 0x1.0p-53); }
    int randint(int lo, int hi) {  // inclusive
        return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
    }
    std::vector<float> floats(size_t n, double lo, double hi) {
        std::vector<float> v(n);
        for (auto& x : v) x = static_cast<float>(uniform(lo, hi));
        return v;
    }
    template <class T>
    void shuffle(std::vector<T>& v) {
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
    }

  private:
    uint64_t s_;
};

std::unique_ptr<Backend> cpu() { return infoflow::make_cpu_backend(2); }

// ---- moving data in and out of the backend's memory ------------------------------------------
template <class T>
Buffer to_dev(Backend& be, const std::vector<T>& v) {
    Buffer b = be.alloc(std::max<size_t>(1, v.size()) * sizeof(T));
    if (!v.empty()) be.upload(b.data(), v.data(), v.size() * sizeof(T));
    return b;
}
std::vector<float> from_dev(Backend& be, const float* p, size_t n) {
    be.synchronize();
    std::vector<float> v(n);
    if (n) be.download(v.data(), p, n * sizeof(float));
    return v;
}

// ---- comparison of a float array with a double reference --------------------------------------
// An element is bad when it is NaN, when the reference is +-inf and it is not the same inf, or
// when |got - want| > tol(i). The report names the number of bad elements and the worst one.
struct Cmp {
    size_t n = 0, n_bad = 0, worst = 0;
    double worst_ratio = -1.0, got = 0.0, want = 0.0, tol = 0.0;
    std::string text(const std::function<std::string(size_t)>& where) const {
        std::ostringstream s;
        s.precision(9);
        s << n_bad << " of " << n << " elements out of tolerance";
        if (n) {
            s << "; worst at " << (where ? where(worst) : "[" + std::to_string(worst) + "]")
              << ": got " << got << " want " << want << " |diff| " << std::fabs(got - want)
              << " tol " << tol;
        }
        return s.str();
    }
};

Cmp compare(const float* got, const double* want, size_t n,
            const std::function<double(size_t)>& tol) {
    Cmp c;
    c.n = n;
    for (size_t i = 0; i < n; ++i) {
        const double g = got[i], w = want[i], t = tol(i);
        double ratio;
        if (std::isnan(g) || std::isnan(w)) {
            ratio = kInf;
        } else if (std::isinf(w) || std::isinf(g)) {
            ratio = (g == w) ? 0.0 : kInf;
        } else {
            const double e = std::fabs(g - w);
            ratio = e == 0.0 ? 0.0 : (t > 0.0 ? e / t : kInf);
        }
        if (ratio > 1.0) ++c.n_bad;
        if (ratio > c.worst_ratio) {
            c.worst_ratio = ratio;
            c.worst = i;
            c.got = g;
            c.want = w;
            c.tol = t;
        }
    }
    return c;
}

#define CHECK_CLOSE(what, got, want, n, tol, where)          \
    do {                                                     \
        const Cmp cmp_ = compare((got), (want), (n), (tol)); \
        INFO(what << ": " << cmp_.text(where));              \
        CHECK(cmp_.n_bad == 0);                              \
    } while (0)

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- attention case builder ----------------------------------------------------------------
enum class PosMode { causal, shuffled, duplicates, decode, middle, runs };
enum class KvLayout { packed, fused, padded_nan };

const char* name_of(PosMode m) {
    switch (m) {
        case PosMode::causal:
            return "causal";
        case PosMode::shuffled:
            return "shuffled";
        case PosMode::duplicates:
            return "duplicates";
        case PosMode::decode:
            return "decode";
        case PosMode::middle:
            return "middle";
        case PosMode::runs:
            return "runs";
    }
    return "?";
}
const char* name_of(KvLayout l) {
    switch (l) {
        case KvLayout::packed:
            return "packed";
        case KvLayout::fused:
            return "fused";
        case KvLayout::padded_nan:
            return "padded_nan";
    }
    return "?";
}

struct AttnCase {
    uint64_t seed = 1;
    int n_head = 4, n_head_kv = 2, head_dim = 64;
    int n_q = 16, n_kv = 64;
    PosMode pos = PosMode::causal;
    int n_groups = 0;  // 0 = no group visibility
    KvLayout layout = KvLayout::packed;
    float scale = 0.0f;  // 0 = default 1/sqrt(D)
    bool with_lse = true;
    int threads = 2;
    KvDtype kv = KvDtype::f32;  // f16/bf16: K/V rounded to it, the op reads the 16-bit copy
    int isa = -1;               // -1: Backend::attention; else cpu::attention_isa(CpuIsa(isa))
    std::string str() const {
        std::ostringstream s;
        s << "seed=" << seed << " n_head=" << n_head << " n_head_kv=" << n_head_kv
          << " head_dim=" << head_dim << " n_q=" << n_q << " n_kv=" << n_kv
          << " pos=" << name_of(pos) << " n_groups=" << n_groups << " layout=" << name_of(layout)
          << " scale=" << scale << " with_lse=" << with_lse << " threads=" << threads
          << " kv=" << infoflow::kv_dtype_name(kv)
          << " isa=" << (isa < 0 ? "backend" : infoflow::cpu::cpu_isa_name(CpuIsa(isa)));
        return s.str();
    }
};

// f32 <-> the 16-bit KV storage types, as the KV cache rounds (nearest even).
uint16_t narrow1(KvDtype t, float x) {
    return t == KvDtype::f16 ? infoflow::fp32_to_fp16(x) : infoflow::fp32_to_bf16(x);
}
float widen1(KvDtype t, uint16_t h) {
    return t == KvDtype::f16 ? infoflow::fp16_to_fp32(h) : infoflow::bf16_to_fp32(h);
}
std::vector<uint16_t> narrow_all(KvDtype t, const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = narrow1(t, v[i]);
    return out;
}

// Host-side inputs of one attention call.
struct AttnInputs {
    std::vector<float> q, kv;  // kv: k rows and v rows, see k_off / v_off / stride
    size_t v_base = 0;         // index of v's token 0 in kv
    int stride = 0;            // floats between tokens (AttnParams::kv_stride, never 0 here)
    std::vector<int32_t> q_pos, k_pos, q_group, k_group;
};

AttnInputs make_inputs(const AttnCase& c) {
    Rng rng(c.seed);
    AttnInputs in;
    const int D = c.head_dim, w = c.n_head_kv * D;
    in.q = rng.floats(static_cast<size_t>(c.n_q) * c.n_head * D, -1.0, 1.0);
    switch (c.layout) {
        case KvLayout::packed:
            in.stride = w;
            break;
        case KvLayout::fused:
            in.stride = 2 * w;
            break;  // [k | v] in one row
        case KvLayout::padded_nan:
            in.stride = w + 7;
            break;
    }
    const size_t n_rows = static_cast<size_t>(std::max(c.n_kv, 1)) * in.stride;
    if (c.layout == KvLayout::packed) {
        in.kv = rng.floats(2 * n_rows, -1.0, 1.0);  // k then v, two arrays
        in.v_base = n_rows;
    } else if (c.layout == KvLayout::fused) {
        in.kv = rng.floats(n_rows, -1.0, 1.0);
        in.v_base = w;
    } else {
        // Padding between rows is NaN: an op that reads outside its head's slice shows it.
        in.kv = rng.floats(2 * n_rows, -1.0, 1.0);
        in.v_base = n_rows;
        for (size_t t = 0; t < 2 * static_cast<size_t>(std::max(c.n_kv, 1)); ++t)
            for (int j = w; j < in.stride; ++j)
                in.kv[t * in.stride + j] = std::numeric_limits<float>::quiet_NaN();
    }
    const int p0 = rng.randint(0, 1000);
    in.k_pos.resize(c.n_kv);
    in.q_pos.resize(c.n_q);
    switch (c.pos) {
        case PosMode::causal:  // keys p0.., queries are the last n_q of them (prefill over cache)
            for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = p0 + j;
            for (int i = 0; i < c.n_q; ++i) in.q_pos[i] = p0 + c.n_kv - c.n_q + i;
            break;
        case PosMode::shuffled:  // keys in random order; some queries before every key
            for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = p0 + j;
            rng.shuffle(in.k_pos);
            for (int i = 0; i < c.n_q; ++i) in.q_pos[i] = rng.randint(p0 - 3, p0 + c.n_kv + 3);
            break;
        case PosMode::duplicates:  // many keys share a position; queries sit on key positions
            for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = p0 + rng.randint(0, c.n_kv / 4);
            for (int i = 0; i < c.n_q; ++i)
                in.q_pos[i] = c.n_kv ? in.k_pos[rng.randint(0, c.n_kv - 1)] : p0;
            break;
        case PosMode::decode:  // queries after every key, keys unsorted
            for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = p0 + j;
            rng.shuffle(in.k_pos);
            for (int i = 0; i < c.n_q; ++i) in.q_pos[i] = p0 + c.n_kv + i;
            break;
        case PosMode::middle:  // keys sorted, queries in the middle third of the key range
            for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = p0 + j;
            for (int i = 0; i < c.n_q; ++i)
                in.q_pos[i] = p0 + rng.randint(c.n_kv / 3, 2 * c.n_kv / 3);
            break;
        case PosMode::runs: {  // a sorted shard, then sorted keys from before and after it (a
                               // cache with gathered selected tokens appended), queries anywhere
            const int n1 = c.n_kv / 2;
            for (int j = 0; j < n1; ++j) in.k_pos[j] = p0 + c.n_kv + j;
            std::vector<int32_t> rest;
            for (int j = n1; j < c.n_kv; ++j) rest.push_back(p0 + rng.randint(0, 3 * c.n_kv));
            std::sort(rest.begin(), rest.end());
            std::copy(rest.begin(), rest.end(), in.k_pos.begin() + n1);
            for (int i = 0; i < c.n_q; ++i) in.q_pos[i] = p0 + rng.randint(0, 3 * c.n_kv);
            break;
        }
    }
    if (c.n_groups > 0) {
        in.q_group.resize(c.n_q);
        in.k_group.resize(c.n_kv);
        for (auto& g : in.q_group) g = rng.randint(0, c.n_groups - 1);
        for (auto& g : in.k_group) g = rng.randint(-1, c.n_groups - 1);  // -1: visible to all
    }
    if (c.kv != KvDtype::f32) {  // the values the 16-bit copy holds exactly (NaN padding stays)
        for (float& x : in.kv)
            if (!std::isnan(x)) x = widen1(c.kv, narrow1(c.kv, x));
    }
    return in;
}

// Host pointers of `in` as AttnParams (for the reference).
AttnParams host_params(const AttnCase& c, const AttnInputs& in) {
    AttnParams p;
    p.q = in.q.data();
    p.k = in.kv.data();
    p.v = in.kv.data() + in.v_base;
    p.q_pos = in.q_pos.data();
    p.k_pos = in.k_pos.data();
    p.q_group = in.q_group.empty() ? nullptr : in.q_group.data();
    p.k_group = in.k_group.empty() ? nullptr : in.k_group.data();
    p.n_q = c.n_q;
    p.n_kv = c.n_kv;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.kv_stride = c.layout == KvLayout::packed ? 0 : in.stride;  // packed: exercise the default
    p.scale = c.scale;
    return p;
}

// Runs the backend's attention on `in` (uploaded to its memory); returns out and lse.
struct AttnResult {
    std::vector<float> out, lse;
};
AttnResult run_backend_attention(Backend& be, const AttnCase& c, const AttnInputs& in) {
    Buffer q = to_dev(be, in.q), kv = to_dev(be, in.kv), qp = to_dev(be, in.q_pos),
           kp = to_dev(be, in.k_pos), qg = to_dev(be, in.q_group), kg = to_dev(be, in.k_group);
    const size_t n_out = static_cast<size_t>(c.n_q) * c.n_head * c.head_dim;
    const size_t n_lse = static_cast<size_t>(c.n_q) * c.n_head;
    // Outputs start as NaN: every element must be written, empty rows included.
    Buffer out = to_dev(be, std::vector<float>(n_out, std::numeric_limits<float>::quiet_NaN()));
    Buffer lse = to_dev(be, std::vector<float>(n_lse, std::numeric_limits<float>::quiet_NaN()));
    AttnParams p = host_params(c, in);
    p.q = q.data();
    p.k = kv.data();
    p.v = kv.data() + in.v_base;
    Buffer kv16;
    if (c.kv != KvDtype::f32) {
        kv16 = to_dev(be, narrow_all(c.kv, in.kv));
        const uint16_t* base = static_cast<const uint16_t*>(static_cast<const void*>(kv16.data()));
        p.kv_dtype = c.kv;
        p.k = p.v = nullptr;
        p.k16 = base;
        p.v16 = base + in.v_base;
    }
    p.q_pos = qp.as_int();
    p.k_pos = kp.as_int();
    p.q_group = in.q_group.empty() ? nullptr : qg.as_int();
    p.k_group = in.k_group.empty() ? nullptr : kg.as_int();
    p.out = out.data();
    p.lse = c.with_lse ? lse.data() : nullptr;
    be.set_threads(c.threads);
    if (c.isa < 0) {
        be.attention(p);
    } else {
        infoflow::cpu::attention_isa(CpuIsa(c.isa), p, c.threads);
    }
    AttnResult r;
    r.out = from_dev(be, out.data(), n_out);
    if (c.with_lse) r.lse = from_dev(be, lse.data(), n_lse);
    return r;
}

// Attention tolerances. fp32 score error ~ u * scale * sum_d |q_d k_d| <= u * (a few) * (1 +
// max|score|); a weight's relative error is that score error; the weighted sum over n_kv keys
// adds <= ~u * n_kv relative in the worst (naive sum) case, ~u * sqrt(n_kv) typically. Bounds:
//   out: vmax * (1e-5 + 2e-6 * max|score| + 4u * n_kv)     (vmax = max |v|)
//   lse: 1e-5 + 2e-6 * max|score| + 4u * n_kv            (absolute, natural log)
// For unit-scale data that is ~1e-5..4e-5, while one key wrongly included or excluded among
// <= 700 visible ones moves out by ~|v_j - out| / n_vis >~ 1e-3 * vmax.
double attn_tol(double max_score, int n_kv) { return 1e-5 + 2e-6 * max_score + 4 * kU * n_kv; }

// The amx path (docs/design.md §6, "Numerics per CPU path") rounds Q and K to bf16 for Q·Kᵀ: a
// score moves by at most ds = 1.1 * 2^-8 * scale * sum_d |q_d k_d| (tests/amx/test_amx_ops.cpp),
// its softmax weight by a factor within exp(+-2 ds), so out may move 2.2 ds max|v| more and lse
// ds more. Returns the largest ds of the case on the amx path, 0 on the fp32 paths.
double amx_score_shift(const AttnCase& c, const AttnInputs& in) {
    if (infoflow::cpu::active_cpu_isa() != infoflow::cpu::CpuIsa::amx) return 0.0;
    const int D = c.head_dim, g = c.n_head / c.n_head_kv;
    const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(double(D));
    double qk = 0.0;
    for (int i = 0; i < c.n_q; ++i)
        for (int h = 0; h < c.n_head; ++h)
            for (int j = 0; j < c.n_kv; ++j) {
                double a = 0.0;
                for (int d = 0; d < D; ++d)
                    a += std::fabs(double(in.q[(size_t(i) * c.n_head + h) * D + d]) *
                                   in.kv[size_t(j) * in.stride + (h / g) * D + d]);
                qk = std::max(qk, a * scale);
            }
    return 1.1 / 256.0 * qk;
}

// Checks out/lse of the backend against the reference, plus the empty-row contract.
void check_attention_case(Backend& be, const AttnCase& c, int* n_empty_rows = nullptr) {
    INFO("attention case: " << c.str());
    const AttnInputs in = make_inputs(c);
    const AttnResult got = run_backend_attention(be, c, in);
    std::vector<double> want_out, want_lse;
    double max_score = 0.0;
    infoflow::ref::attention(host_params(c, in), &want_out, &want_lse, &max_score);

    double vmax = 0.0;
    for (int j = 0; j < c.n_kv; ++j)
        for (int d = 0; d < c.n_head_kv * c.head_dim; ++d)
            vmax = std::max(vmax, std::fabs(static_cast<double>(
                                      in.kv[in.v_base + static_cast<size_t>(j) * in.stride + d])));
    const double ds = amx_score_shift(c, in);
    const double tol = attn_tol(max_score, c.n_kv) + 2.2 * ds;
    CAPTURE(max_score, vmax, ds, tol);
    const int H = c.n_head, D = c.head_dim;
    auto where_out = [&](size_t idx) {
        const size_t i = idx / (H * D), h = idx / D % H, d = idx % D;
        return "query " + std::to_string(i) + " (pos " + std::to_string(in.q_pos[i]) + ") head " +
               std::to_string(h) + " dim " + std::to_string(d);
    };
    auto where_lse = [&](size_t idx) {
        const size_t i = idx / H, h = idx % H;
        return "query " + std::to_string(i) + " (pos " + std::to_string(in.q_pos[i]) + ") head " +
               std::to_string(h);
    };
    // Empty rows (lse = -inf in the reference) must be exactly 0: the comparison demands
    // |got - 0| <= tol, so check exactness separately.
    int empty = 0, empty_bad = 0;
    for (size_t r = 0; r < want_lse.size(); ++r) {
        if (want_lse[r] != -kInf) continue;
        ++empty;
        for (int d = 0; d < D; ++d)
            if (got.out[r * D + d] != 0.0f) ++empty_bad;
    }
    if (n_empty_rows) *n_empty_rows = empty / H;
    CAPTURE(empty);
    CHECK(empty_bad == 0);
    CHECK_CLOSE(
        "out", got.out.data(), want_out.data(), want_out.size(),
        [&](size_t) { return tol * std::max(vmax, 1e-30); }, where_out);
    if (c.with_lse)
        CHECK_CLOSE(
            "lse", got.lse.data(), want_lse.data(), want_lse.size(),
            [&](size_t) { return tol - 1.2 * ds; }, where_lse);
}

// Runs the backend's attention over a subset of the keys of `in` (keys with take[j]).
AttnResult backend_attention_subset(Backend& be, const AttnCase& c, const AttnInputs& in,
                                    const std::vector<char>& take) {
    AttnInputs sub = in;
    AttnCase cs = c;
    cs.layout = KvLayout::packed;
    const int w = c.n_head_kv * c.head_dim;
    std::vector<int> idx;
    for (int j = 0; j < c.n_kv; ++j)
        if (take[j]) idx.push_back(j);
    cs.n_kv = static_cast<int>(idx.size());
    const size_t rows = std::max<size_t>(1, idx.size());
    sub.stride = w;
    sub.kv.assign(2 * rows * w, 0.0f);
    sub.v_base = rows * w;
    sub.k_pos.clear();
    sub.k_group.clear();
    for (size_t t = 0; t < idx.size(); ++t) {
        const int j = idx[t];
        for (int d = 0; d < w; ++d) {
            sub.kv[t * w + d] = in.kv[static_cast<size_t>(j) * in.stride + d];
            sub.kv[sub.v_base + t * w + d] =
                in.kv[in.v_base + static_cast<size_t>(j) * in.stride + d];
        }
        sub.k_pos.push_back(in.k_pos[j]);
        if (!in.k_group.empty()) sub.k_group.push_back(in.k_group[j]);
    }
    cs.with_lse = true;
    return run_backend_attention(be, cs, sub);
}

}  // namespace

// =============================================================================================
TEST_CASE("ops: buffer alloc/upload/download/copy round trip", "[ops]") {
    auto be = cpu();
    Rng rng(7);
    std::vector<float> host = rng.floats(1000, -1e3, 1e3);
    // Bit patterns that must survive untouched.
    host[0] = -0.0f;
    host[1] = std::numeric_limits<float>::infinity();
    host[2] = -std::numeric_limits<float>::infinity();
    host[3] = std::numeric_limits<float>::quiet_NaN();
    host[4] = std::numeric_limits<float>::denorm_min();
    host[999] = std::numeric_limits<float>::max();

    Buffer a = be->alloc_floats(host.size());
    REQUIRE(!a.empty());
    CHECK(a.bytes() == host.size() * sizeof(float));
    be->upload(a.data(), host.data(), host.size() * sizeof(float));
    std::vector<float> back = from_dev(*be, a.data(), host.size());
    CHECK(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)) == 0);

    Buffer b = be->alloc_floats(host.size());
    be->copy(b.data(), a.data(), host.size() * sizeof(float));
    back = from_dev(*be, b.data(), host.size());
    CHECK(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)) == 0);

    // Sub-range copy at odd offsets leaves the rest of the destination alone.
    std::vector<float> zeros(host.size(), 0.0f);
    be->upload(b.data(), zeros.data(), zeros.size() * sizeof(float));
    be->copy(b.data() + 13, a.data() + 501, 77 * sizeof(float));
    back = from_dev(*be, b.data(), host.size());
    std::vector<float> expect = zeros;
    std::copy(host.begin() + 501, host.begin() + 501 + 77, expect.begin() + 13);
    CHECK(std::memcmp(back.data(), expect.data(), host.size() * sizeof(float)) == 0);

    // Integers through as_int.
    std::vector<int32_t> ids = {0, -1, 2147483647, -2147483647 - 1, 42, 7};
    Buffer c = be->alloc(ids.size() * sizeof(int32_t));
    be->upload(c.as_int(), ids.data(), ids.size() * sizeof(int32_t));
    Buffer d = be->alloc(ids.size() * sizeof(int32_t));
    be->copy(d.as_int(), c.as_int(), ids.size() * sizeof(int32_t));
    be->synchronize();
    std::vector<int32_t> ids_back(ids.size());
    be->download(ids_back.data(), d.as_int(), ids.size() * sizeof(int32_t));
    CHECK(ids_back == ids);

    // Moving a buffer transfers ownership; the moved-from buffer is empty.
    Buffer moved = std::move(a);
    CHECK(a.empty());
    CHECK(!moved.empty());
    CHECK(moved.bytes() == host.size() * sizeof(float));
    back = from_dev(*be, moved.data(), host.size());
    CHECK(std::memcmp(back.data(), host.data(), host.size() * sizeof(float)) == 0);
}

// =============================================================================================
TEST_CASE("ops: embed copies table rows exactly", "[ops]") {
    auto be = cpu();
    const int n_vocab = 1000;
    for (int n_embd : {1, 7, 576}) {
        for (int n : {1, 33}) {
            const uint64_t seed = 100 + n_embd * 10 + n;
            INFO("embed: seed=" << seed << " n_vocab=" << n_vocab << " n_embd=" << n_embd
                                << " n=" << n);
            Rng rng(seed);
            std::vector<float> table = rng.floats(static_cast<size_t>(n_vocab) * n_embd, -2, 2);
            std::vector<int32_t> ids(n);
            for (auto& id : ids) id = rng.randint(0, n_vocab - 1);
            ids[0] = n_vocab - 1;
            if (n > 2) {
                ids[1] = 0;
                ids[2] = ids[0];  // repeated id
            }
            Buffer t = to_dev(*be, table), i = to_dev(*be, ids);
            Buffer out = be->alloc_floats(static_cast<size_t>(n) * n_embd);
            be->embed(t.data(), i.as_int(), n, n_embd, out.data());
            auto got = from_dev(*be, out.data(), static_cast<size_t>(n) * n_embd);
            auto want = infoflow::ref::embed(table.data(), ids.data(), n, n_embd);
            // A copy: exact.
            CHECK_CLOSE(
                "embed", got.data(), want.data(), want.size(), [](size_t) { return 0.0; }, nullptr);
        }
    }
}

// =============================================================================================
TEST_CASE("ops: rms_norm, separate output and in place", "[ops]") {
    auto be = cpu();
    struct Shape {
        int n, d;
    };
    for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 24}, Shape{17, 576}, Shape{5, 4096}}) {
        for (double eps : {1e-5, 1e-6}) {
            const uint64_t seed = 200 + s.n * 7 + s.d;
            INFO("rms_norm: seed=" << seed << " n=" << s.n << " d=" << s.d << " eps=" << eps);
            Rng rng(seed);
            std::vector<float> x(static_cast<size_t>(s.n) * s.d);
            for (int i = 0; i < s.n; ++i) {
                // Rows of very different magnitude; row 1 is tiny so eps dominates mean(x^2).
                const double mag = (i == 1) ? 1e-4 : std::pow(10.0, rng.uniform(-3, 2));
                for (int j = 0; j < s.d; ++j)
                    x[static_cast<size_t>(i) * s.d + j] =
                        static_cast<float>(mag * rng.uniform(-1, 1));
            }
            if (s.n > 2)
                std::fill(x.begin() + 2 * s.d, x.begin() + 3 * s.d, 0.0f);  // zero row -> zero
            std::vector<float> w = rng.floats(s.d, -2, 2);
            auto want = infoflow::ref::rms_norm(x.data(), w.data(), s.n, s.d, eps);
            // fp32: the sum of d positive squares has relative error ~sqrt(d)*u typically
            // (<= d*u worst, blocked sums far less); rsqrt and two products add a few u. 1e-5
            // relative per element is ~2.5x that typical error at d = 4096 and ~7x at d = 576.
            auto tol = [&](size_t i) { return 1e-5 * std::fabs(want[i]) + 1e-30; };

            Buffer xb = to_dev(*be, x), wb = to_dev(*be, w);
            Buffer out = be->alloc_floats(x.size());
            be->rms_norm(xb.data(), wb.data(), s.n, s.d, static_cast<float>(eps), out.data());
            auto got = from_dev(*be, out.data(), x.size());
            CHECK_CLOSE("rms_norm out", got.data(), want.data(), want.size(), tol, nullptr);

            be->rms_norm(xb.data(), wb.data(), s.n, s.d, static_cast<float>(eps), xb.data());
            got = from_dev(*be, xb.data(), x.size());
            CHECK_CLOSE("rms_norm in place", got.data(), want.data(), want.size(), tol, nullptr);
        }
    }
}

// =============================================================================================
TEST_CASE("ops: matmul with/without bias and accumulate, odd and large sizes", "[ops]") {
    auto be = cpu();
    struct Shape {
        int n, k, m;
    };
    const Shape shapes[] = {{1, 1, 1},    {1, 7, 5},     {3, 13, 1},    {1, 64, 3},
                            {5, 100, 37}, {37, 257, 19}, {129, 33, 65}, {64, 576, 192},
                            {2, 1000, 7}, {16, 8192, 32}};
    for (const Shape& s : shapes) {
        for (int variant = 0; variant < 4; ++variant) {
            const bool use_bias = variant & 1, accumulate = variant & 2;
            const uint64_t seed = 300 + s.n * 31 + s.k * 7 + s.m + variant;
            INFO("matmul: seed=" << seed << " n=" << s.n << " k=" << s.k << " m=" << s.m
                                 << " bias=" << use_bias << " accumulate=" << accumulate);
            Rng rng(seed);
            auto x = rng.floats(static_cast<size_t>(s.n) * s.k, -1, 1);
            auto w = rng.floats(static_cast<size_t>(s.m) * s.k, -1, 1);
            auto bias = rng.floats(s.m, -1, 1);
            auto prev = rng.floats(static_cast<size_t>(s.n) * s.m, -4, 4);
            // Without accumulate the old content must be ignored: start from NaN.
            std::vector<float> init =
                accumulate
                    ? prev
                    : std::vector<float>(prev.size(), std::numeric_limits<float>::quiet_NaN());
            auto want = infoflow::ref::matmul(x.data(), w.data(), use_bias ? bias.data() : nullptr,
                                              s.n, s.k, s.m, accumulate ? prev.data() : nullptr);
            // Tolerance relative to S = sum_t |x_t w_t| (+ |bias| + |prev|), the natural scale
            // of fp32 dot-product error: the bound is k*u*S, but with random signs the partial
            // sums stay ~sqrt(k) terms large and naive summation errs ~u*S (blocked BLAS/FMA
            // less). 2e-6 * S is ~30x that, and at k = 8192 still ~5e-4 of a typical output
            // (|out| ~ sqrt(k)/3, S ~ k/4): any missing or extra term is far larger.
            std::vector<double> scale_s(want.size());
            for (int i = 0; i < s.n; ++i)
                for (int o = 0; o < s.m; ++o) {
                    double a = 0.0;
                    for (int t = 0; t < s.k; ++t)
                        a += std::fabs(static_cast<double>(x[static_cast<size_t>(i) * s.k + t]) *
                                       w[static_cast<size_t>(o) * s.k + t]);
                    if (use_bias) a += std::fabs(bias[o]);
                    if (accumulate) a += std::fabs(prev[static_cast<size_t>(i) * s.m + o]);
                    scale_s[static_cast<size_t>(i) * s.m + o] = a;
                }
            Buffer xb = to_dev(*be, x), wb = to_dev(*be, w), bb = to_dev(*be, bias),
                   out = to_dev(*be, init);
            be->matmul(xb.data(), wb.data(), use_bias ? bb.data() : nullptr, s.n, s.k, s.m,
                       out.data(), accumulate);
            auto got = from_dev(*be, out.data(), want.size());
            auto where = [&](size_t idx) {
                return "row " + std::to_string(idx / s.m) + " col " + std::to_string(idx % s.m);
            };
            // The amx path rounds x and w to bf16: 1.1 * 2^-8 of the same scale (docs/design.md
            // §6, "Numerics per CPU path"; tests/amx/test_amx_ops.cpp).
            const double rel =
                infoflow::cpu::active_cpu_isa() == infoflow::cpu::CpuIsa::amx ? 1.1 / 256.0 : 2e-6;
            CHECK_CLOSE(
                "matmul", got.data(), want.data(), want.size(),
                [&](size_t i) { return rel * scale_s[i] + 1e-30; }, where);
        }
    }
}

// =============================================================================================
namespace {
struct RopeShape {
    int n, n_head, head_dim;
};

// fp32 RoPE error per pair, angle given: cos/sin within ~1 ulp, then x*c - y*s with two
// products and a sum: <= ~4u * (|x_a| + |x_b|). 4e-6 is ~17x that.
constexpr double kRopeRel = 4e-6;

std::vector<double> pair_scale(const std::vector<float>& x, int n_vec, int head_dim) {
    // |x_a| + |x_b| for each element's pair.
    std::vector<double> s(x.size());
    const int half = head_dim / 2;
    for (int v = 0; v < n_vec; ++v)
        for (int i = 0; i < half; ++i) {
            const size_t a = static_cast<size_t>(v) * head_dim + i, b = a + half;
            s[a] = s[b] = std::fabs(x[a]) + std::fabs(x[b]);
        }
    return s;
}
}  // namespace

TEST_CASE("ops: rope half-split pairing with fp32 angles, negative positions", "[ops]") {
    auto be = cpu();
    const RopeShape shapes[] = {{5, 3, 64}, {7, 2, 128}, {3, 1, 2}, {11, 4, 24}, {1, 9, 64}};
    const double bases[] = {10000.0, 500000.0, 100000.0, 10000.0, 100000.0};
    int idx = 0;
    for (const RopeShape& s : shapes) {
        const uint64_t seed = 400 + idx;
        const double base = bases[idx++];
        INFO("rope: seed=" << seed << " n=" << s.n << " n_head=" << s.n_head
                           << " head_dim=" << s.head_dim << " base=" << base);
        Rng rng(seed);
        auto x = rng.floats(static_cast<size_t>(s.n) * s.n_head * s.head_dim, -2, 2);
        auto inv = infoflow::ref::rope_inv_freq(s.head_dim, base);
        std::vector<int32_t> pos(s.n);
        for (auto& p : pos) p = rng.randint(-40000, 40000);
        pos[0] = s.n > 1 ? 0 : 131071;
        if (s.n > 2) pos[1] = -1, pos[2] = 100000;
        auto want =
            infoflow::ref::rope(x.data(), pos.data(), s.n, s.n_head, s.head_dim, inv.data());
        auto scale = pair_scale(x, s.n * s.n_head, s.head_dim);

        Buffer xb = to_dev(*be, x), pb = to_dev(*be, pos), fb = to_dev(*be, inv);
        be->rope(xb.data(), pb.as_int(), s.n, s.n_head, s.head_dim, fb.data());
        auto got = from_dev(*be, xb.data(), x.size());
        auto where = [&](size_t e) {
            const size_t t = e / (s.n_head * s.head_dim);
            return "token " + std::to_string(t) + " (pos " + std::to_string(pos[t]) + ") head " +
                   std::to_string(e / s.head_dim % s.n_head) + " dim " +
                   std::to_string(e % s.head_dim);
        };
        auto tol = [&](size_t e) { return kRopeRel * scale[e] + 1e-30; };
        CHECK_CLOSE("rope", got.data(), want.data(), want.size(), tol, where);

        // Sensitivity: at these positions, exact (double) angles differ from HF's fp32 angles
        // by more than the tolerance, so the check above pins the fp32 angle.
        if (s.head_dim >= 64) {
            auto exact = infoflow::ref::rope(x.data(), pos.data(), s.n, s.n_head, s.head_dim,
                                             inv.data(), false);
            double worst = 0.0;
            for (size_t e = 0; e < exact.size(); ++e)
                worst = std::max(worst, std::fabs(exact[e] - want[e]) / tol(e));
            CHECK(worst > 10.0);
        }

        // Rotating back by -pos restores x (fp32 angles of -p are exactly minus those of p).
        std::vector<int32_t> neg(pos);
        for (auto& p : neg) p = -p;
        Buffer nb = to_dev(*be, neg);
        be->rope(xb.data(), nb.as_int(), s.n, s.n_head, s.head_dim, fb.data());
        auto round = from_dev(*be, xb.data(), x.size());
        auto xd = widen(x);
        CHECK_CLOSE(
            "rope(rope(x, p), -p) == x", round.data(), xd.data(), xd.size(),
            [&](size_t e) { return 2 * kRopeRel * scale[e] + 1e-30; }, where);
    }
}

TEST_CASE("ops: rope pairs (i, i + D/2), not adjacent elements", "[ops]") {
    // One nonzero element at dim i must rotate into dim i + D/2 only.
    auto be = cpu();
    const int D = 16, half = D / 2;
    auto inv = infoflow::ref::rope_inv_freq(D, 10000.0);
    for (int i = 0; i < half; ++i) {
        INFO("unit vector at dim " << i);
        std::vector<float> x(D, 0.0f);
        x[i] = 1.0f;
        std::vector<int32_t> pos = {1};
        Buffer xb = to_dev(*be, x), pb = to_dev(*be, pos), fb = to_dev(*be, inv);
        be->rope(xb.data(), pb.as_int(), 1, 1, D, fb.data());
        auto got = from_dev(*be, xb.data(), D);
        for (int d = 0; d < D; ++d) {
            INFO("dim " << d);
            const double angle = infoflow::ref::rope_angle_fp32(1, inv[i]);
            const double want = d == i ? std::cos(angle) : d == i + half ? std::sin(angle) : 0.0;
            CHECK(std::fabs(got[d] - want) <= 1e-6);
        }
    }
}

TEST_CASE("ops: rope composes: rope(rope(x, a), b) == rope(x, a + b)", "[ops]") {
    // docs/design.md §3.2 / §6.5: re-positioning chunk-local keys by delta = global - local.
    auto be = cpu();
    struct Case {
        const char* name;
        int n_head, head_dim, max_local, max_delta;
        std::vector<float> inv;
    };
    const std::vector<Case> cases = {
        {"smollm2 base 1e5 D 64", 3, 64, 2048, 30000, infoflow::ref::rope_inv_freq(64, 100000.0)},
        {"base 1e4 D 128 small positions", 2, 128, 64, 64,
         infoflow::ref::rope_inv_freq(128, 10000.0)},
        {"llama3.1 scaled D 128", 2, 128, 8192, 60000,
         infoflow::ref::llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 8192.0)},
    };
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        const uint64_t seed = 500 + ci;
        const int n = 40, H = c.n_head, D = c.head_dim, half = D / 2;
        INFO("rope composition: " << c.name << " seed=" << seed << " n=" << n << " n_head=" << H
                                  << " max_local=" << c.max_local << " max_delta=" << c.max_delta);
        Rng rng(seed);
        auto x = rng.floats(static_cast<size_t>(n) * H * D, -1, 1);
        std::vector<int32_t> a(n), b(n), ab(n);
        for (int t = 0; t < n; ++t) {
            a[t] = rng.randint(0, c.max_local);
            b[t] = rng.randint(-c.max_delta, c.max_delta);
            ab[t] = a[t] + b[t];
        }
        Buffer x1 = to_dev(*be, x), x2 = to_dev(*be, x), ab_ = to_dev(*be, a), bb = to_dev(*be, b),
               abb = to_dev(*be, ab), fb = to_dev(*be, c.inv);
        be->rope(x1.data(), ab_.as_int(), n, H, D, fb.data());
        be->rope(x1.data(), bb.as_int(), n, H, D, fb.data());
        be->rope(x2.data(), abb.as_int(), n, H, D, fb.data());
        auto twice = from_dev(*be, x1.data(), x.size());
        auto once = from_dev(*be, x2.data(), x.size());
        auto exact = infoflow::ref::rope(x.data(), ab.data(), n, H, D, c.inv.data(), false);
        // Each fp32 angle p*f is rounded with relative error <= u, so the two rotations and the
        // direct one differ in angle by <= u * f_i * (|a| + |b| + |a+b|); an angle error dθ moves
        // the pair by <= dθ * (|x_a| + |x_b|). Plus 3x the per-rotation arithmetic bound.
        auto scale = pair_scale(x, n * H, D);
        auto tol = [&](size_t e) {
            const size_t t = e / (H * D);
            const int i = static_cast<int>(e % D) % half;
            const double dtheta =
                kU * c.inv[i] * (std::abs(a[t]) + std::abs(b[t]) + std::abs(ab[t]));
            return (dtheta + 3 * kRopeRel) * scale[e];
        };
        auto where = [&](size_t e) {
            const size_t t = e / (H * D);
            return "token " + std::to_string(t) + " a=" + std::to_string(a[t]) +
                   " b=" + std::to_string(b[t]) + " dim " + std::to_string(e % D);
        };
        auto once_d = widen(once);
        CHECK_CLOSE("rope twice vs once (backend)", twice.data(), once_d.data(), once_d.size(), tol,
                    where);
        CHECK_CLOSE("rope twice vs exact-angle reference", twice.data(), exact.data(), exact.size(),
                    tol, where);
    }
}

TEST_CASE("ops: rope with llama3-scaled inverse frequencies", "[ops]") {
    auto be = cpu();
    const int D = 128;
    auto plain = infoflow::ref::rope_inv_freq(D, 500000.0);
    auto inv = infoflow::ref::llama3_inv_freq(D, 500000.0, 8.0, 1.0, 4.0, 8192.0);
    // The scaling itself (docs/formats.md §4.5): high frequencies kept, low ones divided by 8, the
    // band with wavelength in [2048, 8192] interpolated, monotone throughout.
    const double pi = 3.14159265358979323846;
    int kept = 0, divided = 0, mixed = 0;
    for (int i = 0; i < D / 2; ++i) {
        const double wavelen = 2 * pi / plain[i];
        if (wavelen < 2048.0) {
            CHECK(inv[i] == plain[i]);
            ++kept;
        } else if (wavelen > 8192.0) {
            CHECK(std::fabs(inv[i] * 8.0 / plain[i] - 1.0) < 1e-6);
            ++divided;
        } else {
            CHECK(inv[i] < plain[i]);
            CHECK(inv[i] > plain[i] / 8.0f);
            ++mixed;
        }
        if (i > 0) CHECK(inv[i] < inv[i - 1]);
    }
    CAPTURE(kept, divided, mixed);
    CHECK(kept > 0);
    CHECK(divided > 0);
    CHECK(mixed > 0);

    const int n = 33, H = 4;
    const uint64_t seed = 600;
    INFO("llama3 rope: seed=" << seed << " n=" << n << " n_head=" << H << " head_dim=" << D);
    Rng rng(seed);
    auto x = rng.floats(static_cast<size_t>(n) * H * D, -3, 3);
    std::vector<int32_t> pos(n);
    for (auto& p : pos) p = rng.randint(-131072, 131072);
    auto want = infoflow::ref::rope(x.data(), pos.data(), n, H, D, inv.data());
    auto scale = pair_scale(x, n * H, D);
    Buffer xb = to_dev(*be, x), pb = to_dev(*be, pos), fb = to_dev(*be, inv);
    be->rope(xb.data(), pb.as_int(), n, H, D, fb.data());
    auto got = from_dev(*be, xb.data(), x.size());
    CHECK_CLOSE(
        "rope llama3", got.data(), want.data(), want.size(),
        [&](size_t e) { return kRopeRel * scale[e] + 1e-30; }, nullptr);
}

// =============================================================================================
TEST_CASE("ops: attention, position layouts x GQA x head_dim", "[ops]") {
    auto be = cpu();
    std::vector<AttnCase> cases;
    auto add = [&](int H, int Hkv, int D, int nq, int nkv, PosMode pm) {
        AttnCase c;
        c.seed = 700 + cases.size();
        c.n_head = H;
        c.n_head_kv = Hkv;
        c.head_dim = D;
        c.n_q = nq;
        c.n_kv = nkv;
        c.pos = pm;
        cases.push_back(c);
    };
    add(9, 3, 64, 300, 300, PosMode::causal);     // SmolLM2 shape, plain causal prefill
    add(4, 2, 128, 57, 700, PosMode::causal);     // prefill of 57 over a 643-token cache
    add(4, 1, 128, 64, 700, PosMode::shuffled);   // group 4, keys unsorted
    add(2, 2, 24, 37, 211, PosMode::duplicates);  // group 1, repeated positions
    add(8, 2, 128, 1, 700, PosMode::decode);      // one decode row
    add(6, 2, 16, 3, 500, PosMode::decode);       // group 3
    add(6, 2, 16, 100, 500, PosMode::middle);     // queries in the middle of the keys
    add(3, 1, 24, 1, 1, PosMode::causal);         // smallest
    add(1, 1, 64, 129, 129, PosMode::causal);     // MHA, odd length
    add(4, 4, 128, 150, 333, PosMode::shuffled);
    for (const AttnCase& c : cases) check_attention_case(*be, c);
}

TEST_CASE("ops: attention, random sweep with groups, strides, scales, threads", "[ops]") {
    auto be = cpu();
    const int ratios[] = {1, 2, 3, 4};
    const int dims[] = {16, 64, 128, 24};
    const PosMode modes[] = {PosMode::causal, PosMode::shuffled, PosMode::duplicates,
                             PosMode::decode, PosMode::middle};
    const KvLayout layouts[] = {KvLayout::packed, KvLayout::fused, KvLayout::padded_nan};
    Rng meta(12345);
    int total_empty = 0;
    for (int ci = 0; ci < 24; ++ci) {
        AttnCase c;
        c.seed = 800 + ci;
        c.n_head_kv = meta.randint(1, 3);
        c.n_head = c.n_head_kv * ratios[ci % 4];
        c.head_dim = dims[(ci / 4) % 4];
        c.pos = modes[ci % 5];
        c.layout = layouts[ci % 3];
        c.n_groups = (ci % 2) ? meta.randint(1, 4) : 0;
        c.n_kv = meta.randint(1, 700);
        c.n_q = c.pos == PosMode::causal ? meta.randint(1, c.n_kv) : meta.randint(1, 300);
        // Keep each case's reference under ~2e7 multiply-adds.
        while (static_cast<double>(c.n_q) * c.n_kv * c.n_head * c.head_dim > 2e7)
            c.n_q = std::max(1, c.n_q / 2);
        const float scales[] = {0.0f, 0.05f, 0.5f, 3.0f};  // 3.0: sharply peaked softmax
        c.scale = scales[meta.randint(0, 3)];
        c.with_lse = ci % 7 != 3;
        c.threads = 1 + ci % 3;
        int empty = 0;
        check_attention_case(*be, c, &empty);
        total_empty += empty;
    }
    CHECK(total_empty > 0);  // the sweep did exercise rows with no visible key
}

// Each ISA path of the CPU kernel (kernels/cpu/attention_cpu.h) called directly, for every KV
// storage type, on shapes whose lengths are not multiples of the vector width (8 / 16), the key
// tile (32 / 64) or the query block (32), with masks, groups, unsorted keys and sorted runs (a
// shard followed by appended keys: the per-tile cut-off must not drop visible keys). The
// reference reads the same values the 16-bit copy holds, so the fp32 tolerance applies.
TEST_CASE("ops: attention, each CPU ISA path x KV dtype, random shapes", "[ops]") {
    auto be = cpu();
    std::vector<CpuIsa> isas = {CpuIsa::avx2};
    if (infoflow::cpu::cpu_has_avx512()) isas.push_back(CpuIsa::avx512);
    const PosMode modes[] = {PosMode::causal, PosMode::shuffled, PosMode::duplicates,
                             PosMode::decode, PosMode::middle,   PosMode::runs};
    const KvLayout layouts[] = {KvLayout::packed, KvLayout::fused, KvLayout::padded_nan};
    const int dims[] = {64, 24, 128, 40, 8};
    const KvDtype kvs[] = {KvDtype::f32, KvDtype::f16, KvDtype::bf16};
    Rng meta(4242);
    int total_empty = 0, n_cases = 0;
    for (CpuIsa isa : isas) {
        for (KvDtype kv : kvs) {
            for (int ci = 0; ci < 12; ++ci) {
                AttnCase c;
                c.seed = 3000 + n_cases++;
                c.isa = int(isa);
                c.kv = kv;
                c.n_head_kv = meta.randint(1, 3);
                c.n_head = c.n_head_kv * meta.randint(1, 4);
                c.head_dim = dims[ci % 5];
                c.pos = modes[ci % 6];
                c.layout = layouts[ci % 3];
                c.n_groups = (ci % 4 == 1) ? meta.randint(1, 3) : 0;
                c.n_kv = meta.randint(1, 300);
                c.n_q = c.pos == PosMode::causal ? meta.randint(1, c.n_kv) : meta.randint(1, 90);
                c.scale = ci % 5 == 4 ? 2.0f : 0.0f;
                c.with_lse = ci % 6 != 5;
                c.threads = 1 + ci % 2;
                int empty = 0;
                check_attention_case(*be, c, &empty);
                total_empty += empty;
            }
            // A longer causal prefill over many tiles, and one decode row.
            AttnCase c;
            c.seed = 3000 + n_cases++;
            c.isa = int(isa);
            c.kv = kv;
            c.n_head = 9;
            c.n_head_kv = 3;
            c.n_q = 203;
            c.n_kv = 203;
            check_attention_case(*be, c);
            c.n_q = 1;
            c.n_kv = 517;
            c.pos = PosMode::decode;
            check_attention_case(*be, c);
            // A decode row over 9 key segments on 2 threads: each unit of work takes one
            // segment for all kv heads, as one thread always does.
            c.n_kv = 2100;
            c.threads = 2;
            check_attention_case(*be, c);
        }
    }
    CHECK(total_empty > 0);  // rows with no visible key were exercised
}

// The 16-bit KV cache against exact fp32 K/V. Rounding K to unit roundoff u (f16: 2^-11, bf16:
// 2^-8) moves each score by at most ds = u * scale * sum_d |q_d k_d| (worst pair of the case);
// the softmax weights then change by a factor within exp(+-2 ds), so a convex combination of V
// rows moves by <= 2.2 ds * vmax; rounding V adds <= u * vmax; the lse moves by <= ds. On top
// comes the fp32 tolerance of the kernel. For these unit-scale inputs the f16 bound is ~1e-3 *
// vmax and the bf16 one ~1e-2: well below the change one wrongly masked key causes (the mask is
// exact either way, checked above), and the check also asserts the 16-bit result did change.
TEST_CASE("ops: attention with f16/bf16 K/V within the rounding bound of fp32", "[ops]") {
    auto be = cpu();
    const PosMode modes[] = {PosMode::causal, PosMode::runs, PosMode::decode, PosMode::shuffled};
    int ci = 0;
    for (KvDtype kv : {KvDtype::f16, KvDtype::bf16}) {
        const double u = kv == KvDtype::f16 ? 1.0 / 2048 : 1.0 / 256;
        for (PosMode pm : modes) {
            AttnCase c;
            c.seed = 3500 + ci++;
            c.n_head = 6;
            c.n_head_kv = 2;
            c.head_dim = 64;
            c.n_q = pm == PosMode::decode ? 2 : 77;
            c.n_kv = 301;
            c.pos = pm;
            c.n_groups = pm == PosMode::shuffled ? 2 : 0;
            AttnCase c32 = c;
            c.kv = kv;
            INFO("case: " << c.str());
            const AttnInputs in32 = make_inputs(c32), in16 = make_inputs(c);
            std::vector<double> want_out, want_lse;
            double max_score = 0.0;
            infoflow::ref::attention(host_params(c32, in32), &want_out, &want_lse, &max_score);
            const AttnResult got = run_backend_attention(*be, c, in16);
            const int D = c.head_dim, g = c.n_head / c.n_head_kv;
            const double scale = 1.0 / std::sqrt(double(D));
            double qk = 0.0, vmax = 0.0;  // max scale * sum_d |q_d k_d|, max |v|
            for (int i = 0; i < c.n_q; ++i)
                for (int h = 0; h < c.n_head; ++h)
                    for (int j = 0; j < c.n_kv; ++j) {
                        double a = 0.0;
                        for (int d = 0; d < D; ++d)
                            a += std::fabs(double(in32.q[(size_t(i) * c.n_head + h) * D + d]) *
                                           in32.kv[size_t(j) * in32.stride + (h / g) * D + d]);
                        qk = std::max(qk, a * scale);
                    }
            for (size_t j = 0; j < size_t(c.n_kv) * in32.stride; ++j)
                vmax = std::max(vmax, std::fabs(double(in32.kv[in32.v_base + j])));
            const double ds = u * qk;
            const double tol32 = attn_tol(max_score, c.n_kv);
            const double tol_out = vmax * (u + 2.2 * ds + tol32), tol_lse = ds + tol32;
            CAPTURE(ds, vmax, tol_out, tol_lse);
            CHECK_CLOSE(
                "out", got.out.data(), want_out.data(), want_out.size(),
                [&](size_t) { return tol_out; }, nullptr);
            CHECK_CLOSE(
                "lse", got.lse.data(), want_lse.data(), want_lse.size(),
                [&](size_t) { return tol_lse; }, nullptr);
            double diff = 0.0;
            for (size_t r = 0; r < want_out.size(); ++r)
                diff = std::max(diff, std::fabs(got.out[r] - want_out[r]));
            CHECK(diff > 1e-7);  // the 16-bit copy was really used
        }
    }
}

TEST_CASE("ops: attention mask is exactly key_pos <= query_pos", "[ops]") {
    // One query at position 10; keys at 9, 10, 11. The key at 11 (future) has a large score and
    // v = 100 e_3: including it would put ~98 in dim 3. The key at 10 (same position) carries
    // most of the weight to e_2: excluding it would leave out = e_1.
    auto be = cpu();
    const int D = 16;
    AttnCase c;
    c.n_head = 1;
    c.n_head_kv = 1;
    c.head_dim = D;
    c.n_q = 1;
    c.n_kv = 3;
    c.scale = 0.25f;
    AttnInputs in;
    in.q.assign(D, 0.0f);
    in.q[0] = 4.0f;
    in.stride = D;
    in.kv.assign(2 * 3 * D, 0.0f);
    in.v_base = 3 * D;
    in.k_pos = {11, 9, 10};  // unsorted on purpose
    in.q_pos = {10};
    in.kv[0 * D + 0] = 8.0f;  // key pos 11: score 8
    in.kv[1 * D + 0] = 0.0f;  // key pos 9: score 0
    in.kv[2 * D + 0] = 4.0f;  // key pos 10: score 4
    in.kv[in.v_base + 0 * D + 3] = 100.0f;
    in.kv[in.v_base + 1 * D + 1] = 1.0f;
    in.kv[in.v_base + 2 * D + 2] = 1.0f;
    const AttnResult got = run_backend_attention(*be, c, in);
    const double w9 = 1.0 / (1.0 + std::exp(4.0)), w10 = 1.0 - w9;
    INFO("got out[1..3] = " << got.out[1] << " " << got.out[2] << " " << got.out[3]
                            << ", lse = " << got.lse[0]);
    CHECK(got.out[3] == 0.0f);  // the future key contributes nothing at all
    CHECK(std::fabs(got.out[1] - w9) < 1e-6);
    CHECK(std::fabs(got.out[2] - w10) < 1e-6);
    CHECK(std::fabs(got.lse[0] - std::log(1.0 + std::exp(4.0))) < 1e-5);

    // The same through the reference, for all query positions 8..12.
    for (int qp = 8; qp <= 12; ++qp) {
        in.q_pos = {qp};
        c.seed = static_cast<uint64_t>(qp);
        INFO("query position " << qp);
        const AttnResult g = run_backend_attention(*be, c, in);
        std::vector<double> wo, wl;
        infoflow::ref::attention(host_params(c, in), &wo, &wl);
        CHECK_CLOSE(
            "out", g.out.data(), wo.data(), wo.size(), [](size_t) { return 1e-4; }, nullptr);
        CHECK_CLOSE(
            "lse", g.lse.data(), wl.data(), wl.size(), [](size_t) { return 1e-5; }, nullptr);
    }
}

TEST_CASE("ops: attention rows with no visible key give out 0 and lse -inf", "[ops]") {
    auto be = cpu();
    for (int with_lse = 0; with_lse < 2; ++with_lse) {
        AttnCase c;
        c.seed = 900 + with_lse;
        c.n_head = 4;
        c.n_head_kv = 2;
        c.head_dim = 64;
        c.n_q = 6;
        c.n_kv = 50;
        c.with_lse = with_lse;
        INFO("case: " << c.str());
        AttnInputs in = make_inputs(c);
        for (int j = 0; j < c.n_kv; ++j) in.k_pos[j] = 100 + j;
        in.q_pos = {99, 0, -5, 100, 149, 99};  // rows 0, 1, 2, 5 see nothing (positions)
        in.q_group = {0, 0, 0, 2, 3, 1};       // row 4: group 3 matches no key, none global
        in.k_group.assign(c.n_kv, 1);
        in.k_group[0] = 2;  // row 3 sees exactly the key at 100
        const AttnResult got = run_backend_attention(*be, c, in);
        const int H = c.n_head, D = c.head_dim;
        for (int i : {0, 1, 2, 4, 5}) {
            INFO("empty query row " << i);
            for (int h = 0; h < H; ++h) {
                for (int d = 0; d < D; ++d) {
                    const float o = got.out[(static_cast<size_t>(i) * H + h) * D + d];
                    if (o != 0.0f) FAIL_CHECK("head " << h << " dim " << d << " out " << o);
                }
                if (with_lse) CHECK(got.lse[static_cast<size_t>(i) * H + h] == -kInf);
            }
        }
        // Row 3 sees one key: out = v of that key, lse = its score.
        std::vector<double> wo, wl;
        infoflow::ref::attention(host_params(c, in), &wo, &wl);
        CHECK_CLOSE(
            "out", got.out.data(), wo.data(), wo.size(), [](size_t) { return 1e-5; }, nullptr);
        if (with_lse)
            CHECK_CLOSE(
                "lse", got.lse.data(), wl.data(), wl.size(), [](size_t) { return 1e-5; }, nullptr);
    }
}

TEST_CASE("ops: attention with no keys at all (n_kv = 0)", "[ops]") {
    auto be = cpu();
    AttnCase c;
    c.seed = 950;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.head_dim = 16;
    c.n_q = 5;
    c.n_kv = 0;
    INFO("case: " << c.str());
    const AttnInputs in = make_inputs(c);
    const AttnResult got = run_backend_attention(*be, c, in);
    for (float o : got.out) CHECK(o == 0.0f);
    for (float l : got.lse) CHECK(l == -std::numeric_limits<float>::infinity());
}

// =============================================================================================
TEST_CASE("ops: swiglu", "[ops]") {
    auto be = cpu();
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(1000), size_t(100003)}) {
        const uint64_t seed = 1000 + n;
        INFO("swiglu: seed=" << seed << " n=" << n);
        Rng rng(seed);
        auto gate = rng.floats(n, -12, 12);
        auto up = rng.floats(n, -3, 3);
        // Extremes: exp(-g) overflows fp32 for g < -88.7; silu must give ~0, not NaN.
        const float extremes[] = {-100.0f, 100.0f, -88.0f, 88.0f,   -30.0f, 30.0f,
                                  0.0f,    -0.0f,  1e-30f, -1e-30f, 1e4f,   -1e4f};
        for (size_t i = 0; i < n && i < 12; ++i) gate[n - 1 - i] = extremes[i];
        auto want = infoflow::ref::swiglu(gate.data(), up.data(), n);
        Buffer g = to_dev(*be, gate), u = to_dev(*be, up), out = be->alloc_floats(n);
        be->swiglu(g.data(), u.data(), n, out.data());
        auto got = from_dev(*be, out.data(), n);
        // expf, a division and a product: a few u relative (silu's relative condition number
        // w.r.t. exp is < 1). 1e-5 relative; 1e-30 absolute for results below FLT_MIN.
        CHECK_CLOSE(
            "swiglu", got.data(), want.data(), n,
            [&](size_t i) { return 1e-5 * std::fabs(want[i]) + 1e-30; },
            [&](size_t i) {
                return "[" + std::to_string(i) + "] gate " + std::to_string(gate[i]) + " up " +
                       std::to_string(up[i]);
            });
    }
}

TEST_CASE("ops: add", "[ops]") {
    auto be = cpu();
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(33), size_t(100003)}) {
        const uint64_t seed = 1100 + n;
        INFO("add: seed=" << seed << " n=" << n);
        Rng rng(seed);
        auto y = rng.floats(n, -100, 100);
        auto x = rng.floats(n, -1, 1);
        // float(double(y) + double(x)) is the correctly rounded fp32 sum: exact match.
        std::vector<double> want(n);
        for (size_t i = 0; i < n; ++i)
            want[i] = static_cast<float>(static_cast<double>(y[i]) + static_cast<double>(x[i]));
        Buffer yb = to_dev(*be, y), xb = to_dev(*be, x);
        be->add(yb.data(), xb.data(), n);
        auto got = from_dev(*be, yb.data(), n);
        CHECK_CLOSE(
            "add", got.data(), want.data(), n, [](size_t) { return 0.0; }, nullptr);
    }
}

// =============================================================================================
TEST_CASE("ops: lse_merge of partials over a key split equals attention over all keys", "[ops]") {
    auto be = cpu();
    for (int variant = 0; variant < 3; ++variant) {
        AttnCase c;
        c.seed = 1200 + variant;
        c.n_head = variant == 1 ? 9 : 4;
        c.n_head_kv = variant == 1 ? 3 : 2;
        c.head_dim = variant == 2 ? 128 : 64;
        c.n_q = 60;
        c.n_kv = 400;
        c.pos = PosMode::shuffled;  // includes queries before every key
        c.n_groups = variant == 0 ? 0 : 3;
        c.layout = variant == 2 ? KvLayout::fused : KvLayout::packed;
        const int n_parts = variant == 0 ? 2 : 3;
        INFO("lse_merge split: " << c.str() << " n_parts=" << n_parts);
        AttnInputs in = make_inputs(c);
        const int first = *std::min_element(in.k_pos.begin(), in.k_pos.end());
        in.q_pos[0] = first - 1;  // rows that see no key at all, in any part
        in.q_pos[c.n_q / 2] = first - 100;
        // Parts: keys above a position cut go to the last part, the rest are dealt at random,
        // so early queries see nothing in some parts (empty partials on either side).
        Rng rng(c.seed + 99);
        const int cut = first + c.n_kv / 2;
        std::vector<int> part(c.n_kv);
        for (int j = 0; j < c.n_kv; ++j)
            part[j] = in.k_pos[j] >= cut ? n_parts - 1 : rng.randint(0, n_parts - 2);
        if (variant == 0)  // two parts: the random side gets every key below the cut
            for (int j = 0; j < c.n_kv; ++j) part[j] = in.k_pos[j] >= cut ? 1 : 0;

        const size_t rows = static_cast<size_t>(c.n_q) * c.n_head;
        const size_t n_out = rows * c.head_dim;
        // Accumulator starts as the empty state (0, -inf), as ring attention does.
        Buffer acc_o = to_dev(*be, std::vector<float>(n_out, 0.0f));
        Buffer acc_l =
            to_dev(*be, std::vector<float>(rows, -std::numeric_limits<float>::infinity()));
        int empty_partial_rows = 0;
        for (int pi = 0; pi < n_parts; ++pi) {
            std::vector<char> take(c.n_kv);
            for (int j = 0; j < c.n_kv; ++j) take[j] = part[j] == pi;
            const AttnResult r = backend_attention_subset(*be, c, in, take);
            for (float l : r.lse)
                empty_partial_rows += l == -std::numeric_limits<float>::infinity();
            Buffer po = to_dev(*be, r.out), pl = to_dev(*be, r.lse);
            be->lse_merge(acc_o.data(), acc_l.data(), po.data(), pl.data(), static_cast<int>(rows),
                          c.head_dim);
        }
        CHECK(empty_partial_rows > 0);
        auto got_o = from_dev(*be, acc_o.data(), n_out);
        auto got_l = from_dev(*be, acc_l.data(), rows);
        std::vector<double> want_o, want_l;
        double max_score = 0.0;
        infoflow::ref::attention(host_params(c, in), &want_o, &want_l, &max_score);
        int empty_rows = 0;
        for (double l : want_l) empty_rows += l == -kInf;
        CAPTURE(empty_rows, empty_partial_rows);
        CHECK(empty_rows > 0);  // rows empty in every part stay (0, -inf)
        // Attention tolerance plus a few u per merge step (and the amx path's bf16 scores).
        const double tol =
            attn_tol(max_score, c.n_kv) + 8 * kU * n_parts + 2.2 * amx_score_shift(c, in);
        CHECK_CLOSE(
            "merged out", got_o.data(), want_o.data(), n_out, [&](size_t) { return tol; },
            nullptr);  // |v| <= 1
        CHECK_CLOSE(
            "merged lse", got_l.data(), want_l.data(), rows, [&](size_t) { return tol; }, nullptr);
        for (size_t r = 0; r < rows; ++r)
            if (want_l[r] == -kInf)
                for (int d = 0; d < c.head_dim; ++d)
                    if (got_o[r * c.head_dim + d] != 0.0f)
                        FAIL_CHECK("empty row " << r << " dim " << d << " = "
                                                << got_o[r * c.head_dim + d]);
    }
}

TEST_CASE("ops: lse_merge edge cases: empty sides, large lse gaps, overflow-prone values",
          "[ops]") {
    auto be = cpu();
    const float ninf = -std::numeric_limits<float>::infinity();
    // (lse_a, lse_b) per row; an empty side (-inf) has o = 0 as attention produces it.
    const std::vector<std::pair<float, float>> lses = {
        {0.5f, -1.25f},   {3.0f, 3.0f},    {ninf, 2.0f},       {2.0f, ninf},
        {ninf, ninf},     {1000.0f, 0.0f}, {0.0f, 1000.0f},    {-500.0f, 500.0f},
        {100.0f, 100.0f}, {88.8f, 89.5f},  {-200.0f, -200.0f}, {-1000.0f, -1001.0f},
        {1e4f, 1e4f},     {20.0f, -20.0f}, {ninf, -1000.0f},   {-87.0f, -120.0f},
    };
    const int rows = static_cast<int>(lses.size());
    for (int D : {1, 7, 64}) {
        const uint64_t seed = 1300 + D;
        INFO("lse_merge edge: seed=" << seed << " head_dim=" << D);
        Rng rng(seed);
        auto oa = rng.floats(static_cast<size_t>(rows) * D, -2, 2);
        auto ob = rng.floats(static_cast<size_t>(rows) * D, -2, 2);
        std::vector<float> la(rows), lb(rows);
        for (int r = 0; r < rows; ++r) {
            la[r] = lses[r].first;
            lb[r] = lses[r].second;
            for (int d = 0; d < D; ++d) {
                if (la[r] == ninf) oa[static_cast<size_t>(r) * D + d] = 0.0f;
                if (lb[r] == ninf) ob[static_cast<size_t>(r) * D + d] = 0.0f;
            }
        }
        std::vector<double> want_o = widen(oa), want_l = widen(la);
        infoflow::ref::lse_merge(&want_o, &want_l, ob.data(), lb.data(), rows, D);
        Buffer oab = to_dev(*be, oa), lab = to_dev(*be, la), obb = to_dev(*be, ob),
               lbb = to_dev(*be, lb);
        be->lse_merge(oab.data(), lab.data(), obb.data(), lbb.data(), rows, D);
        auto got_o = from_dev(*be, oab.data(), oa.size());
        auto got_l = from_dev(*be, lab.data(), rows);
        auto where_l = [&](size_t r) {
            return "row " + std::to_string(r) + " (lse_a " + std::to_string(la[r]) + ", lse_b " +
                   std::to_string(lb[r]) + ")";
        };
        auto where_o = [&](size_t e) { return where_l(e / D) + " dim " + std::to_string(e % D); };
        // A merge is a max, exp, log1p and two products: a few u relative. lse: 8u relative to
        // |lse| (plus 1e-6). out: the weights exp(lse_x - lse) (docs/design.md §5.3) see the fp32
        // rounding of the merged lse, u * |lse| absolute, as a relative error, so out gets
        // 8u * (1 + |lse|) of (|o_a| + |o_b|), plus 1e-7. (At |lse| = 1e4 that is ~1e-3: the
        // price of the prescribed form; any wrong weighting is O(1).)
        CHECK_CLOSE(
            "merged lse", got_l.data(), want_l.data(), rows,
            [&](size_t r) { return 8 * kU * std::fabs(want_l[r]) + 1e-6; }, where_l);
        auto tol_o = [&](size_t e) {
            const double l = std::isinf(want_l[e / D]) ? 0.0 : std::fabs(want_l[e / D]);
            return 8 * kU * (1.0 + l) * (std::fabs(oa[e]) + std::fabs(ob[e])) + 1e-7;
        };
        CHECK_CLOSE("merged out", got_o.data(), want_o.data(), want_o.size(), tol_o, where_o);
        // Both empty: exactly (0, -inf).
        CHECK(got_l[4] == ninf);
        for (int d = 0; d < D; ++d) CHECK(got_o[4 * static_cast<size_t>(D) + d] == 0.0f);
    }
}

// =============================================================================================
TEST_CASE("ops: attention_scores, norm and sum aggregates over a column prefix", "[ops]") {
    auto be = cpu();
    struct Variant {
        int n_head, n_head_kv, head_dim, n_q, n_kv, n_cols, n_groups;
        PosMode pos;
        KvLayout layout;
        float scale;
    };
    const Variant variants[] = {
        {9, 3, 64, 40, 600, 600, 0, PosMode::decode, KvLayout::packed, 0.0f},
        {4, 2, 128, 70, 500, 300, 3, PosMode::shuffled, KvLayout::fused, 0.0f},
        {4, 1, 24, 65, 300, 257, 0, PosMode::middle, KvLayout::padded_nan, 0.5f},
        {3, 3, 16, 129, 129, 129, 2, PosMode::causal, KvLayout::packed, 3.0f},
        {2, 1, 64, 1, 700, 650, 0, PosMode::duplicates, KvLayout::packed, 0.0f},
    };
    int vi = 0;
    for (const Variant& v : variants) {
        AttnCase c;
        c.seed = 1400 + vi++;
        c.n_head = v.n_head;
        c.n_head_kv = v.n_head_kv;
        c.head_dim = v.head_dim;
        c.n_q = v.n_q;
        c.n_kv = v.n_kv;
        c.n_groups = v.n_groups;
        c.pos = v.pos;
        c.layout = v.layout;
        c.scale = v.scale;
        for (int aggregate_sum = 0; aggregate_sum < 2; ++aggregate_sum) {
            for (int threads : {1, 2}) {
                c.kv = threads == 1 ? KvDtype::f32 : aggregate_sum ? KvDtype::bf16 : KvDtype::f16;
                INFO("attention_scores: " << c.str() << " n_cols=" << v.n_cols << " aggregate_sum="
                                          << aggregate_sum << " threads=" << threads);
                const AttnInputs in = make_inputs(c);
                const AttnParams ap = host_params(c, in);
                // The row normalizer over ALL n_kv keys, from the float64 reference, rounded to
                // fp32 as the backend would hold it; columns are the first n_cols keys only.
                std::vector<double> ref_out, ref_lse;
                double max_score = 0.0;
                infoflow::ref::attention(ap, &ref_out, &ref_lse, &max_score);
                std::vector<float> lse(ref_lse.begin(), ref_lse.end());
                Rng rng(c.seed + 7);
                std::vector<float> col0 = rng.floats(v.n_cols, 0.0, 1.0);  // accumulated into

                ScoreParams sp;
                sp.q = ap.q;
                sp.k = ap.k;
                sp.lse = lse.data();
                sp.q_pos = ap.q_pos;
                sp.k_pos = ap.k_pos;
                sp.q_group = ap.q_group;
                sp.k_group = ap.k_group;
                sp.n_q = c.n_q;
                sp.n_cols = v.n_cols;
                sp.n_head = c.n_head;
                sp.n_head_kv = c.n_head_kv;
                sp.head_dim = c.head_dim;
                sp.kv_stride = ap.kv_stride;
                sp.scale = c.scale;
                sp.aggregate_sum = aggregate_sum;
                const std::vector<double> add = infoflow::ref::attention_scores(sp);
                std::vector<double> want(v.n_cols);
                for (int j = 0; j < v.n_cols; ++j) want[j] = col0[j] + add[j];

                Buffer q = to_dev(*be, in.q), kv = to_dev(*be, in.kv), lb = to_dev(*be, lse),
                       qp = to_dev(*be, in.q_pos), kp = to_dev(*be, in.k_pos),
                       qg = to_dev(*be, in.q_group), kg = to_dev(*be, in.k_group),
                       col = to_dev(*be, col0);
                sp.q = q.data();
                sp.k = kv.data();
                Buffer kv16;
                if (c.kv != KvDtype::f32) {  // the 16-bit copy of the same (rounded) values
                    kv16 = to_dev(*be, narrow_all(c.kv, in.kv));
                    sp.kv_dtype = c.kv;
                    sp.k = nullptr;
                    sp.k16 = static_cast<const uint16_t*>(static_cast<const void*>(kv16.data()));
                }
                sp.lse = lb.data();
                sp.q_pos = qp.as_int();
                sp.k_pos = kp.as_int();
                sp.q_group = in.q_group.empty() ? nullptr : qg.as_int();
                sp.k_group = in.k_group.empty() ? nullptr : kg.as_int();
                sp.col = col.data();
                be->set_threads(threads);
                be->attention_scores(sp);
                const auto got = from_dev(*be, col.data(), v.n_cols);
                // All terms are positive, so the tolerance is relative. P = exp(s - lse) carries
                // the fp32 error of the score and of lse, ~u * (|s| + |lse|) each, doubled by the
                // square of "norm"; the sums add ~u * n_q * n_head. 1e-5 + 8u * (max|s| +
                // max|lse|) relative: ~1.5e-5 here; a missing head or wrong mean is O(1).
                double max_lse = 0.0;
                for (double l : ref_lse)
                    if (!std::isinf(l)) max_lse = std::max(max_lse, std::fabs(l));
                const double rel =
                    1e-5 + 8 * kU * (max_score + max_lse) + 4 * kU * c.n_q * c.n_head;
                CAPTURE(max_score, max_lse, rel);
                CHECK_CLOSE(
                    "col", got.data(), want.data(), want.size(),
                    [&](size_t j) { return rel * want[j] + 1e-30; },
                    [&](size_t j) {
                        return "column " + std::to_string(j) + " (pos " +
                               std::to_string(in.k_pos[j]) + ")";
                    });
                // Sanity of the oracle: with every key a column, "sum" adds exactly one per
                // (row, head) that sees a key (softmax rows sum to one).
                if (aggregate_sum && v.n_cols == v.n_kv) {
                    double total = 0.0;
                    for (double a : add) total += a;
                    double rows_seeing = 0.0;
                    for (double l : ref_lse) rows_seeing += std::isinf(l) ? 0.0 : 1.0;
                    CHECK(std::fabs(total - rows_seeing) < 1e-6 * (1.0 + rows_seeing));
                }
            }
        }
    }
}

TEST_CASE("cpu isa: the override accepts the known paths and names a bad one", "[kernels][isa]") {
    using infoflow::cpu::CpuIsa;
    const CpuIsa before = infoflow::cpu::active_cpu_isa();
    CHECK_THROWS_WITH(infoflow::cpu::set_cpu_isa_override("sse2"),
                      Catch::Contains("cpu.isa") && Catch::Contains("sse2"));
    infoflow::cpu::set_cpu_isa_override("avx2");
    CHECK(infoflow::cpu::active_cpu_isa() == CpuIsa::avx2);
    CHECK(infoflow::cpu::cpu_isa_summary() == "avx2");
    if (infoflow::cpu::cpu_has_avx512()) {
        infoflow::cpu::set_cpu_isa_override("avx512");
        CHECK(infoflow::cpu::active_cpu_isa() == CpuIsa::avx512);
        CHECK(infoflow::cpu::cpu_isa_summary().rfind("avx512", 0) == 0);
    } else {
        CHECK_THROWS_WITH(infoflow::cpu::set_cpu_isa_override("avx512"),
                          Catch::Contains("no AVX-512"));
    }
    infoflow::cpu::set_cpu_isa_override(infoflow::cpu::cpu_isa_name(before));
}

TEST_CASE("cpu isa: amx only where the CPU and Linux provide it, else an error saying why",
          "[kernels][isa]") {
    // "amx" means the CPU's tiles, or the emulator under its test hook (INFOFLOW_AMX_EMULATE,
    // the amx variant of this test on a CPU without AMX); "auto" never picks the emulator.
    namespace cpu = infoflow::cpu;
    const cpu::CpuIsa before = cpu::active_cpu_isa();
    INFO("amx: " << (cpu::cpu_has_amx() ? "usable" : cpu::cpu_amx_missing())
                 << (cpu::amx_emulated() ? " (emulator hook set)" : ""));
    if (cpu::cpu_has_amx()) {
        CHECK(cpu::cpu_amx_missing().empty());
        cpu::set_cpu_isa_override("auto");
        CHECK(cpu::active_cpu_isa() == cpu::CpuIsa::amx);
        cpu::set_cpu_isa_override("amx");
        CHECK(cpu::cpu_isa_summary().rfind("amx (", 0) == 0);
    } else {
        CHECK_FALSE(cpu::cpu_amx_missing().empty());
        if (cpu::amx_emulated() && cpu::cpu_has_avx512()) {
            cpu::set_cpu_isa_override("amx");
            CHECK(cpu::cpu_isa_summary().find("emulated tiles") != std::string::npos);
        } else if (cpu::cpu_has_avx512()) {
            CHECK_THROWS_WITH(
                cpu::set_cpu_isa_override("amx"),
                Catch::Contains("cpu.isa") && Catch::Contains(cpu::cpu_amx_missing()));
        } else {  // an AVX2-only CPU: the amx path's AVX-512 part is named first
            CHECK_THROWS_WITH(cpu::set_cpu_isa_override("amx"),
                              Catch::Contains("cpu.isa") && Catch::Contains("no AVX-512"));
        }
        cpu::set_cpu_isa_override("auto");
        CHECK(cpu::active_cpu_isa() != cpu::CpuIsa::amx);
        if (cpu::cpu_has_avx512()) {
            // The run summary says why the path is not amx.
            CHECK(cpu::cpu_isa_summary().find("no amx: " + cpu::cpu_amx_missing()) !=
                  std::string::npos);
        }
    }
    cpu::set_cpu_isa_override(cpu::cpu_isa_name(before));
}
