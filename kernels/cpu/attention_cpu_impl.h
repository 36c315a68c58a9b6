// The tiled attention kernel of attention_cpu.h, written once over a vector traits type `V` and
// instantiated per ISA by attention_cpu.cpp (AVX2) and attention_cpu_avx512.cpp (AVX-512).
// Included by those two files alone. `V` provides:
//   F (vector of L floats), L, NV (vectors per key tile: the tile is KT = L * NV keys, a whole
//   score row of a tile lives in NV registers), RB (query rows per register block), DV (output
//   vectors per P·V register block), zero/set1/load/store/fmadd/add/sub/mul, exp (of x <= 0),
//   hmax/hsum, mask (scores of invisible keys to -inf), widen (a row of K/V to fp32) and
//   load_f16/load_bf16 (L 16-bit values widened in a register).
// attention_tiles is the same kernel with Q·Kᵀ on AMX bf16 tiles (cpu.isa = amx),
// instantiated by attention_cpu_avx512.cpp alone.
#pragma once

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/amx_tiles.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow::cpu::tiled {

constexpr int kQueryBlock = 32;  // query tokens per task (times the g heads sharing a kv head)

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// kt[d * KT + j] = src[j * rstride + d] for the nk (<= KT) keys of a tile: L x L blocks
// transposed in registers (V::transpose), a head width that is not a multiple of L finished
// element by element. Keys past nk in the last block come out as zeros.
template <class V>
void transpose_tile(const float* src, size_t rstride, int nk, int D, float* kt, int KT) {
    constexpr int L = V::L;
    const int Dv = D / L * L;
    for (int j0 = 0; j0 < nk; j0 += L) {
        const int n = std::min(L, nk - j0);
        for (int d0 = 0; d0 < Dv; d0 += L)
            V::transpose(src + size_t(j0) * rstride + d0, rstride, n, kt + size_t(d0) * KT + j0,
                         size_t(KT));
        for (int j = j0; j < j0 + n; ++j)
            for (int d = Dv; d < D; ++d) kt[size_t(d) * KT + j] = src[size_t(j) * rstride + d];
    }
}

// One row's online-softmax step over a key tile: sc holds the row's NV vectors of masked
// scores; prow gets exp(sc - m_new), l becomes l * alpha + the row sum, m becomes m_new.
// Returns alpha = exp(m_old - m_new) (0 for the first visible tile; 1, with a zero prow, when
// nothing in the tile is visible).
template <class V>
inline float softmax_tile(const typename V::F* sc, float* prow, float& m, double& l) {
    using F = typename V::F;
    constexpr int L = V::L, NV = V::NV;
    F mx = sc[0];
#pragma GCC unroll 16
    for (int v = 1; v < NV; ++v) mx = V::max(mx, sc[v]);
    const float tm = V::hmax(mx);
    if (tm == -INFINITY) {
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) V::store(prow + v * L, V::zero());
        return 1.0f;
    }
    const float m_new = std::max(m, tm);
    const F mv = V::set1(m_new);
    F sum = V::zero();
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
        const F e = V::exp(V::sub(sc[v], mv));
        V::store(prow + v * L, e);
        sum = V::add(sum, e);
    }
    const float alpha = std::exp(m - m_new);
    l = l * alpha + double(V::hsum(sum));
    m = m_new;
    return alpha;
}

// How a row of K or V is read: L elements from element c of a row given by its first byte,
// stored as fp32 (kKind 0), f16 (1) or bf16 (2); the 16-bit kinds are widened in registers.
template <class V, int kKind>
struct RowLoad {
    static typename V::F at(const char* row, int c) {
        if constexpr (kKind == 0) {
            return V::load(reinterpret_cast<const float*>(row) + c);
        } else if constexpr (kKind == 1) {
            return V::load_f16(reinterpret_cast<const uint16_t*>(row) + c);
        } else {
            return V::load_bf16(reinterpret_cast<const uint16_t*>(row) + c);
        }
    }
};

// Output rows r0..r0+RB-1 (ob, Dp floats a row): o = alpha * o + P V over the tile's nk keys,
// P row r at pt + r * KT, V row j at v0 + j * vstep bytes (read by RowLoad<V, kKind>); DV output
// vectors at a time.
template <class V, int kKind>
inline void pv_block_rows(float* ob, int Dp, int r0, const float* alpha, const float* pt,
                          const char* v0, size_t vstep, int nk) {
    using F = typename V::F;
    constexpr int L = V::L, KT = V::L * V::NV, RB = V::RB, DV = V::DV;
    for (int dc = 0; dc < Dp; dc += DV * L) {
        F o[RB][DV];
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) {
            const F a = V::set1(alpha[r0 + r]);
#pragma GCC unroll 16
            for (int v = 0; v < DV; ++v)
                o[r][v] = V::mul(a, V::load(ob + size_t(r0 + r) * Dp + dc + v * L));
        }
        for (int j = 0; j < nk; ++j) {
            const char* vj = v0 + size_t(j) * vstep;
            F vv[DV];
#pragma GCC unroll 16
            for (int v = 0; v < DV; ++v) vv[v] = RowLoad<V, kKind>::at(vj, dc + v * L);
#pragma GCC unroll 16
            for (int r = 0; r < RB; ++r) {
                const F b = V::set1(pt[size_t(r0 + r) * KT + j]);
#pragma GCC unroll 16
                for (int v = 0; v < DV; ++v) o[r][v] = V::fmadd(b, vv[v], o[r][v]);
            }
        }
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
            for (int v = 0; v < DV; ++v) V::store(ob + size_t(r0 + r) * Dp + dc + v * L, o[r][v]);
    }
}

