// libFuzzer target: the request parser of job serve (runtime/serve/api.h). The first byte picks
// the endpoint (chat, completions, documents), the rest is the request body. Properties: a body
// either parses or throws serve::ApiError with a 4xx status and a non-empty message whose JSON
// form serializes; an accepted request keeps the limits (max_tokens in [1, cap], at most 4
// non-empty stop strings, temperature in [0, 2], top_p in (0, 1], non-empty documents, a served
// method), and its text streamed through the TextStreamer, one byte at a time, comes out as the
// whole answer cut at its first stop string. Seeds: tests/fuzz/corpus/serve_request (written by
// hand: a byte for the endpoint, then a body).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/serve/api.h"

using namespace infoflow::serve;

namespace {

void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_serve_request: property violated: %s\n", what);
        std::abort();
    }
}

// The answer text an accepted request would stream: its question and documents joined.
void check_streamer(const CompletionRequest& r) {
    std::string text = r.endpoint == Endpoint::chat ? r.messages.back().content : r.prompt;
    for (const std::string& d : r.documents) text += d;
    text.resize(std::min<size_t>(text.size(), 4096));  // byte-by-byte streaming is quadratic
    TextStreamer s(r.stop);
    std::string out;
    for (size_t i = 1; i <= text.size() && !s.stop_hit(); ++i) out += s.update(text.substr(0, i));
    out += s.finish();
    require(out == s.sent(), "the deltas add up to the text sent");
    size_t cut = text.size();
    for (const std::string& st : r.stop) cut = std::min(cut, text.find(st));
    require(out == text.substr(0, cut), "the text sent is the answer cut at its first stop string");
    dump_json(stream_chunk({r.endpoint, "id", 0, "m"}, out, true, "stop"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const int which = data[0] % 3;
    const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
    Limits lim;
    lim.max_tokens = 64;
    try {
        if (which == 2) {
            const std::vector<std::string> docs = parse_documents_request(body, lim);
            require(!docs.empty() && int(docs.size()) <= lim.max_documents, "documents count");
            return 0;
        }
        const CompletionRequest r =
            parse_completion_request(which == 0 ? Endpoint::chat : Endpoint::completion, body, lim);
        if (r.endpoint == Endpoint::chat) {
            require(!r.messages.empty() && r.messages.back().role == "user", "a user question");
        } else {
            require(!r.prompt.empty(), "a prompt");
        }
        require(!r.max_tokens || (*r.max_tokens >= 1 && *r.max_tokens <= lim.max_tokens),
                "max_tokens in range");
        require(int(r.stop.size()) <= lim.max_stop, "stop count");
        for (const std::string& s : r.stop) require(!s.empty(), "non-empty stop strings");
        require(!r.temperature || (*r.temperature >= 0 && *r.temperature <= 2), "temperature");
        require(!r.top_p || (*r.top_p > 0 && *r.top_p <= 1), "top_p");
        for (const std::string& d : r.documents) require(!d.empty(), "non-empty documents");
        if (r.method) {
            const auto& m = served_methods();
            require(std::find(m.begin(), m.end(), *r.method) != m.end(), "a served method");
        }
        check_streamer(r);
    } catch (const ApiError& e) {
        require(e.status >= 400 && e.status < 500, "a 4xx status");
        require(e.what()[0] != '\0', "a message");
        dump_json(e.to_json());
    }
    return 0;
}
