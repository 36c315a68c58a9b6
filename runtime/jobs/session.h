// What every job opens once: the model weights on a backend, the tokenizer and chat template
// of the model file (none for synthetic `random:` models).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/method/prefix_cache.h"
#include "runtime/model/model.h"
#include "runtime/model/weights.h"

namespace infoflow {

class Communicator;

// Where one rank ran (docs/results-schema.md "placement"): its host name, its rank among the
// ranks of that host (Communicator::local_rank: MPI_Comm_split_type SHARED under MPI) and
// their count, and its backend device.
struct RankPlacement {
    int rank = 0;
    std::string host;
    int local_rank = 0;
    int local_size = 1;
    std::string device;
};

struct Session {
    std::unique_ptr<ModelWeights> weights;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;  // null for random: models
    std::unique_ptr<ChatTemplate> chat;    // null for random: models
    double load_ms = 0.0;
    // The model's own window (positions it was trained on): model.config().n_ctx_train unless
    // model.positions moved it; positions past it are timing only.
    int trained_positions = 0;
    Communicator* comm = nullptr;  // the job's ranks (a single-process communicator on one rank)
    // Backend::device() of every rank, by rank (from gather_placement); summaries and result
    // JSON "devices".
    std::vector<std::string> devices;
    // Where every rank ran, by rank (gather_placement); result JSON "placement".
    std::vector<RankPlacement> placement;
    // Chunk 0 kept across this session's requests (job serve: serve.prefix_cache_mb); null:
    // prefilled for every request. answer_request hands it to the pipeline.
    std::unique_ptr<PrefixKvCache> prefix_cache;

    const Tokenizer& tok() const;  // errors when the model has no tokenizer
    const ChatTemplate& chat_template() const;
};

// `local_rank`: the node-local rank (Communicator::local_rank()); a device backend uses device
// local_rank % (visible devices).
std::unique_ptr<Session> open_session(const Config& cfg, int local_rank = 0);

// The placement of every rank of `comm`, by rank (collective; its bytes are counted under the phase
// "placement", outside every method phase). Every rank gets the same vector.
std::vector<RankPlacement> gather_placement(Communicator& comm, const Backend& backend);
// One line for the run summary: "2 hosts: nodeA ranks 0 (local 0/1); nodeB ranks 1 (local
// 0/1)" -- ranks grouped by host in the order of their first rank.
std::string placement_summary(const std::vector<RankPlacement>& placement);
nlohmann::json placement_json(const std::vector<RankPlacement>& placement);
// "cuda:0 NVIDIA H200 (...)" when all ranks name one device, else "rank 0: ..., rank 1: ...".
std::string devices_summary(const std::vector<std::string>& devices);

}  // namespace infoflow
