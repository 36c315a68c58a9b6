// The method pipelines on the strict device-like backend (guarded_backend.h): every method on
// one rank (run_method) and the sequence-parallel pipeline on a one-rank communicator
// (run_method_sp) must reach backend memory only through the Backend interface — a direct
// host access aborts the test with the faulting address — and must give what they give on the
// plain CPU backend: the same selected positions, chunk order and answer ids, first-token logits
// within 1e-5 (the guarded backend runs the CPU kernels, but on the device code path of Model:
// one GEMM per projection instead of the stacked one, so last bits may differ).
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "../method/method_fixture.h"
#include "comm/communicator.h"
#include "guarded_backend.h"
#include "runtime/formats/chat_template.h"
#include "runtime/formats/gguf.h"
#include "runtime/formats/tokenizer.h"
#include "runtime/parallel/sp_pipeline.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

constexpr double kTol = 1e-5;
const std::vector<int32_t> kNoStop;

// tol: kTol for f32 caches; with a 16-bit cache a last-bit difference of the fp32 projections
// can round a K/V element to its neighbouring 16-bit value: 1e-3 there.
void check_same(const MethodResult& dev, const MethodResult& cpu, double tol = kTol) {
    CHECK(dev.selected_positions == cpu.selected_positions);
    CHECK(dev.chunk_order == cpu.chunk_order);
    CHECK(dev.answer == cpu.answer);
    REQUIRE(dev.first_logits.size() == cpu.first_logits.size());
    CHECK(rel_err(dev.first_logits, cpu.first_logits) <= tol);
}

const Config::Method kMethods[] = {Config::Method::full, Config::Method::none,
                                   Config::Method::infoflow, Config::Method::cacheblend,
                                   Config::Method::epic};

}  // namespace

