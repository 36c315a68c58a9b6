// job = "reform-heads": ranks every (layer, head, q|k|v) state of the model as a REFORM retrieval
// embedding (docs/reform.md). It generates synthetic retrieval tasks from the filler text, as
// the REFORM paper does: pattern matching (a pass key stated once, asked for by its owner) and
// multi-hop (a person's city stated in one place, the city's pass key in another, the question
// naming only the person). Each task is one request (chat template, niah filler) that fits the
// window; the context and the suffix run through every layer once, and at each layer every
// head's pre-RoPE state of each token is L2-normalized; a context token scores its maximum
// cosine over the question tokens, and the head's figure is the mean normalized rank of the
// answer tokens (0 = ranked first, 1 = last), averaged over the tasks. The ranking is printed,
// and the best reform.top heads are written as a config snippet (output.path with ".toml").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/jobs/haystack.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/request.h"

namespace infoflow {
namespace {

using json = nlohmann::json;

struct Task {
    std::string kind;
    PreparedRequest req;
    std::vector<int> answer;  // context indices of the answer tokens
};

// Start of `needle` tokens inside `seq`, or -1.
int find_tokens(const std::vector<int32_t>& seq, const std::vector<int32_t>& needle) {
    if (needle.empty() || needle.size() > seq.size()) return -1;
    const auto it = std::search(seq.begin(), seq.end(), needle.begin(), needle.end());
    return it == seq.end() ? -1 : int(it - seq.begin());
}

std::vector<Task> make_tasks(const Config& cfg, Session& s) {
    const Tokenizer& tok = s.tok();
    const ChatTemplate& chat = s.chat_template();
    const InstructionText ins = instruction_text(cfg.request.prompt_template);
    const std::vector<std::string> paragraphs = split_paragraphs(builtin_filler());
    const TokenCounter count = [&](const std::string& t) { return int(chat.text(t).size()); };
    static const char* names[] = {"Ana",   "Boris", "Chen", "Dalia", "Emeka", "Farah",
                                  "Goran", "Hiro",  "Ines", "Jonas", "Kemal", "Lena"};
    static const char* cities[] = {"Lisbon", "Oslo",   "Quito", "Nairobi", "Hanoi", "Tbilisi",
                                   "Perth",  "Bergen", "Kyoto", "Dakar",   "Lima",  "Riga"};
    std::mt19937_64 rng(cfg.niah.seed + 17);
    std::vector<Task> tasks;
    for (int kind = 0; kind < 2; ++kind) {
        for (int t = 0; t < cfg.reform.tasks; ++t) {
            const std::string name = names[rng() % 12], city = cities[rng() % 12];
            const std::string key = std::to_string(10000 + rng() % 90000);
            HaystackSpec spec;
            spec.target_tokens = cfg.reform.task_tokens;
            spec.depth = double(rng() % 1000) / 999.0;
            spec.seed = rng();
            spec.separator = ins.doc_separator;
            std::string question;
            if (kind == 0) {
                spec.needle = "The pass key of " + name + " is " + key + ".";
                question = "What is the pass key of " + name + "?";
            } else {
                spec.needle = "The pass key of " + city + " is " + key + ".";
                question = "What is the pass key of the city where " + name + " lives?";
            }
            Haystack h = build_haystack(paragraphs, spec, count);
            if (kind == 1) {  // the first hop, in another document
                int d = int(rng() % h.documents.size());
                if (d == h.needle_doc) d = (d + 1) % int(h.documents.size());
                h.documents[size_t(d)] = name + " lives in " + city + ". " + h.documents[size_t(d)];
            }
            Task task;
            task.kind = kind == 0 ? "pattern" : "multi-hop";
            task.req = prepare_request(tok, chat,
                                       RequestText{cfg.request.system, h.documents, question}, cfg);
            const std::vector<int32_t> seq = task.req.context_sequence();
            int at = -1;
            std::vector<int32_t> ids;
            for (const std::string& form : {" " + key, key}) {
                ids = chat.text(form);
                at = find_tokens(seq, ids);
                if (at >= 0) break;
            }
            IF_CHECK(at >= 0,
                     "reform-heads: the pass key " << key << " is not found in the tokens");
            for (size_t i = 0; i < ids.size(); ++i) task.answer.push_back(at + int(i));
            tasks.push_back(std::move(task));
        }
    }
    return tasks;
}

// One state of one head.
struct HeadId {
    int layer, head;
    char kind;
};

// At every layer: every head's normalized states, the answer tokens' normalized ranks.
class RankTap final : public LayerTap {
  public:
    RankTap(const Model& m, const Task& t, int n_ctx_tokens, std::vector<double>& total)
        : m_(m), t_(t), T_(n_ctx_tokens), total_(total) {}
    bool wants(int) const override { return true; }
    void on_attention(int layer, const float* q, const float*, int n, const int32_t* pos,
                      const int32_t*, const KvCache& cache) override {
        const ModelConfig& c = m_.config();
        const int D = c.head_dim;
        std::vector<float> k(size_t(n) * cache.row()), v(k.size());
        cache.read_range(layer, 0, n, k.data(), v.data());  // CPU backend: host memory
        const int qb = T_ + t_.req.question_begin, qe = T_ + t_.req.question_end;
        const int per_layer = c.n_head + 2 * c.n_head_kv;
        std::vector<float> st(size_t(n) * D);
        for (int hi = 0; hi < per_layer; ++hi) {
            const char kind = hi < c.n_head ? 'q' : hi < c.n_head + c.n_head_kv ? 'k' : 'v';
            const int head = kind == 'q'   ? hi
                             : kind == 'k' ? hi - c.n_head
                                           : hi - c.n_head - c.n_head_kv;
            const float* src = kind == 'q' ? q : kind == 'k' ? k.data() : v.data();
            const int stride = kind == 'q' ? c.n_head * D : cache.row();
            for (int i = 0; i < n; ++i) {
                float* x = st.data() + size_t(i) * D;
                std::copy_n(src + size_t(i) * stride + size_t(head) * D, D, x);
                if (kind != 'v') {
                    for (int d = 0; d < D / 2; ++d) {
                        const double a = double(pos[i]) * m_.inv_freq()[size_t(d)];
                        const float cs = float(std::cos(a)), sn = float(std::sin(a));
                        const float u = x[d], w = x[d + D / 2];
                        x[d] = u * cs + w * sn;
                        x[d + D / 2] = w * cs - u * sn;
                    }
                }
                double ss = 0.0;
                for (int d = 0; d < D; ++d) ss += double(x[d]) * x[d];
                const float inv = ss > 0 ? float(1.0 / std::sqrt(ss)) : 0.0f;
                for (int d = 0; d < D; ++d) x[d] *= inv;
            }
            std::vector<float> score(static_cast<size_t>(T_));
            for (int j = 0; j < T_; ++j) {
                float best = -2.0f;
                for (int i = qb; i < qe; ++i) {
                    float dot = 0.0f;
                    for (int d = 0; d < D; ++d)
                        dot += st[size_t(j) * D + d] * st[size_t(i) * D + d];
                    best = std::max(best, dot);
                }
                score[size_t(j)] = best;
            }
            double rank_sum = 0.0;
            for (int a : t_.answer) {
                int above = 0;
                for (int j = 0; j < T_; ++j) above += score[size_t(j)] > score[size_t(a)];
                rank_sum += double(above) / double(std::max(1, T_ - 1));
            }
            total_[size_t(layer) * per_layer + hi] += rank_sum / double(t_.answer.size());
        }
    }

