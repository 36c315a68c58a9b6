#include "runtime/method/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace infoflow {
namespace {

constexpr int kGroup8 = 64, kGroup4 = 32;

// Header of a group: the fp16 step (int8), or the fp16 minimum then step (int4).
size_t header_bytes(KvCodec c) { return c == KvCodec::int8 ? 2 : 4; }
size_t code_bytes(KvCodec c, size_t g) { return c == KvCodec::int8 ? g : (g + 1) / 2; }

void put_half(uint8_t* at, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(at, &h, 2);
}
float get_half(const uint8_t* at) {
    uint16_t h;
    std::memcpy(&h, at, 2);
    return fp16_to_fp32(h);
}

// Codes are rounded with the step as stored (fp16), so decoding sees the step encoding used.
void encode8(const float* x, size_t g, uint8_t* out) {
    float amax = 0.0f;
    for (size_t i = 0; i < g; ++i) amax = std::max(amax, std::fabs(x[i]));
    put_half(out, amax / 127.0f);
    const float s = get_half(out);
    int8_t* q = reinterpret_cast<int8_t*>(out + 2);
    for (size_t i = 0; i < g; ++i) {
        const float r = s > 0.0f ? std::nearbyint(x[i] / s) : 0.0f;
        q[i] = int8_t(std::clamp(r, -127.0f, 127.0f));
    }
}
void decode8(const uint8_t* in, size_t g, float* x) {
    const float s = get_half(in);
    const int8_t* q = reinterpret_cast<const int8_t*>(in + 2);
    for (size_t i = 0; i < g; ++i) x[i] = float(q[i]) * s;
}

void encode4(const float* x, size_t g, uint8_t* out) {
    float lo = x[0], hi = x[0];
    for (size_t i = 1; i < g; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    put_half(out, lo);
    const float m = get_half(out);
    put_half(out + 2, (hi - m) / 15.0f);
    const float s = get_half(out + 2);
    uint8_t* q = out + 4;
    std::memset(q, 0, code_bytes(KvCodec::int4, g));
    for (size_t i = 0; i < g; ++i) {
        const float r = s > 0.0f ? std::nearbyint((x[i] - m) / s) : 0.0f;
        const uint8_t c = uint8_t(std::clamp(r, 0.0f, 15.0f));
        q[i / 2] |= uint8_t(i % 2 ? c << 4 : c);
    }
}
// `scale` (a power of two: exact) multiplies every value (int4h's 1/D, folded in here).
void decode4(const uint8_t* in, size_t g, float* x, float scale = 1.0f) {
    const float m = get_half(in) * scale, s = get_half(in + 2) * scale;
    const uint8_t* q = in + 4;
    for (size_t j = 0; j < g / 2; ++j) {
        x[2 * j] = m + float(q[j] & 0xF) * s;
        x[2 * j + 1] = m + float(q[j] >> 4) * s;
    }
    if (g % 2) x[g - 1] = m + float(q[g / 2] & 0xF) * s;
}

// In place: x = H_d x (unnormalized fast Walsh-Hadamard transform, d a power of two): stage
// len = 1, 2, 4, .., each pair (j, j + len) becoming (a + b, a - b).
void hadamard(float* x, int d) {
    for (int len = 1; len < d; len *= 2) {
        for (int i = 0; i < d; i += 2 * len) {
            for (int j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
        }
    }
}

// The same on nv vectors at once (x: [nv, d]), through a transposed copy ([d, nv]) so that every
// stage is whole-array adds: the same sums in the same order, so the same bits as hadamard().
void hadamard_rows(float* x, int nv, int d, std::vector<float>& t) {
    t.resize(size_t(d) * nv);
    for (int v = 0; v < nv; ++v) {
        for (int i = 0; i < d; ++i) t[size_t(i) * nv + v] = x[size_t(v) * d + i];
    }
    for (int len = 1; len < d; len *= 2) {
        for (int i = 0; i < d; i += 2 * len) {
            for (int j = i; j < i + len; ++j) {
                float* a = t.data() + size_t(j) * nv;
                float* b = t.data() + size_t(j + len) * nv;
                for (int v = 0; v < nv; ++v) {
                    const float p = a[v], q = b[v];
                    a[v] = p + q;
                    b[v] = p - q;
                }
            }
        }
    }
    for (int v = 0; v < nv; ++v) {
        for (int i = 0; i < d; ++i) x[size_t(v) * d + i] = t[size_t(i) * nv + v];
    }
}

// The codes of already turned values (no turn here), and their values times `scale`.
void encode_values(KvCodec c, const float* x, size_t n, uint8_t* out) {
    const size_t g = size_t(c == KvCodec::int8 ? kGroup8 : kGroup4);
    for (size_t at = 0; at < n; at += g) {
        const size_t len = std::min(g, n - at);
        if (c == KvCodec::int8) {
            encode8(x + at, len, out);
        } else {
            encode4(x + at, len, out);
        }
        out += header_bytes(c) + code_bytes(c, len);
    }
}
void decode_values(KvCodec c, const uint8_t* in, size_t n, float* x, float scale) {
    const size_t g = size_t(c == KvCodec::int8 ? kGroup8 : kGroup4);
    for (size_t at = 0; at < n; at += g) {
        const size_t len = std::min(g, n - at);
        if (c == KvCodec::int8) {
            decode8(in, len, x + at);
        } else {
            decode4(in, len, x + at, scale);
        }
        in += header_bytes(c) + code_bytes(c, len);
    }
}

bool power_of_two(int d) { return d > 0 && (d & (d - 1)) == 0; }

}  // namespace

void check_kv_codec(KvCodec c, int head_dim) {
    IF_CHECK(c != KvCodec::int4h || power_of_two(head_dim),
             "the int4h codes (parallel.exchange = \"compact-int4h\") turn each head by a "
             "Hadamard matrix, for a power-of-two head_dim only; head_dim "
                 << head_dim << " is not implemented yet");
}

int kv_codec_group(KvCodec c) { return c == KvCodec::int8 ? kGroup8 : kGroup4; }

size_t kv_codec_bytes(KvCodec c, size_t n) {
    const size_t g = size_t(kv_codec_group(c));
    const size_t full = n / g, rest = n % g;
    size_t b = full * (header_bytes(c) + code_bytes(c, g));
    if (rest > 0) b += header_bytes(c) + code_bytes(c, rest);
    return b;
}

void kv_encode(KvCodec c, const float* x, size_t n, int head_dim, uint8_t* out) {
    std::vector<float> turned;
    if (c == KvCodec::int4h) {  // each head turned, then coded as int4
        check_kv_codec(c, head_dim);
        turned.assign(x, x + n);
        for (size_t h = 0; h + size_t(head_dim) <= n; h += size_t(head_dim)) {
            hadamard(turned.data() + h, head_dim);
        }
        x = turned.data();
    }
    encode_values(c, x, n, out);
}

void kv_decode(KvCodec c, const uint8_t* in, size_t n, int head_dim, float* x) {
    if (c == KvCodec::int4h) check_kv_codec(c, head_dim);
    // int4h: x = H_D y / D; the 1/D (a power of two) goes into the decoded values first, which
    // gives the same bits as dividing after the transform.
    decode_values(c, in, n, x, c == KvCodec::int4h ? 1.0f / float(head_dim) : 1.0f);
    if (c != KvCodec::int4h) return;
    for (size_t h = 0; h + size_t(head_dim) <= n; h += size_t(head_dim)) hadamard(x + h, head_dim);
}

size_t kv_codec_slot_bytes(KvCodec c, const KvCache& cache) {
    return 2 * kv_codec_bytes(c, size_t(cache.row()));
}

namespace {

// Rows travel between the cache and the codes a few runs of slots at a time, through scratch
// that stays in cache (the backend's memory and a host copy of it), so the whole context is
// never held twice.
constexpr int kBatchRows = 128;

struct RowScratch {
    RowScratch(Backend& be, size_t row)
        : k(be.alloc_floats(kBatchRows * row)),
          v(be.alloc_floats(kBatchRows * row)),
          hk(kBatchRows * row),
          hv(kBatchRows * row) {}
    Buffer k, v;
    std::vector<float> hk, hv, t;  // t: int4h's transposed heads
};

}  // namespace

void encode_cache_rows(KvCodec c, const KvCache& cache, int layer,
                       const std::vector<int32_t>& slots, uint8_t* out) {
    const int n = int(slots.size());
    if (n == 0) return;
    const int hd = cache.head_dim();
    check_kv_codec(c, hd);
    const size_t row = size_t(cache.row()), rb = kv_codec_bytes(c, row);
    Backend& be = cache.backend();
    RowScratch w(be, row);
    for (int at = 0; at < n; at += kBatchRows) {
        const int m = std::min(kBatchRows, n - at);
        cache.read_rows(layer, slots.data() + at, w.k.data(), w.v.data(), m);
        be.download(w.hk.data(), w.k.data(), size_t(m) * row * sizeof(float));
        be.download(w.hv.data(), w.v.data(), size_t(m) * row * sizeof(float));
        if (c == KvCodec::int4h) {  // every head of the batch turned at once (kv_encode's bits)
            hadamard_rows(w.hk.data(), m * int(row) / hd, hd, w.t);
            hadamard_rows(w.hv.data(), m * int(row) / hd, hd, w.t);
        }
        for (int i = 0; i < m; ++i) {
            encode_values(c, w.hk.data() + size_t(i) * row, row, out);
            encode_values(c, w.hv.data() + size_t(i) * row, row, out + rb);
            out += 2 * rb;
        }
    }
}

void decode_cache_rows(KvCodec c, const uint8_t* in, int layer, const std::vector<int32_t>& slots,
                       KvCache& cache) {
    const int n = int(slots.size());
    if (n == 0) return;
    const int hd = cache.head_dim();
    check_kv_codec(c, hd);
    const float scale = c == KvCodec::int4h ? 1.0f / float(hd) : 1.0f;  // as kv_decode
    const size_t row = size_t(cache.row()), rb = kv_codec_bytes(c, row);
    Backend& be = cache.backend();
    RowScratch w(be, row);
    for (int at = 0; at < n; at += kBatchRows) {
        const int m = std::min(kBatchRows, n - at);
        for (int i = 0; i < m; ++i) {
            decode_values(c, in, row, w.hk.data() + size_t(i) * row, scale);
            decode_values(c, in + rb, row, w.hv.data() + size_t(i) * row, scale);
            in += 2 * rb;
        }
        if (c == KvCodec::int4h) {  // every head of the batch turned back at once
            hadamard_rows(w.hk.data(), m * int(row) / hd, hd, w.t);
            hadamard_rows(w.hv.data(), m * int(row) / hd, hd, w.t);
        }
        be.upload(w.k.data(), w.hk.data(), size_t(m) * row * sizeof(float));
        be.upload(w.v.data(), w.hv.data(), size_t(m) * row * sizeof(float));
        cache.write_rows(layer, slots.data() + at, w.k.data(), w.v.data(), m);
    }
}

void round_trip_cache_rows(KvCodec c, KvCache& cache, const std::vector<int32_t>& slots) {
    std::vector<uint8_t> codes(slots.size() * kv_codec_slot_bytes(c, cache));
    for (int l = 0; l < cache.n_layer(); ++l) {
        encode_cache_rows(c, cache, l, slots, codes.data());
        decode_cache_rows(c, codes.data(), l, slots, cache);
    }
}

KvCodec exchange_kv_codec(Config::Exchange ex) {
    switch (ex) {
        case Config::Exchange::compact_int8:
            return KvCodec::int8;
        case Config::Exchange::compact_int4:
            return KvCodec::int4;
        case Config::Exchange::compact_int4h:
            return KvCodec::int4h;
        default:
            IF_FAIL("parallel.exchange = \"" << to_string(ex) << "\" sends no codes");
    }
}

}  // namespace infoflow
