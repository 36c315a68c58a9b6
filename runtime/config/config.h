// The run configuration of infoflow_sp (docs/design.md §9): one typed field per TOML key, loaded
// from a config file plus `--set section.key=value` overrides, validated once here (types, ranges,
// enum names, unknown keys with a "did you mean" hint), every error naming the key and
// FILE:LINE (or the `--set` argument). The effective config has a canonical JSON form
// (`to_json`, every key) and a hash of it, compared across ranks at start-up (docs/design.md §11).
//
// Relative paths (model.path, request.documents_file, request.question_file, niah.filler_file,
// eval.data_file, store.path, output.path, output.csv) are kept as written and
// resolved against the current working directory of the process — the directory `mpirun` /
// `srun` / the user launches from, usually the repository root — never against the config
// file's directory. So `--set` paths, file paths and `--out` behave alike, and the effective
// config (and its hash) does not depend on where the config file lives.
//
// This file does not read model files or check that input files exist; `load_request_text`
// reads the request's documents / question files when a job needs them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace infoflow {

struct Config {
    // Enum-valued keys. Their TOML spellings are the `to_string` names below
    // ("bench-ttft", "hl-tp", "auto", ...).
    enum class Job { answer, niah, eval, bench_ttft, cache_build, reform_heads, sweep, serve };
    enum class Backend { cpu, cuda };
    enum class DType { fp32, bf16, fp16 };
    enum class Template { qa, longbench, raw };  // instruction template (request.template)
    enum class ChatTemplate { automatic, chatml, llama3, raw };  // "auto": from the model file
    enum class ChunkMode { passage, fixed };
    enum class Method { full, none, infoflow, cacheblend, epic, ring, reform, h2o, streamingllm };
    enum class Query { question, suffix };
    enum class Aggregate { norm, sum };
    enum class Layout { global, hl_tp, hl_hp, tl_tp };
    enum class Softmax { global, local };
    enum class BlendMetric { v, k };
    enum class EpicMode { ratio, fixed };
    enum class Comm { automatic, mpi, nccl, self };  // "auto"
    // parallel.exchange (docs/design.md §5.2): what a recomputed token and the answer see on P
    // ranks, and what travels for it.
    enum class Exchange {
        kv,               // recompute and answer: chunk 0, own shard (rank 0's), S
        exact,            // pass-Q: every key, the one-rank result
        kv_answer_exact,  // recompute as kv, the answer across the ranks (every key)
        exact_answer_kv,  // recompute as exact, the answer as kv (the decomposition's other half)
        gather,           // every context row to every rank as stored: the one-rank result
        compact_int8,     // the unselected rows once as 8-bit codes, S at full precision
        compact_int4,     // the same with 4-bit codes
        compact_int4h,    // 4-bit codes of each head turned by a Hadamard matrix
        automatic         // "auto" (the default): resolve_exchange picks one for the rank count
    };
    enum class Placement { chunks, tokens };    // parallel.placement
    enum class Balance { automatic, on, off };  // parallel.balance: "auto" | true | false
    enum class LinkKind { automatic, shm, tcp, ib, nvlink };  // parallel.link ("auto")
    enum class RingLayout { zigzag, contiguous };
    enum class RingExchange { p2p, allgather };
    enum class StoreMode { read, read_write };
    enum class StoreDType { f16, bf16, f32 };
    enum class KvDType { f32, f16, bf16 };
    enum class Weights { native, f32 };             // model.weights
    enum class CpuIsa { automatic, avx2, avx512, amx };  // cpu.isa ("auto")
    enum class SweepClock { wall, cpu };                 // sweep.clock

    static constexpr int k_default_chunk_size = 2048;

