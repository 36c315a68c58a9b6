// Byte-level BPE (docs/formats.md §7): vocabulary loading from GGUF / tokenizer.json, literal matching of
// added tokens, NFC (qwen2), PCRE2 pre-tokenization, the GPT-2 byte map, the rank-ordered merge
// loop with a per-piece cache, and decoding. The split of text around special tokens and the
// pre-tokenizer regexes follow llama.cpp (src/llama-vocab.cpp, src/unicode.cpp).
#include "runtime/formats/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/formats/gguf.h"

namespace infoflow {

namespace {

using json = nlohmann::json;

// ---- pre-tokenizer patterns (docs/formats.md §7.3) ----------------------------------------------------

const char* const k_re_digit = R"(\p{N})";
const char* const k_re_gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const k_re_llama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const k_re_qwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// PCRE2's UCP `\s` is Unicode Z plus \t\n\v\f\r; HF (Rust White_Space) and llama.cpp also count
// U+0085 (NEL). Widen every \s / \S so all three engines agree.
std::string widen_whitespace(const std::string& re) {
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < re.size(); ++i) {
        char c = re[i];
        if (c == '\\' && i + 1 < re.size()) {
            char d = re[++i];
            if (d == 's') {
                out += in_class ? R"(\s\x{85})" : R"([\s\x{85}])";
            } else if (d == 'S') {
                IF_CHECK(!in_class, "pre-tokenizer regex: \\S inside a class is not supported");
                out += R"([^\s\x{85}])";
            } else {
                out += c;
                out += d;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
        } else if (c == ']' && in_class) {
            in_class = false;
        }
        out += c;
    }
    return out;
}

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Move-only.
class Regex {
  public:
    explicit Regex(const std::string& pattern) {
        std::string p = widen_whitespace(pattern);
        int err = 0;
        PCRE2_SIZE err_off = 0;
        code_ =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), p.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            IF_FAIL("pre-tokenizer regex does not compile at offset " << err_off << ": " << msg
                                                                      << " (pattern " << p << ")");
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on error
    }
    Regex(Regex&& o) noexcept : code_(o.code_) { o.code_ = nullptr; }
    Regex& operator=(Regex&&) = delete;
    Regex(const Regex&) = delete;
    ~Regex() { pcre2_code_free(code_); }
    const pcre2_code* code() const { return code_; }

  private:
    pcre2_code* code_ = nullptr;
};

// Per-call PCRE2 scratch: match data plus a JIT stack large enough for long runs.
class MatchScratch {
  public:
    explicit MatchScratch(const pcre2_code* code) {
        md_ = pcre2_match_data_create_from_pattern(code, nullptr);
        ctx_ = pcre2_match_context_create(nullptr);
        stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
        IF_CHECK(md_ && ctx_ && stack_, "out of memory for PCRE2 match data");
        pcre2_jit_stack_assign(ctx_, nullptr, stack_);
    }
    ~MatchScratch() {
        pcre2_jit_stack_free(stack_);
        pcre2_match_context_free(ctx_);
        pcre2_match_data_free(md_);
    }
    MatchScratch(const MatchScratch&) = delete;
    MatchScratch& operator=(const MatchScratch&) = delete;
    pcre2_match_data* md() { return md_; }
    pcre2_match_context* ctx() { return ctx_; }

  private:
    pcre2_match_data* md_ = nullptr;
    pcre2_match_context* ctx_ = nullptr;
    pcre2_jit_stack* stack_ = nullptr;
};

struct Span {
    size_t off;
    size_t len;
};

// ---- GPT-2 byte map (docs/formats.md §7.2) -------------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

struct ByteMap {
    uint32_t byte_to_cp[256];
    std::string byte_to_utf8[256];
    int cp_to_byte[512];  // mapped code points are all < 324; -1 elsewhere

    ByteMap() {
        std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), -1);
        uint32_t n = 0;
        for (int b = 0; b < 256; ++b) {
            bool same = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            uint32_t cp = same ? static_cast<uint32_t>(b) : 256 + n++;
            byte_to_cp[b] = cp;
            cp_to_byte[cp] = b;
            append_utf8(byte_to_utf8[b], cp);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

// Decodes one code point at s[i] (advancing i); returns false on invalid UTF-8 (i advances 1).
bool next_cp(const std::string& s, size_t& i, uint32_t& cp) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) {
        ++i;
        return false;
    }
    cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
        unsigned char d = static_cast<unsigned char>(s[i + k]);
        if ((d & 0xC0) != 0x80) {
            ++i;
            return false;
        }
        cp = (cp << 6) | (d & 0x3F);
    }
    i += n;
    return true;
}

