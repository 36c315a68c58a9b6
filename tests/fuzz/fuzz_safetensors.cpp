// libFuzzer target: the safetensors reader (runtime/formats/safetensors.h): header JSON, tensor
// table, offsets, and the conversion of every (small) tensor to fp32. Seeds:
// tests/fuzz/corpus/safetensors (the project's SafetensorsWriter).
#include <cstdint>
#include <vector>

#include "runtime/formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace infoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = fuzz::input_file(data, size, ".safetensors");
    fuzz::expect_parse_or_error([&] {
        SafetensorsFile f(path);
        for (const SafetensorsTensorInfo& t : f.tensors()) {
            if (t.numel() > 4096) continue;  // bounded work per input
            fuzz::expect_parse_or_error([&] {
                const std::vector<float> v = f.read_f32(t.name);
                fuzz::require(int64_t(v.size()) == t.numel(), "read_f32 size == numel");
            });
        }
    });
    return 0;
}
