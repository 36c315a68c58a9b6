// A strict "device-like" backend for tests (never shipped): the CPU backend's ops, but every
// Buffer it hands out lies in one mmap'd region kept PROT_NONE except while one of its own calls
// runs (the region is made readable and writable at the call's entry and inaccessible again at
// its exit). Its name is not "cpu", so Model treats it as a device backend (weights
// through load_matrix, never read in place). Host code that touches backend memory directly —
// what would read a device pointer on the host with the CUDA backend — faults at once, and
// install_guard_handler() turns the fault into a clear message with the faulting address and
// the backtrace, then aborts. This proves, on the CPU, that a pipeline only reaches backend
// memory through upload/download/copy and the ops.
#pragma once

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/core/error.h"

namespace infoflow::test {

class GuardedBackend final : public Backend {
  public:
    explicit GuardedBackend(int n_threads) : cpu_(make_cpu_backend(n_threads)) {
        // One reserved region for every buffer, so opening and closing all of them is one
        // mprotect; transparent huge pages keep that cheap for hundreds of MB of weights.
        void* m = mmap(nullptr, kReserve + kHuge, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        IF_CHECK(m != MAP_FAILED, "guarded backend: cannot reserve " << kReserve << " bytes");
        map_ = static_cast<char*>(m);
        base_ = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(map_) + kHuge - 1) / kHuge *
                                        kHuge);
        top_ = base_;
        madvise(base_, kReserve, MADV_HUGEPAGE);
    }
    ~GuardedBackend() override { munmap(map_, kReserve + kHuge); }
    GuardedBackend(const GuardedBackend&) = delete;
    GuardedBackend& operator=(const GuardedBackend&) = delete;

    std::string name() const override { return "guarded"; }
    std::string device() const override { return "guarded (cpu, memory locked between ops)"; }
    void set_threads(int n_threads) override { cpu_->set_threads(n_threads); }
    // The CPU's kernels run underneath: its rate, so the recompute plan (parallel.balance,
    // which weighs compute against bytes) is the CPU backend's on every CPU path.
    double nominal_gmacs() const override { return cpu_->nominal_gmacs(); }
    // Calls made so far, for tests that want to see traffic go through the interface.
    size_t ops() const { return ops_; }

    // ---- memory: best fit among released blocks, else the end of the region ----
    Buffer alloc(size_t bytes) override {
        if (bytes == 0) return Buffer();
        const size_t len = (bytes + kAlign - 1) / kAlign * kAlign;
        char* p = nullptr;
        const auto it = free_.lower_bound(len);
        if (it != free_.end()) {
            p = it->second;
            const size_t have = it->first;
            free_.erase(it);
            if (have > len) free_.emplace(have - len, p + len);
        } else {
            IF_CHECK(size_t(top_ - base_) + len <= kReserve,
                     "guarded backend: out of its " << kReserve << "-byte region");
            p = top_;
            top_ += len;
            // Inside an op the rest of the region is open; the new part must be too.
            if (depth_ > 0) protect(p, len, PROT_READ | PROT_WRITE);
        }
        live_.emplace(p, len);
        return Buffer(this, p, bytes);
    }
    void release(void* ptr) override {
        const auto it = live_.find(static_cast<char*>(ptr));
        if (it == live_.end()) return;
        free_.emplace(it->second, it->first);
        live_.erase(it);
    }
    void upload(void* dst, const void* host_src, size_t bytes) override {
        Op op(*this);
        std::memcpy(dst, host_src, bytes);
    }
    void download(void* host_dst, const void* src, size_t bytes) override {
        Op op(*this);
        std::memcpy(host_dst, src, bytes);
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        Op op(*this);
        std::memmove(dst, src, bytes);
    }
    void synchronize() override {}
    void narrow_kv(KvDtype t, const float* src, size_t n, void* dst) override {
        Op op(*this);
        cpu_->narrow_kv(t, src, n, dst);
    }
    void widen_kv(KvDtype t, const void* src, size_t n, float* dst) override {
        Op op(*this);
        cpu_->widen_kv(t, src, n, dst);
    }

    // ---- weights (fp32, as the CPU stores them, but in this backend's memory) ----
    Buffer load_matrix(const float* host, int rows, int cols) override {
        Buffer b = alloc(size_t(rows) * cols * sizeof(float));
        upload(b.data(), host, b.bytes());
        return b;
    }
    Buffer random_matrix(int rows, int cols, const RandomMatrixSpec& spec) override {
        const Buffer h = cpu_->random_matrix(rows, cols, spec);  // CPU memory, host-readable
        return load_matrix(h.data(), rows, cols);
    }