// pv_block_rows over fp32 rows vstep floats apart.
template <class V>
inline void pv_block(float* ob, int Dp, int r0, const float* alpha, const float* pt,
                     const float* v0, size_t vstep, int nk) {
    pv_block_rows<V, 0>(ob, Dp, r0, alpha, pt, reinterpret_cast<const char*>(v0),
                        vstep * sizeof(float), nk);
}

// How both paths address the K/V cache: fp32 or 16-bit rows `stride` elements apart, head hk
// at element hk * head_dim, and the score scale.
struct KvView {
    bool wide;      // fp32 rows (p.k, p.v); else 16-bit (p.k16, p.v16)
    size_t stride;  // elements between consecutive tokens
    size_t esize;   // bytes per element
    const char* kbase;
    const char* vbase;
    float scale;
};

inline KvView kv_view(const AttnParams& p) {
    const bool wide = p.kv_dtype == KvDtype::f32;
    return {wide,
            size_t(p.kv_stride > 0 ? p.kv_stride : p.n_head_kv * p.head_dim),
            kv_dtype_size(p.kv_dtype),
            wide ? reinterpret_cast<const char*>(p.k) : reinterpret_cast<const char*>(p.k16),
            wide ? reinterpret_cast<const char*>(p.v) : reinterpret_cast<const char*>(p.v16),
            p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(p.head_dim))};
}

// ---- few query rows (decode) ----
// With n_q * g <= kFewRows (one decoded token, or a handful) a tile's K is not worth transposing
// for so few rows: each row's scores of L keys are L dot products over the cache rows, summed
// across lanes by V::reduce_lanes. The keys are split into fixed segments of kSegmentKeys, one
// task per (kv head, segment), merged at the end by their maxima and normalizers, so that the
// threads share the work of a single token and the result does not depend on the thread count.
constexpr int kFewRows = 16;
constexpr int kSegmentKeys = 256;

// One kv head's step over one key tile in attention_few: rows_p query rows (qh, Dp floats a
// row, scaled), keys' K/V rows at k0/v0 + j * step bytes read by RowLoad<V, kKind>; updates the
// rows' running maxima m, normalizers l and outputs ob.
// Query row r of a block (r = t * g + gi <-> token t0 + t, query head hk * g + gi), scaled, into
// dst[0..D); its position and group into *pos and *grp. Returns the position.
inline int32_t query_row(const AttnParams& p, const KvView& kv, int t0, int r, int g, int hk,
                         bool groups, float* dst, int32_t* pos, int32_t* grp) {
    const int t = r / g, gi = r % g, H = p.n_head, D = p.head_dim;
    const float* src = p.q + (size_t(t0 + t) * H + hk * g + gi) * D;
    for (int d = 0; d < D; ++d) dst[d] = src[d] * kv.scale;
    *pos = p.q_pos[t0 + t];
    *grp = groups ? p.q_group[t0 + t] : 0;
    return *pos;
}

// A query block's online-softmax state before its first key tile: output rows 0, running maxima
// -inf, running sums 0 (rows x Dp outputs).
inline void reset_block_state(std::vector<float>& ob, std::vector<float>& m, std::vector<double>& l,
                              int rows, int Dp) {
    std::fill(ob.begin(), ob.begin() + size_t(rows) * Dp, 0.0f);
    std::fill(m.begin(), m.begin() + rows, -INFINITY);
    std::fill(l.begin(), l.begin() + rows, 0.0);
}

// Positions and groups of the KT key slots of the tile at j0 (slots past nk are never visible).
inline void key_slots(const AttnParams& p, bool groups, int j0, int nk, int KT, int32_t* kpos,
                      int32_t* kgrp) {
    for (int j = 0; j < KT; ++j) {
        kpos[j] = j < nk ? p.k_pos[j0 + j] : INT32_MAX;
        kgrp[j] = j < nk && groups ? p.k_group[j0 + j] : -1;
    }
}