// Bytes of a byte-mapped vocab string ("Ġthe" -> " the"); unmapped code points pass through.
std::string unmap_bytes(const std::string& text) {
    const ByteMap& bm = byte_map();
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
        size_t start = i;
        uint32_t cp = 0;
        if (next_cp(text, i, cp) && cp < 512 && bm.cp_to_byte[cp] >= 0) {
            out += static_cast<char>(bm.cp_to_byte[cp]);
        } else {
            out.append(text, start, i - start);
        }
    }
    return out;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t fnv1a_str(uint64_t h, const std::string& s) {
    uint64_t n = s.size();
    h = fnv1a(h, &n, sizeof(n));
    return fnv1a(h, s.data(), s.size());
}

std::string nfc(const char* p, size_t n) {
    std::string in(p, n);
    utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(in.c_str()));
    if (!out) return in;  // invalid UTF-8 (or embedded NUL): keep the text as it is
    std::string r(reinterpret_cast<char*>(out));
    std::free(out);
    return r;
}

// Control tokens that end a turn or the text (llama.cpp's end-of-generation list, the parts that
// apply to the supported families).
const char* const k_stop_texts[] = {"<|eot_id|>",      "<|im_end|>",    "<|end|>",
                                    "<end_of_turn>",   "<|endoftext|>", "<|eom_id|>",
                                    "<|end_of_text|>", "<EOT>"};
const char* const k_eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};

}  // namespace

// ---- implementation state
// ------------------------------------------------------------------------

struct SpecialToken {
    std::string text;
    int32_t id;
    bool control;
    bool lstrip;
    bool rstrip;
};

struct Merge {
    int32_t rank;
    int32_t id;
};

struct Tokenizer::Impl {
    std::string source;
    std::string pre_name;
    bool nfc = false;
    bool ignore_merges = false;
    std::vector<Regex> regexes;

    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<std::string> pieces;  // decoded bytes per token
    std::unordered_map<std::string, int32_t> token_to_id;
    std::unordered_map<uint64_t, Merge> merges;  // (left << 32 | right) -> rank, result
    int32_t byte_ids[256];
    std::vector<SpecialToken> specials;  // longest first

    int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1;
    bool add_bos = false;
    std::vector<int32_t> stop_ids;
    std::string chat_template;
    uint64_t fingerprint = 0;

    mutable std::mutex cache_mu;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

    void split(const char* text, size_t n, std::vector<Span>& out) const;
    void bpe(const char* p, size_t n, std::vector<int32_t>& out) const;
    void bpe_cached(const char* p, size_t n, std::vector<int32_t>& out) const;
    void encode_plain(const char* p, size_t n, std::vector<int32_t>& out) const;
    void check_id(int32_t id) const {
        IF_CHECK(id >= 0 && id < static_cast<int32_t>(tokens.size()),
                 "token id " << id << " is out of range [0, " << tokens.size() << ") for the "
                             << "tokenizer of " << source);
    }
};

