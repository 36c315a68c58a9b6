// The haystack of job `niah` (needle in a haystack, passkey style): filler paragraphs as the
// request's documents (one passage each), cut to a token budget, with the needle inserted as a
// sentence of its own at a relative depth (0 = before the first filler token, 1 = after the
// last). Token counts come from a caller-supplied counter (the model's tokenizer in the job, any
// function in tests), so the builder knows nothing about models.
// Deterministic: the same paragraphs, budget, depth and seed give the same documents.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace infoflow {

// Tokens of a piece of text, as the request would tokenize it.
using TokenCounter = std::function<int(const std::string&)>;

// Paragraphs of a filler text: blocks separated by blank lines, inner line breaks joined with
// spaces, surrounding whitespace trimmed, empty blocks dropped.
std::vector<std::string> split_paragraphs(const std::string& text);

// Sentences of a paragraph: each ends after '.', '!' or '?' (and any closing quotes or
// brackets) that is followed by whitespace or the end; the text after the last one is a
// sentence too. Concatenating the sentences with single spaces gives the paragraph back when it
// has single spaces between sentences.
std::vector<std::string> split_sentences(const std::string& paragraph);

// A short built-in filler, used when niah.filler_file is empty.
const std::string& builtin_filler();

struct HaystackSpec {
    int target_tokens = 0;  // tokens of all documents together (each counted with separator)
    double depth = 0.0;     // in [0, 1]
    uint64_t seed = 0;      // picks the first filler paragraph
    std::string needle;     // one or more sentences
    std::string separator;  // appended to every document when it is tokenized
};

struct Haystack {
    std::vector<std::string> documents;  // filler paragraphs in order; one holds the needle
    int needle_doc = -1;                 // index of the document with the needle
    int doc_tokens = 0;                  // sum over documents of count(document + separator)
    int needle_tokens = 0;               // count(needle)
    int needle_offset = 0;               // document tokens before the needle's first token
    int first_paragraph = 0;             // index of the filler paragraph the haystack starts at
    // needle_offset / (doc_tokens - needle_tokens): where the needle sits in the filler.
    double actual_depth() const;
};

// Fills `spec.target_tokens` with paragraphs taken cyclically from `paragraphs` starting at a
// seed-dependent one (the last one is cut at a word boundary so the total, needle included, is
// within a few tokens of the target), then inserts the needle at the sentence boundary of the
// filler nearest to depth · filler tokens. Errors when there are no paragraphs or the budget
// cannot hold the needle.
Haystack build_haystack(const std::vector<std::string>& paragraphs, const HaystackSpec& spec,
                        const TokenCounter& count);

}  // namespace infoflow
