// libFuzzer target: SmolLM2's tokenizer (the real vocabulary, from the model file) on arbitrary
// text. Properties: encode never fails; every id is in the vocabulary; for valid UTF-8 text
// without NUL bytes or special-token parsing, decode(encode(text)) == text (byte-level BPE is
// lossless), and the streaming decoder yields the same text as decode. The first input byte
// selects parse_special. Seeds: tests/fuzz/corpus/tokenizer_encode.
#include <cstdint>
#include <memory>
#include <string>

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
        // Text with embedded NUL bytes is excluded: it does not round-trip (found by this
        // target: " \0\0\0\x06"; reported, not fixed yet).
        if (!parse_special && valid_utf8(text) && text.find('\0') == std::string::npos) {
            fuzz::require(back == text, "decode(encode(text)) == text for valid UTF-8");
        }
        TokenStreamDecoder stream(tok, false);
        std::string streamed;
        for (int32_t id : ids) streamed += stream.push(id);
        streamed += stream.flush();
        fuzz::require(streamed == back, "streaming decode == decode");
    });
    return 0;
}
