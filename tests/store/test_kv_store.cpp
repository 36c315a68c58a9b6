// The document KV store on real HDF5 files (docs/design.md §8): round trips per dtype against an
// independent prefill, the phase-1 chunk source (load = prefill, read-write adds), content keys,
// refusal of a store written for another model / tokenizer / dtype (naming the file and the
// attribute), a flipped byte inside a K dataset detected and named, writer serialization, and
// job sweep's store points (the store path against the fresh chunk prefill).
// The fault tests that need processes (kill -9, concurrent builds, a full file system, h5py)
// are tests/store/store_cli_test.sh.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/fs.h"
#include "runtime/core/half.h"
#include "runtime/core/pieces.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/store/kv_store.h"
#include "tests/method/method_fixture.h"
#include "tests/test_util.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

std::string fresh_path(const std::string& name) {
    static int n = 0;
    return shared_temp_dir("store") + "/" + name + std::to_string(++n) + ".h5";
}

Config store_config(const std::string& path, Config::StoreDType dt,
                    Config::StoreMode mode = Config::StoreMode::read_write) {
    Config c = method_config(Config::Method::infoflow);
    c.store.path = path;
    c.store.dtype = dt;
    c.store.mode = mode;
    return c;
}

std::vector<float> host(Model& m, const Buffer& b, size_t n) {
    std::vector<float> out(n);
    m.backend().download(out.data(), b.data(), n * sizeof(float));
    return out;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("store: content keys depend on tokens, sink and chunking", "[cpu][store]") {
    const std::vector<int32_t> a = {5, 6, 7}, b = {5, 6, 8};
    CHECK(document_key(a, 1, "passage") == document_key(a, 1, "passage"));
    CHECK(document_key(a, 1, "passage").size() == 16);
    CHECK(document_key(a, 1, "passage") != document_key(b, 1, "passage"));
    CHECK(document_key(a, 1, "passage") != document_key(a, -1, "passage"));
    CHECK(document_key(a, 1, "passage") != document_key(a, 1, "fixed/2048"));
}

TEST_CASE("store: f32 round trip is bit-exact, f16/bf16 round to nearest", "[cpu][store]") {
    REQUIRE(kv_store_available());
    TinyModel tm;
    Model& m = *tm.m;
    const PreparedRequest req = random_request(3, tm.w.config.n_vocab, 4, {19, 7}, 6);
    const ModelConfig& c = tm.w.config;
    const size_t row = size_t(c.n_head_kv) * c.head_dim;
    for (auto dt : {Config::StoreDType::f32, Config::StoreDType::f16, Config::StoreDType::bf16}) {
        CAPTURE(to_string(dt));
        const Config cfg = store_config(fresh_path("rt"), dt);
        auto store = open_store_for(m, "", cfg, true);
        std::vector<ChunkKv> ref;
        std::vector<StoredChunk> host_chunks;
        for (int ci = 1; ci < req.n_chunks(); ++ci) {
            ref.push_back(prefill_chunk(m, req.chunks[ci], req.sink_id));
            host_chunks.push_back(to_stored(m, ref.back(), req.sink_id,
                                            document_key(req.chunks[ci], req.sink_id, "passage"),
                                            "passage"));
        }
        std::vector<const StoredChunk*> ptrs;
        for (auto& h : host_chunks) ptrs.push_back(&h);
        CHECK(store->add(ptrs) == 2);
        CHECK(store->add(ptrs) == 0);  // present keys are skipped

        auto reader =
            open_store_for(m, "", store_config(cfg.store.path, dt, Config::StoreMode::read), false);
        CHECK(reader->n_documents() == 2);
        for (size_t i = 0; i < ref.size(); ++i) {
            const std::vector<int32_t>& toks = req.chunks[i + 1];
            const StoredChunk s = reader->load(host_chunks[i].key, toks);
            CHECK(s.tokens == toks);
            CHECK(s.local_pos == ref[i].local_pos);
            CHECK(s.sink_id == req.sink_id);
            const size_t n = toks.size() * row;
            for (int l = 0; l < c.n_layer; ++l) {
                const std::vector<float> k = host(m, ref[i].k[l], n), v = host(m, ref[i].v[l], n);
                size_t bad = 0;
                for (size_t e = 0; e < n; ++e) {
                    float want_k = k[e], want_v = v[e];
                    if (dt == Config::StoreDType::f16) {
                        want_k = fp16_to_fp32(fp32_to_fp16(want_k));
                        want_v = fp16_to_fp32(fp32_to_fp16(want_v));
                        // Independent bound: half keeps 11 significant bits.
                        if (std::fabs(s.k[l][e] - k[e]) > std::ldexp(std::fabs(k[e]), -11) + 6e-8)
                            ++bad;
                    } else if (dt == Config::StoreDType::bf16) {
                        want_k = bf16_to_fp32(fp32_to_bf16(want_k));
                        want_v = bf16_to_fp32(fp32_to_bf16(want_v));
                        if (std::fabs(s.k[l][e] - k[e]) > std::ldexp(std::fabs(k[e]), -8)) ++bad;
                    }
                    if (std::memcmp(&s.k[l][e], &want_k, 4) != 0) ++bad;
                    if (std::memcmp(&s.v[l][e], &want_v, 4) != 0) ++bad;
                }
                CHECK(bad == 0);
            }
        }
        // A chunk with other tokens under the same key is refused (collision / tampering).
        std::vector<int32_t> other = req.chunks[1];
        other.back() += 1;
        CHECK_THAT(error_of([&] { reader->load(host_chunks[0].key, other); }),
                   Catch::Contains("differ"));
    }
}

TEST_CASE("store: chunk source loads what it prefilled and reports it", "[cpu][store]") {
    TinyModel tm;
    Model& m = *tm.m;
    const PreparedRequest req = random_request(4, tm.w.config.n_vocab, 4, {11, 23, 5, 30}, 6);
    const std::vector<int> which = {1, 2, 3, 4};
    const std::vector<std::vector<int32_t>> docs(req.chunks.begin() + 1, req.chunks.end());
    const std::vector<ChunkKv> fresh = prefill_chunks(m, docs, req.sink_id);
    const size_t row = size_t(tm.w.config.n_head_kv) * tm.w.config.head_dim;

    const Config rw = store_config(fresh_path("src"), Config::StoreDType::f32);
    {
        // Empty store, read-write: every chunk prefilled, then added.
        ChunkSource src(m, req, rw);
        src.load(which);
        CHECK(src.use().chunks_loaded == 0);
        std::vector<ChunkKv> got = src.take(which);
        CHECK(src.use().chunks_prefilled == 4);
        std::vector<ChunkKv> indexed;
        indexed.push_back(prefill_chunk(m, req.chunks[0], -1));
        for (auto& g : got) indexed.push_back(std::move(g));
        src.save(indexed);
        CHECK(src.use().chunks_added == 4);
    }
    Config ro = rw;
    ro.store.mode = Config::StoreMode::read;
    ChunkSource src(m, req, ro);
    int points = 0;
    {
        // Job serve's time slice (runtime/core/pieces.h; 1 ns: every point): a point after each
        // layer read from the file, after each layer brought into the model's KV type, and
        // after each document loaded.
        const PieceScope scope(
            1000000, true, [&] { ++points; }, std::chrono::nanoseconds(1));
        src.load({2, 4});
    }
    CHECK(points == 2 * (2 * tm.w.config.n_layer + 1));
    CHECK(src.use().chunks_loaded == 2);
    CHECK(src.use().tokens_loaded == 23 + 30);
    CHECK(src.use().bytes_loaded > 0);
    const std::vector<ChunkKv> got = src.take(which);
    CHECK(src.use().chunks_prefilled == 2);
    CHECK_FALSE(src.writes());
    for (size_t i = 0; i < which.size(); ++i) {
        const size_t n = docs[i].size() * row;
        CHECK(got[i].tokens == fresh[i].tokens);
        CHECK(got[i].local_pos == fresh[i].local_pos);
        for (int l = 0; l < tm.w.config.n_layer; ++l) {
            CHECK(host(m, got[i].k[l], n) == host(m, fresh[i].k[l], n));
            CHECK(host(m, got[i].v[l], n) == host(m, fresh[i].v[l], n));
        }
    }
}

TEST_CASE("store: another model, tokenizer or dtype is refused naming file and attribute",
          "[cpu][store]") {
    TinyModel tm;
    const PreparedRequest req = random_request(5, tm.w.config.n_vocab, 4, {9}, 6);
    const std::string path = fresh_path("id");
    Config cfg = store_config(path, Config::StoreDType::f16);
    {
        ChunkSource src(*tm.m, req, cfg);
        std::vector<ChunkKv> all;
        all.push_back(prefill_chunk(*tm.m, req.chunks[0], -1));
        for (auto& c : src.take({1})) all.push_back(std::move(c));
        src.save(all);
    }
    // A different model: same shape, other weights.
    TinyModel other("tiny", 4);
    other.w.layers[0].wq[0] += 1.0f;
    other.w.fingerprint = model_fingerprint(other.w);
    REQUIRE(other.w.fingerprint != tm.w.fingerprint);
    Model om(*other.be, other.w);
    const std::string e1 = error_of([&] { ChunkSource s(om, req, cfg); });
    CHECK_THAT(e1, Catch::Contains(path) && Catch::Contains("model_fingerprint") &&
                       Catch::Contains("refused"));
    PreparedRequest req2 = req;
    req2.tokenizer_hash = "0123456789abcdef";
    const std::string e2 = error_of([&] { ChunkSource s(*tm.m, req2, cfg); });
    CHECK_THAT(e2, Catch::Contains(path) && Catch::Contains("tokenizer_hash"));
    Config f32 = cfg;
    f32.store.dtype = Config::StoreDType::f32;
    const std::string e3 = error_of([&] { ChunkSource s(*tm.m, req, f32); });
    CHECK_THAT(e3, Catch::Contains(path) && Catch::Contains("dtype"));
    // A read-only open of a missing store names it.
    Config missing = cfg;
    missing.store.path = path + ".absent.h5";
    missing.store.mode = Config::StoreMode::read;
    CHECK_THAT(error_of([&] { ChunkSource s(*tm.m, req, missing); }),
               Catch::Contains(missing.store.path) && Catch::Contains("does not exist"));
    // Not an HDF5 file at all.
    const std::string junk = fresh_path("junk");
    std::ofstream(junk) << "not hdf5";
    missing.store.path = junk;
    CHECK_THAT(error_of([&] { ChunkSource s(*tm.m, req, missing); }), Catch::Contains(junk));
}

TEST_CASE("store: a flipped byte inside a K dataset is detected and named", "[cpu][store]") {
    TinyModel tm;
    Model& m = *tm.m;
    const PreparedRequest req = random_request(6, tm.w.config.n_vocab, 4, {40}, 6);
    const std::string path = fresh_path("flip");
    const Config cfg = store_config(path, Config::StoreDType::f32);
    const ChunkKv kv = prefill_chunk(m, req.chunks[1], req.sink_id);
    const std::string key = document_key(req.chunks[1], req.sink_id, "passage");
    const StoredChunk s = to_stored(m, kv, req.sink_id, key, "passage");
    open_store_for(m, "", cfg, true)->add({&s});

    // Find layer 2's K bytes in the document file (f32: stored as computed) and flip one.
    const std::string doc = path + ".d/" + key + ".h5";
    std::string bytes;
    {
        std::ifstream in(doc, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string needle(reinterpret_cast<const char*>(s.k[2].data()), 256);
    const size_t at = bytes.find(needle);
    REQUIRE(at != std::string::npos);
    REQUIRE(bytes.find(needle, at + 1) == std::string::npos);
    bytes[at + 100] ^= 0x10;
    {
        std::ofstream out(doc, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), std::streamsize(bytes.size()));
    }
    auto reader = open_store_for(m, "", cfg, false);
    const std::string e = error_of([&] { reader->load(key, req.chunks[1]); });
    CHECK_THAT(
        e, Catch::Contains(key) && Catch::Contains("layer_002/k") && Catch::Contains("checksum"));
}

TEST_CASE("store: concurrent writers serialize and lose nothing", "[cpu][store]") {
    TinyModel tm;
    Model& m = *tm.m;
    const std::string path = fresh_path("conc");
    const Config cfg = store_config(path, Config::StoreDType::f16);
    // Two writers (separate store objects, separate lock descriptors), 6 documents each.
    std::vector<StoredChunk> docs;
    for (int i = 0; i < 12; ++i) {
        const PreparedRequest r = random_request(100 + i, tm.w.config.n_vocab, 2, {8 + i}, 4);
        const ChunkKv kv = prefill_chunk(m, r.chunks[1], r.sink_id);
        docs.push_back(to_stored(m, kv, r.sink_id, document_key(r.chunks[1], r.sink_id, "p"), "p"));
    }
    auto w1 = open_store_for(m, "", cfg, true);
    auto w2 = open_store_for(m, "", cfg, true);
    std::string err1, err2;
    std::thread t1([&] {
        err1 = error_of([&] {
            for (int i = 0; i < 12; i += 2) w1->add({&docs[i]});
        });
    });
    std::thread t2([&] {
        err2 = error_of([&] {
            for (int i = 1; i < 12; i += 2) w2->add({&docs[i]});
        });
    });
    t1.join();
    t2.join();
    CHECK(err1.empty());
    CHECK(err2.empty());
    auto reader = open_store_for(m, "", cfg, false);
    CHECK(reader->n_documents() == 12);
    for (const StoredChunk& d : docs) {
        CHECK(reader->contains(d.key));
        CHECK(reader->load(d.key, d.tokens).k.size() == size_t(tm.w.config.n_layer));
    }
}

TEST_CASE("store: a sweep's store points, documents cached one by one, match the fresh prefill",
          "[store][quality][model]") {
    // The measurement of docs/quality.md "The store" in small: the same cases through InfoFlow on
    // the fresh chunk prefill and with every document loaded from a store. An f32 store holds
    // the fresh chunks' bits, so its rows are the fresh point's exactly; an f16 store rounds
    // them once (the cache here is f32), which must show (else the store was not read).
    const std::string model = INFOFLOW_MODEL_PATH;
    REQUIRE(std::ifstream(model).good());
    Config cfg;
    cfg.job = Config::Job::sweep;
    cfg.model.path = model;
    cfg.decode.max_new_tokens = 6;
    cfg.sweep.cases = 2;
    cfg.sweep.kinds = {"facts", "niah"};
    cfg.sweep.documents = 3;
    cfg.sweep.context_tokens = 160;
    const std::string f32 = fresh_path("sweep_f32"), f16 = fresh_path("sweep_f16");
    cfg.sweep.points = {"method.name=infoflow",
                        "method.name=infoflow; store.path=" + f32 + "; store.dtype=f32",
                        "method.name=infoflow; store.path=" + f16 + "; store.dtype=f16"};
    std::unique_ptr<Session> s = open_session(cfg);
    const nlohmann::json out = run_sweep(cfg, *s);
    const auto& rows = out["rows"];
    REQUIRE(rows.size() == 8);  // per case: full, then the 3 points
    for (int c = 0; c < 2; ++c) {
        const auto& fresh = rows[c * 4 + 1];
        const auto& st32 = rows[c * 4 + 2];
        const auto& st16 = rows[c * 4 + 3];
        CAPTURE(c, fresh["mean_kl"], st32["mean_kl"], st16["mean_kl"]);
        CHECK(st32["store"]["chunks_loaded"] == 3);
        CHECK(st16["store"]["chunks_loaded"] == 3);
        CHECK(fresh.count("store") == 0);
        CHECK(st32["mean_kl"] == fresh["mean_kl"]);
        CHECK(st32["answer"] == fresh["answer"]);
        CHECK(st32["chunk_prefill_ms"].get<double>() == 0.0);
        CHECK(st16["mean_kl"] != fresh["mean_kl"]);
    }
    CHECK(open_store_for(*s->model, hex64(s->tok().fingerprint()),
                         store_config(f32, Config::StoreDType::f32, Config::StoreMode::read), false)
              ->n_documents() == 6);
    // store.path for the whole sweep is refused: it is a point's setting.
    cfg.store.path = f32;
    CHECK_THROWS_WITH(run_sweep(cfg, *s), Catch::Contains("set per point"));
}
