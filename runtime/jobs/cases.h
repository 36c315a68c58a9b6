// The case generator of job `sweep` (docs/quality.md): many short multi-document questions,
// cheaply and deterministically (the same spec and index give the same case on every machine).
// Kinds:
//   niah      a passkey sentence ("The special magic number is 4821.") hidden in one of the
//             filler documents; the question asks for it;
//   facts     every document holds one fact of the same relation about a different person
//             (the distractors) amid filler; the question asks about one of them;
//   multihop  one document links two people ("Anna's brother is Tom."), another gives the
//             second one's fact; the question needs both ("Which city does Anna's brother
//             live in?"); the other documents hold distractor facts of the same relation.
//   keys      (long layout only) multi-key retrieval: the evidence document holds "The special
//             magic number for the north gate is 4821.", every distractor document the same
//             sentence for another key; the question names the key.
// Two layouts. The original one (every field below the seed at its default) splits
// context_tokens evenly over the documents and puts a fact in every document; its cases are
// exactly those of earlier versions. The long layout (any of document_tokens, depths,
// distractors or filler set) draws document lengths, places the evidence at a controlled depth,
// puts distractors (the evidence's template about other people or keys) in a chosen number of
// the other documents and cuts filler from a given text. Token counts come from a
// caller-supplied counter (as in haystack.h), so the generator knows nothing about models.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/jobs/haystack.h"

namespace infoflow {

struct CaseSpec {
    std::vector<std::string> kinds = {"niah", "facts"};  // drawn in turn: index % kinds.size()
    int documents = 6;                                   // >= 2
    int context_tokens = 600;  // documents together, separators included (approximate)
    uint64_t seed = 0;
    std::string separator = "\n\n";  // appended to every document when it is counted
    // The long layout (all default: the original layout).
    // {lo, hi}: each document's length drawn log-uniform in [lo, hi] tokens, then all scaled
    // together so the documents fill context_tokens; empty = equal lengths.
    std::vector<int> document_tokens;
    // Evidence depths in [0, 1] (0 = first document, 1 = last), the evidence document being
    // round(depth * (documents - 1)); case i takes depths[(i / kinds.size()) % depths.size()]
    // (every kind at every depth in turn); empty = a random document.
    std::vector<double> depths;
    // Documents holding a distractor (the evidence's template about another person or key);
    // -1 = every other document.
    int distractors = -1;
    // Filler sentences the documents are cut from (consecutive, from a random start); empty =
    // the built-in neutral prose.
    std::vector<std::string> filler;
    bool long_layout() const {
        return !document_tokens.empty() || !depths.empty() || distractors >= 0 || !filler.empty();
    }
};

struct QualityCase {
    int index = 0;
    std::string kind;
    std::string relation;  // the fact template's name ("city", "passkey", ...)
    std::vector<std::string> documents;
    std::string question;
    std::vector<std::string> answers;  // gold; a run is correct when its answer contains one
    std::vector<int> evidence_docs;    // documents holding the needed facts
    // Where the answer's document (evidence_docs.back()) sits: the spec's depth for the case,
    // else its index / (documents - 1).
    double depth = 0.0;
    std::vector<int> document_tokens;  // count(document + separator) of each document
};

// The kinds the generator knows, for messages: "niah|facts|multihop|keys".
std::string case_kinds();
// Throws unless every kind is known (the message names sweep.kinds).
void check_case_kinds(const std::vector<std::string>& kinds);

// Throws unless the spec can make cases (the messages name the sweep.* keys).
void check_case_spec(const CaseSpec& spec);

// Case `index` of the spec.
QualityCase make_case(const CaseSpec& spec, int index, const TokenCounter& count);

// The spec as JSON, for the result (the filler as its sentence count and a hash of its text).
nlohmann::json case_spec_json(const CaseSpec& spec);

// True when `answer` contains one of the case's answers, ignoring case.
bool case_correct(const QualityCase& c, const std::string& answer);

}  // namespace infoflow