template <class V, int kKind>
void few_head_tile(const float* qh, int rows_p, int Dp, const int32_t* rpos, const int32_t* rgrp,
                   const int32_t* kpos, const int32_t* kgrp, int32_t tmin, int32_t tmax,
                   bool plain, bool groups, const char* k0, const char* v0, size_t step, int nk,
                   float* pt, float* alpha, float* m, double* l, float* ob) {
    using F = typename V::F;
    constexpr int L = V::L, NV = V::NV, KT = L * NV, RB = V::RB;
    for (int r = 0; r < rows_p; ++r) {
        float* prow = pt + size_t(r) * KT;
        alpha[r] = 1.0f;
        if (rpos[r] < tmin) {  // nothing visible (and padding rows)
            std::fill(prow, prow + KT, 0.0f);
            continue;
        }
        const float* qr = qh + size_t(r) * Dp;
        F sc[NV];
        for (int v = 0; v < NV; ++v) {
            // L keys' dot products side by side (L independent accumulators, each summed over
            // the head in the same order as one at a time). Keys past nk read row nk - 1 (in
            // bounds); the mask drops them.
            const char* kr[L];
#pragma GCC unroll 16
            for (int jj = 0; jj < L; ++jj) kr[jj] = k0 + size_t(std::min(v * L + jj, nk - 1)) * step;
            F t[L];
#pragma GCC unroll 16
            for (int jj = 0; jj < L; ++jj) t[jj] = V::zero();
            for (int c = 0; c < Dp; c += L) {
                const F qv = V::load(qr + c);
#pragma GCC unroll 16
                for (int jj = 0; jj < L; ++jj)
                    t[jj] = V::fmadd(qv, RowLoad<V, kKind>::at(kr[jj], c), t[jj]);
            }
            sc[v] = V::reduce_lanes(t);
            if (!(plain && tmax <= rpos[r]))
                sc[v] = V::mask(sc[v], kpos + v * L, kgrp + v * L, rpos[r], rgrp[r], groups);
        }
        alpha[r] = softmax_tile<V>(sc, prow, m[r], l[r]);
    }
    for (int r0 = 0; r0 < rows_p; r0 += RB)
        pv_block_rows<V, kKind>(ob, Dp, r0, alpha, pt, v0, step, nk);
}

