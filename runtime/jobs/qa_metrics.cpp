#include "runtime/jobs/qa_metrics.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>

#include "runtime/core/error.h"
#include "runtime/model/sampling.h"

namespace infoflow {
namespace {

// Invalid UTF-8 bytes are carried through as code points of their own in this private range, so
// they survive normalization unchanged (Python would have failed to decode them earlier).
constexpr int32_t k_raw_byte_base = 0x110000;

std::vector<int32_t> decode_utf8(const std::string& s) {
    std::vector<int32_t> cps;
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
    utf8proc_ssize_t i = 0;
    const utf8proc_ssize_t n = utf8proc_ssize_t(s.size());
    while (i < n) {
        utf8proc_int32_t cp = 0;
        const utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
        if (len <= 0) {
            cps.push_back(k_raw_byte_base + p[i]);
            ++i;
        } else {
            cps.push_back(cp);
            i += len;
        }
    }
    return cps;
}

void append_utf8(std::string& out, int32_t cp) {
    if (cp >= k_raw_byte_base) {
        out.push_back(char(cp - k_raw_byte_base));
        return;
    }
    utf8proc_uint8_t buf[4];
    const utf8proc_ssize_t len = utf8proc_encode_char(cp, buf);
    out.append(reinterpret_cast<const char*>(buf), size_t(len));
}

// Python's string.punctuation.
bool is_ascii_punct(int32_t cp) {
    return cp < 128 && cp > 0 && std::strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", int(cp));
}

// Python str.split() whitespace.
bool is_space(int32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) {
        return true;
    }
    if (cp < 128 || cp >= k_raw_byte_base) return false;
    const utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

// Python re `\w` on str: letters, numbers, underscore.
bool is_word(int32_t cp) {
    if (cp < 128) return cp == '_' || std::isalnum(cp);
    if (cp >= k_raw_byte_base) return false;
    const utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

bool is_article(const std::vector<int32_t>& w) {
    auto eq = [&](const char* s) {
        const size_t n = std::strlen(s);
        if (w.size() != n) return false;
        for (size_t i = 0; i < n; ++i) {
            if (w[i] != int32_t(s[i])) return false;
        }
        return true;
    };
    return eq("a") || eq("an") || eq("the");
}

std::vector<std::string> split_words(const std::string& s) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && s[i] == ' ') ++i;
        const size_t b = i;
        while (i < s.size() && s[i] != ' ') ++i;
        if (i > b) out.push_back(s.substr(b, i - b));
    }
    return out;
}

}  // namespace

std::string normalize_answer(const std::string& s) {
    // lower, then remove punctuation.
    std::vector<int32_t> cps;
    for (int32_t cp : decode_utf8(s)) {
        const int32_t l = cp >= k_raw_byte_base ? cp : utf8proc_tolower(cp);
        if (!is_ascii_punct(l)) cps.push_back(l);
    }
    // Remove articles: `\b(a|an|the)\b` matches exactly the maximal word-character runs equal
    // to an article; each becomes one space.
    std::vector<int32_t> no_articles;
    for (size_t i = 0; i < cps.size();) {
        if (!is_word(cps[i])) {
            no_articles.push_back(cps[i++]);
            continue;
        }
        size_t j = i;
        while (j < cps.size() && is_word(cps[j])) ++j;
        const std::vector<int32_t> run(cps.begin() + long(i), cps.begin() + long(j));
        if (is_article(run)) {
            no_articles.push_back(' ');
        } else {
            no_articles.insert(no_articles.end(), run.begin(), run.end());
        }
        i = j;
    }
    // White-space fix: " ".join(text.split()).
    std::string out;
    bool pending_space = false;
    for (int32_t cp : no_articles) {
        if (is_space(cp)) {
            pending_space = !out.empty();
            continue;
        }
        if (pending_space) out.push_back(' ');
        pending_space = false;
        append_utf8(out, cp);
    }
    return out;
}

double qa_f1(const std::string& prediction, const std::string& reference) {
    const std::vector<std::string> p = split_words(normalize_answer(prediction));
    const std::vector<std::string> r = split_words(normalize_answer(reference));
    std::map<std::string, int> count_p, count_r;
    for (const auto& w : p) ++count_p[w];
    for (const auto& w : r) ++count_r[w];
    int same = 0;
    for (const auto& [w, n] : count_p) {
        const auto it = count_r.find(w);
        if (it != count_r.end()) same += std::min(n, it->second);
    }
    if (same == 0) return 0.0;
    const double precision = double(same) / double(p.size());
    const double recall = double(same) / double(r.size());
    return 2.0 * precision * recall / (precision + recall);
}

double qa_f1_max(const std::string& prediction, const std::vector<std::string>& references) {
    double best = 0.0;
    for (const auto& r : references) best = std::max(best, qa_f1(prediction, r));
    return best;
}

std::vector<std::string> split_passages(const std::string& context) {
    static const std::string sep = "\nPassage ";
    auto trim = [](const std::string& s) {
        const char* ws = " \t\r\n\v\f";
        const size_t b = s.find_first_not_of(ws);
        if (b == std::string::npos) return std::string();
        const size_t e = s.find_last_not_of(ws);
        return s.substr(b, e - b + 1);
    };
    std::vector<std::string> out;
    size_t begin = 0;
    bool first = true;
    while (true) {
        const size_t at = context.find(sep, begin);
        const size_t end = at == std::string::npos ? context.size() : at;
        std::string piece = context.substr(begin, end - begin);
        if (!first) piece = "Passage " + piece;
        piece = trim(piece);
        // A piece that is only the re-attached prefix carries no text.
        if (!piece.empty() && (first || piece != "Passage")) out.push_back(std::move(piece));
        if (at == std::string::npos) break;
        begin = at + sep.size();
        first = false;
    }
    return out;
}

double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
    IF_CHECK(log_p.size() == log_q.size(),
             "KL of rows of different sizes (" << log_p.size() << " vs " << log_q.size() << ")");
    double kl = 0.0;
    for (size_t i = 0; i < log_p.size(); ++i) {
        const double p = std::exp(log_p[i]);
        if (p == 0.0) continue;
        kl += p * (log_p[i] - log_q[i]);
    }
    return std::max(0.0, kl);
}

FirstTokenComparison compare_first_token(const std::vector<float>& ref_logits,
                                         const std::vector<float>& logits) {
    IF_CHECK(!ref_logits.empty() && ref_logits.size() == logits.size(),
             "first-token logits of different sizes (" << ref_logits.size() << " vs "
                                                       << logits.size() << ")");
    const int n = int(logits.size());
    FirstTokenComparison c;
    c.ref_top1 = argmax(ref_logits.data(), n);
    c.top1 = argmax(logits.data(), n);
    c.top1_agree = c.ref_top1 == c.top1;
    c.kl = kl_divergence(log_softmax(ref_logits.data(), n), log_softmax(logits.data(), n));
    return c;
}

}  // namespace infoflow
