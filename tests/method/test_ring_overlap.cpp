// How the distributed code drives a device communicator, checked on the CPU with tracing stand-ins
// (the NCCL communicator cannot run here): ring attention starts each block's transfer before it
// queues the attention that should hide it (docs/design.md §5.4; NCCL defers point-to-point work
// until a test() or wait(), so a ring that only waits would serialize transfer and attention),
// and the collectives on backend memory are enqueued on the backend's stream (a device
// communicator given no stream would use the legacy default stream, which the CUDA backend's
// non-blocking stream does not wait for).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/thread_comm.h"
#include "method_fixture.h"
#include "runtime/parallel/comm_stage.h"
#include "runtime/parallel/ring.h"

using namespace infoflow;
using namespace infoflow::test;

namespace {

// Every op forwarded to a CPU backend; attention calls are logged into the trace of the calling
// thread's rank. `name` and `stream` stand in for a device backend's where a test needs them.
thread_local std::vector<std::string>* t_trace = nullptr;

class TracingBackend final : public Backend {
  public:
    TracingBackend(std::string name, void* stream)
        : cpu_(make_cpu_backend(1)), name_(std::move(name)), stream_(stream) {}
    std::string name() const override { return name_; }
    void set_threads(int n) override { cpu_->set_threads(n); }
    void* stream() override { return stream_; }
    Buffer alloc(size_t bytes) override { return cpu_->alloc(bytes); }
    void release(void* p) override { cpu_->release(p); }
    void upload(void* d, const void* s, size_t b) override { cpu_->upload(d, s, b); }
    void download(void* d, const void* s, size_t b) override { cpu_->download(d, s, b); }
    void copy(void* d, const void* s, size_t b) override { cpu_->copy(d, s, b); }
    void synchronize() override { cpu_->synchronize(); }
    Buffer load_matrix(const float* h, int r, int c) override { return cpu_->load_matrix(h, r, c); }
    Buffer random_matrix(int r, int c, const RandomMatrixSpec& s) override {
        return cpu_->random_matrix(r, c, s);
    }
    void embed(const float* t, const int32_t* ids, int n, int e, float* o) override {
        cpu_->embed(t, ids, n, e, o);
    }
    void rms_norm(const float* x, const float* w, int n, int d, float eps, float* o) override {
        cpu_->rms_norm(x, w, n, d, eps, o);
    }
    void matmul(const float* x, const float* w, const float* b, int n, int k, int m, float* o,
                bool acc) override {
        cpu_->matmul(x, w, b, n, k, m, o, acc);
    }
    void rope(float* x, const int32_t* pos, int n, int h, int d, const float* f) override {
        cpu_->rope(x, pos, n, h, d, f);
    }
    void attention(const AttnParams& p) override {
        if (t_trace) t_trace->push_back("attention");
        cpu_->attention(p);
    }
    void attention_scores(const ScoreParams& p) override { cpu_->attention_scores(p); }
    void swiglu(const float* g, const float* u, size_t n, float* o) override {
        cpu_->swiglu(g, u, n, o);
    }
    void add(float* y, const float* x, size_t n) override { cpu_->add(y, x, n); }
    void lse_merge(float* oa, float* la, const float* ob, const float* lb, int rows,
                   int d) override {
        cpu_->lse_merge(oa, la, ob, lb, rows, d);
    }

  private:
    std::unique_ptr<Backend> cpu_;
    std::string name_;
    void* stream_;
};

// A Request of the wrapped communicator whose wait() and test() are logged.
class TracedRequest : public RequestImpl {
  public:
    TracedRequest(Request r, std::vector<std::string>* trace) : r_(std::move(r)), trace_(trace) {}
    void wait() override {
        trace_->push_back("wait");
        r_.wait();
    }
    bool test() override {
        trace_->push_back("test");
        return r_.test();
    }
    void abandon() noexcept override { r_ = Request(); }

  private:
    Request r_;
    std::vector<std::string>* trace_;
};

// Forwards to `inner` (a ThreadComm rank), logging the point-to-point calls.
class TracingComm final : public Communicator {
  public:
    TracingComm(Communicator& inner, std::vector<std::string>* trace)
        : Communicator(inner.rank(), inner.size(), inner.local_rank(), inner.local_size()),
          in_(inner),
          trace_(trace) {}
    const char* kind() const override { return in_.kind(); }
    MemorySpace memory_space() const override { return in_.memory_space(); }
    [[noreturn]] void abort(int code, const std::string& msg) override {
        in_.abort(code, msg);
        std::_Exit(code);  // not reached
    }

  protected:
    void do_barrier(Stream) override { in_.barrier(); }
    void do_broadcast(void* b, size_t n, int root, Stream) override { in_.broadcast(b, n, root); }
    void do_all_reduce(void* b, size_t n, DType t, ReduceOp op, Stream) override {
        in_.all_reduce(b, n, t, op);
    }
    void do_all_gather(const void* s, size_t n, void* r, Stream) override {
        in_.all_gather(s, n, r);
    }
    void do_all_gather_v(const void* s, size_t n, void* r, const std::vector<size_t>& rb,
                         Stream) override {
        in_.all_gather_v(s, n, r, rb);
    }
    void do_all_to_all_v(const void* s, const std::vector<size_t>& sb, void* r,
                         const std::vector<size_t>& rb, Stream) override {
        in_.all_to_all_v(s, sb, r, rb);
    }
    std::unique_ptr<RequestImpl> do_isend(const void* b, size_t n, int dst, int tag,
                                          Stream) override {
        trace_->push_back("isend");
        return std::make_unique<TracedRequest>(in_.isend(b, n, dst, tag), trace_);
    }
    std::unique_ptr<RequestImpl> do_irecv(void* b, size_t n, int src, int tag, Stream) override {
        trace_->push_back("irecv");
        return std::make_unique<TracedRequest>(in_.irecv(b, n, src, tag), trace_);
    }

