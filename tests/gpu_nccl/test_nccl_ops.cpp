// NcclComm on 1 rank (any GPU machine) and on P ranks (mpiexec, one GPU per rank): every op with
// device buffers against the values every rank can compute for itself, the byte accounting of
// comm/communicator.h checked exactly per phase, the host-buffer route (through the host
// channel, after the stream), the mixed-buffer error and the pointer classification of real
// device, managed and pinned memory. Deadlock rule (docs/formats.md §11.3): every rank runs every
// collective of a case; only CHECK after communication.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/nccl_comm.h"
#include "tests/gpu_nccl/gpu_nccl_test.h"

using namespace infoflow;

namespace {

uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + i * 11 + 1); }

uint64_t all_reduce_bytes(uint64_t n, uint64_t e, int p, int r) {
    if (p == 1) return 0;
    const uint64_t c_r = e * (n / p + (static_cast<uint64_t>(r) < n % p ? 1 : 0));
    return n * e + (p - 2) * c_r;
}

void check_stats(const CommStats& s, uint64_t sent, uint64_t recv, uint64_t calls) {
    CHECK(s.bytes_sent == sent);
    CHECK(s.bytes_recv == recv);
    CHECK(s.calls == calls);
    CHECK(s.wait_ms >= 0.0);
}

// A non-blocking stream for the ops (the per-rank stream of a backend).
struct TestStream {
    cudaStream_t s = nullptr;
    TestStream() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
    ~TestStream() { cudaStreamDestroy(s); }
};

}  // namespace

TEST_CASE("nccl gpu: ranks, device and pointer classification", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    CHECK(std::string(c.kind()) == "nccl");
    CHECK(c.memory_space() == MemorySpace::device);
    CHECK(c.size() == std::max(1, launcher_world_size()));
    int n = 0, dev = -1;
    cuda_ok(cudaGetDeviceCount(&n), "count");
    cuda_ok(cudaGetDevice(&dev), "device");
    CHECK(dev == (n == 1 ? 0 : c.local_rank() % n));

    DevBuf d(64);
    void* managed = nullptr;
    void* pinned = nullptr;
    cuda_ok(cudaMallocManaged(&managed, 64), "managed");
    cuda_ok(cudaMallocHost(&pinned, 64), "pinned");
    int on_stack = 0;
    CHECK(classify_pointer(d.get()) == PointerSpace::device);
    CHECK(classify_pointer(d.get() + 17) == PointerSpace::device);
    CHECK(classify_pointer(managed) == PointerSpace::device);
    CHECK(classify_pointer(pinned) == PointerSpace::host);
    CHECK(classify_pointer(&on_stack) == PointerSpace::host);
    cudaFree(managed);
    cudaFreeHost(pinned);
}

TEST_CASE("nccl gpu: broadcast and barrier", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    const size_t b = 13;
    TestStream st;
    c.reset_stats();
    PhaseScope phase(c, "bcast");
    bool ok = true;
    DevBuf buf(b);
    for (int root = 0; root < p; ++root) {
        std::vector<uint8_t> h(b, 0);
        if (r == root) {
            for (size_t i = 0; i < b; ++i) h[i] = pattern(root, i);
        }
        buf.upload(h.data(), b);
        c.broadcast(buf.get(), b, root, st.s);
        const auto got = buf.download<uint8_t>();
        for (size_t i = 0; i < b; ++i) ok = ok && got[i] == pattern(root, i);
    }
    c.broadcast(nullptr, 0, p - 1, st.s);
    CHECK(ok);
    check_stats(c.stats("bcast"), b * (p - 1), b * (p - 1), p + 1);
    {
        PhaseScope bp(c, "barrier");
        c.barrier(st.s);
        c.barrier();
        check_stats(c.stats("barrier"), 0, 0, 2);
    }
}

