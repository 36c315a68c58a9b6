// A request tokenized into the parts of docs/design.md §2: chunk 0 (chat header, system prompt and the
// instruction's opening, always exact), context chunks 1..K (one per document, or fixed-size
// token chunks), and the suffix (instruction + question + assistant header). Every method runs
// on the same tokens, so `full` and the approximations are compared on one sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config/config.h"

namespace infoflow {

class Tokenizer;
class ChatTemplate;

struct PreparedRequest {
    std::vector<std::vector<int32_t>> chunks;  // [0] = prefix, [1..K] = context chunks
    std::vector<int32_t> suffix;               // tokens after the context
    int question_begin = 0;                    // question tokens: suffix[begin, end)
    int question_end = 0;
    int32_t sink_id = -1;        // prepended to chunks >= 1 at prefill; -1 = none
    std::string tokenizer_hash;  // of the tokenizer that made the ids (KV store identity, §8)

    int n_chunks() const { return int(chunks.size()); }
    int context_tokens() const;                     // T: tokens of chunks 0..K
    std::vector<int> chunk_offsets() const;         // o_i, size K+1
    std::vector<int32_t> context_sequence() const;  // chunks concatenated
    std::vector<int32_t> full_sequence() const;     // context + suffix
};

// Instruction wording of each request.template (the `longbench` one is the paper's).
struct InstructionText {
    std::string intro;            // after the user-turn opener, before the context
    std::string doc_separator;    // appended to every document
    std::string before_question;  // after the context, before the question
    std::string after_question;   // after the question, before the assistant header
};
InstructionText instruction_text(Config::Template t);

PreparedRequest prepare_request(const Tokenizer& tok, const ChatTemplate& chat,
                                const RequestText& text, const Config& cfg);

// parallel.placement = "tokens": the request with its context chunks cut at the even shard edges
// of `n_ranks` shards (shard_edge_cuts, placement.h); every piece is a chunk of its own. The same
// request when the placement is "chunks" or n_ranks <= 1.
PreparedRequest place_request(const PreparedRequest& req, const Config& cfg, int n_ranks);

// Resolves chunking.sink: "bos" = the model's BOS token, or the first token of the chat prefix
// when the model has no BOS; "none" = -1; otherwise a literal that must be exactly one token.
int32_t resolve_sink(const Tokenizer& tok, const std::vector<int32_t>& prefix,
                     const std::string& sink);

}  // namespace infoflow