namespace {

// Everything a vocabulary source provides, before indexing.
struct VocabSpec {
    std::string source;      // file, for errors
    std::string merges_key;  // "tokenizer.ggml.merges" or "model.merges"
    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<uint8_t> lstrip, rstrip;  // per token; empty = none
    std::vector<std::pair<std::string, std::string>> merges;
    std::string pre;
    bool nfc = false;
    bool ignore_merges = false;
    int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1;
    bool add_bos = false;
    std::string chat_template;
};

void set_pre_tokenizer(Tokenizer::Impl& t, const std::string& pre, const std::string& where) {
    if (pre == "smollm") {
        t.regexes.emplace_back(k_re_digit);
        t.regexes.emplace_back(k_re_gpt2);
        t.pre_name = "smollm";
    } else if (pre == "gpt2") {
        t.regexes.emplace_back(k_re_gpt2);
        t.pre_name = "gpt2";
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
        t.regexes.emplace_back(k_re_llama3);
        t.pre_name = "llama-bpe";
    } else if (pre == "qwen2") {
        t.regexes.emplace_back(k_re_qwen2);
        t.pre_name = "qwen2";
    } else {
        IF_FAIL(where << ": unsupported pre-tokenizer '" << pre
                      << "' (supported: smollm, gpt2, llama-bpe/llama3/llama-v3, qwen2)");
    }
}

std::unique_ptr<Tokenizer::Impl> build(VocabSpec&& s) {
    auto t = std::make_unique<Tokenizer::Impl>();
    t->source = s.source;
    set_pre_tokenizer(*t, s.pre, s.source);
    t->nfc = s.nfc;
    t->ignore_merges = s.ignore_merges;
    const int32_t n = static_cast<int32_t>(s.tokens.size());
    IF_CHECK(n > 0, s.source << ": the vocabulary is empty");
    IF_CHECK(s.types.size() == s.tokens.size(),
             s.source << ": " << s.types.size() << " token types for " << n << " tokens");

    t->tokens = std::move(s.tokens);
    t->types = std::move(s.types);
    t->token_to_id.reserve(n * 2);
    t->pieces.resize(n);
    uint64_t fp = fnv1a_str(14695981039346656037ull, t->pre_name);
    fp = fnv1a(fp, &t->nfc, 1);
    fp = fnv1a(fp, &t->ignore_merges, 1);
    for (int32_t id = 0; id < n; ++id) {
        const std::string& text = t->tokens[id];
        TokenType ty = t->types[id];
        if (!text.empty()) t->token_to_id.emplace(text, id);  // first id wins on duplicates
        bool verbatim = ty == TokenType::control || ty == TokenType::user_defined;
        t->pieces[id] = verbatim ? text : unmap_bytes(text);
        if (verbatim && !text.empty()) {
            bool l = !s.lstrip.empty() && s.lstrip[id];
            bool r = !s.rstrip.empty() && s.rstrip[id];
            t->specials.push_back({text, id, ty == TokenType::control, l, r});
        }
        fp = fnv1a_str(fp, text);
        int32_t ti = static_cast<int32_t>(ty);
        fp = fnv1a(fp, &ti, sizeof(ti));
    }
    std::stable_sort(
        t->specials.begin(), t->specials.end(),
        [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });

    const ByteMap& bm = byte_map();
    for (int b = 0; b < 256; ++b) {
        auto it = t->token_to_id.find(bm.byte_to_utf8[b]);
        t->byte_ids[b] = it == t->token_to_id.end() ? -1 : it->second;
    }

    t->merges.reserve(s.merges.size() * 2);
    for (size_t r = 0; r < s.merges.size(); ++r) {
        const auto& m = s.merges[r];
        auto find = [&](const std::string& tok, const char* what) {
            auto it = t->token_to_id.find(tok);
            IF_CHECK(it != t->token_to_id.end(),
                     s.source << ": " << s.merges_key << "[" << r << "] ('" << m.first << " "
                              << m.second << "') names " << what << " token '" << tok
                              << "' that is not in the vocabulary");
            return it->second;
        };
        int32_t a = find(m.first, "unknown");
        int32_t b = find(m.second, "unknown");
        int32_t c = find(m.first + m.second, "the merged");
        uint64_t key =
            (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
        t->merges.emplace(key, Merge{static_cast<int32_t>(r), c});  // lowest rank wins
        fp = fnv1a_str(fp, m.first);
        fp = fnv1a_str(fp, m.second);
    }
    t->fingerprint = fp;

    auto check_special = [&](int32_t id, const char* what) {
        IF_CHECK(id >= -1 && id < n, s.source << ": " << what << " id " << id
                                              << " is outside the vocabulary (" << n << " tokens)");
        return id;
    };
    t->bos = check_special(s.bos, "bos");
    t->eos = check_special(s.eos, "eos");
    t->eot = check_special(s.eot, "eot");
    t->eom = check_special(s.eom, "eom");
    t->unk = check_special(s.unk, "unknown");
    t->add_bos = s.add_bos && t->bos >= 0;
    if (t->eot < 0) {
        for (const char* txt : k_eot_texts) {
            auto it = t->token_to_id.find(txt);
            if (it != t->token_to_id.end() && t->types[it->second] != TokenType::normal) {
                t->eot = it->second;
                break;
            }
        }
    }
    for (int32_t id : {t->eos, t->eot, t->eom}) {
        if (id >= 0) t->stop_ids.push_back(id);
    }
    for (const char* txt : k_stop_texts) {
        auto it = t->token_to_id.find(txt);
        if (it != t->token_to_id.end() && t->types[it->second] != TokenType::normal) {
            t->stop_ids.push_back(it->second);
        }
    }
    std::sort(t->stop_ids.begin(), t->stop_ids.end());
    t->stop_ids.erase(std::unique(t->stop_ids.begin(), t->stop_ids.end()), t->stop_ids.end());
    t->chat_template = std::move(s.chat_template);
    return t;
}

}  // namespace

// ---- encoding
// ------------------------------------------------------------------------------------

void Tokenizer::Impl::split(const char* text, size_t n, std::vector<Span>& out) const {
    std::vector<Span> cur{{0, n}};
    std::vector<Span> next;
    for (const Regex& re : regexes) {
        MatchScratch ms(re.code());
        next.clear();
        for (const Span& sp : cur) {
            const auto* subject = reinterpret_cast<PCRE2_SPTR>(text + sp.off);
            size_t pos = 0;
            while (pos < sp.len) {
                int rc = pcre2_match(re.code(), subject, sp.len, pos, 0, ms.md(), ms.ctx());
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof(msg));
                    IF_FAIL("pre-tokenizer '" << pre_name << "' failed at byte " << sp.off + pos
                                              << ": " << msg);
                }
                const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md());
                size_t s = ov[0], e = ov[1];
                if (e == s) {  // no pattern matches empty text; guard against a loop anyway
                    pos = s + 1;
                    continue;
                }
                if (s > pos) next.push_back({sp.off + pos, s - pos});  // unmatched text is kept
                next.push_back({sp.off + s, e - s});
                pos = e;
            }
            if (pos < sp.len) next.push_back({sp.off + pos, sp.len - pos});
        }
        cur.swap(next);
    }
    out.insert(out.end(), cur.begin(), cur.end());
}

