#include "runtime/method/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
void decode4(const uint8_t* in, size_t g, float* x) {
    const float m = get_half(in), s = get_half(in + 2);
    const uint8_t* q = in + 4;
    for (size_t j = 0; j < g / 2; ++j) {
        x[2 * j] = m + float(q[j] & 0xF) * s;
        x[2 * j + 1] = m + float(q[j] >> 4) * s;
    }
    if (g % 2) x[g - 1] = m + float(q[g / 2] & 0xF) * s;
}

}  // namespace

int kv_codec_group(KvCodec c) { return c == KvCodec::int8 ? kGroup8 : kGroup4; }

size_t kv_codec_bytes(KvCodec c, size_t n) {
    const size_t g = size_t(kv_codec_group(c));
    const size_t full = n / g, rest = n % g;
    size_t b = full * (header_bytes(c) + code_bytes(c, g));
    if (rest > 0) b += header_bytes(c) + code_bytes(c, rest);
    return b;
}

void kv_encode(KvCodec c, const float* x, size_t n, uint8_t* out) {
    const size_t g = size_t(kv_codec_group(c));
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

void kv_decode(KvCodec c, const uint8_t* in, size_t n, float* x) {
    const size_t g = size_t(kv_codec_group(c));
    for (size_t at = 0; at < n; at += g) {
        const size_t len = std::min(g, n - at);
        if (c == KvCodec::int8) {
            decode8(in, len, x + at);
        } else {
            decode4(in, len, x + at);
        }
        in += header_bytes(c) + code_bytes(c, len);
    }
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
    std::vector<float> hk, hv;
};

}  // namespace

void encode_cache_rows(KvCodec c, const KvCache& cache, int layer,
                       const std::vector<int32_t>& slots, uint8_t* out) {
    const int n = int(slots.size());
    if (n == 0) return;
    const size_t row = size_t(cache.row()), rb = kv_codec_bytes(c, row);
    Backend& be = cache.backend();
    RowScratch w(be, row);
    for (int at = 0; at < n; at += kBatchRows) {
        const int m = std::min(kBatchRows, n - at);
        cache.read_rows(layer, slots.data() + at, w.k.data(), w.v.data(), m);
        be.download(w.hk.data(), w.k.data(), size_t(m) * row * sizeof(float));
        be.download(w.hv.data(), w.v.data(), size_t(m) * row * sizeof(float));
        for (int i = 0; i < m; ++i) {
            kv_encode(c, w.hk.data() + size_t(i) * row, row, out);
            kv_encode(c, w.hv.data() + size_t(i) * row, row, out + rb);
            out += 2 * rb;
        }
    }
}

void decode_cache_rows(KvCodec c, const uint8_t* in, int layer, const std::vector<int32_t>& slots,
                       KvCache& cache) {
    const int n = int(slots.size());
    if (n == 0) return;
    const size_t row = size_t(cache.row()), rb = kv_codec_bytes(c, row);
    Backend& be = cache.backend();
    RowScratch w(be, row);
    for (int at = 0; at < n; at += kBatchRows) {
        const int m = std::min(kBatchRows, n - at);
        for (int i = 0; i < m; ++i) {
            kv_decode(c, in, row, w.hk.data() + size_t(i) * row);
            kv_decode(c, in + rb, row, w.hv.data() + size_t(i) * row);
            in += 2 * rb;
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

}  // namespace infoflow
