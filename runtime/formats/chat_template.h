// Chat prompts as token segments (docs/formats.md §7.5, §8.2; docs/design.md §2): ChatML (SmolLM2
// with its default system prompt, Qwen), Llama-3 (3.1's dated system preamble when the template has
// it) and raw. Control tokens are inserted as ids; message text is tokenized without special
// parsing, so "<|im_end|>" typed by a user stays plain text. Not a Jinja engine: the format is
// detected from the tokenizer's chat_template / pre-tokenizer, or named explicitly.
//
// Segments are tokenized independently at the template's structural boundaries; `render` is
// defined as the concatenation of the same segments, so for one user message
//   render({{"user", m}}) == prefix("") + text(m) + suffix_close().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace infoflow {

class Tokenizer;

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

enum class ChatFormat { raw, chatml, llama3 };

class ChatTemplate {
  public:
    // name: "auto" (detect ChatML or Llama-3 from the model file; an error when it is neither),
    // "chatml", "smollm2" (ChatML + SmolLM2's default system prompt),
    // "qwen" (= chatml), "llama3", "raw". The tokenizer must outlive the template.
    explicit ChatTemplate(const Tokenizer& tok, const std::string& name = "auto");

    ChatFormat format() const { return format_; }
    const std::string& name() const { return name_; }  // resolved: "chatml", "llama3", "raw"
    // System prompt used when a conversation has none ("" = no system turn then).
    const std::string& default_system() const { return default_system_; }

    // Everything before the first user content: BOS when the model wants one, the system turn
    // (`system`, or default_system() when empty), and the user-turn opener.
    std::vector<int32_t> prefix(const std::string& system = "") const;
    // The same after earlier turns of a conversation (`history`: an optional first system
    // turn, then user / assistant turns): BOS, the system turn (or the default one), every
    // turn of `history`, and the opener of the next user turn. prefix(s) == prefix({{system,
    // s}}) for a non-empty s, and prefix("") == prefix({}).
    std::vector<int32_t> prefix(const std::vector<ChatMessage>& history) const;
    // Plain text inside a turn, never parsing special tokens.
    std::vector<int32_t> text(const std::string& s) const;
    // Closes the user turn and opens the assistant turn ("<|im_end|>\n<|im_start|>assistant\n").
    std::vector<int32_t> suffix_close() const;

    // Whole conversation; with add_generation_prompt the assistant header is appended.
    std::vector<int32_t> render(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true) const;
    // The same conversation as text, control tokens written out (what the Jinja template
    // would produce).
    std::string render_text(const std::vector<ChatMessage>& messages,
                            bool add_generation_prompt = true) const;

    // Token that ends an assistant turn (<|im_end|>, <|eot_id|>); -1 in raw mode.
    int32_t end_of_turn_id() const { return end_turn_; }

  private:
    // A piece of a rendered prompt: a control token (id >= 0) or plain text.
    struct Part {
        int32_t id;
        std::string text;
    };
    std::vector<Part> parts(const std::vector<ChatMessage>& messages, bool open_user,
                            bool add_generation_prompt) const;
    std::vector<int32_t> to_ids(const std::vector<Part>& parts) const;
    std::string to_text(const std::vector<Part>& parts) const;
    int32_t require(const std::string& token) const;

    const Tokenizer* tok_;
    ChatFormat format_ = ChatFormat::raw;
    std::string name_;
    std::string default_system_;
    bool llama31_preamble_ = false;
    bool bos_ = false;
    int32_t bos_id_ = -1;
    int32_t im_start_ = -1, im_end_ = -1;                     // ChatML
    int32_t start_header_ = -1, end_header_ = -1, eot_ = -1;  // Llama-3
    int32_t end_turn_ = -1;
};

// The literal default system prompt of a ChatML Jinja template ("" if it has none), e.g.
// SmolLM2's "You are a helpful AI assistant named SmolLM, trained by Hugging Face".
std::string chatml_default_system(const std::string& jinja);

}  // namespace infoflow
