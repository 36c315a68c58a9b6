// Chat templates as token segments: ChatML, Llama-3 and raw (see chat_template.h).
#include "runtime/formats/chat_template.h"

#include "runtime/core/error.h"
#include "runtime/formats/tokenizer.h"

namespace infoflow {

namespace {

const char* const k_smollm2_system =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
// Llama-3.1's template always opens with a system turn carrying these lines.
const char* const k_llama31_preamble =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

std::string trim(const std::string& s) {
    const char* ws = " \t\n\r\f\v";
    size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    size_t e = s.find_last_not_of(ws);
    return s.substr(b, e - b + 1);
}

}  // namespace

std::string chatml_default_system(const std::string& jinja) {
    const std::string open = "<|im_start|>system";
    const std::string close = "<|im_end|>";
    for (size_t pos = jinja.find(open); pos != std::string::npos; pos = jinja.find(open, pos + 1)) {
        size_t p = pos + open.size();
        if (jinja.compare(p, 1, "\n") == 0) {
            p += 1;
        } else if (jinja.compare(p, 2, "\\n") == 0) {  // newline escaped inside a Jinja string
            p += 2;
        } else {
            continue;
        }
        size_t e = jinja.find(close, p);
        if (e == std::string::npos) break;
        std::string body = jinja.substr(p, e - p);
        // A literal prompt, not an expression such as "' + messages[0]['content'] + '".
        if (!body.empty() && body.find_first_of("'\"{}+") == std::string::npos) return body;
    }
    return {};
}

ChatTemplate::ChatTemplate(const Tokenizer& tok, const std::string& name) : tok_(&tok) {
    const std::string& jinja = tok.chat_template();
    auto has_token = [&](const char* t) {
        int32_t id = tok.token_id(t);
        return id >= 0 && tok.token_type(id) != TokenType::normal;
    };
    std::string kind = name;
    if (kind == "auto") {
        if (jinja.find("<|im_start|>") != std::string::npos) {
            kind = "chatml";
        } else if (jinja.find("<|start_header_id|>") != std::string::npos) {
            kind = "llama3";
        } else if (has_token("<|start_header_id|>") && has_token("<|eot_id|>")) {
            kind = "llama3";
        } else if (has_token("<|im_start|>") && has_token("<|im_end|>")) {
            kind = "chatml";
        } else {
            // Guessing would silently change the prompt the model was trained on.
            IF_FAIL(
                "the model's chat template is neither ChatML nor Llama-3, so "
                "request.chat_template = \"auto\" cannot pick one: set "
                "request.chat_template to \"chatml\", \"llama3\" or \"raw\" (no template)");
        }
    }
    if (kind == "chatml" || kind == "qwen" || kind == "smollm2") {
        format_ = ChatFormat::chatml;
        name_ = "chatml";
        default_system_ = kind == "smollm2" ? k_smollm2_system : chatml_default_system(jinja);
        im_start_ = require("<|im_start|>");
        im_end_ = require("<|im_end|>");
        end_turn_ = im_end_;
        bos_ = tok.add_bos();
    } else if (kind == "llama3") {
        format_ = ChatFormat::llama3;
        name_ = "llama3";
        llama31_preamble_ = jinja.find("Cutting Knowledge Date") != std::string::npos;
        start_header_ = require("<|start_header_id|>");
        end_header_ = require("<|end_header_id|>");
        eot_ = require("<|eot_id|>");
        end_turn_ = eot_;
        bos_ = tok.bos_id() >= 0;  // the template starts with {{ bos_token }}
    } else if (kind == "raw") {
        format_ = ChatFormat::raw;
        name_ = "raw";
        bos_ = tok.add_bos();
    } else {
        IF_FAIL("unknown chat template '"
                << name << "' (expected auto, chatml, qwen, smollm2, llama3, raw)");
    }
    bos_id_ = tok.bos_id();
}

int32_t ChatTemplate::require(const std::string& token) const {
    int32_t id = tok_->token_id(token);
    IF_CHECK(id >= 0, "chat template '" << name_ << "' needs the token " << token
                                        << ", which the tokenizer of " << tok_->source()
                                        << " does not have");
    return id;
}

std::vector<ChatTemplate::Part> ChatTemplate::parts(const std::vector<ChatMessage>& messages,
                                                    bool open_user,
                                                    bool add_generation_prompt) const {
    std::vector<Part> p;
    if (bos_ && bos_id_ >= 0) p.push_back({bos_id_, {}});
    switch (format_) {
        case ChatFormat::chatml: {
            auto turn = [&](const std::string& role, const std::string& content) {
                p.push_back({im_start_, {}});
                p.push_back({-1, role + "\n"});
                p.push_back({-1, content});
                p.push_back({im_end_, {}});
                p.push_back({-1, "\n"});
            };
            bool has_system = !messages.empty() && messages[0].role == "system";
            if (!has_system && !default_system_.empty()) turn("system", default_system_);
            for (const ChatMessage& m : messages) turn(m.role, m.content);
            if (open_user) {
                p.push_back({im_start_, {}});
                p.push_back({-1, "user\n"});
            }
            if (add_generation_prompt) {
                p.push_back({im_start_, {}});
                p.push_back({-1, "assistant\n"});
            }
            break;
        }
        case ChatFormat::llama3: {
            auto header = [&](const std::string& role) {
                p.push_back({start_header_, {}});
                p.push_back({-1, role});
                p.push_back({end_header_, {}});
                p.push_back({-1, "\n\n"});
            };
            size_t first = 0;
            std::string system;
            if (!messages.empty() && messages[0].role == "system") {
                system = trim(messages[0].content);
                first = 1;
            }
            if (llama31_preamble_ || first == 1) {
                header("system");
                p.push_back({-1, (llama31_preamble_ ? k_llama31_preamble : "") + system});
                p.push_back({eot_, {}});
            }
            for (size_t i = first; i < messages.size(); ++i) {
                header(messages[i].role);
                p.push_back({-1, trim(messages[i].content)});
                p.push_back({eot_, {}});
            }
            if (open_user) header("user");
            if (add_generation_prompt) header("assistant");
            break;
        }
        case ChatFormat::raw: {
            for (size_t i = 0; i < messages.size(); ++i) {
                p.push_back({-1, messages[i].content});
                if (i + 1 < messages.size() || open_user) p.push_back({-1, "\n\n"});
            }
            break;
        }
    }
    return p;
}

std::vector<int32_t> ChatTemplate::to_ids(const std::vector<Part>& parts) const {
    std::vector<int32_t> ids;
    for (const Part& p : parts) {
        if (p.id >= 0) {
            ids.push_back(p.id);
        } else if (!p.text.empty()) {
            std::vector<int32_t> t = tok_->encode(p.text, false);
            ids.insert(ids.end(), t.begin(), t.end());
        }
    }
    return ids;
}

std::string ChatTemplate::to_text(const std::vector<Part>& parts) const {
    std::string s;
    for (const Part& p : parts) s += p.id >= 0 ? tok_->token_text(p.id) : p.text;
    return s;
}

std::vector<int32_t> ChatTemplate::prefix(const std::string& system) const {
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    return to_ids(parts(msgs, true, false));
}

std::vector<int32_t> ChatTemplate::prefix(const std::vector<ChatMessage>& history) const {
    return to_ids(parts(history, true, false));
}

std::vector<int32_t> ChatTemplate::text(const std::string& s) const {
    return tok_->encode(s, false);
}

std::vector<int32_t> ChatTemplate::suffix_close() const {
    switch (format_) {
        case ChatFormat::chatml:
            return to_ids({{im_end_, {}}, {-1, "\n"}, {im_start_, {}}, {-1, "assistant\n"}});
        case ChatFormat::llama3:
            return to_ids({{eot_, {}},
                           {start_header_, {}},
                           {-1, "assistant"},
                           {end_header_, {}},
                           {-1, "\n\n"}});
        case ChatFormat::raw:
            break;
    }
    return {};
}

std::vector<int32_t> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) const {
    return to_ids(parts(messages, false, add_generation_prompt));
}

std::string ChatTemplate::render_text(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const {
    return to_text(parts(messages, false, add_generation_prompt));
}

}  // namespace infoflow