template <class V>
void attention_few(const AttnParams& p, int n_threads) {
    constexpr int L = V::L, KT = L * V::NV, RB = V::RB, DV = V::DV;
    static_assert(kSegmentKeys % KT == 0, "segments are whole key tiles");
    const int D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv, g = H / Hkv;
    const KvView kv = kv_view(p);  // a plain struct: OpenMP regions capture it
    const int n_q = p.n_q, n_kv = p.n_kv;
    const bool groups = p.k_group != nullptr;
    const int Dp = round_up(D, L * DV);
    // K and V read straight from the cache rows (16-bit ones widened in registers) when the
    // head width needs no padding; else each tile's rows are widened into zero-padded scratch.
    const bool in_place = Dp == D;
    const int kind = !in_place || kv.wide ? 0 : p.kv_dtype == KvDtype::f16 ? 1 : 2;
    const int rows = n_q * g, rows_p = round_up(rows, RB);
    const int n_seg = std::max(1, (n_kv + kSegmentKeys - 1) / kSegmentKeys);
    const int n_tasks = Hkv * n_seg;  // (kv head, segment) pairs: the unit of the result
    // A unit of work is one segment for every kv head when that still leaves each thread
    // several: a key tile's K/V rows then come from memory once for all the heads, which read
    // them one after the other from cache (one head per unit streamed a third of each row, and
    // the cache three times over). Otherwise one unit per (kv head, segment). The arithmetic of
    // each (kv head, segment) is the same either way.
    const bool all_heads = n_threads <= 1 || n_seg >= 4 * n_threads;
    const int hpu = all_heads ? Hkv : 1;  // kv heads per unit
    const int n_units = all_heads ? n_seg : n_tasks;

    // Row r = t * g + gi <-> token t, query head hk * g + gi (the same for every kv head hk);
    // padding rows see no key.
    std::vector<int32_t> rpos(rows_p, INT32_MIN), rgrp(rows_p, 0);
    int32_t max_qpos = INT32_MIN;
    for (int r = 0; r < rows; ++r) {
        rpos[r] = p.q_pos[r / g];
        rgrp[r] = groups ? p.q_group[r / g] : 0;
        max_qpos = std::max(max_qpos, rpos[r]);
    }
    // Each task's running maximum, normalizer and unnormalized output per row.
    std::vector<float> pm(size_t(n_tasks) * rows_p, -INFINITY);
    std::vector<double> pl(size_t(n_tasks) * rows_p, 0.0);
    std::vector<float> po(size_t(n_tasks) * rows_p * Dp, 0.0f);

#pragma omp parallel num_threads(std::min(n_threads, n_units)) if (n_threads > 1 && n_units > 1)
    {
        // Queries of the unit's heads (scaled); widened K/V of a tile, key j's heads at
        // j * wstep (each head Dp floats).
        const size_t wstep = size_t(hpu) * Dp;
        std::vector<float> qb(size_t(hpu) * rows_p * Dp, 0.0f), pt(size_t(rows_p) * KT);
        std::vector<float> kw(in_place ? 0 : size_t(KT) * wstep, 0.0f);
        std::vector<float> vw(in_place ? 0 : size_t(KT) * wstep, 0.0f);
        std::vector<float> alpha(rows_p);
        alignas(64) int32_t kpos[KT];
        alignas(64) int32_t kgrp[KT];
#pragma omp for schedule(dynamic, 1)
        for (int unit = 0; unit < n_units; ++unit) {
            const int seg = all_heads ? unit : unit % n_seg;
            const int h0 = all_heads ? 0 : unit / n_seg;
            for (int hh = 0; hh < hpu; ++hh) {
                for (int r = 0; r < rows; ++r) {
                    const float* src = p.q + (size_t(r / g) * H + (h0 + hh) * g + r % g) * D;
                    float* dst = qb.data() + (size_t(hh) * rows_p + r) * Dp;
                    for (int d = 0; d < D; ++d) dst[d] = src[d] * kv.scale;
                }
            }
            const int a = seg * kSegmentKeys, b = std::min(n_kv, a + kSegmentKeys);
            for (int j0 = a; j0 < b; j0 += KT) {
                const int nk = std::min(KT, b - j0);
                int32_t tmin = INT32_MAX, tmax = INT32_MIN;
                for (int j = 0; j < KT; ++j) {
                    kpos[j] = j < nk ? p.k_pos[j0 + j] : INT32_MAX;
                    kgrp[j] = j < nk && groups ? p.k_group[j0 + j] : -1;
                    if (j < nk) {
                        tmin = std::min(tmin, kpos[j]);
                        tmax = std::max(tmax, kpos[j]);
                    }
                }
                if (tmin > max_qpos) continue;  // every key after every query
                if (!in_place) {
                    for (int j = 0; j < nk; ++j) {
                        const size_t at = ((size_t(j0) + j) * kv.stride + size_t(h0) * D) * kv.esize;
                        for (int hh = 0; hh < hpu; ++hh) {
                            const size_t ah = at + size_t(hh) * D * kv.esize;
                            float* kd = kw.data() + j * wstep + size_t(hh) * Dp;
                            float* vd = vw.data() + j * wstep + size_t(hh) * Dp;
                            V::widen(p.kv_dtype, kv.kbase + ah, D, kd);
                            V::widen(p.kv_dtype, kv.vbase + ah, D, vd);
                        }
                    }
                }
                const bool plain = !groups && nk == KT;
                for (int hh = 0; hh < hpu; ++hh) {
                    const int hk = h0 + hh, task = hk * n_seg + seg;
                    float* m = pm.data() + size_t(task) * rows_p;
                    double* l = pl.data() + size_t(task) * rows_p;
                    float* ob = po.data() + size_t(task) * rows_p * Dp;
                    const size_t at = (size_t(j0) * kv.stride + size_t(hk) * D) * kv.esize;
                    const char* k0 = in_place ? kv.kbase + at
                                              : reinterpret_cast<const char*>(kw.data() + hh * Dp);
                    const char* v0 = in_place ? kv.vbase + at
                                              : reinterpret_cast<const char*>(vw.data() + hh * Dp);
                    const size_t step = in_place ? kv.stride * kv.esize : wstep * sizeof(float);
                    const float* qh = qb.data() + size_t(hh) * rows_p * Dp;
                    auto run = [&](auto kind_c) {
                        few_head_tile<V, decltype(kind_c)::value>(
                            qh, rows_p, Dp, rpos.data(), rgrp.data(), kpos, kgrp, tmin, tmax,
                            plain, groups, k0, v0, step, nk, pt.data(), alpha.data(), m, l, ob);
                    };
                    if (kind == 1) {
                        run(std::integral_constant<int, 1>{});
                    } else if (kind == 2) {
                        run(std::integral_constant<int, 2>{});
                    } else {
                        run(std::integral_constant<int, 0>{});
                    }
                }
            }
        }
    }

    // Merge the segments of each (row, kv head) in segment order.
    for (int hk = 0; hk < Hkv; ++hk) {
        for (int r = 0; r < rows; ++r) {
            const int t = r / g, h = hk * g + r % g;
            float mmax = -INFINITY;
            for (int s = 0; s < n_seg; ++s)
                mmax = std::max(mmax, pm[size_t(hk * n_seg + s) * rows_p + r]);
            float* dst = p.out + (size_t(t) * H + h) * D;
            if (mmax == -INFINITY) {
                std::fill(dst, dst + D, 0.0f);
                if (p.lse) p.lse[size_t(t) * H + h] = -INFINITY;
                continue;
            }
            double lsum = 0.0;
            std::vector<double> acc(D, 0.0);
            for (int s = 0; s < n_seg; ++s) {
                const size_t task = size_t(hk * n_seg + s);
                const float ms = pm[task * rows_p + r];
                if (ms == -INFINITY) continue;
                const double w = std::exp(double(ms) - double(mmax));
                lsum += pl[task * rows_p + r] * w;
                const float* o = po.data() + (task * rows_p + r) * Dp;
                for (int d = 0; d < D; ++d) acc[d] += double(o[d]) * w;
            }
            for (int d = 0; d < D; ++d) dst[d] = float(acc[d] / lsum);
            if (p.lse) p.lse[size_t(t) * H + h] = mmax + float(std::log(lsum));
        }
    }
}