    // ---- ops: the CPU backend's, with this backend's memory open for the call ----
    void embed(const float* table, const int32_t* ids, int n, int n_embd, float* out) override {
        Op op(*this);
        cpu_->embed(table, ids, n, n_embd, out);
    }
    void rms_norm(const float* x, const float* w, int n, int d, float eps, float* out) override {
        Op op(*this);
        cpu_->rms_norm(x, w, n, d, eps, out);
    }
    void matmul(const float* x, const float* w, const float* bias, int n, int k, int m, float* out,
                bool accumulate) override {
        Op op(*this);
        cpu_->matmul(x, w, bias, n, k, m, out, accumulate);
    }
    void rope(float* x, const int32_t* pos, int n, int n_head, int head_dim,
              const float* inv_freq) override {
        Op op(*this);
        cpu_->rope(x, pos, n, n_head, head_dim, inv_freq);
    }
    void attention(const AttnParams& p) override {
        Op op(*this);
        cpu_->attention(p);
    }
    void attention_scores(const ScoreParams& p) override {
        Op op(*this);
        cpu_->attention_scores(p);
    }
    void swiglu(const float* gate, const float* up, size_t n, float* out) override {
        Op op(*this);
        cpu_->swiglu(gate, up, n, out);
    }
    void add(float* y, const float* x, size_t n) override {
        Op op(*this);
        cpu_->add(y, x, n);
    }
    void lse_merge(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int rows,
                   int head_dim) override {
        Op op(*this);
        cpu_->lse_merge(o_a, lse_a, o_b, lse_b, rows, head_dim);
    }

  private:
    static constexpr size_t kHuge = size_t(2) << 20;
    static constexpr size_t kReserve = size_t(64) << 30;  // address space only (NORESERVE)
    static constexpr size_t kAlign = 256;                 // as a device allocator aligns

    // Opens the region for the duration of one call (calls may nest: load_matrix).
    class Op {
      public:
        explicit Op(GuardedBackend& b) : b_(b) {
            ++b_.ops_;
            if (b_.depth_++ == 0) b_.protect(b_.base_, b_.used(), PROT_READ | PROT_WRITE);
        }
        ~Op() {
            if (--b_.depth_ == 0) b_.protect(b_.base_, b_.used(), PROT_NONE);
        }
        Op(const Op&) = delete;
        Op& operator=(const Op&) = delete;

      private:
        GuardedBackend& b_;
    };

    // Bytes of the region in use so far, rounded to whole pages.
    size_t used() const {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        return (size_t(top_ - base_) + page - 1) / page * page;
    }
    static void protect(char* p, size_t bytes, int prot) {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        char* start = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) / page * page);
        const size_t len = (size_t(p + bytes - start) + page - 1) / page * page;
        if (len > 0 && mprotect(start, len, prot) != 0) {
            std::fprintf(stderr, "guarded backend: mprotect failed: %s\n", std::strerror(errno));
            std::abort();
        }
    }

    std::unique_ptr<Backend> cpu_;
    char* map_ = nullptr;                // the reservation
    char* base_ = nullptr;               // its 2 MiB aligned start
    char* top_ = nullptr;                // end of the part handed out so far
    std::map<char*, size_t> live_;       // buffer -> its length
    std::multimap<size_t, char*> free_;  // released blocks by length
    int depth_ = 0;
    size_t ops_ = 0;
};

// SIGSEGV/SIGBUS: host code touched guarded backend memory (or any bad address). Prints the
// faulting address and the backtrace, then aborts, so the test fails with the place to fix.
inline void guard_fault(int sig, siginfo_t* info, void*) {
    char msg[160];
    const int n = std::snprintf(msg, sizeof msg,
                                "\nFATAL: host code touched backend memory directly (signal %d "
                                "at address %p); backtrace:\n",
                                sig, info ? info->si_addr : nullptr);
    if (n > 0) (void)!write(STDERR_FILENO, msg, size_t(n));
    void* frames[64];
    const int depth = backtrace(frames, 64);
    backtrace_symbols_fd(frames, depth, STDERR_FILENO);
    signal(SIGABRT, SIG_DFL);
    std::abort();
}

inline void install_guard_handler() {
    struct sigaction sa {};
    sa.sa_sigaction = guard_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace infoflow::test