TEST_CASE("nccl gpu: all_reduce of every dtype and op", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    const size_t n = 7;
    const double tri = p * (p + 1) / 2.0;
    TestStream st;
    c.reset_stats();
    uint64_t expect_bytes = 0;
    PhaseScope phase(c, "reduce");
    for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
            INFO("dtype " << dtype_name(t) << " op " << reduce_op_name(op) << " rank " << r
                          << " of " << p);
            const double scale = t == DType::i64 ? static_cast<double>(1ll << 36) : 1.0;
            auto value = [&](int rank, size_t i) {
                return (rank + 1) * (i + 1.0) * (i % 2 ? -1.0 : 1.0) * scale;
            };
            auto expected = [&](size_t i) {
                const double s = (i % 2 ? -1.0 : 1.0) * scale * (i + 1.0);
                if (op == ReduceOp::sum) return s * tri;
                const bool hi = (op == ReduceOp::max) == (s > 0);
                return s * (hi ? p : 1);
            };
            const size_t e = dtype_size(t);
            std::vector<char> h(n * e);
            auto put = [&](size_t i, double v) {
                switch (t) {
                    case DType::f32: {
                        const float f = static_cast<float>(v);
                        std::memcpy(&h[i * e], &f, e);
                        break;
                    }
                    case DType::f64:
                        std::memcpy(&h[i * e], &v, e);
                        break;
                    case DType::i32: {
                        const int32_t x = static_cast<int32_t>(v);
                        std::memcpy(&h[i * e], &x, e);
                        break;
                    }
                    case DType::i64: {
                        const int64_t x = static_cast<int64_t>(v);
                        std::memcpy(&h[i * e], &x, e);
                        break;
                    }
                }
            };
            auto get = [&](const std::vector<char>& g, size_t i) {
                double v = 0;
                switch (t) {
                    case DType::f32: {
                        float f;
                        std::memcpy(&f, &g[i * e], e);
                        v = f;
                        break;
                    }
                    case DType::f64:
                        std::memcpy(&v, &g[i * e], e);
                        break;
                    case DType::i32: {
                        int32_t x;
                        std::memcpy(&x, &g[i * e], e);
                        v = static_cast<double>(x);
                        break;
                    }
                    case DType::i64: {
                        int64_t x;
                        std::memcpy(&x, &g[i * e], e);
                        v = static_cast<double>(x);
                        break;
                    }
                }
                return v;
            };
            for (size_t i = 0; i < n; ++i) put(i, value(r, i));
            DevBuf d(n * e);
            d.upload(h.data(), h.size());
            c.all_reduce(d.get(), n, t, op, st.s);
            expect_bytes += all_reduce_bytes(n, e, p, r);
            const auto got = d.download<char>();
            for (size_t i = 0; i < n; ++i) CHECK(get(got, i) == expected(i));
        }
    }
    check_stats(c.stats("reduce"), expect_bytes, expect_bytes, 12);
}

TEST_CASE("nccl gpu: all_gather and all_gather_v, in place too", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    TestStream st;
    c.reset_stats();
    const size_t b = 9;
    {
        PhaseScope phase(c, "gather");
        std::vector<uint8_t> mine(b);
        for (size_t i = 0; i < b; ++i) mine[i] = pattern(r, i);
        DevBuf send(b), recv(b * p);
        send.upload(mine.data(), b);
        c.all_gather(send.get(), b, recv.get(), st.s);
        auto got = recv.download<uint8_t>();
        bool ok = true;
        for (int q = 0; q < p; ++q) {
            for (size_t i = 0; i < b; ++i) ok = ok && got[q * b + i] == pattern(q, i);
        }
        CHECK(ok);
        // In place: this rank's block already sits in the result buffer.
        DevBuf inplace(b * p);
        inplace.upload(mine.data(), b, r * b);
        c.all_gather(inplace.get() + r * b, b, inplace.get(), st.s);
        got = inplace.download<uint8_t>();
        ok = true;
        for (int q = 0; q < p; ++q) {
            for (size_t i = 0; i < b; ++i) ok = ok && got[q * b + i] == pattern(q, i);
        }
        CHECK(ok);
        check_stats(c.stats("gather"), 2 * b * (p - 1), 2 * b * (p - 1), 2);
    }
    {
        PhaseScope phase(c, "gatherv");
        // Rank q sends 3q+1 bytes, except the last rank (of several) which sends none.
        std::vector<size_t> sizes(p);
        for (int q = 0; q < p; ++q) sizes[q] = (p > 1 && q == p - 1) ? 0 : 3 * q + 1;
        size_t total = 0;
        std::vector<size_t> off(p);
        for (int q = 0; q < p; ++q) {
            off[q] = total;
            total += sizes[q];
        }
        std::vector<uint8_t> mine(sizes[r]);
        for (size_t i = 0; i < sizes[r]; ++i) mine[i] = pattern(r, i);
        DevBuf send(std::max<size_t>(sizes[r], 1)), recv(total);
        send.upload(mine.data(), mine.size());
        c.all_gather_v(send.get(), sizes[r], recv.get(), sizes, st.s);
        auto got = recv.download<uint8_t>();
        bool ok = got.size() == total;
        for (int q = 0; q < p && ok; ++q) {
            for (size_t i = 0; i < sizes[q]; ++i) ok = ok && got[off[q] + i] == pattern(q, i);
        }
        CHECK(ok);
        DevBuf inplace(total);
        inplace.upload(mine.data(), mine.size(), off[r]);
        c.all_gather_v(inplace.get() + off[r], sizes[r], inplace.get(), sizes, st.s);
        got = inplace.download<uint8_t>();
        ok = got.size() == total;
        for (int q = 0; q < p && ok; ++q) {
            for (size_t i = 0; i < sizes[q]; ++i) ok = ok && got[off[q] + i] == pattern(q, i);
        }
        CHECK(ok);
        uint64_t others = 0;
        for (int q = 0; q < p; ++q) others += q == r ? 0 : sizes[q];
        check_stats(c.stats("gatherv"), 2 * sizes[r] * (p - 1), 2 * others, 2);
    }
}

