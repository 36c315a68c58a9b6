// SelfComm: the one-rank communicator (P = 1), used when no launcher started the job and as the
// reference the MPI tests compare with. No library: collectives are copies (or nothing), every
// byte count is zero (a rank's own data is never counted, communicator.h), and a message to self
// is matched in posting order by tag like MPI's. Single-threaded, so a send or receive to self
// that has no partner yet can never complete: waiting on it is an error, not a hang.
#include <cstring>
#include <deque>

#include "comm/communicator.h"
#include "runtime/core/error.h"

namespace infoflow {

namespace {

struct SelfMessage {
    const void* send = nullptr;  // set for a posted send
    void* recv = nullptr;        // set for a posted receive
    size_t bytes = 0;
    int tag = 0;
    std::shared_ptr<bool> done;
};

class SelfComm;

class SelfRequest : public RequestImpl {
  public:
    SelfRequest(SelfComm* comm, std::shared_ptr<bool> done, bool is_send, int tag)
        : comm_(comm), done_(std::move(done)), is_send_(is_send), tag_(tag) {}
    void wait() override {
        IF_CHECK(*done_, "self communicator: " << (is_send_ ? "send to" : "receive from")
                                               << " rank 0 with tag " << tag_ << " has no matching "
                                               << (is_send_ ? "receive" : "send")
                                               << " posted; waiting would deadlock");
    }
    bool test() override { return *done_; }
    void abandon() noexcept override;

  private:
    SelfComm* comm_;
    std::shared_ptr<bool> done_;
    bool is_send_;
    int tag_;
};

class SelfComm final : public Communicator {
  public:
    SelfComm() : Communicator(0, 1, 0, 1) {}
    const char* kind() const override { return "self"; }
    MemorySpace memory_space() const override { return MemorySpace::host; }

    [[noreturn]] void abort(int code, const std::string& msg) override { abort_job(msg, code); }

    void forget(const std::shared_ptr<bool>& done) noexcept {
        for (auto* q : {&sends_, &recvs_}) {
            for (auto it = q->begin(); it != q->end(); ++it) {
                if (it->done == done) {
                    q->erase(it);
                    break;
                }
            }
        }
    }

  protected:
    void do_barrier(Stream) override {}
    void do_broadcast(void*, size_t, int, Stream) override {}
    void do_all_reduce(void*, size_t, DType, ReduceOp, Stream) override {}
    void do_all_gather(const void* send, size_t bytes, void* recv, Stream) override {
        copy(recv, send, bytes);
    }
    void do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                         const std::vector<size_t>&, Stream) override {
        copy(recv, send, send_bytes);
    }
    void do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                         const std::vector<size_t>&, Stream) override {
        copy(recv, send, send_bytes[0]);
    }
    std::unique_ptr<RequestImpl> do_isend(const void* buf, size_t bytes, int, int tag,
                                          Stream) override {
        auto done = std::make_shared<bool>(false);
        if (!match(recvs_, tag, [&](SelfMessage& r) { deliver(buf, bytes, r); })) {
            sends_.push_back({buf, nullptr, bytes, tag, done});
        } else {
            *done = true;
        }
        return std::make_unique<SelfRequest>(this, done, true, tag);
    }
    std::unique_ptr<RequestImpl> do_irecv(void* buf, size_t bytes, int, int tag, Stream) override {
        auto done = std::make_shared<bool>(false);
        SelfMessage me{nullptr, buf, bytes, tag, done};
        if (!match(sends_, tag, [&](SelfMessage& s) { deliver(s.send, s.bytes, me); })) {
            recvs_.push_back(me);
        }
        return std::make_unique<SelfRequest>(this, done, false, tag);
    }

  private:
    static void copy(void* dst, const void* src, size_t bytes) {
        if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    }
    // Copies a send into a posted receive and completes both; the sizes must agree.
    static void deliver(const void* send, size_t bytes, SelfMessage& r) {
        IF_CHECK(bytes == r.bytes, "self communicator: a message of "
                                       << bytes << " bytes with tag " << r.tag
                                       << " does not match the posted receive of " << r.bytes
                                       << " bytes");
        copy(r.recv, send, bytes);
        *r.done = true;
    }
    // Completes the oldest queued message with `tag` through `f`; false when there is none.
    template <class F>
    static bool match(std::deque<SelfMessage>& q, int tag, F f) {
        for (auto it = q.begin(); it != q.end(); ++it) {
            if (it->tag == tag) {
                SelfMessage m = *it;
                q.erase(it);
                f(m);
                *m.done = true;
                return true;
            }
        }
        return false;
    }

    std::deque<SelfMessage> sends_;
    std::deque<SelfMessage> recvs_;
};

void SelfRequest::abandon() noexcept { comm_->forget(done_); }

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() { return std::make_unique<SelfComm>(); }

}  // namespace infoflow
