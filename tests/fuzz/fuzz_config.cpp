// libFuzzer target: the TOML config loader and --set overrides (runtime/config/config.h). The
// input is TOML text, optionally followed by a line "%%" and then one --set argument per line.
// Properties: loading either succeeds or throws infoflow::Error; an accepted config serializes
// (hash, JSON dump), and loading the same input twice gives the same hash. Seeds:
// tests/fuzz/corpus/config.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace infoflow;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string input(reinterpret_cast<const char*>(data), size);
    std::string toml = input;
    std::vector<std::string> sets;
    const size_t sep = input.find("\n%%\n");
    if (sep != std::string::npos) {
        toml = input.substr(0, sep);
        size_t start = sep + 4;
        while (start < input.size() && sets.size() < 16) {
            size_t nl = input.find('\n', start);
            if (nl == std::string::npos) nl = input.size();
            sets.push_back(input.substr(start, nl - start));
            start = nl + 1;
        }
    }
    fuzz::expect_parse_or_error([&] {
        const Config a = parse_config(toml, "fuzz.toml", sets);
        const std::string h = a.hash();
        a.to_json().dump();
        const Config b = parse_config(toml, "fuzz.toml", sets);
        fuzz::require(b.hash() == h, "the same input gives the same config hash");
    });
    return 0;
}
