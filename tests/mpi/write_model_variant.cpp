// Writes a copy of a GGUF model whose shapes, metadata and tokenizer are identical but whose
// weights differ (one tensor requantized from weights scaled by 1.05), with the project's own
// GGUF writer. For the model-identity test of tests/mpi/run_watchdog_test.sh:
//   write_model_variant SRC.gguf DST.gguf
#include <cstdio>
#include <exception>
#include <vector>

#include "runtime/formats/dequant.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/gguf_writer.h"

using namespace infoflow;

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s SRC.gguf DST.gguf\n", argv[0]);
        return 2;
    }
    try {
        GgufFile src(argv[1]);
        GgufWriter out;
        out.set_version(src.version());
        for (const auto& kv : src.metadata()) out.set_value(kv.first, kv.second);
        bool changed = false;
        for (const GgufTensorInfo& t : src.tensors()) {
            const uint8_t* bytes = src.tensor_data(t);
            if (!changed && t.ne.size() == 2 && ggml_type_quantizable(t.type)) {
                const int64_t n = int64_t(t.n_elements());
                std::vector<float> w(static_cast<size_t>(n));
                dequantize_row(t.type, bytes, w.data(), n);
                for (float& x : w) x *= 1.05f;
                out.add_tensor(t.name, t.ne, t.type, w.data());
                std::printf("changed tensor %s\n", t.name.c_str());
                changed = true;
            } else {
                out.add_tensor_raw(t.name, t.ne, t.type, bytes, t.n_bytes);
            }
        }
        if (!changed) {
            std::fprintf(stderr, "%s: no quantizable 2-D tensor to change\n", argv[1]);
            return 1;
        }
        out.write(argv[2]);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