TEST_CASE("nccl gpu: all_to_all_v", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    TestStream st;
    c.reset_stats();
    PhaseScope phase(c, "a2a");
    // Block r -> q has (r + 2q) % 4 + 1 bytes, except r -> r+1 which is empty; byte i of it is
    // pattern(r * p + q, i).
    auto len = [&](int from, int to) -> size_t {
        if (p > 1 && to == (from + 1) % p) return 0;
        return (from + 2 * to) % 4 + 1;
    };
    std::vector<size_t> sb(p), rb(p);
    for (int q = 0; q < p; ++q) {
        sb[q] = len(r, q);
        rb[q] = len(q, r);
    }
    std::vector<uint8_t> hs;
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < sb[q]; ++i) hs.push_back(pattern(r * p + q, i));
    }
    size_t rtotal = 0;
    for (size_t x : rb) rtotal += x;
    DevBuf send(hs.size()), recv(rtotal);
    send.upload(hs.data(), hs.size());
    c.all_to_all_v(send.get(), sb, recv.get(), rb, st.s);
    const auto got = recv.download<uint8_t>();
    bool ok = true;
    size_t off = 0;
    for (int q = 0; q < p; ++q) {
        for (size_t i = 0; i < rb[q]; ++i) ok = ok && got[off + i] == pattern(q * p + r, i);
        off += rb[q];
    }
    CHECK(ok);
    uint64_t s_other = 0, r_other = 0;
    for (int q = 0; q < p; ++q) {
        if (q == r) continue;
        s_other += sb[q];
        r_other += rb[q];
    }
    check_stats(c.stats("a2a"), s_other, r_other, 1);
}

TEST_CASE("nccl gpu: ring of isend/irecv and sendrecv", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    TestStream st;
    c.reset_stats();
    const size_t b = 21;
    std::vector<uint8_t> mine(b);
    for (size_t i = 0; i < b; ++i) mine[i] = pattern(r, i);
    const uint64_t moved = p == 1 ? 0 : b;  // a message to self is never counted
    {
        PhaseScope phase(c, "p2p");
        DevBuf send(b), recv(b);
        send.upload(mine.data(), b);
        // Two ring steps: one started by test() (the early start of the header), one by wait.
        std::vector<Request> reqs;
        reqs.push_back(c.isend(send.get(), b, next, 5, st.s));
        reqs.push_back(c.irecv(recv.get(), b, prev, 5, st.s));
        reqs[0].test();
        wait_all(reqs);
        auto got = recv.download<uint8_t>();
        bool ok = true;
        for (size_t i = 0; i < b; ++i) ok = ok && got[i] == pattern(prev, i);
        CHECK(ok);
        DevBuf recv2(b);
        Request rr = c.irecv(recv2.get(), b, prev, 6, st.s);  // receive posted first
        Request sr = c.isend(send.get(), b, next, 6, st.s);
        rr.wait();
        sr.wait();
        CHECK(rr.done());
        CHECK(sr.done());
        got = recv2.download<uint8_t>();
        ok = true;
        for (size_t i = 0; i < b; ++i) ok = ok && got[i] == pattern(prev, i);
        CHECK(ok);
        check_stats(c.stats("p2p"), 2 * moved, 2 * moved, 4);
    }
    {
        PhaseScope phase(c, "shift");
        DevBuf send(b), recv(b);
        send.upload(mine.data(), b);
        c.sendrecv(send.get(), b, next, recv.get(), b, prev, 0, st.s);
        const auto got = recv.download<uint8_t>();
        bool ok = true;
        for (size_t i = 0; i < b; ++i) ok = ok && got[i] == pattern(prev, i);
        CHECK(ok);
        check_stats(c.stats("shift"), moved, moved, 1);
    }
    if (p == 1) {
        // A message to self with no partner cannot complete: an error, not a hang.
        DevBuf send(b);
        Request s = c.isend(send.get(), b, 0, 9, st.s);
        CHECK_THROWS_WITH(s.wait(), Catch::Contains("has no matching receive"));
        DevBuf a(b), z(b + 1);
        Request rs = c.isend(a.get(), b, 0, 3, st.s);
        Request rv = c.irecv(z.get(), b + 1, 0, 3, st.s);
        CHECK_THROWS_WITH(rv.wait(), Catch::Contains("posted " + std::to_string(b + 1)));
        CHECK_THROWS(rs.wait());  // its group never started
    }
}

