// The config reference (docs/config.md) generated from the loader's own field table, so the
// document lists exactly the keys, types, ranges, defaults and enum names the loader accepts.
// Only the one-line meaning of each key is written by hand (config_reference.cpp); a key
// without one is an error, so a new key cannot reach the reference undocumented.
#pragma once

#include <string>

namespace infoflow {

// The whole reference as Markdown (what `infoflow_sp --print-config-reference` prints).
// Throws infoflow::Error naming any key that has no description.
std::string config_reference_markdown();

}  // namespace infoflow
