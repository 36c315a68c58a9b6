#include "runtime/jobs/haystack.h"

#include <cmath>
#include <cstring>

#include "runtime/core/error.h"

namespace infoflow {
namespace {

const char* k_space = " \t\r\n\v\f";

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(k_space);
    if (b == std::string::npos) return std::string();
    const size_t e = s.find_last_not_of(k_space);
    return s.substr(b, e - b + 1);
}

bool is_space(char c) { return c != '\0' && std::strchr(k_space, c) != nullptr; }

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

std::string join(const std::vector<std::string>& parts, size_t begin, size_t end) {
    std::string s;
    for (size_t i = begin; i < end; ++i) {
        if (!s.empty()) s += ' ';
        s += parts[i];
    }
    return s;
}

std::vector<std::string> split_words(const std::string& s) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_space(s[i])) ++i;
        const size_t b = i;
        while (i < s.size() && !is_space(s[i])) ++i;
        if (i > b) out.push_back(s.substr(b, i - b));
    }
    return out;
}

// The longest word prefix of `paragraph` whose count (with separator) fits `budget`; "" if none.
std::string cut_to_tokens(const std::string& paragraph, int budget, const std::string& sep,
                          const TokenCounter& count) {
    const std::vector<std::string> words = split_words(paragraph);
    size_t lo = 0, hi = words.size();  // invariant: prefix(lo) fits, prefix(hi + 1) does not
    while (lo < hi) {
        const size_t mid = (lo + hi + 1) / 2;
        if (count(join(words, 0, mid) + sep) <= budget) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return join(words, 0, lo);
}

// Length of a closing quote or bracket at s[i] (UTF-8 right quotes included), 0 if none.
size_t closer_at(const std::string& s, size_t i) {
    const char c = s[i];
    if (c == '"' || c == '\'' || c == ')' || c == ']') return 1;
    // U+2019 and U+201D: E2 80 99 / E2 80 9D.
    if (i + 2 < s.size() && (unsigned char)c == 0xE2 && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0x99 || (unsigned char)s[i + 2] == 0x9D)) {
        return 3;
    }
    return 0;
}

}  // namespace

std::vector<std::string> split_paragraphs(const std::string& text) {
    std::vector<std::string> out;
    std::string cur;
    auto flush = [&]() {
        std::string p = trim(cur);
        if (!p.empty()) out.push_back(std::move(p));
        cur.clear();
    };
    size_t i = 0;
    while (i < text.size()) {
        size_t e = text.find('\n', i);
        if (e == std::string::npos) e = text.size();
        const std::string line = trim(text.substr(i, e - i));
        if (line.empty()) {
            flush();
        } else {
            if (!cur.empty()) cur += ' ';
            cur += line;
        }
        i = e + 1;
    }
    flush();
    return out;
}

std::vector<std::string> split_sentences(const std::string& paragraph) {
    std::vector<std::string> out;
    size_t begin = 0;
    size_t i = 0;
    while (i < paragraph.size()) {
        const char c = paragraph[i];
        if (c == '.' || c == '!' || c == '?') {
            size_t j = i + 1;
            while (j < paragraph.size()) {
                const size_t n = closer_at(paragraph, j);
                if (n == 0) break;
                j += n;
            }
            if (j == paragraph.size() || is_space(paragraph[j])) {
                std::string s = trim(paragraph.substr(begin, j - begin));
                if (!s.empty()) out.push_back(std::move(s));
                begin = j;
            }
            i = j;
            continue;
        }
        ++i;
    }
    std::string rest = trim(paragraph.substr(begin));
    if (!rest.empty()) out.push_back(std::move(rest));
    return out;
}

double Haystack::actual_depth() const {
    const int filler = doc_tokens - needle_tokens;
    return filler > 0 ? double(needle_offset) / double(filler) : 0.0;
}

