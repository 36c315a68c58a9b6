#include "runtime/method/request.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/method/placement.h"

namespace infoflow {

int PreparedRequest::context_tokens() const {
    int t = 0;
    for (const auto& c : chunks) t += int(c.size());
    return t;
}

std::vector<int> PreparedRequest::chunk_offsets() const {
    std::vector<int> o;
    int acc = 0;
    for (const auto& c : chunks) {
        o.push_back(acc);
        acc += int(c.size());
    }
    return o;
}

std::vector<int32_t> PreparedRequest::context_sequence() const {
    std::vector<int32_t> s;
    for (const auto& c : chunks) s.insert(s.end(), c.begin(), c.end());
    return s;
}

std::vector<int32_t> PreparedRequest::full_sequence() const {
    std::vector<int32_t> s = context_sequence();
    s.insert(s.end(), suffix.begin(), suffix.end());
    return s;
}

InstructionText instruction_text(Config::Template t) {
    switch (t) {
        case Config::Template::qa:
            return {"Answer the question using the documents below.\n\n", "\n\n",
                    "Question: ", "\nAnswer with a short phrase."};
        case Config::Template::longbench: {
            const std::string ask =
                "Answer the question based on the given passages. Only give me the answer and do "
                "not output any other words.";
            return {ask + "\n\nThe following are given passages.\n", "\n",
                    "\n" + ask + "\n\nQuestion: ", "\nAnswer:"};
        }
        case Config::Template::raw:
            return {"", "\n", "", ""};
    }
    return {};
}

int32_t resolve_sink(const Tokenizer& tok, const std::vector<int32_t>& prefix,
                     const std::string& sink) {
    if (sink == "none") return -1;
    if (sink == "bos") {
        if (tok.bos_id() >= 0) return tok.bos_id();
        IF_CHECK(!prefix.empty(),
                 "chunking.sink = \"bos\": the model has no BOS token and the "
                 "chat prefix is empty; set chunking.sink to a token string");
        return prefix.front();
    }
    const std::vector<int32_t> ids = tok.encode(sink, /*parse_special=*/true);
    IF_CHECK(ids.size() == 1, "chunking.sink = \"" << sink << "\" is " << ids.size()
                                                   << " tokens; it must be exactly one token");
    return ids[0];
}

PreparedRequest prepare_request(const Tokenizer& tok, const ChatTemplate& chat,
                                const RequestText& text, const Config& cfg) {
    IF_CHECK(!text.question.empty(), "request.question is empty");
    const InstructionText ins = instruction_text(cfg.request.prompt_template);
    PreparedRequest r;

    IF_CHECK(text.history.empty() || text.system.empty(),
             "request: a system prompt and conversation turns together (the system prompt is "
             "the first turn)");
    std::vector<int32_t> prefix;
    if (text.history.empty()) {
        prefix = chat.prefix(text.system);
    } else {
        std::vector<ChatMessage> turns;
        for (const RequestText::Turn& t : text.history) turns.push_back({t.role, t.content});
        prefix = chat.prefix(turns);
    }
    const std::vector<int32_t> intro = chat.text(ins.intro);
    prefix.insert(prefix.end(), intro.begin(), intro.end());
    r.sink_id = resolve_sink(tok, prefix, cfg.chunking.sink);
    r.tokenizer_hash = hex64(tok.fingerprint());
    r.chunks.push_back(prefix);

    std::vector<std::vector<int32_t>> docs;
    for (const std::string& d : text.documents) docs.push_back(chat.text(d + ins.doc_separator));
    if (cfg.chunking.mode == Config::ChunkMode::passage) {
        for (auto& d : docs) {
            if (!d.empty()) r.chunks.push_back(std::move(d));
        }
    } else {
        const int size = cfg.chunking.size_or_default();
        std::vector<int32_t> all;
        for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
        for (size_t i = 0; i < all.size(); i += size_t(size)) {
            const size_t end = std::min(all.size(), i + size_t(size));
            r.chunks.emplace_back(all.begin() + long(i), all.begin() + long(end));
        }
    }

    r.suffix = chat.text(ins.before_question);
    r.question_begin = int(r.suffix.size());
    const std::vector<int32_t> q = chat.text(text.question);
    r.suffix.insert(r.suffix.end(), q.begin(), q.end());
    r.question_end = int(r.suffix.size());
    const std::vector<int32_t> after = chat.text(ins.after_question);
    r.suffix.insert(r.suffix.end(), after.begin(), after.end());
    const std::vector<int32_t> close = chat.suffix_close();
    r.suffix.insert(r.suffix.end(), close.begin(), close.end());
    IF_CHECK(r.question_end > r.question_begin, "request.question tokenizes to no tokens");
    return r;
}

PreparedRequest place_request(const PreparedRequest& req, const Config& cfg, int n_ranks) {
    if (cfg.parallel.placement != Config::Placement::tokens || n_ranks <= 1) return req;
    std::vector<int> sizes;
    for (const auto& ch : req.chunks) sizes.push_back(int(ch.size()));
    const std::vector<std::vector<int>> cuts = shard_edge_cuts(sizes, n_ranks);
    PreparedRequest out = req;
    out.chunks.clear();
    for (size_t i = 0; i < req.chunks.size(); ++i) {
        const std::vector<int32_t>& ch = req.chunks[i];
        int from = 0;
        for (int at : cuts[i]) {
            out.chunks.emplace_back(ch.begin() + from, ch.begin() + at);
            from = at;
        }
        out.chunks.emplace_back(ch.begin() + from, ch.end());
    }
    return out;
}

}  // namespace infoflow
