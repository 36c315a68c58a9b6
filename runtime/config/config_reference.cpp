// The generated config reference: keys, types, ranges, defaults and enum names come from
// config_key_info() (the loader's field table); the meaning of each key and the section
// headings are the only hand-written parts, kept here next to each other.
#include "runtime/config/config_reference.h"

#include <map>
#include <sstream>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/core/error.h"

namespace infoflow {
namespace {

// Section headings, in the order the sections first appear in the field table.
const std::map<std::string, std::string>& section_titles() {
    static const std::map<std::string, std::string> t = {
        {"", "top level"},
        {"model", "[model]"},
        {"cpu", "[cpu]"},
        {"request", "[request]"},
        {"chunking", "[chunking]"},
        {"method", "[method]"},
        {"scoring", "[scoring]"},
        {"cacheblend", "[cacheblend]"},
        {"epic", "[epic]"},
        {"reform", "[reform] (methods `reform`, `h2o`, `streamingllm`; job `reform-heads`)"},
        {"parallel", "[parallel]"},
        {"ring", "[ring]"},
        {"decode", "[decode]"},
        {"niah", "[niah] (job `niah`)"},
        {"eval", "[eval] (job `eval`)"},
        {"bench", "[bench] (job `bench-ttft`)"},
        {"sweep", "[sweep] (job `sweep`, docs/quality.md)"},
        {"store", "[store] (document KV store, docs/store.md)"},
        {"serve", "[serve] (job `serve`, the OpenAI-compatible server, docs/serve.md)"},
        {"output", "[output]"},
    };
    return t;
}

// What each key means. Markdown; `|` inside a cell must be written `\|`.
const std::map<std::string, std::string>& descriptions() {
    static const std::map<std::string, std::string> d = {
        {"job",
         "what runs: one request (`answer`), a needle-in-a-haystack sweep (`niah`), a "
         "LongBench-format QA evaluation (`eval`), the TTFT table (`bench-ttft`), or prefill "
         "documents once into the KV store (`cache-build`, needs `store.path`), rank the "
         "retrieval heads of REFORM on synthetic tasks (`reform-heads`), or run a quality "
         "sweep over config points on generated cases (`sweep`, docs/quality.md), or serve the "
         "OpenAI HTTP API on rank 0 with the model loaded once on every rank (`serve`, "
         "docs/serve.md)"},
        {"model.path",
         "GGUF file, Hugging Face directory, or `random:<shape>[:seed]` (seeded random weights: "
         "`tiny`, `tiny-qwen2`, `tiny-qwen3`, `smollm2-135m`, `llama-3.1-8b`, `qwen3-14b`)"},
        {"model.backend",
         "compute backend; `cuda`: bf16 weights, cuBLAS and FlashInfer on the rank's GPU (built, "
         "not "
         "yet run on a GPU)"},
        {"model.check_finite",
         "reject NaN/Inf in any loaded tensor of a model file, naming the tensor"},
        {"model.threads", "CPU threads per rank; `0` = all cores (the OpenMP default)"},
        {"model.positions",
         "positions the model accepts; `0` = its trained window (GGUF `context_length`, "
         "`max_position_embeddings`). A larger value lets requests run past the window with the "
         "same RoPE: the answers there mean nothing, so it is for timing only (bench-ttft at "
         "16K-32K on SmolLM2's shape; the table and rows say `past window`); a warning is "
         "printed at load"},
        {"model.kv_dtype",
         "storage type of the KV cache: `f32` (the exact reference), `f16` or `bf16` (half the "
         "memory and half the K/V bytes exchanged between ranks; attention widens to fp32 and "
         "accumulates in fp32; on the cuda backend FlashInfer reads a bf16 cache in place, f32 "
         "and f16 rows are cast to bf16 for it)"},
        {"model.weights",
         "CPU backend: `native` keeps every matrix in the file's stored type (GGUF "
         "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q6_K/F16/BF16, safetensors F16/BF16; F32 matrices stay fp32; "
         "Q4_0/Q4_1/Q8_0 rows block-interleaved in "
         "groups of 4, the same bytes; every pass but decode (prefill, scoring, recompute, "
         "suffix) multiplies fp32 activations by the weights dequantized to fp32 in one fixed "
         "order of operations, so a token's result does not depend on how many rows share its "
         "call (docs/design.md §6); decode steps use fused dot products with activations "
         "quantized to 8 bits per 32-value block, the LM head with fp32 activations; all of it in "
         "one mapping on transparent huge pages where the kernel allows); `f32` "
         "dequantizes the whole model to fp32 at load (4 bytes per weight), and the fp32 rows "
         "take the same products (the same bits). The `cuda` backend always loads `f32` (bf16 on "
         "the device)"},
        {"cpu.isa",
         "CPU kernel path: `auto` (AMX where the CPU has it and Linux grants the tile state, "
         "else AVX-512 with VNNI/BF16 where the CPU has it, else AVX2), `avx2`, `avx512` (an "
         "error on a CPU without AVX-512) or `amx` (AVX-512 with every product of the "
         "prefill, scoring, recompute and suffix passes and the many-row attention's Q·Kᵀ on "
         "bf16 tiles, fp32 accumulation; an error naming what is missing on a CPU without usable "
         "AMX); the environment variable INFOFLOW_CPU_ISA does the same when this key is `auto`. "
         "What each path promises: docs/design.md §6, \"Numerics per CPU path\". The run summary "
         "prints the path and, on avx512, why not amx; `infoflow_sp --version` lists the paths "
         "this CPU can run. Test hooks (never the default): INFOFLOW_AMX_EMULATE=1 runs the "
         "tiles in a software emulator (~2.3x the avx512 path's time), so `amx` can be tested on "
         "a CPU without it; INFOFLOW_CPU_CEILING=avx2|avx512 takes the CPU to have no path above "
         "it"},
        {"model.dtype",
         "compute type of weights and activations; the CPU backend computes in fp32 (`bf16` / "
         "`fp16` are planned: not implemented yet)"},
        {"request.system", "system prompt (part of chunk 0)"},
        {"request.documents", "the context documents, inline"},
        {"request.documents_file",
         "documents from a file instead (not both): `.jsonl` = one JSON object per non-empty "
         "line with a string `\"text\"` (or `\"context\"`), or a JSON string; `.txt` = documents "
         "separated by lines holding only `---`, each trimmed, empty ones skipped"},
        {"request.question", "the question"},
        {"request.reference",
         "expected answer: printed next to the model's answer with whether the answer contains it "
         "(case-insensitive), and stored in the result JSON"},
        {"request.question_file", "the question from a text file instead (not both), trimmed"},
        {"request.template",
         "instruction template around the question (`longbench` is the paper's wording, `raw` "
         "adds nothing)"},
        {"request.chat_template",
         "chat format; `auto` detects it from the model file (ChatML or Llama-3; an error when it "
         "is neither: set `raw` for no template)"},
        {"chunking.mode",
         "`passage`: one chunk per document; `fixed`: the concatenated context cut into chunks "
         "of `chunking.size` tokens"},
        {"chunking.size",
         "tokens per chunk for `fixed`; unset = 2048 on one rank, and one chunk per rank in a "
         "distributed `fixed` run (docs/design.md §5.1)"},
        {"chunking.sink",
         "token prefilled before each context chunk and dropped afterwards: `bos` (the model's "
         "BOS, else the first token of the chat prefix), `none`, or a literal one-token string"},
        {"method.name",
         "the method (docs/design.md §4); `reform`, `h2o` and `streamingllm` read inputs longer "
         "than the model's window (docs/design.md §4.1, docs/reform.md)"},
        {"method.ratio", "recompute fraction: k = ⌊ratio · T⌋ context tokens"},
        {"method.reorder", "two-stage chunk reorder before selection (docs/design.md §3.7)"},
        {"scoring.query", "scoring rows: the `question` tokens or the whole `suffix`"},
        {"scoring.aggregate",
         "`norm`: root of the summed squared head-mean per layer, averaged over layers (the "
         "authors' code); `sum`: summed over layers, heads and rows (the paper's formula)"},
        {"scoring.layout",
         "key and row positions of the scoring pass only (docs/design.md §3.3); recompute and "
         "generation always use global positions"},
        {"scoring.layers",
         "scoring layers; `[]` = the measured default of the model's depth: `[2, 3, 4, 5]` for "
         "30 layers (SmolLM2-135M, long contexts: docs/quality.md), `[22, 23, 24, 25]` for "
         "other depths >= 26 (the paper's 32-layer choice), else the four ending at "
         "round(0.8·L)"},
        {"scoring.softmax",
         "on P ranks: `global` merges the attention normalizer across ranks (exact); `local` "
         "scores each shard against its own keys only (the authors' approximation)"},
        {"scoring.block", "row/column block size of the scoring pass (memory, not results)"},
        {"scoring.value_norm",
         "InfoFlow variant: each scoring layer's column score times the L2 norm of that "
         "token's value row at the layer (attention weight x ||v||; docs/quality.md)"},
        {"scoring.deviation_weight",
         "InfoFlow variant: score x (CacheBlend's layer-1 value deviation)^w, the layer-1 K/V "
         "refreshed for every token as CacheBlend does; 0 = off; one rank only"},
        {"scoring.span",
         "InfoFlow variant: each token's score is the largest within +-span tokens of its "
         "document, so the neighbours of a peak are recomputed with it; 0 = off"},
        {"scoring.chunk_decay",
         "InfoFlow variant: within a document the m-th best token's score counts 1/(1 + d*m), "
         "spreading the budget over documents; 0 = off"},
        {"scoring.chunk_floor",
         "InfoFlow variant: this share of the budget is reserved as per-document quotas "
         "(proportional to length, at least one token each); 0 = off"},
        {"cacheblend.metric", "CacheBlend's deviation is measured on `v` or on `k`"},
        {"epic.mode",
         "`ratio`: the first ⌊ratio·\\|C\\|⌋ tokens of each chunk; `fixed`: the first `epic.k`"},
        {"epic.k", "tokens per chunk for `epic.mode = \"fixed\"`"},
        {"reform.chunk_size", "tokens fed per step of the recurrent chunked forward"},
        {"reform.budget",
         "cache tokens kept after each compression (h2o, reform: heavy hitters + recent; "
         "streamingllm: sinks + recent); the cache never holds more than budget + chunk_size"},
        {"reform.recent", "`h2o`, `reform`: the most recent tokens always kept (≤ budget)"},
        {"reform.sink", "`streamingllm`: the first tokens always kept (attention sinks)"},
        {"reform.heads",
         "retrieval heads `[layer, head, \"q\"\\|\"k\"\\|\"v\"]` (head: query head for q, KV head "
         "for k/v); each head's state L2-normalized, concatenated; the default is the "
         "`reform-heads` result for SmolLM2"},
        {"reform.pool", "max-pool window over the per-token scores (odd)"},
        {"reform.gather",
         "context tokens gathered by score for the recompute (the top-scoring of the whole "
         "context, kept ends included)"},
        {"reform.keep_ends", "first and last context tokens always gathered"},
        {"reform.tasks", "`reform-heads`: synthetic tasks per kind (pattern match, multi-hop)"},
        {"reform.task_tokens", "`reform-heads`: context tokens of each synthetic task"},
        {"reform.top", "`reform-heads`: heads written to the config snippet"},
        {"parallel.comm",
         "communicator; `auto` = NCCL with the cuda backend on more than one rank (when built), "
         "else MPI when started by a launcher, else one rank; `nccl` = device collectives over "
         "NCCL (MPI bootstraps it and carries host buffers; asked for by name it runs on one rank "
         "too)"},
        {"parallel.startup_timeout_s",
         "the same deadline until the start-up checks (config and model identity) are done, "
         "NCCL's initialization included"},
        {"parallel.timeout_s",
         "deadline in seconds of every blocking collective or wait; a peer that does not arrive "
         "ends the job naming the rank and phase"},
        {"parallel.exchange",
         "what a recomputed token and the answer see on P ranks, and what travels for it "
         "(docs/design.md §5.2): `kv` all-gathers the selected tokens' K/V per layer (a "
         "recomputed token sees chunk 0, its shard and S; the answer on rank 0 sees rank 0's "
         "shard and S); `exact` passes the queries (pass-Q) and reproduces the one-rank result; "
         "`gather` all-gathers every context token's K/V once as stored (the one-rank result, "
         "every rank holding the whole context); `compact-int8` / `compact-int4` the same with "
         "the unselected tokens' rows as 8-bit / 4-bit codes, `compact-int4h` as 4-bit codes of "
         "each head turned by a Hadamard matrix (runtime/method/kv_codec.h); "
         "`kv-answer-exact` and `exact-answer-kv` mix the two halves (`kv`'s recompute with "
         "`exact`'s answer, and the reverse: the decomposition of docs/quality.md); `auto` "
         "(the default): `exact` on 3 or more ranks, `kv` on 2, by the held-out study of "
         "docs/quality.md \"P ranks\" (`compact-int4` keeps one rank's quality within 0.01 "
         "nats at about half `exact`'s time and a third of the ring's bytes: name it where that "
         "matters); results report the value it resolved to"},
        {"parallel.virtual_ranks",
         "job `sweep`: run a point's method on this many virtual ranks in one process (the "
         "sequence-parallel code, its messages through an in-process communicator, the ranks "
         "taking turns); 0 or 1 = one rank (docs/quality.md)"},
        {"parallel.balance",
         "`kv` exchange on P ranks: balance the recompute across ranks; a helper rank runs some "
         "of the busiest ranks' selected tokens (projections, MLP, attention over chunk 0 and "
         "the other shards' selected tokens) while their owner adds the attention over its "
         "shard, merged by LSE; the result is the same `kv` semantics; costs the moved "
         "queries and partial states in bytes. `auto`: the plan's cost model (compute at "
         "`parallel.compute_gmacs`, each message alpha + bytes / beta on `parallel.link`) moves "
         "tokens only as far as the modelled recompute time, bytes included, falls; `true`: "
         "balance the compute alone; `false`: every token on its owner (docs/design.md §5.2)"},
        {"parallel.link",
         "the link the balance model assumes: `auto` = detected (one node: `shm` over MPI, "
         "`nvlink` over NCCL; several nodes: `ib` when every node has an active InfiniBand "
         "port, else `tcp`; NCCL across nodes `ib`); or named: `shm` (1 us, 8 GB/s), `tcp` "
         "(30 us, 1.2 GB/s), `ib` (3 us, 12 GB/s), `nvlink` (10 us, 370 GB/s)"},
        {"parallel.link_alpha_us",
         "latency of one message on the link in microseconds for the balance model; `0` = the "
         "link's figure"},
        {"parallel.link_gbs",
         "bandwidth of the link in GB/s (one direction) for the balance model; `0` = the "
         "link's figure"},
        {"parallel.compute_gmacs",
         "compute rate of one rank in billions of multiply-adds per second for the balance "
         "model; `0` = the backend's nominal rate (CPU: 30 per thread with AVX-512, 15 with "
         "AVX2; CUDA: 150000)"},
        {"parallel.placement",
         "how context chunks are dealt to the P shards: `chunks` = whole chunks, the largest "
         "shard as small as whole chunks allow; `tokens` = shard edges at even token counts, a "
         "chunk that straddles an edge is cut there into two chunks (each prefilled on its own "
         "with the sink, docs/design.md §5.1); the chunking then depends on P, and the one-rank "
         "oracle of a `tokens` run is `parallel.emulate_ranks = P` with `tokens`"},
        {"parallel.emulate_ranks",
         "on one rank, compute what `parallel.exchange` computes on this many ranks (the "
         "oracle of a P-rank run): the `kv` visibility mask where the exchange's recompute or "
         "answer has it, the compact codes of the unselected rows for `compact-*`, nothing for "
         "`exact` and `gather`; `0` = off; with `bench.emulate_timing`: the number of virtual "
         "ranks"},
        {"ring.layout",
         "sequence layout of ring attention: `zigzag` (causal balance) or "
         "`contiguous`"},
        {"ring.exchange",
         "`p2p`: K/V blocks travel around the ring; `allgather`: all-gather K/V per layer (the "
         "authors' baseline)"},
        {"decode.max_new_tokens", "answer length limit (stops earlier on EOS / end of turn)"},
        {"decode.temperature", "`0` = greedy"},
        {"decode.seed", "sampling seed"},
        {"decode.top_k", "sample among the top k logits; unset = the whole vocabulary"},
        {"decode.logit_bias",
         "`[[token id, bias], ...]`: added to those tokens' logits before sampling, greedy "
         "included (OpenAI's `logit_bias`; -100 all but bans a token); the reported first-token "
         "logits are the model's, without it"},
        {"decode.top_p",
         "nucleus sampling: sample among the most likely tokens whose probabilities add up to at "
         "least this (after `decode.top_k`); `1` = no cut"},
        {"niah.lengths", "context lengths in tokens"},
        {"niah.depths", "needle depth as a fraction of the context (0 = start, 1 = end)"},
        {"niah.methods", "methods to compare, as in `method.name`"},
        {"niah.layouts", "scoring layouts to compare (InfoFlow runs), as in `scoring.layout`"},
        {"niah.needle", "the sentence hidden in the haystack"},
        {"niah.question", "the question asked about it"},
        {"niah.answer", "a run is correct when its answer contains this text"},
        {"niah.filler_file", "text the haystack is cut from; `\"\"` = the built-in filler"},
        {"niah.seed", "seed of the haystack cut"},
        {"eval.data_file", "samples, one JSON object per line (`.jsonl`, LongBench format)"},
        {"eval.max_samples", "`0` = all samples"},
        {"eval.task", "dataset / metric name, e.g. `hotpotqa`"},
        {"bench.lengths", "context lengths in tokens (docs/design.md §10)"},
        {"bench.methods", "methods, as in `method.name`"},
        {"bench.rows",
         "rows to run, by label: `single`, `ring/zigzag`, `ring/contiguous`, `ring/allgather`, "
         "`<method>/kv`, `<method>/exact` on P ranks, `<method>` on one; `[]` = every row of "
         "`bench.methods`"},
        {"bench.runs", "timed runs per row; the median is reported"},
        {"bench.warmup", "untimed runs before them"},
        {"bench.spread_limit",
         "flag a row (`!`) whose (max - min) / median over the timed runs exceeds this"},
        {"bench.threads", "CPU threads per rank for the benchmark; `0` = `model.threads`"},
        {"bench.emulate_timing",
         "run `parallel.emulate_ranks` virtual ranks in one process, taking turns on the one "
         "device: compute measured per segment, communication modelled (docs/gpu.md)"},
        {"bench.clock",
         "what the measured times read: `wall` = the wall clock; `cpu` = the process's CPU time, "
         "which on a machine shared with other work leaves out the time other processes took; "
         "one process with one thread only (`bench.threads` or `model.threads` = 1, one rank or "
         "`bench.emulate_timing`'s virtual ranks, which take turns): real ranks wait for each "
         "other, which CPU time does not count (docs/benchmarks.md)"},
        {"bench.link_alpha_us",
         "latency of one message step in the emulated timing mode, microseconds (NVLink: 10)"},
        {"bench.link_beta_gbs",
         "bandwidth of one link, one direction, in the emulated timing mode, GB/s (NVLink: 370)"},
        {"sweep.key",
         "the config key each of `sweep.values` sets, one point per value (e.g. "
         "`scoring.layers`); empty = only `sweep.points`"},
        {"sweep.values", "TOML value texts for `sweep.key`, e.g. `[\"[3]\", \"[4]\"]`"},
        {"sweep.points",
         "more points, each `key=value` overrides separated by `;`, e.g. "
         "`method.name=epic; method.ratio=0.3`"},
        {"sweep.reference",
         "continuation scored by teacher forcing: `full` (its greedy answer) or `gold` (the "
         "case's answer)"},
        {"sweep.cases", "cases generated (kept, with `sweep.full_correct_only`)"},
        {"sweep.kinds",
         "case kinds, drawn in turn: `niah` (passkey), `facts` (one fact among distractor "
         "documents), `multihop` (two linked facts in two documents), `keys` (long layout: the "
         "magic number of one key among other keys' numbers)"},
        {"sweep.context_tokens", "approximate context tokens of a case (filler included)"},
        {"sweep.documents", "documents (chunks) per case"},
        {"sweep.seed", "seed of the case generator"},
        {"sweep.full_correct_only",
         "keep only cases `full` answers correctly (at most 4 x `sweep.cases` are tried)"},
        {"sweep.cases_file", "also write the cases as `eval` JSONL; empty = no"},
        {"sweep.clock",
         "what the points' times (online ms, TTFT, the virtual ranks' compute segments) read: "
         "`wall` = the wall clock; `cpu` = the process's CPU time, which on a machine shared "
         "with other work leaves out the time other processes took (the virtual ranks' critical "
         "path takes the slowest rank at every collective, so that time would inflate balanced "
         "schedules most); needs `model.threads = 1` (docs/quality.md)"},
        {"sweep.first_case",
         "generator index of the first case tried: shards of one long run in separate processes "
         "(e.g. 0 and 1000), their row logs concatenated (docs/quality.md)"},
        {"sweep.document_tokens",
         "long layout: `[lo, hi]`, each document's length drawn log-uniform in [lo, hi] tokens, "
         "then scaled together to fill `sweep.context_tokens`; empty = equal lengths "
         "(docs/quality.md)"},
        {"sweep.depths",
         "long layout: evidence depths (0 = first document, 1 = last), every kind at every "
         "depth in turn; empty = a random document"},
        {"sweep.distractors",
         "long layout: documents holding a distractor (the evidence's sentence about another "
         "person or key); -1 = every other document"},
        {"sweep.filler_file",
         "long layout: text the documents' filler is cut from (sentences in order from a random "
         "start); empty = the built-in prose"},
        {"store.path",
         "HDF5 index file of the document KV store; written by `cache-build`, read by `answer` "
         "/ `niah` / `eval` / `bench-ttft` when set; empty = no store (replaces the former "
         "`cache.path`)"},
        {"store.mode",
         "`read`, or `read-write`: documents missing from the store are prefilled and added "
         "after the answer"},
        {"store.dtype", "how K/V are stored; must match an existing store"},
        {"store.compression", "0 = none; 1-9 = shuffle + deflate at that level"},
        {"serve.host",
         "address rank 0 listens on; `127.0.0.1` (loopback) by default; any other address needs "
         "an API key (`serve.api_key` or `serve.api_key_env`) or `serve.allow_unauthenticated`"},
        {"serve.port", "TCP port; `0` = any free port (printed at start-up)"},
        {"serve.api_key",
         "key clients must send as `Authorization: Bearer KEY` (401 otherwise, compared in "
         "constant time); empty = read it from `serve.api_key_env`"},
        {"serve.api_key_env",
         "environment variable holding the key when `serve.api_key` is empty (keeps the key out "
         "of config files); unset or empty variable = no key"},
        {"serve.allow_unauthenticated",
         "serve a non-loopback address without a key; never the default"},
        {"serve.queue_size",
         "requests waiting to be admitted (behind `serve.max_batch` running ones, or for KV "
         "memory); a request beyond it gets 429 with `Retry-After`"},
        {"serve.max_batch",
         "requests running at once: decoding together, one forward over every running "
         "request's next token per step, or in their context work (docs/serve.md \"Batching\")"},
        {"serve.prefill_chunk",
         "tokens of a new request's context work (chunk prefill, scoring, recompute) between two "
         "decode steps of the running requests; long forwards are cut into pieces this long "
         "(the same bits); at least 32"},
        {"serve.prefill_slice_ms",
         "the most milliseconds of context work between two decode steps while requests decode "
         "(checked at every layer of a piece, so a step can come later by one layer of one "
         "piece); whichever of it and `serve.prefill_chunk` comes first; 0 = tokens only. "
         "Smaller: steadier streams, slower new requests (docs/serve.md \"Batching\")"},
        {"serve.kv_budget_mb",
         "MiB of KV cache all running requests may hold together (rank 0's caches, a prefill "
         "counted at its peak); a request waits until its share fits, one that could never fit "
         "is refused (400)"},
        {"serve.buffer_pool_mb",
         "MiB of freed CPU buffers each rank keeps for the next request (the stored documents' "
         "K/V, the KV cache, scratch), so it need not page-fault them in again after the memory "
         "freed by the last one went back to the system; the resident memory beyond what is in "
         "use stays under it; 0 = keep none (docs/serve.md \"Memory\")"},
        {"serve.prefix_cache_mb",
         "MiB of K/V each rank keeps of chunk 0 (the chat prefix and the instruction before the "
         "documents: the same for every request with the same system prompt), so that the next "
         "request with that prefix copies it instead of prefilling it (the same bits); least "
         "recently used first out; 0 = prefill it for every request (docs/serve.md "
         "\"Batching\")"},
        {"serve.max_body_bytes", "largest request body in bytes (413 beyond)"},
        {"serve.max_tokens",
         "largest `max_tokens` / `max_completion_tokens` a request may ask for (400 beyond); "
         "also the default when a request names none"},
        {"serve.request_timeout_s",
         "deadline from a request's arrival to its last token (504 beyond; checked when it leaves "
         "the queue and at every generated token)"},
        {"serve.heartbeat_s",
         "while no request runs, rank 0 checks every other rank this often (a collective "
         "under the watchdog); must be below `parallel.timeout_s`"},
        {"serve.http_threads", "HTTP connections handled at once (waiting requests hold one each)"},
        {"serve.model_name",
         "model id in `/v1/models` and in responses; empty = the model file's name"},
        {"output.path", "results JSON (`--out` overrides it)"},
        {"output.csv", "table rows as CSV (`niah`, `bench-ttft`, `eval`)"},
        {"output.name",
         "file name (without extension) of the results written by `--results-dir`; empty = the "
         "config file's name"},
        {"output.logits_file",
         "job `answer`: write the first answer token's log-probs over the whole vocabulary "
         "(raw little-endian float32, docs/results-schema.md); empty = no file"},
    };
    return d;
}

// A default value as written in TOML: strings quoted, arrays with ", ".
std::string toml_text(const nlohmann::json& v) {
    if (v.is_array()) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_text(v[i]);
        return s + "]";
    }
    return v.dump();
}

std::string choices_text(const std::string& choices) {
    std::string s = "`";
    for (char c : choices) s += c == '|' ? std::string("` \\| `") : std::string(1, c);
    return s + "`";
}

// The type column: the accepted names for enum keys, else the loader's type text with
// typographic comparison signs.
std::string type_text(const ConfigKeyInfo& k) {
    if (k.type == "enum") return choices_text(k.choices);
    if (k.type == "[enum]") return "[" + choices_text(k.choices) + "]";
    std::string t = k.type;
    for (const char* op : {">=", "<="}) {
        for (size_t p = t.find(op); p != std::string::npos; p = t.find(op)) {
            t.replace(p, 2, op[0] == '>' ? "≥" : "≤");
        }
    }
    return t;
}

}  // namespace