Haystack build_haystack(const std::vector<std::string>& paragraphs, const HaystackSpec& spec,
                        const TokenCounter& count) {
    IF_CHECK(!paragraphs.empty(), "the niah filler text has no paragraphs");
    IF_CHECK(spec.depth >= 0.0 && spec.depth <= 1.0,
             "niah depth " << spec.depth << " is outside [0, 1]");
    IF_CHECK(!trim(spec.needle).empty(), "niah.needle is empty");
    Haystack h;
    h.needle_tokens = count(spec.needle);
    const int filler_budget = spec.target_tokens - h.needle_tokens;
    IF_CHECK(filler_budget >= 1, "a haystack of " << spec.target_tokens
                                                  << " document tokens cannot hold the needle ("
                                                  << h.needle_tokens << " tokens)");
    const size_t n = paragraphs.size();
    h.first_paragraph = int(splitmix64(spec.seed) % n);

    // Filler paragraphs, cycled, the last one cut at a word boundary.
    std::vector<int> counts;
    int total = 0;
    for (size_t i = 0; total < filler_budget; ++i) {
        const std::string& p = paragraphs[(size_t(h.first_paragraph) + i) % n];
        const int c = count(p + spec.separator);
        IF_CHECK(c > 0, "a filler paragraph counts as no tokens");
        if (total + c <= filler_budget) {
            h.documents.push_back(p);
            counts.push_back(c);
            total += c;
            continue;
        }
        const std::string cut = cut_to_tokens(p, filler_budget - total, spec.separator, count);
        if (!cut.empty()) {
            h.documents.push_back(cut);
            counts.push_back(count(cut + spec.separator));
            total += counts.back();
        }
        break;
    }
    IF_CHECK(!h.documents.empty(),
             "a haystack of " << spec.target_tokens << " tokens holds no filler text");

    // The document holding the target offset, then its nearest sentence boundary.
    const double target = spec.depth * double(total);
    int doc = int(h.documents.size()) - 1;
    int doc_start = total - counts.back();
    for (int i = 0, s = 0; i < int(h.documents.size()); s += counts[size_t(i)], ++i) {
        if (double(s + counts[size_t(i)]) > target) {
            doc = i;
            doc_start = s;
            break;
        }
    }
    const std::vector<std::string> sentences = split_sentences(h.documents[size_t(doc)]);
    size_t best_k = 0;
    int best_offset = 0;
    double best_err = -1.0;
    for (size_t k = 0; k <= sentences.size(); ++k) {
        const int off = k == 0 ? 0 : count(join(sentences, 0, k));
        const double err = std::abs(double(doc_start + off) - target);
        if (best_err < 0.0 || err < best_err) {
            best_err = err;
            best_k = k;
            best_offset = off;
        }
    }
    const std::string before = join(sentences, 0, best_k);
    const std::string after = join(sentences, best_k, sentences.size());
    std::string with_needle = before;
    if (!with_needle.empty()) with_needle += ' ';
    with_needle += trim(spec.needle);
    if (!after.empty()) with_needle += ' ' + after;
    h.documents[size_t(doc)] = with_needle;
    counts[size_t(doc)] = count(with_needle + spec.separator);
    h.needle_doc = doc;
    h.needle_offset = doc_start + best_offset;
    h.doc_tokens = 0;
    for (int c : counts) h.doc_tokens += c;
    return h;
}

const std::string& builtin_filler() {
    static const std::string text = R"(
The village bakery opens before dawn. The ovens are lit at four, and by six the first loaves are cooling on wooden racks by the window. People on their way to the early train stop for a warm roll, and the baker knows most of them by name. On rainy mornings the queue reaches the corner.

Bees keep their hives warm in winter by clustering together and shivering their flight muscles. The cluster moves slowly across the combs, eating the honey stored in autumn. On mild days a few workers leave the hive to clear out waste, then hurry back before the cold slows them down.

The old canal was dug to carry coal from the hills to the river port. When the railway arrived, the barges became fewer, and the locks fell into disrepair. Volunteers later cleared the towpath, rebuilt two of the gates, and now narrowboats drift along it every summer.

Learning to play the cello takes patience. A beginner spends weeks on open strings, drawing the bow slowly so that the note does not scratch or wobble. Only later come scales, simple pieces and the slow work of playing in tune with others.

A thunderstorm begins when warm, moist air rises quickly into colder air above. The water vapour condenses into towering clouds, and collisions between ice particles separate electric charge. When the charge becomes large enough, lightning jumps between the cloud and the ground.

Market gardens on the edge of the town grow lettuce, beans and early potatoes. The soil there is light and drains well, so it warms quickly in spring. Growers sell most of their produce within a day of picking it, at stalls in the square.

Lighthouses were once kept by families who lived at the foot of the tower. They trimmed the wicks, polished the lenses and wound the clockwork that turned the light. Today most of the lights run by themselves, and the keepers' cottages have become small museums.

Paper was made by hand for centuries. Rags were soaked and beaten into a pulp, which was scooped up on a fine wire screen and pressed between felt sheets. The sheets were hung to dry in lofts, where a steady breeze passed through slatted walls.
)";
    return text;
}

}  // namespace infoflow