namespace {

double steady_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void CUDART_CB note_start(void* at) { *static_cast<double*>(at) = steady_s(); }

}  // namespace

TEST_CASE("nccl gpu: a started transfer runs beside work queued after it (ring overlap)",
          "[nccl][gpu]") {
    // A message to self of 8 GiB (a device copy of several ms) is started with test(); then the
    // caller's stream gets a host function that notes when it runs. On the communicator's own
    // point-to-point stream the copy does not hold that function back: it starts at once, ms
    // before the copy is waited for. Were the copy on the caller's stream (stream order), the
    // function could only start once the copy had finished, i.e. when wait() returns.
    Communicator& c = *g_nccl;
    const int r = c.rank();
    TestStream st;
    const size_t b = size_t(8) << 30;
    DevBuf send(b), recv(b);
    cuda_ok(cudaMemset(send.get(), 7, b), "memset");
    cuda_ok(cudaDeviceSynchronize(), "sync");
    double started = 0.0;
    Request rr = c.irecv(recv.get(), b, r, 11, st.s);
    Request sr = c.isend(send.get(), b, r, 11, st.s);
    rr.test();
    cuda_ok(cudaLaunchHostFunc(st.s, note_start, &started), "host function");
    rr.wait();
    sr.wait();
    const double waited = steady_s();
    cuda_ok(cudaStreamSynchronize(st.s), "sync");
    INFO("the host function started " << (waited - started) * 1e3 << " ms before wait returned");
    CHECK(started > 0.0);
    CHECK(waited - started > 1e-3);
    uint8_t tail = 0;
    cuda_ok(cudaMemcpy(&tail, recv.get() + b - 1, 1, cudaMemcpyDeviceToHost), "download");
    CHECK(tail == 7);
}

TEST_CASE("nccl gpu: host buffers go through the host channel after the stream", "[nccl][gpu]") {
    Communicator& c = *g_nccl;
    const int p = c.size(), r = c.rank();
    TestStream st;
    c.reset_stats();
    PhaseScope phase(c, "host");
    // Device values copied to pinned host memory asynchronously on the stream: the host-buffer
    // all_reduce must wait for that copy before it reads the buffer.
    const size_t n = 1 << 16;
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((r + 1) * (i % 97));
    DevBuf d(n * sizeof(float));
    d.upload(h.data(), n * sizeof(float));
    float* pinned = nullptr;
    cuda_ok(cudaMallocHost(&pinned, n * sizeof(float)), "pinned");
    std::memset(pinned, 0, n * sizeof(float));
    cuda_ok(cudaMemcpyAsync(pinned, d.get(), n * sizeof(float), cudaMemcpyDeviceToHost, st.s),
            "copy");
    c.all_reduce(pinned, n, DType::f32, ReduceOp::sum, st.s);
    bool ok = true;
    const float tri = p * (p + 1) / 2.0f;
    for (size_t i = 0; i < n; ++i) ok = ok && pinned[i] == tri * static_cast<float>(i % 97);
    CHECK(ok);
    cudaFreeHost(pinned);
    // Pageable host memory, an all_gather and the stats gather (host buffers inside).
    const int32_t mine = 100 + r;
    std::vector<int32_t> all(p, -1);
    c.all_gather(&mine, sizeof mine, all.data(), st.s);
    for (int q = 0; q < p; ++q) CHECK(all[q] == 100 + q);
    const uint64_t red = all_reduce_bytes(n, 4, p, r);
    check_stats(c.stats("host"), red + 4 * (p - 1), red + 4 * (p - 1), 2);
    const auto gathered = gather_stats(c);
    bool found = false;
    for (const auto& ph : gathered) {
        if (ph.phase != "host") continue;
        found = true;
        CHECK(ph.per_rank.size() == static_cast<size_t>(p));
        for (int q = 0; q < p; ++q) CHECK(ph.per_rank[q].calls == 2);
    }
    CHECK(found);
    CHECK_NOTHROW(check_same_config(c, "same-on-every-rank"));
    // Host and device buffers in one call: an error naming the call, on every rank alike.
    DevBuf dev(sizeof(int32_t) * p);
    CHECK_THROWS_WITH(c.all_gather(&mine, sizeof mine, dev.get(), st.s),
                      Catch::Contains("all_gather was given host and device buffers"));
}