    struct ModelSection {
        std::string path =
            "models/SmolLM2-135M-Instruct.Q4_1.gguf";  // GGUF, HF dir, random:<shape>
        Backend backend = Backend::cpu;
        int threads = 2;                  // CPU threads per rank; 0 = all cores (OpenMP default)
        DType dtype = DType::fp32;        // compute type of weights and activations
        bool check_finite = true;         // reject NaN/Inf in the loaded weights, naming the tensor
        KvDType kv_dtype = KvDType::f32;  // storage type of the KV cache
        Weights weights = Weights::native;  // CPU: matrices kept in the file's stored type
        // Positions the model accepts; 0 = its trained window. More runs RoPE positions past the
        // window: timing only (bench-ttft beyond SmolLM2's 8192 positions).
        int positions = 0;
    };
    struct CpuSection {
        CpuIsa isa = CpuIsa::automatic;  // CPU kernel path (kernels/cpu/cpu_features.h)
    };
    struct RequestSection {
        std::string system;                  // system prompt (part of chunk 0)
        std::vector<std::string> documents;  // inline documents, each non-empty
        std::string documents_file;          // .jsonl or .txt (see load_request_text)
        std::string question;
        std::string question_file;                // whole file, trailing whitespace trimmed
        Template prompt_template = Template::qa;  // key: request.template
        ChatTemplate chat_template = ChatTemplate::automatic;
        // Expected answer, printed next to the model's; a run "matches" when the answer
        // contains it (case-insensitive). Empty = none.
        std::string reference;
    };
    struct ChunkingSection {
        ChunkMode mode = ChunkMode::passage;
        // Tokens per chunk for mode "fixed", > 0. Unset = k_default_chunk_size on one rank, and
        // one chunk per rank in a distributed "fixed" run (docs/design.md §5.1).
        std::optional<int> size;
        std::string sink = "bos";  // "bos", "none", or a literal token string
        int size_or_default() const { return size ? *size : k_default_chunk_size; }
    };
    struct MethodSection {
        Method name = Method::infoflow;
        double ratio = 0.15;   // recompute fraction of T, in [0, 1]
        bool reorder = false;  // docs/design.md §3.7
    };
    struct ScoringSection {
        Query query = Query::question;
        Aggregate aggregate = Aggregate::norm;
        Layout layout = Layout::global;
        std::vector<int>
            layers;  // empty = the model rule of docs/design.md §3.3 (resolve_scoring_layers)
        Softmax softmax = Softmax::global;
        int block = 512;  // row/column block of the scoring pass, > 0
        // InfoFlow's selection variants (docs/quality.md); all off = the paper's rule.
        bool value_norm = false;        // column score x ||v|| of the column at that layer
        double deviation_weight = 0.0;  // x (CacheBlend's layer-1 deviation)^w; 0 = off
        int span = 0;                   // scores max-pooled over +-span tokens of a chunk
        double chunk_decay = 0.0;       // a chunk's m-th best token weighted 1/(1+d*m)
        double chunk_floor = 0.0;       // share of the budget kept as per-chunk quotas
    };
    struct CacheBlendSection {
        BlendMetric metric = BlendMetric::v;
    };
    struct EpicSection {
        EpicMode mode = EpicMode::ratio;
        int k = 16;  // tokens per chunk for mode "fixed", >= 1
    };
    // REFORM and its baselines h2o / streamingllm (docs/design.md §4.1): recurrent chunked
    // forwarding with a compressed cache, retrieval embeddings of chosen heads, gather, recompute.
    struct ReformHead {
        int layer = 0;
        int head = 0;     // query head for "q", KV head for "k" and "v"
        char kind = 'k';  // 'q', 'k' or 'v'
    };
    struct ReformSection {
        int chunk_size = 1024;  // tokens per recurrent step, > 0
        int budget = 2048;      // cache tokens kept after each compression, > 0
        int recent = 256;       // h2o/reform: most recent tokens always kept, >= 0
        int sink = 4;           // streamingllm: first tokens always kept, >= 0
        // Retrieval embedding heads; the default is the `reform-heads` result for SmolLM2.
        std::vector<ReformHead> heads = {{21, 2, 'v'}, {27, 0, 'v'}, {22, 7, 'q'}};
        int pool = 129;          // max-pool window of the scores, odd, > 0
        int gather = 1024;       // tokens gathered by score for the recompute, >= 0
        int keep_ends = 256;     // first and last tokens always gathered, >= 0
        int tasks = 8;           // reform-heads: synthetic tasks per kind, > 0
        int task_tokens = 2048;  // reform-heads: context tokens per task, > 0
        int top = 3;             // reform-heads: heads written to the snippet, > 0
    };
    struct ParallelSection {
        Comm comm = Comm::automatic;
        Exchange exchange = Exchange::automatic;
        // > 1: single-rank run with what `exchange` computes on this many ranks (§5.2)
        int emulate_ranks = 0;
        // job sweep: > 1 runs a point's method on this many virtual ranks in one process (the
        // sequence-parallel code over an in-process communicator); 0/1 = one rank.
        int virtual_ranks = 0;
        // "kv": helpers run part of the busiest ranks' recompute; "auto" when the plan's cost
        // model (compute_gmacs, the link's alpha-beta) says it is faster with the extra bytes.
        Balance balance = Balance::automatic;
        LinkKind link = LinkKind::automatic;  // the link the cost model assumes ("auto": detected)
        double link_alpha_us = 0.0;           // > 0: overrides the link's latency
        double link_gbs = 0.0;                // > 0: overrides the link's bandwidth (GB/s)
        double compute_gmacs = 0.0;           // > 0: overrides the backend's nominal rate
        Placement placement = Placement::chunks;  // "tokens": chunks cut at even shard edges
        double timeout_s = 600.0;                 // a peer that does not arrive ends the job (§11)
        double startup_timeout_s = 300.0;         // the same until the start-up checks are done
    };
    struct RingSection {
        RingLayout layout = RingLayout::zigzag;
        RingExchange exchange = RingExchange::p2p;
    };
    struct DecodeSection {
        int max_new_tokens = 32;   // >= 0
        double temperature = 0.0;  // >= 0; 0 = greedy
        uint64_t seed = 0;
        std::optional<int> top_k;  // > 0; unset = whole vocabulary
        double top_p = 1.0;        // nucleus sampling: smallest set of mass >= top_p, in (0, 1]
        // Added to the logits of these token ids before sampling ([id, bias], bias in
        // [-100, 100]; OpenAI's logit_bias).
        std::vector<std::pair<int, double>> logit_bias;
    };
    struct NiahSection {
        std::vector<int> lengths = {4096, 8192};                   // context tokens, each > 0
        std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};  // needle depth, in [0, 1]
        std::vector<Method> methods = {Method::full, Method::infoflow};
        std::vector<Layout> layouts = {Layout::global};
        std::string needle = "The special magic number is 7481.";
        std::string question = "What is the special magic number mentioned in the text?";
        std::string answer = "7481";  // a run is correct when the answer text contains it
        std::string filler_file;      // text the haystack is cut from; empty = built-in filler
        uint64_t seed = 0;
    };
    struct EvalSection {
        std::string data_file;  // .jsonl samples
        int max_samples = 0;    // 0 = all
        std::string task;       // dataset / metric name, e.g. "hotpotqa"
    };
    struct BenchSection {
        std::vector<int> lengths = {8192, 16384, 32768};  // context tokens, each > 0
        std::vector<Method> methods = {Method::full, Method::ring, Method::infoflow};
        // Row labels to run ("single", "ring/zigzag", "infoflow/kv", ...); empty = every row.
        std::vector<std::string> rows;
        int runs = 5;     // timed runs, median reported, >= 1
        int warmup = 1;   // >= 0
        int threads = 0;  // CPU threads per rank for the benchmark; 0 = model.threads
        // A row whose (max - min) / median TTFT exceeds this is flagged as noisy.
        double spread_limit = 0.25;
        // parallel.emulate_ranks virtual ranks in one process, timed (runtime/parallel/emulate.h)
        bool emulate_timing = false;
        double link_alpha_us = 10.0;   // alpha-beta model of a link (comm/comm_model.h)
        double link_beta_gbs = 370.0;  // GB/s per direction
        // What the measured times read (as sweep.clock): "cpu" = the process's CPU time, for one
        // process with one thread (one rank, or bench.emulate_timing's virtual ranks).
        SweepClock clock = SweepClock::wall;
    };
    // Job `sweep` (docs/quality.md): points (config overrides) x generated cases, every point
    // scored by teacher-forced fidelity to `full` and by answer accuracy, with intervals.
    struct SweepSection {
        std::string key;                  // the key one point each of `values` sets; "" = none
        std::vector<std::string> values;  // TOML value texts for sweep.key
        std::vector<std::string> points;  // more points: "key=value; key=value"
        std::string reference = "full";   // teacher-forced reference: "full" | "gold"
        int cases = 100;                  // generated cases, >= 1
        std::vector<std::string> kinds = {"niah", "facts"};  // niah | facts | multihop
        int context_tokens = 600;  // approximate context tokens of a case, > 0
        int documents = 6;         // documents (chunks) per case, >= 2
        uint64_t seed = 0;
        // Keep only cases `full` answers correctly (more are generated until `cases` are kept,
        // at most 4 x cases tries).
        bool full_correct_only = false;
        std::string cases_file;  // also write the cases as eval JSONL; "" = no
        int first_case = 0;      // generator index of the first case tried (shards of a run)
        // The generator's long layout (runtime/jobs/cases.h); all unset = the original layout.
        std::vector<int> document_tokens;  // {lo, hi}: log-uniform document lengths
        std::vector<double> depths;        // evidence depths in [0, 1], in turn
        int distractors = -1;              // documents with a distractor; -1 = every other
        std::string filler_file;           // filler text; "" = the built-in prose
        // What the points' times read (runtime/core/timing_clock.h): "cpu" = the process's CPU
        // time, which leaves out what other processes took (model.threads = 1 only).
        SweepClock clock = SweepClock::wall;
    };
    // The document KV store (docs/design.md §8; layout in docs/store.md). Replaces the former
    // [cache] section (cache.path, cache.build_from), which is no longer accepted.
    struct StoreSection {
        std::string path;  // HDF5 index file; empty = no store
        StoreMode mode = StoreMode::read;
        StoreDType dtype = StoreDType::f16;
        int compression = 0;  // 0 = none, 1..9 = shuffle + deflate level
    };
    // Job `serve` (docs/serve.md): the OpenAI-compatible HTTP server on rank 0.
    struct ServeSection {
        std::string host = "127.0.0.1";  // address rank 0 listens on (loopback by default)
        int port = 8080;                 // 0 = any free port (printed at start-up)
        std::string api_key;             // Bearer key the clients must send; "" = none
        // Environment variable that holds the key when api_key is empty; "" = none.
        std::string api_key_env = "INFOFLOW_API_KEY";
        // Serve a non-loopback address without a key (never the default).
        bool allow_unauthenticated = false;
        int queue_size = 16;  // requests waiting to be admitted (429 beyond)
        // Batching (docs/serve.md "Batching"): requests running at once (decoding together, or
        // the one in its context work), the tokens of context work between two decode steps of
        // the running ones, and the KV memory all running requests may hold.
        int max_batch = 16;
        int prefill_chunk = 64;
        // The most milliseconds of context work between two decode steps while requests
        // decode (0: only prefill_chunk bounds it).
        double prefill_slice_ms = 2.5;
        int kv_budget_mb = 4096;
        // MiB of freed buffers each rank keeps for the next request (kernels/cpu/buffer_pool.h).
        int buffer_pool_mb = 256;
        // MiB of chunk-0 K/V (the chat prefix) each rank keeps across requests (prefix_cache.h).
        int prefix_cache_mb = 64;
        int max_body_bytes = 8 << 20;    // request body limit (413 beyond)
        int max_tokens = 1024;           // cap on a request's max_tokens (400 beyond)
        double request_timeout_s = 300;  // arrival to last token (504 beyond)
        double heartbeat_s = 1.0;        // idle ranks are checked this often (< parallel.timeout_s)
        int http_threads = 32;           // connections handled at once
        std::string model_name;          // model id of the API; "" = the model file's name
    };
    struct OutputSection {
        std::string path;  // results JSON (also --out)
        std::string csv;   // table rows as CSV
        // File stem of the results under `--results-dir DIR` (DIR/NAME.json and its CSV twin);
        // empty = the config file's name without its extension.
        std::string name;
        // job `answer`: the full-vocabulary first-token log-probs as raw float32
        // (docs/results-schema.md)
        std::string logits_file;
    };

    Job job = Job::answer;
    ModelSection model;
    CpuSection cpu;
    RequestSection request;
    ChunkingSection chunking;
    MethodSection method;
    ScoringSection scoring;
    CacheBlendSection cacheblend;
    EpicSection epic;
    ReformSection reform;
    ParallelSection parallel;
    RingSection ring;
    DecodeSection decode;
    NiahSection niah;
    EvalSection eval;
    BenchSection bench;
    SweepSection sweep;
    StoreSection store;
    ServeSection serve;
    OutputSection output;

    // Effective config, every key, as {"job": ..., "model": {...}, ...}; unset optionals are
    // null. Enum values use their TOML spellings.
    nlohmann::json to_json() const;
    // 16 hex digits: FNV-1a 64 of to_json().dump() (keys sorted, so canonical).
    std::string hash() const;
    // Inverse of to_json (same validation as a TOML file; missing keys keep defaults; null
    // leaves an optional unset). `origin` names the source in errors.
    static Config from_json(const nlohmann::json& j, const std::string& origin = "<json>");
};

