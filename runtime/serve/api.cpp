// Request parsing and response JSON of the OpenAI API (api.h). Every check names the field at
// fault in `param` and at the start of the message, so a client sees what to fix.
#include "runtime/serve/api.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace infoflow::serve {

using nlohmann::json;

namespace {

std::string default_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "not_found_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return status == 503 ? "service_unavailable" : "server_error";
    return "invalid_request_error";
}

// Where a JSON parse stopped: the path of the value being read ("messages[1].content").
class PathSax : public json::json_sax_t {
  public:
    bool null() override { return value(); }
    bool boolean(bool) override { return value(); }
    bool number_integer(number_integer_t) override { return value(); }
    bool number_unsigned(number_unsigned_t) override { return value(); }
    bool number_float(number_float_t, const string_t&) override { return value(); }
    bool string(string_t&) override { return value(); }
    bool binary(binary_t&) override { return value(); }
    bool start_object(std::size_t) override {
        frames_.push_back({false, 0, {}});
        return true;
    }
    bool key(string_t& k) override {
        frames_.back().key = k;
        return true;
    }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override {
        frames_.push_back({true, 0, {}});
        return true;
    }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t position, const std::string&,
                     const nlohmann::detail::exception& ex) override {
        position_ = position;
        what_ = ex.what();
        return false;
    }

    std::string path() const {
        std::string p;
        for (const Frame& f : frames_) {
            if (f.array) {
                p += "[" + std::to_string(f.index) + "]";
            } else if (!f.key.empty()) {
                p += (p.empty() ? "" : ".") + f.key;
            }
        }
        return p;
    }
    size_t position() const { return position_; }
    const std::string& what() const { return what_; }

  private:
    struct Frame {
        bool array;
        int index;
        std::string key;
    };
    bool value() {
        if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
        return true;
    }
    bool close() {
        frames_.pop_back();
        return value();
    }
    std::vector<Frame> frames_;
    size_t position_ = 0;
    std::string what_;
};

json parse_json_body(const std::string& body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return j;
    PathSax sax;
    json::sax_parse(body, &sax);
    std::string what = sax.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> the part after
    // the tag.
    const size_t tag = what.find("] ");
    if (tag != std::string::npos) what = what.substr(tag + 2);
    const std::string path = sax.path();
    if (body.empty())
        throw ApiError(400, "the request body is empty (expected a JSON object)", "",
                       "invalid_json");
    throw ApiError(400,
                   "malformed JSON" + (path.empty() ? std::string() : " in field '" + path + "'") +
                       " at byte " + std::to_string(sax.position()) + ": " + what,
                   path, "invalid_json");
}

std::string type_of(const json& v) {
    if (v.is_number_integer()) return "an integer";
    if (v.is_number_float()) return "a number";
    if (v.is_string()) return "a string";
    if (v.is_boolean()) return "a boolean";
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    return "null";
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
    bad_field(param, std::string("must be ") + expected + ", got " + type_of(v), "invalid_type");
}

// The field when present and not null.
const json* field(const json& obj, const char* name) {
    const auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

std::string as_string(const json& v, const std::string& param) {
    if (!v.is_string()) wrong_type(param, "a string", v);
    return v.get<std::string>();
}

bool as_bool(const json& v, const std::string& param) {
    if (!v.is_boolean()) wrong_type(param, "a boolean", v);
    return v.get<bool>();
}

double as_number(const json& v, const std::string& param, double lo, double hi, bool lo_open) {
    if (!v.is_number()) wrong_type(param, "a number", v);
    const double x = v.get<double>();
    if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
        bad_field(param, "must be in " + std::string(lo_open ? "(" : "[") + json(lo).dump() + ", " +
                             json(hi).dump() + "], got " + v.dump());
    }
    return x;
}

int64_t as_int(const json& v, const std::string& param) {
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) {
            bad_field(param, "is too large: " + v.dump());
        }
        return int64_t(u);
    }
    if (!v.is_number_integer()) wrong_type(param, "an integer", v);
    return v.get<int64_t>();
}