template <class V>
void attention(const AttnParams& p, int n_threads) {
    using F = typename V::F;
    constexpr int L = V::L, NV = V::NV, KT = L * NV, RB = V::RB, DV = V::DV;
    const int D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv;
    IF_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0, "attention: bad head counts");
    const KvView kv = kv_view(p);  // a plain struct: OpenMP regions capture it
    IF_CHECK(kv.wide ? (p.n_kv == 0 || (p.k && p.v)) : (p.n_kv == 0 || (p.k16 && p.v16)),
             "attention: k/v missing for kv_dtype " << kv_dtype_name(p.kv_dtype));
    const int g = H / Hkv;
    const int n_q = p.n_q, n_kv = p.n_kv;
    if (n_q == 0) return;
    const bool groups = p.k_group != nullptr;
    IF_CHECK(!groups || p.q_group, "attention: k_group given without q_group");
    if (n_q * g <= kFewRows) return attention_few<V>(p, n_threads);
    const int Dp = round_up(D, L * DV);  // padded head width (zeros), a whole number of blocks
    const bool v_in_place = kv.wide && Dp == D;  // P·V reads the fp32 cache rows directly

    // Position range of each key tile: the cut-off that skips a tile for a query block.
    const int n_tiles = (n_kv + KT - 1) / KT;
    std::vector<int32_t> tmin(n_tiles, INT32_MAX), tmax(n_tiles, INT32_MIN);
    for (int j = 0; j < n_kv; ++j) {
        tmin[j / KT] = std::min(tmin[j / KT], p.k_pos[j]);
        tmax[j / KT] = std::max(tmax[j / KT], p.k_pos[j]);
    }
    const int n_qblocks = (n_q + kQueryBlock - 1) / kQueryBlock;
    const int n_tasks = n_qblocks * Hkv;

