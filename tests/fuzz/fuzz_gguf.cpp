// libFuzzer target: the GGUF reader (runtime/formats/gguf.h) and what reads through it: every
// metadata value by type, the tensor table, dequantization of every tensor the file declares,
// the model config and the GGUF tokenizer. Seeds: tests/fuzz/corpus/gguf (project's GgufWriter).
#include <cstdint>
#include <vector>

#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/model/model_loader.h"
#include "tests/fuzz/fuzz_util.h"

using namespace infoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::input_file(data, size, ".gguf");
    fuzz::expect_parse_or_error([&] {
        GgufFile f(path);
        for (const auto& kv : f.metadata()) {
            fuzz::expect_parse_or_error([&] { f.get_string_array(kv.first); });
            fuzz::expect_parse_or_error([&] { f.get_int_array(kv.first); });
            fuzz::expect_parse_or_error([&] { f.get_float(kv.first); });
            fuzz::expect_parse_or_error([&] { f.get_bool(kv.first); });
        }
        for (const GgufTensorInfo& t : f.tensors()) {
            // Only small tensors are dequantized, so an input cannot make the run slow; the
            // reader has checked that the tensor's bytes lie inside the file.
            const uint64_t n = t.n_elements();
            if (n > 4096 || !ggml_type_dequantizable(t.type)) continue;
            fuzz::expect_parse_or_error([&] {
                std::vector<float> out(size_t(n) + 1);
                dequantize_row(t.type, f.tensor_data(t), out.data(), int64_t(n));
            });
        }
        fuzz::expect_parse_or_error([&] { model_config_from_gguf(f); });
        fuzz::expect_parse_or_error([&] { Tokenizer::from_gguf(f); });
    });
    return 0;
}