// Merge loop (docs/formats.md §7.4): lowest rank first, leftmost on ties; stale queue entries are
// recognized by the symbol ids they were made from.
void Tokenizer::Impl::bpe(const char* p, size_t n, std::vector<int32_t>& out) const {
    const ByteMap& bm = byte_map();
    if (ignore_merges) {
        std::string mapped;
        for (size_t i = 0; i < n; ++i) mapped += bm.byte_to_utf8[static_cast<unsigned char>(p[i])];
        auto it = token_to_id.find(mapped);
        if (it != token_to_id.end()) {
            out.push_back(it->second);
            return;
        }
    }
    struct Sym {
        int32_t id;
        int32_t prev;
        int32_t next;
    };
    std::vector<Sym> sym(n);
    // A byte without a token (SmolLM2 lacks e.g. 0x04, 0xF1) gets id -1: it blocks merges
    // across it and is dropped from the output, as llama.cpp and HF (no unk_token) do.
    for (size_t i = 0; i < n; ++i) {
        int32_t id = byte_ids[static_cast<unsigned char>(p[i])];
        sym[i] = {id, static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i) + 1 : -1};
    }
    struct Bigram {
        int32_t rank;
        int32_t left;
        int32_t right;
        int32_t left_id;
        int32_t right_id;
        int32_t result;
    };
    auto worse = [](const Bigram& a, const Bigram& b) {
        return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
    auto try_add = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
        uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(sym[l].id)) << 32) |
                       static_cast<uint32_t>(sym[r].id);
        auto it = merges.find(key);
        if (it == merges.end()) return;
        queue.push({it->second.rank, l, r, sym[l].id, sym[r].id, it->second.id});
    };
    for (size_t i = 0; i + 1 < n; ++i)
        try_add(static_cast<int32_t>(i), static_cast<int32_t>(i) + 1);
    while (!queue.empty()) {
        Bigram b = queue.top();
        queue.pop();
        Sym& l = sym[b.left];
        Sym& r = sym[b.right];
        if (l.id != b.left_id || r.id != b.right_id || l.next != b.right) continue;  // stale
        l.id = b.result;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = b.left;
        r.id = -1;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) out.push_back(sym[i].id);
    }
}