#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        // Sized for this call's query blocks (decode: one token, g rows).
        const int max_rows = round_up(std::min(kQueryBlock, n_q) * g, RB);
        std::vector<float> qb(size_t(max_rows) * Dp, 0.0f), ob(size_t(max_rows) * Dp);
        std::vector<float> pt(size_t(max_rows) * KT), kt(size_t(D) * KT, 0.0f);
        std::vector<float> vt(v_in_place ? 0 : size_t(KT) * Dp, 0.0f), alpha(max_rows), m(max_rows);
        std::vector<double> l(max_rows);
        std::vector<int32_t> rpos(max_rows), rgrp(max_rows);
        std::vector<float> kw(kv.wide ? 0 : size_t(KT) * D);  // a tile's K widened to fp32
        alignas(64) int32_t kpos[KT];
        alignas(64) int32_t kgrp[KT];

        // Later query blocks see more keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < n_tasks; ++task) {
            const int qblk = n_qblocks - 1 - task / Hkv;
            const int hk = task % Hkv;
            const int t0 = qblk * kQueryBlock;
            const int nt = std::min(kQueryBlock, n_q - t0);
            const int rows = nt * g, rows_p = round_up(rows, RB);

            // Row r = t * g + gi <-> token t0 + t, query head hk * g + gi. Padding rows see
            // no key (position INT32_MIN).
            int32_t max_qpos = INT32_MIN;
            for (int r = 0; r < rows_p; ++r) {
                float* dst = qb.data() + size_t(r) * Dp;
                if (r < rows) {
                    max_qpos = std::max(max_qpos, query_row(p, kv, t0, r, g, hk, groups, dst,
                                                            &rpos[r], &rgrp[r]));
                } else {
                    std::fill(dst, dst + D, 0.0f);
                    rpos[r] = INT32_MIN;
                    rgrp[r] = 0;
                }
            }
            reset_block_state(ob, m, l, rows_p, Dp);

            for (int ti = 0; ti < n_tiles; ++ti) {
                if (tmin[ti] > max_qpos) continue;  // every key after every query of the block
                const int j0 = ti * KT, nk = std::min(KT, n_kv - j0);
                key_slots(p, groups, j0, nk, KT, kpos, kgrp);
                // K^T [D, KT] of the tile in fp32 (transposed from the cache rows, or from
                // their widened copies); V [KT, Dp] in fp32 — read in place from an fp32 cache
                // whose head width needs no padding, else widened into vt.
                for (int j = 0; j < nk && (!kv.wide || !v_in_place); ++j) {
                    const size_t at = ((size_t(j0) + j) * kv.stride + size_t(hk) * D) * kv.esize;
                    if (!kv.wide) V::widen(p.kv_dtype, kv.kbase + at, D, kw.data() + size_t(j) * D);
                    if (!v_in_place)
                        V::widen(p.kv_dtype, kv.vbase + at, D, vt.data() + size_t(j) * Dp);
                }
                if (kv.wide) {
                    transpose_tile<V>(reinterpret_cast<const float*>(kv.kbase) +
                                          size_t(j0) * kv.stride + size_t(hk) * D,
                                      kv.stride, nk, D, kt.data(), KT);
                } else {
                    transpose_tile<V>(kw.data(), size_t(D), nk, D, kt.data(), KT);
                }
                if (!v_in_place) {
                    for (int j = nk; j < KT; ++j) {  // P is 0 there; keep V finite
                        std::fill(vt.begin() + size_t(j) * Dp, vt.begin() + size_t(j) * Dp + D,
                                  0.0f);
                    }
                }
                // Row j of the tile's V: the cache row itself, or its widened copy in vt.
                const float* v0 = v_in_place ? reinterpret_cast<const float*>(kv.vbase) +
                                                   size_t(j0) * kv.stride + size_t(hk) * D
                                             : vt.data();
                const size_t vstep = v_in_place ? kv.stride : size_t(Dp);
                // Rows that see every key of the tile need no mask (most of a causal prefill).
                const bool plain = !groups && nk == KT;

                for (int r0 = 0; r0 < rows_p; r0 += RB) {
                    bool live = false;
#pragma GCC unroll 16
                    for (int r = 0; r < RB; ++r) live = live || rpos[r0 + r] >= tmin[ti];
                    if (!live) continue;
                    // Scores of RB rows x KT keys, in registers.
                    F acc[RB][NV];
#pragma GCC unroll 16
                    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
                        for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
                    const float* q0 = qb.data() + size_t(r0) * Dp;
                    for (int d = 0; d < D; ++d) {
                        F kv[NV];
#pragma GCC unroll 16
                        for (int v = 0; v < NV; ++v)
                            kv[v] = V::load(kt.data() + size_t(d) * KT + v * L);
#pragma GCC unroll 16
                        for (int r = 0; r < RB; ++r) {
                            const F b = V::set1(q0[size_t(r) * Dp + d]);
#pragma GCC unroll 16
                            for (int v = 0; v < NV; ++v) acc[r][v] = V::fmadd(b, kv[v], acc[r][v]);
                        }
                    }
// Mask, tile maximum, exp and sum while the scores are in registers.
#pragma GCC unroll 16
                    for (int r = 0; r < RB; ++r) {
                        const int row = r0 + r;
                        float* prow = pt.data() + size_t(row) * KT;
                        if (!(plain && tmax[ti] <= rpos[row])) {
#pragma GCC unroll 16
                            for (int v = 0; v < NV; ++v)
                                acc[r][v] = V::mask(acc[r][v], kpos + v * L, kgrp + v * L,
                                                    rpos[row], rgrp[row], groups);
                        }
                        alpha[row] = softmax_tile<V>(acc[r], prow, m[row], l[row]);
                    }
                    pv_block<V>(ob.data(), Dp, r0, alpha.data(), pt.data(), v0, vstep, nk);
                }
            }

            for (int r = 0; r < rows; ++r) {
                const int t = r / g, h = hk * g + r % g;
                float* dst = p.out + (size_t(t0 + t) * H + h) * D;
                const float* o = ob.data() + size_t(r) * Dp;
                if (l[r] > 0.0) {
                    const float inv = float(1.0 / l[r]);
                    for (int d = 0; d < D; ++d) dst[d] = o[d] * inv;
                    if (p.lse) p.lse[size_t(t0 + t) * H + h] = m[r] + float(std::log(l[r]));
                } else {
                    std::fill(dst, dst + D, 0.0f);
                    if (p.lse) p.lse[size_t(t0 + t) * H + h] = -INFINITY;
                }
            }
        }
    }
}

