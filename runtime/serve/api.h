// The OpenAI HTTP API of job `serve` (docs/serve.md), as plain data: request bodies parsed and
// checked into CompletionRequest (every error an ApiError naming the field), the response and
// stream-chunk JSON, and the text streamer that turns the growing answer into deltas that never
// end inside a UTF-8 sequence or a possible stop string. No model, no sockets: the HTTP side is
// http_server.h, the ranks' side runtime/jobs/serve.cpp; the fuzz target fuzz_serve_request
// drives parse_completion_request directly.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace infoflow::serve {

// An error as the OpenAI API returns it: HTTP status plus {"error": {message, type, param,
// code}}. `param` names the request field at fault ("messages[1].content"), "" for none.
struct ApiError : std::runtime_error {
    int status;
    std::string type;  // "invalid_request_error", "authentication_error", "server_error", ...
    std::string param;
    std::string code;       // machine-readable reason, e.g. "context_length_exceeded"
    int retry_after_s = 0;  // > 0: sent as the Retry-After header (429)
    ApiError(int status, const std::string& message, const std::string& param = "",
             const std::string& code = "", const std::string& type = "");
    nlohmann::json to_json() const;
};

// 400 with the field named in `param` and at the start of the message.
[[noreturn]] void bad_field(const std::string& param, const std::string& what,
                            const std::string& code = "invalid_value");

enum class Endpoint { chat, completion };
const char* endpoint_path(Endpoint e);  // "/v1/chat/completions" | "/v1/completions"

struct Message {
    std::string role;  // "system" | "user" | "assistant"
    std::string content;
};

// One request, checked. Optional fields left unset fall back to the server's config.
struct CompletionRequest {
    Endpoint endpoint = Endpoint::chat;
    std::string model;                   // as sent ("" when absent)
    std::vector<Message> messages;       // chat: the last one is the user's question
    std::string prompt;                  // completions
    std::vector<std::string> documents;  // extension: retrieved passages, the context chunks
    std::optional<int> max_tokens;       // max_tokens or max_completion_tokens, >= 1
    std::optional<double> temperature;   // [0, 2]
    std::optional<double> top_p;         // (0, 1]
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;  // at most 4, non-empty
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    std::vector<std::pair<int32_t, float>> logit_bias;
    // Extension `infoflow`: method (as method.name), ratio (method.ratio), exchange
    // (parallel.exchange).
    std::optional<std::string> method;
    std::optional<double> ratio;
    std::optional<std::string> exchange;
};

struct Limits {
    int max_tokens = 1024;  // cap on max_tokens (serve.max_tokens)
    int max_stop = 4;
    int max_documents = 256;
};

// Methods a request may name in infoflow.method, in the spelling of method.name.
const std::vector<std::string>& served_methods();

// Parses and checks a request body. Throws ApiError (400: malformed JSON naming the byte and,
// when known, the field; a wrong type or value naming the field; a feature that is not built,
// "not implemented yet").
CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body,
                                           const Limits& limits);

// Parses and checks the body of POST /v1/documents: {"documents": ["...", ...]}.
std::vector<std::string> parse_documents_request(const std::string& body, const Limits& limits);

// True for 16 lowercase hex digits (a store key, docs/store.md).
bool is_document_key(const std::string& key);

// Token counts of a finished request (OpenAI `usage`).
struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    nlohmann::json to_json() const;
};

// What stays the same across a response and its stream chunks.
struct ResponseHead {
    Endpoint endpoint = Endpoint::chat;
    std::string id;  // "chatcmpl-..." | "cmpl-..."
    int64_t created = 0;
    std::string model;
};

// The non-streamed response body.
nlohmann::json completion_response(const ResponseHead& h, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage,
                                   const nlohmann::json& infoflow);
// One stream chunk: `delta` text (chat: the first chunk also carries the role), finish_reason
// null unless given; `infoflow` is attached when not null.
nlohmann::json stream_chunk(const ResponseHead& h, const std::string& delta, bool first,
                            const std::string& finish_reason,
                            const nlohmann::json& infoflow = nullptr);
// The usage chunk of stream_options.include_usage (empty choices).
nlohmann::json stream_usage_chunk(const ResponseHead& h, const Usage& usage);
// "data: <json>\n\n"; invalid UTF-8 is replaced (U+FFFD), never thrown.
std::string sse_event(const nlohmann::json& j);
// JSON text with invalid UTF-8 replaced.
std::string dump_json(const nlohmann::json& j);

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence (an invalid
// byte counts as complete: it is replaced when sent).
size_t utf8_complete_prefix(const std::string& s);

// Turns the answer text as it grows into the deltas a client may be sent: text is held back
// while it could be the start of a stop string or ends inside a UTF-8 sequence; a stop string
// ends the answer before it (OpenAI: the stop text is not returned).
class TextStreamer {
  public:
    explicit TextStreamer(std::vector<std::string> stop) : stop_(std::move(stop)) {}
    // `text` = the whole answer so far (it must extend the previous one); returns the new
    // delta, possibly empty.
    std::string update(const std::string& text);
    // After the last token: whatever was held back (none when a stop string matched).
    std::string finish();
    bool stop_hit() const { return stop_hit_; }
    // The answer as sent in total (cut before a stop string).
    const std::string& sent() const { return sent_; }

  private:
    std::vector<std::string> stop_;
    std::string text_;
    std::string sent_;
    bool stop_hit_ = false;
};

// Constant-time equality of a presented key and the expected one (time depends only on the
// expected key's length).
bool keys_equal(const std::string& presented, const std::string& expected);

}  // namespace infoflow::serve
