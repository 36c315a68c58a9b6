// libFuzzer target: SmolLM2's tokenizer (the real vocabulary, from the model file) on arbitrary
// text. Properties: encode never fails; every id is in the vocabulary; for valid UTF-8 text
// without special-token parsing, decode(encode(text)) == the text less the bytes the vocabulary
// has no byte token for (SmolLM2 lacks some control bytes; encode drops them, as llama.cpp and
// HF do), and the streaming decoder yields the same text as decode. The first input byte
// selects parse_special. Seeds: tests/fuzz/corpus/tokenizer_encode.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace infoflow;

namespace {

const Tokenizer& tokenizer() {
    static const std::unique_ptr<Tokenizer> tok = [] {
        const char* env = std::getenv("INFOFLOW_FUZZ_MODEL");
        GgufFile f(env && *env ? env : INFOFLOW_MODEL_PATH);
        return std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
    }();
    return *tok;
}

// GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the rest to U+0100...
std::string byte_token(int b) {
    auto printable = [](int c) {
        return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    };
    int cp = b;
    if (!printable(b)) {
        int n = 0;
        for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

// The bytes of `s` that have a byte token (what encode keeps).
std::string tokenizable(const Tokenizer& tok, const std::string& s) {
    static const std::vector<bool> has = [&] {
        std::vector<bool> h(256);
        for (int b = 0; b < 256; ++b) h[b] = tok.token_id(byte_token(b)) >= 0;
        return h;
    }();
    std::string kept;
    for (unsigned char c : s) {
        if (has[c]) kept += char(c);
    }
    return kept;
}

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    while (i < s.size()) {
        const unsigned c = p[i];
        size_t len = c < 0x80                   ? 1
                     : (c >= 0xC2 && c <= 0xDF) ? 2
                     : (c >= 0xE0 && c <= 0xEF) ? 3
                     : (c >= 0xF0 && c <= 0xF4) ? 4
                                                : 0;
        if (len == 0 || i + len > s.size()) return false;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (len > 1 && (p[i + 1] < lo || p[i + 1] > hi)) return false;
        for (size_t k = 2; k < len; ++k) {
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
        }
        i += len;
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    tokenizer();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const bool parse_special = data[0] & 1;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    const Tokenizer& tok = tokenizer();
    fuzz::expect_parse_or_error([&] {
        const std::vector<int32_t> ids = tok.encode(text, parse_special);
        for (int32_t id : ids) fuzz::require(id >= 0 && id < tok.n_vocab(), "id in vocabulary");
        const std::string back = tok.decode(ids, false);
        if (!parse_special && valid_utf8(text)) {
            fuzz::require(back == tokenizable(tok, text),
                          "decode(encode(text)) == text less untokenizable bytes, for valid UTF-8");
        }
        TokenStreamDecoder stream(tok, false);
        std::string streamed;
        for (int32_t id : ids) streamed += stream.push(id);
        streamed += stream.flush();
        fuzz::require(streamed == back, "streaming decode == decode");
    });
    return 0;
}