// ---- many rows on AMX tiles (cpu.isa = amx) ----
// attention<V> with Q·Kᵀ on bf16 tiles (amx_tiles.h) and the rest unchanged in fp32: every key
// tile's K is rounded to bf16 in the VNNI pair layout ([Dk/2][KT][2]) and its V widened to fp32
// ([KT][Dp]) once per call; per task (query block, kv head), key tile and group of 16 query rows,
// S = Q·Kᵀ (scaled Q rounded to bf16) is accumulated in fp32 tiles over the head in steps of 32,
// then masked, exponentiated (softmax_tile) and multiplied with V (pv_block) as in attention<V>.
// A score depends on its query and its key alone, in a fixed order: neither the other rows of
// its tile nor which keys share the call change it.
// P·V stays in fp32: with P rounded to bf16 relative to the running maximum, a key set split over
// ranks (partials merged by LSE, docs/design.md §5.3) rounds P against other maxima than one call
// over all keys, a 2^-9-relative difference where fp32 gives ~1e-7; on the §6.4 near-tie request
// that moved 2 recomputed tokens of 2 ranks against parallel.emulate_ranks = 2 (cacheblend) and
// the first-token logits by more than 1e-4 (tests/mpi/test_sp_real.cpp on emulated tiles).
// Calls with few rows (decode) keep attention_few. Tiles: score accumulators 0..3, A 4, B 5.
template <class V>
void attention_tiles(const AttnParams& p, int n_threads, const AmxTileOps& tiles) {
    using F = typename V::F;
    constexpr int L = V::L, NV = V::NV, KT = L * NV, RB = V::RB, DV = V::DV, TR = kAmxTileRows;
    static_assert(KT % 32 == 0 && KT / 16 <= 4, "a key tile is whole k steps and 4 score tiles");
    static_assert(TR % RB == 0, "a group of tile rows is whole register blocks");
    const int D = p.head_dim, H = p.n_head, Hkv = p.n_head_kv;
    IF_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0, "attention: bad head counts");
    const KvView kv = kv_view(p);
    IF_CHECK(kv.wide ? (p.n_kv == 0 || (p.k && p.v)) : (p.n_kv == 0 || (p.k16 && p.v16)),
             "attention: k/v missing for kv_dtype " << kv_dtype_name(p.kv_dtype));
    const int g = H / Hkv;
    const int n_q = p.n_q, n_kv = p.n_kv;
    if (n_q == 0) return;
    const bool groups = p.k_group != nullptr;
    IF_CHECK(!groups || p.q_group, "attention: k_group given without q_group");
    if (n_q * g <= kFewRows) return attention_few<V>(p, n_threads);
    const int Dk = round_up(D, 32);      // the head as k steps of Q·Kᵀ (zeros past D)
    const int Dp = round_up(D, L * DV);  // padded head width of V and the output (pv_block)

    const int n_tiles = (n_kv + KT - 1) / KT;
    std::vector<int32_t> tmin(n_tiles, INT32_MAX), tmax(n_tiles, INT32_MIN);
    for (int j = 0; j < n_kv; ++j) {
        tmin[j / KT] = std::min(tmin[j / KT], p.k_pos[j]);
        tmax[j / KT] = std::max(tmax[j / KT], p.k_pos[j]);
    }
    const int n_qblocks = (n_q + kQueryBlock - 1) / kQueryBlock;
    const int n_tasks = n_qblocks * Hkv;

    // Every key tile's K (bf16, as B of Q·Kᵀ: kpack[(d / 2) * 2 KT + j * 2 + d % 2]) and V
    // (fp32, [KT][Dp]) of every kv head, once per call (not once per query block); keys past
    // n_kv and columns past D are zeros.
    const size_t k_tile = size_t(Dk) * KT, v_tile = size_t(KT) * Dp;
    std::vector<uint16_t> kpack(size_t(Hkv) * n_tiles * k_tile);
    std::vector<float> vpack(size_t(Hkv) * n_tiles * v_tile);
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        std::vector<float> kw(D);
#pragma omp for schedule(static)
        for (int u = 0; u < Hkv * n_tiles; ++u) {
            const int hk = u / n_tiles, j0 = (u % n_tiles) * KT, nk = std::min(KT, n_kv - j0);
            uint16_t* kb = kpack.data() + size_t(u) * k_tile;
            float* vb = vpack.data() + size_t(u) * v_tile;
            for (int j = 0; j < nk; ++j) {
                const size_t at = ((size_t(j0) + j) * kv.stride + size_t(hk) * D) * kv.esize;
                V::widen(p.kv_dtype, kv.kbase + at, D, kw.data());
                V::widen(p.kv_dtype, kv.vbase + at, D, vb + size_t(j) * Dp);
                for (int d = 0; d < D; ++d)
                    kb[size_t(d / 2) * 2 * KT + j * 2 + d % 2] = fp32_to_bf16(kw[d]);
            }
        }
    }

