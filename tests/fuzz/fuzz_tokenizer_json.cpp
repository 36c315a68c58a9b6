// libFuzzer target: the Hugging Face tokenizer.json loader (Tokenizer::from_hf_json) and, for
// inputs it accepts, a short encode/decode. Seeds: tests/fuzz/corpus/tokenizer_json (written by
// gen_corpus from the project's tokenizer tests' shapes).
#include <cstdint>
#include <string>

#include "runtime/formats/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace infoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::input_file(data, size, ".json");
    fuzz::expect_parse_or_error([&] {
        const Tokenizer tok = Tokenizer::from_hf_json(path);
        const auto ids = tok.encode("Hello, world! 123 <|endoftext|>", true);
        tok.decode(ids, false);
    });
    return 0;
}