// Equality of every key (compares the canonical JSON forms).
bool operator==(const Config& a, const Config& b);
bool operator!=(const Config& a, const Config& b);

const char* to_string(Config::Job v);
const char* to_string(Config::Backend v);
const char* to_string(Config::DType v);
const char* to_string(Config::Weights v);
const char* to_string(Config::CpuIsa v);
const char* to_string(Config::SweepClock v);
const char* to_string(Config::Template v);
const char* to_string(Config::ChatTemplate v);
const char* to_string(Config::ChunkMode v);
const char* to_string(Config::Method v);
const char* to_string(Config::Query v);
const char* to_string(Config::Aggregate v);
const char* to_string(Config::Layout v);
const char* to_string(Config::Softmax v);
const char* to_string(Config::BlendMetric v);
const char* to_string(Config::EpicMode v);
const char* to_string(Config::Comm v);
const char* to_string(Config::Exchange v);
// What a parallel.exchange value computes on P ranks (docs/design.md §5.2):
// recomputed tokens see chunk 0, their own shard and S (`kv`, `kv-answer-exact`); the answer's
// rows see chunk 0, rank 0's shard and S (`kv`, `exact-answer-kv`); every rank gathers every
// context token's K/V once and the answer runs on rank 0 (`gather`, `compact-*`).
bool exchange_recompute_kv(Config::Exchange v);
bool exchange_answer_kv(Config::Exchange v);
bool exchange_whole_context(Config::Exchange v);
// parallel.exchange made concrete for `ranks` ranks (real, virtual or emulated): "auto" is the
// measured default (docs/quality.md "P ranks"); any other value is itself. Every pipeline runs
// the resolved value, and results report it.
Config::Exchange resolve_exchange(Config::Exchange v, int ranks);
// `cfg` with parallel.exchange resolved for `ranks` ranks.
Config with_exchange_for(const Config& cfg, int ranks);
// The answer and the decode run on rank 0 over its cache (every value but `exact` and
// `kv-answer-exact`, which merge partial states across the ranks).
bool exchange_answer_on_rank0(Config::Exchange v);
const char* to_string(Config::Placement v);
const char* to_string(Config::Balance v);
const char* to_string(Config::LinkKind v);
const char* to_string(Config::RingLayout v);
const char* to_string(Config::RingExchange v);
const char* to_string(Config::StoreMode v);
const char* to_string(Config::StoreDType v);
const char* to_string(Config::KvDType v);