#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        const int max_rows = round_up(std::min(kQueryBlock, n_q) * g, TR);
        std::vector<uint16_t> qb(size_t(max_rows) * Dk);
        std::vector<float> qrow(D), sc_buf(size_t(TR) * KT), pt(size_t(max_rows) * KT);
        std::vector<float> ob(size_t(max_rows) * Dp), alpha(max_rows), m(max_rows);
        std::vector<double> l(max_rows);
        std::vector<int32_t> rpos(max_rows), rgrp(max_rows);
        alignas(64) int32_t kpos[KT];
        alignas(64) int32_t kgrp[KT];
        tiles.config(amx_full_tiles());

#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < n_tasks; ++task) {
            const int qblk = n_qblocks - 1 - task / Hkv;
            const int hk = task % Hkv;
            const int t0 = qblk * kQueryBlock;
            const int nt = std::min(kQueryBlock, n_q - t0);
            const int rows = nt * g, rows_t = round_up(rows, TR);

            // Row r = t * g + gi <-> token t0 + t, query head hk * g + gi, scaled, in bf16.
            // Padding rows are zeros and see no key (position INT32_MIN).
            int32_t max_qpos = INT32_MIN;
            std::fill(qb.begin(), qb.begin() + size_t(rows_t) * Dk, uint16_t(0));
            for (int r = 0; r < rows_t; ++r) {
                if (r < rows) {
                    max_qpos = std::max(max_qpos, query_row(p, kv, t0, r, g, hk, groups,
                                                            qrow.data(), &rpos[r], &rgrp[r]));
                    fp32_to_bf16_rows(qrow.data(), D, qb.data() + size_t(r) * Dk);
                } else {
                    rpos[r] = INT32_MIN;
                    rgrp[r] = 0;
                }
            }
            reset_block_state(ob, m, l, rows_t, Dp);

            for (int ti = 0; ti < n_tiles; ++ti) {
                if (tmin[ti] > max_qpos) continue;  // every key after every query of the block
                const int j0 = ti * KT, nk = std::min(KT, n_kv - j0);
                key_slots(p, groups, j0, nk, KT, kpos, kgrp);
                const uint16_t* kb = kpack.data() + (size_t(hk) * n_tiles + ti) * k_tile;
                const float* vb = vpack.data() + (size_t(hk) * n_tiles + ti) * v_tile;
                const bool plain = !groups && nk == KT;

                for (int rg = 0; rg < rows_t; rg += TR) {
                    bool live = false;
                    for (int r = 0; r < TR; ++r) live = live || rpos[rg + r] >= tmin[ti];
                    if (!live) continue;
                    // S: TR rows x KT keys in KT / 16 accumulator tiles.
                    for (int i = 0; i < KT / 16; ++i) tiles.zero(i);
                    for (int d0 = 0; d0 < Dk; d0 += 32) {
                        tiles.load(4, qb.data() + size_t(rg) * Dk + d0, int64_t(Dk) * 2);
                        for (int i = 0; i < KT / 16; ++i) {
                            tiles.load(5, kb + size_t(d0 / 2) * 2 * KT + i * 32, int64_t(KT) * 4);
                            tiles.dpbf16ps(i, 4, 5);
                        }
                    }
                    for (int i = 0; i < KT / 16; ++i)
                        tiles.store(i, sc_buf.data() + i * 16, int64_t(KT) * 4);
                    // Mask, tile maximum, exp and sum per row in fp32, then P·V in fp32.
                    for (int r = 0; r < TR; ++r) {
                        const int row = rg + r;
                        F sc[NV];
                        for (int v = 0; v < NV; ++v)
                            sc[v] = V::load(sc_buf.data() + size_t(r) * KT + v * L);
                        if (!(plain && tmax[ti] <= rpos[row])) {
                            for (int v = 0; v < NV; ++v)
                                sc[v] = V::mask(sc[v], kpos + v * L, kgrp + v * L, rpos[row],
                                                rgrp[row], groups);
                        }
                        alpha[row] =
                            softmax_tile<V>(sc, pt.data() + size_t(row) * KT, m[row], l[row]);
                    }
                    for (int r0 = rg; r0 < rg + TR; r0 += RB)
                        pv_block<V>(ob.data(), Dp, r0, alpha.data(), pt.data(), vb, size_t(Dp), nk);
                }
            }

            for (int r = 0; r < rows; ++r) {
                const int t = r / g, h = hk * g + r % g;
                float* dst = p.out + (size_t(t0 + t) * H + h) * D;
                const float* o = ob.data() + size_t(r) * Dp;
                if (l[r] > 0.0) {
                    const float inv = float(1.0 / l[r]);
                    for (int d = 0; d < D; ++d) dst[d] = o[d] * inv;
                    if (p.lse) p.lse[size_t(t0 + t) * H + h] = m[r] + float(std::log(l[r]));
                } else {
                    std::fill(dst, dst + D, 0.0f);
                    if (p.lse) p.lse[size_t(t0 + t) * H + h] = -INFINITY;
                }
            }
        }
        tiles.release();
    }
}

}  // namespace infoflow::cpu::tiled
