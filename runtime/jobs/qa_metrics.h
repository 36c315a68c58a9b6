// Quality measures of the comparison jobs (`niah`, `eval`): LongBench's QA F1 with its answer
// normalization (THUDM/LongBench `metrics.py`: `normalize_answer`, `qa_f1_score`, best over the
// reference answers as in `eval.py`), the split of a LongBench context into passages, and the
// comparison of a method's first answer token with the exact (`full`) run: top-1 agreement and
// KL(full || method) of the first-token distributions, in double precision.
// Not here: the other LongBench metrics (ROUGE, code similarity, classification, Chinese F1).
#pragma once

#include <string>
#include <vector>

namespace infoflow {

// LongBench normalize_answer: lower-case, drop ASCII punctuation (Python's string.punctuation),
// drop the words a/an/the, collapse whitespace to single spaces (trimmed). Lower-casing and the
// word / whitespace classes follow Unicode (utf8proc) as Python's str methods do.
std::string normalize_answer(const std::string& s);

// LongBench qa_f1_score: token-level F1 of the normalized prediction and reference (tokens =
// whitespace-split words, counted as multisets); 0 when nothing is shared. In [0, 1].
double qa_f1(const std::string& prediction, const std::string& reference);
// Best qa_f1 over the references (0 when there are none).
double qa_f1_max(const std::string& prediction, const std::vector<std::string>& references);

// A LongBench context as documents: split on "\nPassage ", "Passage " put back in front of every
// piece after the first, each piece trimmed of surrounding whitespace, empty pieces dropped.
std::vector<std::string> split_passages(const std::string& context);

// KL(p || q) = sum_i p_i (log p_i - log q_i) of two log-probability rows of equal size (natural
// log, nats). Terms with p_i = 0 contribute 0.
double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q);

// First answer token of a method run against the reference run, from their logits [n_vocab].
struct FirstTokenComparison {
    int ref_top1 = -1;        // argmax of the reference logits (ties to the lower id)
    int top1 = -1;            // argmax of the method's logits
    bool top1_agree = false;  // ref_top1 == top1
    double kl = 0.0;          // KL(reference || method) of the softmax distributions
};
FirstTokenComparison compare_first_token(const std::vector<float>& ref_logits,
                                         const std::vector<float>& logits);

}  // namespace infoflow
