// Byte-level BPE tokenizer (docs/formats.md §7) built from GGUF metadata (`tokenizer.ggml.*`) or from a
// Hugging Face tokenizer.json (+ tokenizer_config.json). Pre-tokenizers `gpt2`, `smollm`,
// `llama-bpe` (aliases `llama3`, `llama-v3`) and `qwen2` run on PCRE2 (UTF + UCP); `qwen2` NFC-
// normalizes with utf8proc. Encoding matches llama.cpp's `llama_tokenize(add_special = false)`.
// Not here: SentencePiece vocabularies (`tokenizer.ggml.model = llama`), BPE dropout, byte
// fallback. BOS is never added by `encode`; chat prompts are built by chat_template.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace infoflow {

class GgufFile;

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,       // special tokens (<|im_start|>): matched only with parse_special
    user_defined = 4,  // added, non-special tokens: always matched literally, decoded verbatim
    unused = 5,
    byte = 6,
};

class Tokenizer {
  public:
    // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos/eos/eot/eom/unknown ids,
    // add_bos_token} and tokenizer.chat_template. Errors name the file and the key.
    static Tokenizer from_gguf(const GgufFile& gguf);
    // `dir`/tokenizer.json plus, when present, `dir`/tokenizer_config.json and
    // `dir`/chat_template.jinja.
    static Tokenizer from_hf_dir(const std::string& dir);
    // tokenizer.json path; `config_path` (tokenizer_config.json) may be empty.
    static Tokenizer from_hf_json(const std::string& tokenizer_json_path,
                                  const std::string& config_path = "");

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Token ids of `text` (no BOS). Control tokens written in the text are recognized only when
    // `parse_special`; otherwise "<|im_end|>" is tokenized as ordinary characters. Thread-safe.
    std::vector<int32_t> encode(const std::string& text, bool parse_special = false) const;
    // Bytes of the tokens; control tokens are omitted when `skip_special`. Invalid ids throw.
    std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
    // Bytes of one token (may be a partial UTF-8 sequence); "" for a skipped control token.
    std::string token_to_piece(int32_t id, bool skip_special = true) const;

    int32_t n_vocab() const;
    const std::string& token_text(int32_t id) const;        // vocab form (byte-mapped: "Ġthe")
    int32_t token_id(const std::string& vocab_text) const;  // -1 if no such token
    TokenType token_type(int32_t id) const;
    bool is_control(int32_t id) const { return token_type(id) == TokenType::control; }

    int32_t bos_id() const;  // -1 when the vocabulary has none
    int32_t eos_id() const;
    int32_t eot_id() const;  // end of turn (<|im_end|>, <|eot_id|>); -1 if none
    bool add_bos() const;    // whether prompts start with BOS (SmolLM2 and Qwen: no)
    // Ids that end generation: eos, eot, eom and end-of-turn/end-of-text control tokens
    // (llama.cpp's EOG set). Sorted.
    const std::vector<int32_t>& stop_ids() const;
    bool is_stop(int32_t id) const;

    const std::string& pre_name() const;       // "smollm", "llama-bpe", "qwen2", "gpt2"
    const std::string& chat_template() const;  // Jinja source; "" if none
    const std::string& source() const;         // file the tokenizer was read from
    // FNV-1a over pre-tokenizer, vocab, types and merges: equal iff tokenization is equal.
    uint64_t fingerprint() const;

    struct Impl;

  private:
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    // from_hf_json without the conversion of JSON library errors into errors naming the file.
    static Tokenizer from_hf_json_unchecked(const std::string& tokenizer_json_path,
                                            const std::string& config_path);
    std::unique_ptr<Impl> impl_;
};

// Incremental decoding for generation: returns only complete UTF-8; bytes of a character split
// across tokens are held until the rest arrives.
class TokenStreamDecoder {
  public:
    explicit TokenStreamDecoder(const Tokenizer& tok, bool skip_special = true)
        : tok_(&tok), skip_special_(skip_special) {}
    std::string push(int32_t id);  // newly completed text (possibly "")
    std::string flush();           // whatever is held, even an incomplete sequence

  private:
    const Tokenizer* tok_;
    bool skip_special_;
    std::string pending_;
};

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence whose
// remaining bytes may still arrive (invalid bytes count as complete).
size_t utf8_complete_prefix(const std::string& s);

}  // namespace infoflow