void Tokenizer::Impl::bpe_cached(const char* p, size_t n, std::vector<int32_t>& out) const {
    if (n == 0) return;
    std::string key(p, n);
    {
        std::lock_guard<std::mutex> lock(cache_mu);
        auto it = cache.find(key);
        if (it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    size_t first = out.size();
    bpe(p, n, out);
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() > (1u << 18)) cache.clear();  // bound memory on endless distinct input
    cache.emplace(std::move(key), std::vector<int32_t>(out.begin() + first, out.end()));
}

void Tokenizer::Impl::encode_plain(const char* p, size_t n, std::vector<int32_t>& out) const {
    std::string normalized;
    if (nfc) {
        normalized = infoflow::nfc(p, n);
        p = normalized.data();
        n = normalized.size();
    }
    std::vector<Span> spans;
    split(p, n, spans);
    for (const Span& s : spans) bpe_cached(p + s.off, s.len, out);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool parse_special) const {
    const Impl& t = *impl_;
    // Fragments of the text: a token id, or a raw span (id -1). Each special token, longest
    // first, splits the raw spans left by the previous ones (llama.cpp tokenizer_st_partition).
    struct Frag {
        int32_t id;
        size_t off;
        size_t len;
    };
    std::vector<Frag> frags{{-1, 0, text.size()}};
    std::vector<Frag> next;
    for (const SpecialToken& st : t.specials) {
        if (st.control && !parse_special) continue;
        next.clear();
        bool changed = false;
        for (const Frag& f : frags) {
            if (f.id >= 0) {
                next.push_back(f);
                continue;
            }
            size_t off = f.off, len = f.len;
            while (len > 0) {
                size_t m = text.find(st.text, off);
                if (m == std::string::npos || m + st.text.size() > off + len) break;
                changed = true;
                size_t left_len = m - off;
                if (st.lstrip) {
                    while (left_len > 0 &&
                           std::isspace(static_cast<unsigned char>(text[off + left_len - 1]))) {
                        --left_len;
                    }
                }
                if (left_len > 0) next.push_back({-1, off, left_len});
                next.push_back({st.id, m, st.text.size()});
                size_t r_off = m + st.text.size();
                size_t r_len = off + len - r_off;
                if (st.rstrip) {
                    while (r_len > 0 && std::isspace(static_cast<unsigned char>(text[r_off]))) {
                        ++r_off;
                        --r_len;
                    }
                }
                off = r_off;
                len = r_len;
            }
            if (len > 0) next.push_back({-1, off, len});
        }
        if (changed) frags.swap(next);
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    for (const Frag& f : frags) {
        if (f.id >= 0) {
            out.push_back(f.id);
        } else {
            t.encode_plain(text.data() + f.off, f.len, out);
        }
    }
    return out;
}

// ---- decoding
// ------------------------------------------------------------------------------------

std::string Tokenizer::token_to_piece(int32_t id, bool skip_special) const {
    impl_->check_id(id);
    TokenType ty = impl_->types[id];
    if (skip_special && ty == TokenType::control) return {};
    if (ty == TokenType::unknown || ty == TokenType::unused)
        return skip_special ? "" : impl_->tokens[id];
    return impl_->pieces[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
    std::string out;
    for (int32_t id : ids) out += token_to_piece(id, skip_special);
    return out;
}

size_t utf8_complete_prefix(const std::string& s) {
    size_t n = s.size();
    // Look back at most 3 bytes for a lead byte whose sequence is not finished yet.
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        size_t need = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

std::string TokenStreamDecoder::push(int32_t id) {
    pending_ += tok_->token_to_piece(id, skip_special_);
    size_t k = utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, k);
    pending_.erase(0, k);
    return out;
}

std::string TokenStreamDecoder::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

// ---- accessors
// -----------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->tokens.size()); }
const std::string& Tokenizer::token_text(int32_t id) const {
    impl_->check_id(id);
    return impl_->tokens[id];
}
int32_t Tokenizer::token_id(const std::string& vocab_text) const {
    auto it = impl_->token_to_id.find(vocab_text);
    return it == impl_->token_to_id.end() ? -1 : it->second;
}
TokenType Tokenizer::token_type(int32_t id) const {
    impl_->check_id(id);
    return impl_->types[id];
}
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::eot_id() const { return impl_->eot; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::vector<int32_t>& Tokenizer::stop_ids() const { return impl_->stop_ids; }
bool Tokenizer::is_stop(int32_t id) const {
    return std::binary_search(impl_->stop_ids.begin(), impl_->stop_ids.end(), id);
}
const std::string& Tokenizer::pre_name() const { return impl_->pre_name; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::source() const { return impl_->source; }
uint64_t Tokenizer::fingerprint() const { return impl_->fingerprint; }

// ---- GGUF
// ----------------------------------------------------------------------------------------

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
    VocabSpec s;
    s.source = f.path();
    s.merges_key = "tokenizer.ggml.merges";
    std::string model = f.get_string_or("tokenizer.ggml.model", "");
    IF_CHECK(model == "gpt2", f.path() << ": tokenizer.ggml.model is '" << model
                                       << "'; only byte-level BPE ('gpt2') is supported");
    s.tokens = f.get_string_array("tokenizer.ggml.tokens");
    const size_t n = s.tokens.size();
    if (f.has("tokenizer.ggml.token_type")) {
        std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
        IF_CHECK(types.size() == n, f.path() << ": tokenizer.ggml.token_type has " << types.size()
                                             << " entries for " << n << " tokens");
        s.types.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            IF_CHECK(types[i] >= 0 && types[i] <= 6, f.path() << ": tokenizer.ggml.token_type[" << i
                                                              << "] = " << types[i]
                                                              << " is not a token type (0..6)");
            s.types.push_back(static_cast<TokenType>(types[i]));
        }
    } else {
        s.types.assign(n, TokenType::normal);
    }
    std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
    s.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string& m = merges[i];
        size_t sp = m.find(' ', 1);
        IF_CHECK(sp != std::string::npos && sp + 1 < m.size(),
                 f.path() << ": tokenizer.ggml.merges[" << i << "] = '" << m
                          << "' is not two tokens separated by a space");
        s.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    s.pre = f.get_string_or("tokenizer.ggml.pre", "gpt2");
    if (s.pre == "default") s.pre = "gpt2";
    s.nfc = s.pre == "qwen2";
    s.ignore_merges = s.pre == "llama-bpe" || s.pre == "llama3" || s.pre == "llama-v3";
    s.bos = static_cast<int32_t>(f.get_int_or("tokenizer.ggml.bos_token_id", -1));
    s.eos = static_cast<int32_t>(f.get_int_or("tokenizer.ggml.eos_token_id", -1));
    s.eot = static_cast<int32_t>(f.get_int_or("tokenizer.ggml.eot_token_id", -1));
    s.eom = static_cast<int32_t>(f.get_int_or("tokenizer.ggml.eom_token_id", -1));
    s.unk = static_cast<int32_t>(f.get_int_or("tokenizer.ggml.unknown_token_id", -1));
    s.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", s.ignore_merges);
    s.chat_template = f.get_string_or("tokenizer.chat_template", "");
    return Tokenizer(build(std::move(s)));
}

// ---- Hugging Face tokenizer.json -------------------------------------------------------------

namespace {

json read_json_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    IF_CHECK(in, path << ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        IF_FAIL(path << ": not valid JSON: " << e.what());
    }
}

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    IF_CHECK(in, path << ": cannot open");
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// The pre-tokenizer list, Sequence flattened.
void flatten_pre(const json& j, std::vector<json>& out) {
    if (j.is_object() && j.value("type", "") == "Sequence" && j.contains("pretokenizers")) {
        for (const json& p : j["pretokenizers"]) flatten_pre(p, out);
    } else if (!j.is_null()) {
        out.push_back(j);
    }
}

std::string detect_pre(const json& root, const std::string& path) {
    std::vector<json> pre;
    if (root.contains("pre_tokenizer")) flatten_pre(root["pre_tokenizer"], pre);
    std::ostringstream desc;
    for (const json& p : pre) desc << (desc.tellp() > 0 ? ", " : "") << p.value("type", "?");
    auto byte_level = [](const json& p, bool use_regex) {
        return p.value("type", "") == "ByteLevel" && p.value("use_regex", true) == use_regex &&
               !p.value("add_prefix_space", false);
    };
    if (pre.size() == 1 && byte_level(pre[0], true)) return "gpt2";
    if (pre.size() == 2 && pre[0].value("type", "") == "Digits" &&
        pre[0].value("individual_digits", false) && byte_level(pre[1], true)) {
        return "smollm";
    }
    if (pre.size() == 2 && pre[0].value("type", "") == "Split" && byte_level(pre[1], false)) {
        const json& pat = pre[0].value("pattern", json::object());
        std::string re = pat.is_object() ? pat.value("Regex", pat.value("String", "")) : "";
        bool isolated = pre[0].value("behavior", "Isolated") == "Isolated";
        if (isolated && re.find(R"(\p{L}+)") != std::string::npos) {
            if (re.find(R"(\p{N}{1,3})") != std::string::npos) return "llama-bpe";
            if (re.find(R"(|\p{N}|)") != std::string::npos) return "qwen2";
        }
    }
    IF_FAIL(path << ": unsupported pre_tokenizer [" << desc.str()
                 << "] (supported: ByteLevel; Digits(individual)+ByteLevel (smollm); "
                    "Split(Llama-3 or Qwen2 regex)+ByteLevel(use_regex=false))");
}

bool detect_nfc(const json& root, const std::string& path) {
    if (!root.contains("normalizer") || root["normalizer"].is_null()) return false;
    std::vector<json> list;
    const json& n = root["normalizer"];
    if (n.value("type", "") == "Sequence") {
        for (const json& x : n.value("normalizers", json::array())) list.push_back(x);
    } else {
        list.push_back(n);
    }
    bool nfc = false;
    for (const json& x : list) {
        std::string ty = x.value("type", "");
        IF_CHECK(ty == "NFC", path << ": unsupported normalizer '" << ty
                                   << "' (key normalizer; only NFC is supported)");
        nfc = true;
    }
    return nfc;
}

// tokenizer_config.json writes tokens as "text" or {"content": "text", ...}.
std::string token_content(const json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content") && j["content"].is_string()) {
        return j["content"].get<std::string>();
    }
    return {};
}

// BOS from the post-processor: a TemplateProcessing whose `single` starts with a special token.
void post_processor_bos(const json& pp, std::string& bos_text) {
    if (!pp.is_object()) return;
    std::string ty = pp.value("type", "");
    if (ty == "Sequence") {
        for (const json& p : pp.value("processors", json::array())) post_processor_bos(p, bos_text);
    } else if (ty == "TemplateProcessing" && pp.contains("single") && pp["single"].is_array() &&
               !pp["single"].empty() && pp["single"][0].contains("SpecialToken")) {
        bos_text = pp["single"][0]["SpecialToken"].value("id", "");
    }
}

}  // namespace

Tokenizer Tokenizer::from_hf_dir(const std::string& dir) {
    std::string tj = dir + "/tokenizer.json";
    IF_CHECK(file_exists(tj), dir << ": no tokenizer.json in this directory");
    std::string cfg = dir + "/tokenizer_config.json";
    Tokenizer tok = from_hf_json(tj, file_exists(cfg) ? cfg : "");
    std::string jinja = dir + "/chat_template.jinja";
    if (tok.impl_->chat_template.empty() && file_exists(jinja)) {
        tok.impl_->chat_template = read_text_file(jinja);
    }
    return tok;
}

Tokenizer Tokenizer::from_hf_json(const std::string& path, const std::string& config_path) {
    // A field of an unexpected JSON type (a number where a string belongs, ...) surfaces as a
    // JSON library exception; it must name the file like every other error.
    try {
        return from_hf_json_unchecked(path, config_path);
    } catch (const json::exception& e) {
        IF_FAIL(path << (config_path.empty() ? "" : " / " + config_path)
                     << ": a field has an unexpected JSON type or value: " << e.what());
    }
}

Tokenizer Tokenizer::from_hf_json_unchecked(const std::string& path,
                                            const std::string& config_path) {
    json root = read_json_file(path);
    IF_CHECK(root.is_object(), path << ": top level is not a JSON object");
    IF_CHECK(root.contains("model") && root["model"].is_object(),
             path << ": missing key 'model' (object)");
    const json& model = root["model"];
    std::string mtype = model.value("type", "BPE");
    IF_CHECK(mtype == "BPE", path << ": model.type is '" << mtype << "'; only BPE is supported");
    IF_CHECK(!model.value("byte_fallback", false),
             path << ": model.byte_fallback = true (SentencePiece-style BPE) is not supported");
    IF_CHECK(model.contains("vocab") && model["vocab"].is_object(),
             path << ": missing key 'model.vocab' (object of token -> id)");
    IF_CHECK(model.contains("merges") && model["merges"].is_array(),
             path << ": missing key 'model.merges' (array)");

    VocabSpec s;
    s.source = path;
    s.merges_key = "model.merges";
    struct Entry {
        std::string text;
        TokenType type;
        bool lstrip, rstrip;
    };
    std::unordered_map<int64_t, Entry> by_id;
    int64_t max_id = -1;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        IF_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0,
                 path << ": model.vocab['" << it.key() << "'] is not a non-negative integer id");
        int64_t id = it.value().get<int64_t>();
        IF_CHECK(by_id.emplace(id, Entry{it.key(), TokenType::normal, false, false}).second,
                 path << ": model.vocab: id " << id << " is used by two tokens");
        max_id = std::max(max_id, id);
    }
    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
        size_t i = 0;
        for (const json& a : root["added_tokens"]) {
            IF_CHECK(a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                         a["content"].is_string(),
                     path << ": added_tokens[" << i << "] needs an integer 'id' and a 'content'");
            int64_t id = a["id"].get<int64_t>();
            IF_CHECK(id >= 0, path << ": added_tokens[" << i << "] has a negative id");
            Entry e{a["content"].get<std::string>(),
                    a.value("special", false) ? TokenType::control : TokenType::user_defined,
                    a.value("lstrip", false), a.value("rstrip", false)};
            by_id[id] = e;
            max_id = std::max(max_id, id);
            ++i;
        }
    }
    IF_CHECK(max_id >= 0, path << ": model.vocab is empty");
    // Ids size the vocabulary: a stray huge id must not size an allocation. Real vocabularies
    // are dense (added tokens follow the model's vocab, with small gaps at most).
    const int64_t k_id_slack = 65536;
    const int64_t id_limit =
        std::min<int64_t>(int64_t(by_id.size()) * 2 + k_id_slack, INT32_MAX - 1);
    IF_CHECK(max_id < id_limit, path << ": token id " << max_id << " is far beyond the "
                                     << by_id.size() << " tokens listed (ids must be below "
                                     << id_limit << ": model.vocab and added_tokens are dense)");
    const size_t n = static_cast<size_t>(max_id) + 1;
    s.tokens.resize(n);
    s.types.assign(n, TokenType::unused);  // ids nobody claims
    s.lstrip.assign(n, 0);
    s.rstrip.assign(n, 0);
    for (auto& kv : by_id) {
        s.tokens[kv.first] = std::move(kv.second.text);
        s.types[kv.first] = kv.second.type;
        s.lstrip[kv.first] = kv.second.lstrip;
        s.rstrip[kv.first] = kv.second.rstrip;
    }

    const json& merges = model["merges"];
    s.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& m = merges[i];
        if (m.is_string()) {
            std::string str = m.get<std::string>();
            size_t sp = str.find(' ', 1);
            IF_CHECK(sp != std::string::npos && sp + 1 < str.size() &&
                         str.find(' ', sp + 1) == std::string::npos,
                     path << ": model.merges[" << i << "] = '" << str
                          << "' is not two tokens separated by one space");
            s.merges.emplace_back(str.substr(0, sp), str.substr(sp + 1));
        } else {
            IF_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                     path << ": model.merges[" << i << "] is neither \"a b\" nor [\"a\", \"b\"]");
            s.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        }
    }
    s.ignore_merges = model.value("ignore_merges", false);
    s.pre = detect_pre(root, path);
    s.nfc = detect_nfc(root, path);

    // Special ids and flags: tokenizer_config.json first, then the post-processor.
    std::unordered_map<std::string, int32_t> lookup;
    for (size_t id = 0; id < n; ++id) {
        if (!s.tokens[id].empty()) lookup.emplace(s.tokens[id], static_cast<int32_t>(id));
    }
    auto id_of = [&](const std::string& text, const std::string& where) -> int32_t {
        if (text.empty()) return -1;
        auto it = lookup.find(text);
        IF_CHECK(it != lookup.end(), where << ": token '" << text << "' is not in the vocabulary");
        return it->second;
    };
    std::string pp_bos;
    if (root.contains("post_processor")) post_processor_bos(root["post_processor"], pp_bos);
    s.bos = id_of(pp_bos, path + " (post_processor)");
    s.add_bos = s.bos >= 0;
    if (!config_path.empty()) {
        json cfg = read_json_file(config_path);
        if (cfg.contains("bos_token")) {
            int32_t b = id_of(token_content(cfg["bos_token"]), config_path + " (bos_token)");
            if (b >= 0) s.bos = b;
        }
        if (cfg.contains("eos_token")) {
            s.eos = id_of(token_content(cfg["eos_token"]), config_path + " (eos_token)");
        }
        if (cfg.contains("unk_token")) {
            s.unk = id_of(token_content(cfg["unk_token"]), config_path + " (unk_token)");
        }
        if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
            s.add_bos = cfg["add_bos_token"].get<bool>();
        }
        if (cfg.contains("chat_template")) {
            const json& ct = cfg["chat_template"];
            if (ct.is_string()) {
                s.chat_template = ct.get<std::string>();
            } else if (ct.is_array() && !ct.empty()) {
                s.chat_template = ct[0].value("template", "");
                for (const json& e : ct) {
                    if (e.value("name", "") == "default") s.chat_template = e.value("template", "");
                }
            }
        }
    }
    if (s.eos < 0) {
        for (const char* txt : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
            auto it = lookup.find(txt);
            if (it != lookup.end()) {
                s.eos = it->second;
                break;
            }
        }
    }
    if (s.unk < 0 && model.contains("unk_token") && model["unk_token"].is_string()) {
        auto it = lookup.find(model["unk_token"].get<std::string>());
        if (it != lookup.end()) s.unk = it->second;
    }
    return Tokenizer(build(std::move(s)));
}

}  // namespace infoflow