// OpenAI message content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& v, const std::string& param) {
    if (v.is_string()) return v.get<std::string>();
    if (!v.is_array()) wrong_type(param, "a string or an array of text parts", v);
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string p = param + "[" + std::to_string(i) + "]";
        const json& part = v[i];
        if (!part.is_object()) wrong_type(p, "an object", part);
        const json* type = field(part, "type");
        if (!type) bad_field(p + ".type", "is required", "missing_field");
        const std::string t = as_string(*type, p + ".type");
        if (t != "text") {
            bad_field(p + ".type",
                      "content parts of type '" + t + "' are not implemented yet (text only)",
                      "not_implemented");
        }
        const json* text = field(part, "text");
        if (!text) bad_field(p + ".text", "is required", "missing_field");
        out += as_string(*text, p + ".text");
    }
    return out;
}

std::vector<Message> parse_messages(const json& body) {
    const json* m = field(body, "messages");
    if (!m) bad_field("messages", "is required", "missing_field");
    if (!m->is_array()) wrong_type("messages", "an array", *m);
    if (m->empty()) bad_field("messages", "must not be empty (the last message is the question)");
    std::vector<Message> out;
    for (size_t i = 0; i < m->size(); ++i) {
        const std::string p = "messages[" + std::to_string(i) + "]";
        const json& msg = (*m)[i];
        if (!msg.is_object()) wrong_type(p, "an object", msg);
        const json* role = field(msg, "role");
        if (!role) bad_field(p + ".role", "is required", "missing_field");
        Message out_msg;
        out_msg.role = as_string(*role, p + ".role");
        if (out_msg.role == "developer") out_msg.role = "system";  // OpenAI's newer name
        if (out_msg.role != "system" && out_msg.role != "user" && out_msg.role != "assistant") {
            bad_field(p + ".role", "'" + out_msg.role +
                                       "' is not served (system, developer, user, assistant; "
                                       "tool messages are not implemented yet)");
        }
        if (out_msg.role == "system" && i != 0) {
            bad_field(p + ".role", "a system message must be the first message");
        }
        const json* content = field(msg, "content");
        if (!content) bad_field(p + ".content", "is required", "missing_field");
        out_msg.content = content_text(*content, p + ".content");
        for (const char* unsupported : {"tool_calls", "function_call"}) {
            if (field(msg, unsupported)) {
                bad_field(p + "." + unsupported, "tool calls are not implemented yet",
                          "not_implemented");
            }
        }
        out.push_back(std::move(out_msg));
    }
    const std::string last = "messages[" + std::to_string(m->size() - 1) + "].role";
    if (out.back().role != "user") {
        bad_field(last, "the last message must be the user's (it is the question), got '" +
                            out.back().role + "'");
    }
    if (out.back().content.empty()) {
        bad_field("messages[" + std::to_string(m->size() - 1) + "].content",
                  "the question is empty");
    }
    return out;
}

std::string parse_prompt(const json& body) {
    const json* p = field(body, "prompt");
    if (!p) bad_field("prompt", "is required", "missing_field");
    if (p->is_array()) {
        if (p->size() != 1 || !(*p)[0].is_string()) {
            bad_field("prompt",
                      "a batch of prompts or token ids is not implemented yet (send "
                      "one string)",
                      "not_implemented");
        }
        p = &(*p)[0];
    }
    const std::string s = as_string(*p, "prompt");
    if (s.empty()) bad_field("prompt", "must not be empty");
    return s;
}