  private:
    const Model& m_;
    const Task& t_;
    int T_;
    std::vector<double>& total_;
};

}  // namespace

nlohmann::json run_reform_heads(const Config& cfg, Session& s) {
    const auto t0 = std::chrono::steady_clock::now();
    Model& model = *s.model;
    IF_CHECK(model.backend().name() == "cpu", "job reform-heads runs on the cpu backend");
    const ModelConfig& c = model.config();
    const int per_layer = c.n_head + 2 * c.n_head_kv;
    const std::vector<Task> tasks = make_tasks(cfg, s);
    std::printf("reform-heads: %s, %zu tasks (%d pattern, %d multi-hop) of ~%d tokens, %d states\n",
                s.weights->source.c_str(), tasks.size(), cfg.reform.tasks, cfg.reform.tasks,
                cfg.reform.task_tokens, c.n_layer * per_layer);
    std::vector<double> total(size_t(c.n_layer) * per_layer, 0.0);
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
        const Task& t = tasks[ti];
        const std::vector<int32_t> seq = t.req.full_sequence();
        const int n = int(seq.size());
        IF_CHECK(n <= c.n_ctx_train, "reform.task_tokens: a task of " << n << " tokens exceeds the "
                                                                      << c.n_ctx_train
                                                                      << " positions of the model");
        KvCache cache = model.make_cache(n);
        std::vector<int32_t> pos(n), slots(n);
        for (int i = 0; i < n; ++i) pos[i] = slots[i] = i;
        cache.append(n, pos.data(), nullptr);
        Buffer hidden = model.backend().alloc_floats(size_t(n) * c.n_embd);
        model.embed(seq.data(), n, hidden.data());
        RankTap tap(model, t, t.req.context_tokens(), total);
        for (int l = 0; l < c.n_layer; ++l) {
            model.layer_forward(l, hidden.data(), n, pos.data(), nullptr, slots.data(), cache,
                                &tap);
        }
        std::printf("[task %zu/%zu] %-9s %d tokens, answer at %d\n", ti + 1, tasks.size(),
                    t.kind.c_str(), n, t.answer.front());
        std::fflush(stdout);
    }
    std::vector<int> order(total.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return total[a] < total[b]; });
    auto id_of = [&](int i) {
        const int l = i / per_layer, hi = i % per_layer;
        const char kind = hi < c.n_head ? 'q' : hi < c.n_head + c.n_head_kv ? 'k' : 'v';
        const int head = kind == 'q'   ? hi
                         : kind == 'k' ? hi - c.n_head
                                       : hi - c.n_head - c.n_head_kv;
        return HeadId{l, head, kind};
    };
    json ranking = json::array();
    std::printf("\n rank  layer  head  state  mean normalized rank\n");
    for (size_t r = 0; r < order.size(); ++r) {
        const HeadId h = id_of(order[r]);
        const double m = total[size_t(order[r])] / double(tasks.size());
        ranking.push_back({{"layer", h.layer},
                           {"head", h.head},
                           {"state", std::string(1, h.kind)},
                           {"mean_normalized_rank", m}});
        if (r < 20) std::printf(" %4zu  %5d  %4d  %5c  %.4f\n", r + 1, h.layer, h.head, h.kind, m);
    }
    std::string snippet = "[reform]\nheads = [";
    json heads = json::array();
    for (int r = 0; r < std::min<int>(cfg.reform.top, int(order.size())); ++r) {
        const HeadId h = id_of(order[size_t(r)]);
        snippet += (r ? ", " : "") + std::string("[") + std::to_string(h.layer) + ", " +
                   std::to_string(h.head) + ", \"" + h.kind + "\"]";
        heads.push_back(json::array({h.layer, h.head, std::string(1, h.kind)}));
    }
    snippet += "]\n";
    std::printf("\nsnippet:\n%s", snippet.c_str());
    if (!cfg.output.path.empty()) {
        std::string p = cfg.output.path;
        const size_t dot = p.find_last_of('.');
        const size_t slash = p.find_last_of('/');
        if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) p.resize(dot);
        p += ".toml";
        write_file_atomic(p, "# reform-heads on " + s.weights->source + "\n" + snippet);
        std::printf("snippet    : %s\n", p.c_str());
    }
    json out;
    out["job"] = "reform-heads";
    out["model"] = s.weights->source;
    out["tasks"] = int(tasks.size());
    out["task_tokens"] = cfg.reform.task_tokens;
    out["heads"] = heads;
    out["snippet"] = snippet;
    out["ranking"] = ranking;
    out["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out["config"] = cfg.to_json();
    return out;
}

}  // namespace infoflow