std::string config_reference_markdown() {
    const std::vector<ConfigKeyInfo> keys = config_key_info();
    std::vector<std::string> missing;
    for (const auto& k : keys) {
        if (!descriptions().count(k.key)) missing.push_back(k.key);
    }
    if (!missing.empty()) {
        std::string list;
        for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
        IF_FAIL(
            "config keys without a description in runtime/config/config_reference.cpp: " << list);
    }

    std::ostringstream os;
    os << "# Config reference\n\n"
          "<!-- Generated by `infoflow_sp --print-config-reference` from the config loader's "
          "field table\n"
          "     (runtime/config/config.cpp, descriptions in "
          "runtime/config/config_reference.cpp).\n"
          "     Do not edit by hand; regenerate with\n"
          "       build/infoflow_sp --print-config-reference > docs/config.md\n"
          "     The CTest case docs_config_reference fails when this file is stale. -->\n\n"
          "Every key of an `infoflow_sp` run configuration (TOML), with the type and range the "
          "loader\n"
          "accepts, its default and its meaning. Every key is optional: a missing key takes its "
          "default\n"
          "and an empty file is the default configuration. Ranges are inclusive; an integer is "
          "accepted\n"
          "where a float is expected, not the reverse. Where the type lists names, the key "
          "takes one of\n"
          "them as a string; `[...]` is an array. Unknown keys, wrong types, out-of-range values "
          "and\n"
          "unknown names are errors naming the key and `FILE:LINE`. How configs are written, "
          "`--set`\n"
          "overrides and relative paths: `configs/README.md`.\n";

    std::string section = "?";
    for (const auto& k : keys) {
        const size_t dot = k.key.find('.');
        const std::string sec = dot == std::string::npos ? "" : k.key.substr(0, dot);
        if (sec != section) {
            section = sec;
            const auto it = section_titles().find(sec);
            const std::string title = it != section_titles().end() ? it->second : "[" + sec + "]";
            os << "\n## " << title << "\n\n"
               << "| key | type | default | meaning |\n|---|---|---|---|\n";
        }
        const std::string& meaning = descriptions().at(k.key);
        const std::string def = k.value.is_null() ? "unset" : "`" + toml_text(k.value) + "`";
        os << "| `" << k.key << "` | " << type_text(k) << " | " << def << " | " << meaning
           << " |\n";
    }
    return os.str();
}

}  // namespace infoflow