void parse_sampling(const json& body, const Limits& limits, CompletionRequest& r) {
    const json* mt = field(body, "max_tokens");
    const json* mct = field(body, "max_completion_tokens");
    if (mt && mct && *mt != *mct) {
        bad_field("max_completion_tokens",
                  "differs from max_tokens; set one of them (max_completion_tokens is the "
                  "newer name)");
    }
    if (mct || mt) {
        const std::string name = mct ? "max_completion_tokens" : "max_tokens";
        const int64_t n = as_int(mct ? *mct : *mt, name);
        if (n < 1) bad_field(name, "must be >= 1, got " + std::to_string(n));
        if (n > limits.max_tokens) {
            bad_field(name,
                      std::to_string(n) + " is above this server's limit of " +
                          std::to_string(limits.max_tokens) + " tokens (serve.max_tokens)",
                      "max_tokens_exceeded");
        }
        r.max_tokens = int(n);
    }
    if (const json* t = field(body, "temperature")) {
        r.temperature = as_number(*t, "temperature", 0.0, 2.0, false);
    }
    if (const json* t = field(body, "top_p")) r.top_p = as_number(*t, "top_p", 0.0, 1.0, true);
    if (const json* s = field(body, "seed")) r.seed = uint64_t(as_int(*s, "seed"));
    if (const json* s = field(body, "stop")) {
        if (s->is_string()) {
            r.stop.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            for (size_t i = 0; i < s->size(); ++i) {
                r.stop.push_back(as_string((*s)[i], "stop[" + std::to_string(i) + "]"));
            }
        } else {
            wrong_type("stop", "a string or an array of strings", *s);
        }
        if (int(r.stop.size()) > limits.max_stop) {
            bad_field("stop", "at most " + std::to_string(limits.max_stop) + " stop strings, got " +
                                  std::to_string(r.stop.size()));
        }
        for (size_t i = 0; i < r.stop.size(); ++i) {
            if (r.stop[i].empty()) bad_field("stop[" + std::to_string(i) + "]", "is empty");
        }
    }
    if (const json* b = field(body, "logit_bias")) {
        if (!b->is_object()) wrong_type("logit_bias", "an object of token id -> bias", *b);
        for (const auto& [k, v] : b->items()) {
            const std::string p = "logit_bias." + k;
            char* end = nullptr;
            const long id = std::strtol(k.c_str(), &end, 10);
            if (k.empty() || *end != '\0' || id < 0 || id > std::numeric_limits<int32_t>::max()) {
                bad_field(p, "the key must be a token id (a non-negative integer)");
            }
            r.logit_bias.emplace_back(int32_t(id), float(as_number(v, p, -100.0, 100.0, false)));
        }
    }
}

// Fields that would change the answer in ways this server does not build: refused, never
// silently ignored.
void refuse_unbuilt(const json& body) {
    if (const json* n = field(body, "n")) {
        if (as_int(*n, "n") != 1) {
            bad_field("n", "more than one choice per request is not implemented yet",
                      "not_implemented");
        }
    }
    if (const json* lp = field(body, "logprobs")) {
        if ((lp->is_boolean() && lp->get<bool>()) || lp->is_number()) {
            bad_field("logprobs", "log-probabilities are not implemented yet", "not_implemented");
        }
    }
    for (const char* k : {"presence_penalty", "frequency_penalty"}) {
        if (const json* v = field(body, k)) {
            if (as_number(*v, k, -2.0, 2.0, false) != 0.0) {
                bad_field(k, "repetition penalties are not implemented yet", "not_implemented");
            }
        }
    }
    for (const char* k : {"tools", "functions", "tool_choice", "function_call"}) {
        if (const json* v = field(body, k)) {
            if (!(v->is_array() && v->empty()) &&
                !(v->is_string() && v->get<std::string>() == "none")) {
                bad_field(k, "tool calls are not implemented yet", "not_implemented");
            }
        }
    }
    if (const json* rf = field(body, "response_format")) {
        if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
        const json* t = field(*rf, "type");
        if (t && as_string(*t, "response_format.type") != "text") {
            bad_field("response_format.type", "only 'text' is implemented yet", "not_implemented");
        }
    }
    if (const json* e = field(body, "echo")) {
        if (as_bool(*e, "echo"))
            bad_field("echo", "echo is not implemented yet", "not_implemented");
    }
    if (const json* b = field(body, "best_of")) {
        if (as_int(*b, "best_of") != 1) {
            bad_field("best_of", "best_of > 1 is not implemented yet", "not_implemented");
        }
    }
    if (const json* s = field(body, "suffix")) {
        if (!(s->is_string() && s->get<std::string>().empty())) {
            bad_field("suffix", "insertion (suffix) is not implemented yet", "not_implemented");
        }
    }
}