  private:
    Communicator& in_;
    std::vector<std::string>* trace_;
};

// One rank of a device communicator, alone: copies in place of transfers, and the stream of
// every call recorded.
class StreamRecordingComm final : public Communicator {
  public:
    StreamRecordingComm() : Communicator(0, 1, 0, 1) {}
    const char* kind() const override { return "recording"; }
    MemorySpace memory_space() const override { return MemorySpace::device; }
    [[noreturn]] void abort(int code, const std::string& msg) override { abort_job(msg, code); }
    std::vector<Stream> streams;

  protected:
    void do_barrier(Stream s) override { streams.push_back(s); }
    void do_broadcast(void*, size_t, int, Stream s) override { streams.push_back(s); }
    void do_all_reduce(void*, size_t, DType, ReduceOp, Stream s) override { streams.push_back(s); }
    void do_all_gather(const void* send, size_t n, void* recv, Stream s) override {
        streams.push_back(s);
        if (send != recv) std::memmove(recv, send, n);
    }
    void do_all_gather_v(const void* send, size_t n, void* recv, const std::vector<size_t>&,
                         Stream s) override {
        streams.push_back(s);
        if (send != recv) std::memmove(recv, send, n);
    }
    void do_all_to_all_v(const void* send, const std::vector<size_t>& sb, void* recv,
                         const std::vector<size_t>&, Stream s) override {
        streams.push_back(s);
        std::memmove(recv, send, sb[0]);
    }
    std::unique_ptr<RequestImpl> do_isend(const void* b, size_t n, int, int, Stream s) override {
        streams.push_back(s);
        pending_ = std::vector<char>(static_cast<const char*>(b), static_cast<const char*>(b) + n);
        return std::make_unique<Done>();
    }
    std::unique_ptr<RequestImpl> do_irecv(void*, size_t, int, int, Stream s) override {
        streams.push_back(s);
        return std::make_unique<Done>();
    }

  private:
    struct Done : RequestImpl {
        void wait() override {}
        bool test() override { return true; }
        void abandon() noexcept override {}
    };
    std::vector<char> pending_;
};

}  // namespace

TEST_CASE("ring: each block's transfer is started before the attention that hides it", "[ring]") {
    TinyModel tm;
    TracingBackend tb("cpu", nullptr);
    Model model(tb, tm.w);
    const PreparedRequest req = random_request(8, tm.w.config.n_vocab, 4, {13, 11, 9}, 7);
    const int P = 3;
    for (auto layout : {Config::RingLayout::zigzag, Config::RingLayout::contiguous}) {
        Config cfg = method_config(Config::Method::ring);
        cfg.ring.layout = layout;
        cfg.decode.max_new_tokens = 1;
        std::vector<std::vector<std::string>> traces(P);
        ThreadWorld world(P, LinkModel{});
        world.run([&](Communicator& comm) {
            std::vector<std::string>& trace = traces[comm.rank()];
            t_trace = &trace;
            TracingComm traced(comm, &trace);
            run_ring(model, req, cfg, traced, {});
            t_trace = nullptr;
        });
        for (int r = 0; r < P; ++r) {
            CAPTURE(to_string(layout), r);
            // Attentions while a block is in flight: each after its transfer was started.
            int in_flight = 0, started = 0, unstarted = 0, pending = 0;
            bool kicked = false;
            for (const std::string& e : traces[r]) {
                if (e == "isend" || e == "irecv") {
                    ++pending;
                    kicked = false;
                } else if (e == "test") {
                    kicked = true;
                } else if (e == "wait") {
                    pending = std::max(0, pending - 1);
                } else if (e == "attention" && pending > 0) {
                    ++in_flight;
                    (kicked ? started : unstarted)++;
                }
            }
            // P - 1 steps with a transfer per layer (prefill), each overlapping one attention.
            CHECK(in_flight >= tm.w.config.n_layer * (P - 1));
            CHECK(started == in_flight);
            CHECK(unstarted == 0);
        }
    }
}

TEST_CASE("comm_stage: a device communicator is handed the backend's stream", "[comm_stage]") {
    int tag = 0;
    void* const stream = &tag;  // any non-null handle: what the backend's stream() returns
    TracingBackend be("device-like", stream);
    StreamRecordingComm comm;
    REQUIRE(comm_reads_backend(comm, be));
    Buffer a = be.alloc(64), b = be.alloc(64);
    all_gather_backend(comm, be, a.data(), 64, b.data());
    all_gather_v_backend(comm, be, a.data(), 64, b.data(), {64});
    all_to_all_v_backend(comm, be, a.data(), {64}, b.data(), {64});
    BackendP2P p2p(comm, be);
    Request s = p2p.isend(a.data(), 64, 0, 1);
    Request r = p2p.irecv(b.data(), 64, 0, 1);
    s.wait();
    r.wait();
    p2p.complete();
    REQUIRE(comm.streams.size() == 5);
    for (Stream x : comm.streams) CHECK(x == stream);
}