// Loads a TOML config file, then applies `sets` ("section.key=value", in order), then validates
// across keys. Errors (infoflow::Error):
//   parse error        "FILE:LINE:COL: message"
//   unknown key        "unknown key 'method.rato' at FILE:LINE (did you mean 'method.ratio'?)"
//   wrong type         "method.ratio at FILE:LINE: expected a float, got string"
//   bad value          "method.name at FILE:LINE: 'infoflw' is not one of full|none|..."
//   in a --set         the same, with "--set method.ratio" in place of "method.ratio at FILE:LINE"
Config load_config(const std::string& path, const std::vector<std::string>& sets = {});
// The same from TOML text; `origin` stands for FILE in messages.
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& sets = {});
// Applies overrides to an already loaded config and re-validates. The value of a
// "section.key=value" is parsed as a TOML value (42, 0.3, true, "text", [1, 2]); text that is not
// a TOML value is taken as a string, and so is any value given to a string key.
void apply_overrides(Config& cfg, const std::vector<std::string>& sets);

// Rejects values the config can name but this build does not run yet (backend
// "cuda", comm "nccl", compute types other than fp32): an
// Error "KEY = VALUE: not implemented yet (planned, ...)". The loaders accept those values so
// configs and their JSON round-trip; the command line (load_config_from_cli) calls this.
void check_implemented(const Config& cfg);