std::vector<std::string> parse_document_list(const json& v, const std::string& param,
                                             const Limits& limits) {
    if (!v.is_array()) wrong_type(param, "an array of strings", v);
    if (int(v.size()) > limits.max_documents) {
        bad_field(param, "at most " + std::to_string(limits.max_documents) +
                             " documents per request, got " + std::to_string(v.size()));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string p = param + "[" + std::to_string(i) + "]";
        std::string d = v[i].is_object() && field(v[i], "text")
                            ? as_string(*field(v[i], "text"), p + ".text")
                            : as_string(v[i], p);
        if (d.find_first_not_of(" \t\r\n") == std::string::npos) bad_field(p, "is empty");
        out.push_back(std::move(d));
    }
    return out;
}

void parse_infoflow(const json& body, CompletionRequest& r) {
    const json* x = field(body, "infoflow");
    if (!x) return;
    if (!x->is_object()) wrong_type("infoflow", "an object", *x);
    for (const auto& [k, v] : x->items()) {
        if (k != "method" && k != "ratio" && k != "exchange") {
            bad_field("infoflow." + k, "is not a field of the extension (method, ratio, exchange)",
                      "unknown_field");
        }
        (void)v;
    }
    if (const json* m = field(*x, "method")) {
        r.method = as_string(*m, "infoflow.method");
        const auto& ok = served_methods();
        if (std::find(ok.begin(), ok.end(), *r.method) == ok.end()) {
            std::string list;
            for (const std::string& s : ok) list += (list.empty() ? "" : ", ") + s;
            bad_field("infoflow.method",
                      "unknown method '" + *r.method + "' (served: " + list + ")",
                      "unknown_method");
        }
    }
    if (const json* q = field(*x, "ratio"))
        r.ratio = as_number(*q, "infoflow.ratio", 0.0, 1.0, false);
    if (const json* e = field(*x, "exchange")) {
        r.exchange = as_string(*e, "infoflow.exchange");
        // The exchanges a request may name (the decomposition's halves are for the study).
        static const std::vector<std::string> known = {"kv",           "exact",        "gather",
                                                       "compact-int8", "compact-int4",
                                                       "compact-int4h"};
        if (std::find(known.begin(), known.end(), *r.exchange) == known.end()) {
            std::string list;
            for (const std::string& k : known) list += (list.empty() ? "'" : ", '") + k + "'";
            bad_field("infoflow.exchange", "must be one of " + list + ", got '" + *r.exchange + "'");
        }
    }
}

}  // namespace

ApiError::ApiError(int status_, const std::string& message, const std::string& param_,
                   const std::string& code_, const std::string& type_)
    : std::runtime_error(message),
      status(status_),
      type(type_.empty() ? default_type(status_) : type_),
      param(param_),
      code(code_) {}

json ApiError::to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void bad_field(const std::string& param, const std::string& what, const std::string& code) {
    throw ApiError(400, param + ": " + what, param, code);
}

const char* endpoint_path(Endpoint e) {
    return e == Endpoint::chat ? "/v1/chat/completions" : "/v1/completions";
}

const std::vector<std::string>& served_methods() {
    static const std::vector<std::string> m = {"infoflow",   "full", "none",
                                               "cacheblend", "epic", "ring"};
    return m;
}

CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body,
                                           const Limits& limits) {
    const json j = parse_json_body(body);
    if (!j.is_object()) {
        throw ApiError(400, "the request body must be a JSON object, got " + type_of(j), "",
                       "invalid_type");
    }
    CompletionRequest r;
    r.endpoint = endpoint;
    if (const json* m = field(j, "model")) r.model = as_string(*m, "model");
    if (endpoint == Endpoint::chat) {
        r.messages = parse_messages(j);
    } else {
        r.prompt = parse_prompt(j);
    }
    parse_sampling(j, limits, r);
    refuse_unbuilt(j);
    if (const json* s = field(j, "stream")) r.stream = as_bool(*s, "stream");
    if (const json* so = field(j, "stream_options")) {
        if (!so->is_object()) wrong_type("stream_options", "an object", *so);
        if (const json* u = field(*so, "include_usage")) {
            r.include_usage = as_bool(*u, "stream_options.include_usage");
        }
    }
    if (const json* d = field(j, "documents"))
        r.documents = parse_document_list(*d, "documents", limits);
    parse_infoflow(j, r);
    return r;
}

