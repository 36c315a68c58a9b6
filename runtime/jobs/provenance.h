// Where a result came from: the fields every result JSON carries next to its job's own
// (docs/results-schema.md): schema version, tool version, git commit and build features, host
// name, CPU model and flags, thread counts, rank count, the model file (name, size, hash
// prefix) and the start time. Collected on rank 0 once per job.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config/config.h"

namespace infoflow {

// Version of the result JSON layout; bumped when a field changes meaning or goes away.
constexpr int k_result_schema_version = 1;

// Now, UTC, as "2026-12-01T09:05:45Z".
std::string utc_now_iso8601();

// The model as {"path", "file", "bytes", "hash", "hash_scope"}: `hash` is "fnv1a64:" + 16 hex
// digits over the file's size and its first 256 MiB (the whole file when smaller; for a Hugging
// Face directory every regular file, by name, within the same budget); "random:" models hash
// their name and have 0 bytes. Errors name the path.
nlohmann::json model_identity(const std::string& path);

// The "provenance" object of a result (see docs/results-schema.md).
nlohmann::json provenance_json(const Config& cfg, int ranks, int threads_per_rank,
                               const std::string& start_time);

// Adds "schema_version" and "provenance" to a job's result object.
void add_provenance(nlohmann::json& result, const Config& cfg, int ranks,
                    const std::string& start_time);

}  // namespace infoflow