// Every key the loader knows, "job" and "section.key", in to_json order.
std::vector<std::string> config_keys();

// One key as the loader defines it, for the generated reference (docs/config.md,
// `infoflow_sp --print-config-reference`).
struct ConfigKeyInfo {
    std::string key;       // "job" or "section.key"
    std::string type;      // accepted type and range: "str", "bool", "int >= 0", "[enum]", ...
    std::string choices;   // enum spellings "a|b|c" for enum keys; empty otherwise
    nlohmann::json value;  // the default, as in to_json (null: unset)
};
// Every key in config_keys() order.
std::vector<ConfigKeyInfo> config_key_info();

// Scoring layers for a model of `n_layer` layers (docs/design.md §3.3): `layers` when non-empty
// (each must be < n_layer, else an error naming scoring.layers); otherwise the measured set of a
// measured depth ([2, 3, 4, 5] for 30 layers, SmolLM2-135M), [22, 23, 24, 25] for other
// depths >= 26, else the four layers ending at round(0.8 * n_layer), clamped to the model.
std::vector<int> resolve_scoring_layers(const std::vector<int>& layers, int n_layer);

// The request's text with files read in: documents from request.documents or
// request.documents_file, the question from request.question or request.question_file.
// documents_file formats:
//   .jsonl  one document per non-empty line, a JSON object with a string "text" (or "context")
//   .txt    documents separated by lines containing only "---"; each document is trimmed of
//           surrounding blank lines / whitespace; empty documents are skipped
//   DIR/    (a path ending in '/') a folder: every *.txt file in it, by name, is one document
//           (trimmed; empty files skipped)
// Errors name the file (and line for .jsonl).
struct RequestText {
    std::string system;
    std::vector<std::string> documents;
    std::string question;
    // Earlier turns of a conversation (role "system" | "user" | "assistant", content), before
    // the question's user turn; they go into chunk 0 (job serve's chat requests). When set,
    // `system` must be empty (a system turn is the first of them).
    struct Turn {
        std::string role;
        std::string content;
    };
    std::vector<Turn> history = {};
};
RequestText load_request_text(const Config::RequestSection& req);
std::vector<std::string> read_documents_file(const std::string& path);

}  // namespace infoflow