std::vector<std::string> parse_documents_request(const std::string& body, const Limits& limits) {
    const json j = parse_json_body(body);
    if (!j.is_object()) {
        throw ApiError(400, "the request body must be a JSON object, got " + type_of(j), "",
                       "invalid_type");
    }
    const json* d = field(j, "documents");
    if (!d) bad_field("documents", "is required", "missing_field");
    std::vector<std::string> docs = parse_document_list(*d, "documents", limits);
    if (docs.empty()) bad_field("documents", "must not be empty");
    return docs;
}

bool is_document_key(const std::string& key) {
    if (key.size() != 16) return false;
    for (char c : key) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

json Usage::to_json() const {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_response(const ResponseHead& h, const std::string& text,
                         const std::string& finish_reason, const Usage& usage,
                         const json& infoflow) {
    json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
    if (h.endpoint == Endpoint::chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = text;
    }
    json j = {{"id", h.id},
              {"object", h.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
              {"created", h.created},
              {"model", h.model},
              {"choices", json::array({choice})},
              {"usage", usage.to_json()}};
    if (!infoflow.is_null()) j["infoflow"] = infoflow;
    return j;
}

json stream_chunk(const ResponseHead& h, const std::string& delta, bool first,
                  const std::string& finish_reason, const json& infoflow) {
    json choice = {{"index", 0},
                   {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)},
                   {"logprobs", nullptr}};
    if (h.endpoint == Endpoint::chat) {
        json d = json::object();
        if (first) d["role"] = "assistant";
        if (!delta.empty() || first) d["content"] = delta;
        choice["delta"] = d;
    } else {
        choice["text"] = delta;
    }
    json j = {
        {"id", h.id},
        {"object", h.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
        {"created", h.created},
        {"model", h.model},
        {"choices", json::array({choice})}};
    if (!infoflow.is_null()) j["infoflow"] = infoflow;
    return j;
}

json stream_usage_chunk(const ResponseHead& h, const Usage& usage) {
    return {{"id", h.id},
            {"object", h.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", h.created},
            {"model", h.model},
            {"choices", json::array()},
            {"usage", usage.to_json()}};
}

std::string dump_json(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

size_t utf8_complete_prefix(const std::string& s) {
    // Look back at most 3 bytes for the lead byte of a sequence the string ends inside.
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
        size_t len = 1;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
        }
        return len > back ? n - back : n;
    }
    return n;
}

std::string TextStreamer::update(const std::string& text) {
    if (stop_hit_) return {};
    // The answer text only grows (byte-level BPE decodes token by token); a decode that does
    // not extend what was sent is held back until it does.
    if (text.compare(0, sent_.size(), sent_) != 0) return {};
    text_ = text;
    size_t safe = text_.size();
    // A whole stop string ends the answer before its first occurrence. None can start inside
    // the text already sent: a tail that could begin one is always held back.
    for (const std::string& s : stop_) {
        const size_t at = text_.find(s);
        if (at != std::string::npos && at < safe) {
            safe = at;
            stop_hit_ = true;
        }
    }
    if (!stop_hit_) {
        for (const std::string& s : stop_) {  // hold back a tail that could begin a stop string
            for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; --k) {
                if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
                    safe = std::min(safe, text_.size() - k);
                    break;
                }
            }
        }
        safe = std::min(safe, utf8_complete_prefix(text_));
    }
    if (safe <= sent_.size()) return {};
    std::string delta = text_.substr(sent_.size(), safe - sent_.size());
    sent_ += delta;
    return delta;
}

std::string TextStreamer::finish() {
    if (stop_hit_ || text_.size() <= sent_.size()) return {};
    std::string rest = text_.substr(sent_.size());
    sent_ += rest;
    return rest;
}

bool keys_equal(const std::string& presented, const std::string& expected) {
    // Every byte of `expected` is compared whatever the presented length; the lengths are
    // folded into the result, not branched on.
    volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i) {
        const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
        diff = diff | (p ^ static_cast<unsigned char>(expected[i]));
    }
    return diff == 0 && !expected.empty();
}

}  // namespace infoflow::serve