TEST_CASE("guarded backend: host access to its memory between ops is caught", "[devicelike]") {
    GuardedBackend g(1);
    CHECK(g.name() != "cpu");
    const std::vector<float> h = {1.0f, 2.0f, 3.0f};
    Buffer b = g.alloc_floats(3);
    g.upload(b.data(), h.data(), sizeof(float) * 3);
    std::vector<float> back(3);
    g.download(back.data(), b.data(), sizeof(float) * 3);
    CHECK(back == h);
    // Between ops the memory is inaccessible: a child process that reads it dies of SIGSEGV.
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        signal(SIGSEGV, SIG_DFL);
        const volatile float x = *static_cast<const volatile float*>(b.data());
        _exit(x == 1.0f ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
    const size_t ops = g.ops();
    g.add(b.data(), b.data(), 3);
    CHECK(g.ops() == ops + 1);
    g.download(back.data(), b.data(), sizeof(float) * 3);
    CHECK(back == std::vector<float>({2.0f, 4.0f, 6.0f}));
}

TEST_CASE("device-like backend: every method on one rank equals the CPU backend (tiny model)",
          "[devicelike]") {
    install_guard_handler();
    TinyModel tm;
    GuardedBackend g(2);
    Model dev(g, tm.w);
    const PreparedRequest req =
        random_request(5, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    for (Config::Method m : kMethods) {
        for (bool reorder : {false, true}) {
            if (reorder && m != Config::Method::infoflow) continue;
            Config cfg = method_config(m);
            cfg.method.reorder = reorder;
            CAPTURE(to_string(m), reorder);
            check_same(run_method(dev, req, cfg, kNoStop), run_method(*tm.m, req, cfg, kNoStop));
        }
    }
    // The single-rank run with the "kv" mask of 3 ranks (docs/design.md §5.2).
    Config emu = method_config(Config::Method::infoflow);
    emu.parallel.emulate_ranks = 3;
    check_same(run_method(dev, req, emu, kNoStop), run_method(*tm.m, req, emu, kNoStop));
}

TEST_CASE("device-like backend: a 16-bit KV cache (f16, bf16) equals the CPU backend's",
          "[devicelike]") {
    // The cache's conversions, the chunk placement's re-rotation of 16-bit keys and the typed
    // attention all reach backend memory through the Backend interface (narrow_kv, widen_kv).
    install_guard_handler();
    TinyModel tm;
    GuardedBackend g(2);
    Model dev(g, tm.w);
    const PreparedRequest req =
        random_request(5, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    std::unique_ptr<Communicator> comm = make_self_communicator();
    // InfoFlow (chunk prefill, placement, scoring, recompute, decode) in both types, the
    // sequence-parallel pipeline once: what CI affords (~8 s).
    for (KvDtype t : {KvDtype::f16, KvDtype::bf16}) {
        dev.set_kv_dtype(t);
        tm.m->set_kv_dtype(t);
        const Config cfg = method_config(Config::Method::infoflow);
        CAPTURE(kv_dtype_name(t));
        check_same(run_method(dev, req, cfg, kNoStop), run_method(*tm.m, req, cfg, kNoStop), 1e-3);
        if (t == KvDtype::bf16) {
            check_same(run_method_sp(dev, req, cfg, *comm, kNoStop),
                       run_method_sp(*tm.m, req, cfg, *comm, kNoStop), 1e-3);
        }
    }
    tm.m->set_kv_dtype(KvDtype::f32);
}

TEST_CASE("device-like backend: sequence-parallel pipeline on one rank equals the CPU backend",
          "[devicelike]") {
    install_guard_handler();
    TinyModel tm;
    GuardedBackend g(2);
    Model dev(g, tm.w);
    std::unique_ptr<Communicator> comm = make_self_communicator();
    const PreparedRequest req =
        random_request(6, tm.w.config.n_vocab, 4, {17, 9, 23, 12, 14, 8}, 9);
    for (Config::Method m : {Config::Method::none, Config::Method::infoflow,
                             Config::Method::cacheblend, Config::Method::epic}) {
        for (auto ex : {Config::Exchange::kv, Config::Exchange::exact}) {
            Config cfg = method_config(m);
            cfg.parallel.exchange = ex;
            CAPTURE(to_string(m), to_string(ex));
            check_same(run_method_sp(dev, req, cfg, *comm, kNoStop),
                       run_method_sp(*tm.m, req, cfg, *comm, kNoStop));
        }
    }
}

TEST_CASE("device-like backend: SmolLM2 demo request, infoflow, equals the CPU backend",
          "[devicelike][heavy]") {
    install_guard_handler();
    const std::string path = INFOFLOW_MODEL_PATH;
    Config base = load_config(std::string(INFOFLOW_SOURCE_DIR) + "/configs/demo.toml",
                              {"decode.max_new_tokens=2", "model.path=\"" + path + "\""});
    const ModelWeights w = load_model_weights(path);
    GgufFile gguf(path);
    const Tokenizer tok = Tokenizer::from_gguf(gguf);
    const ChatTemplate chat(tok, to_string(base.request.chat_template));
    const PreparedRequest req = prepare_request(tok, chat, load_request_text(base.request), base);
    std::unique_ptr<Backend> cpu = make_cpu_backend(2);
    GuardedBackend g(2);
    Model mc(*cpu, w), md(g, w);
    // InfoFlow alone (chunk prefill, scoring, selection, recompute, decode): every op the other
    // methods use, at a cost CI affords (the tiny-model cases above run every method).
    Config cfg = base;
    cfg.method.name = Config::Method::infoflow;
    check_same(run_method(md, req, cfg, tok.stop_ids()), run_method(mc, req, cfg, tok.stop_ids()));
}

TEST_CASE("device-like backend: generated random: models (weights made by the backend)",
          "[devicelike]") {
    install_guard_handler();
    LoadOptions opt;
    opt.generate_on_backend = true;
    for (const char* shape : {"random:tiny", "random:tiny-qwen3"}) {
        CAPTURE(shape);
        const ModelWeights w = load_model_weights(shape, opt);
        REQUIRE(w.generated);
        std::unique_ptr<Backend> cpu = make_cpu_backend(2);
        GuardedBackend g(2);
        Model mc(*cpu, w), md(g, w);
        const PreparedRequest req = random_request(7, w.config.n_vocab, 4, {20, 11, 16}, 7);
        for (Config::Method m : {Config::Method::full, Config::Method::infoflow}) {
            CAPTURE(to_string(m));
            Config cfg = method_config(m);
            cfg.scoring.layers = {1};  // the generated tiny shapes have 2 layers
            check_same(run_method(md, req, cfg, kNoStop), run_method(mc, req, cfg, kNoStop));
        }
    }
}
