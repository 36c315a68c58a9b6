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
// Token counts come from a caller-supplied counter (as in haystack.h), so the generator knows
// nothing about models.
#pragma once

#include <cstdint>
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
};

struct QualityCase {
    int index = 0;
    std::string kind;
    std::string relation;  // the fact template's name ("city", "passkey", ...)
    std::vector<std::string> documents;
    std::string question;
    std::vector<std::string> answers;  // gold; a run is correct when its answer contains one
    std::vector<int> evidence_docs;    // documents holding the needed facts
};

// The kinds the generator knows, for messages: "niah|facts|multihop".
std::string case_kinds();
// Throws unless every kind is known (the message names sweep.kinds).
void check_case_kinds(const std::vector<std::string>& kinds);

// Case `index` of the spec.
QualityCase make_case(const CaseSpec& spec, int index, const TokenCounter& count);

// True when `answer` contains one of the case's answers, ignoring case.
bool case_correct(const QualityCase& c, const std::string& answer);

}  // namespace infoflow
