// What every job opens once: the model weights on a backend, the tokenizer and chat template
// of the model file (none for synthetic `random:` models).
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/model/model.h"
#include "runtime/model/weights.h"

namespace infoflow {

class Communicator;

struct Session {
    std::unique_ptr<ModelWeights> weights;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;  // null for random: models
    std::unique_ptr<ChatTemplate> chat;    // null for random: models
    double load_ms = 0.0;
    Communicator* comm = nullptr;  // the job's ranks (a single-process communicator on one rank)

    const Tokenizer& tok() const;  // errors when the model has no tokenizer
    const ChatTemplate& chat_template() const;
};

// `local_rank`: the node-local rank (Communicator::local_rank()); a device backend uses device
// local_rank % (visible devices).
std::unique_ptr<Session> open_session(const Config& cfg, int local_rank = 0);

}  // namespace infoflow
