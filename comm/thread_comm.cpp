#include "comm/thread_comm.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "runtime/core/error.h"
#include "runtime/core/timing_clock.h"

namespace infoflow {

namespace {

enum class Op { barrier, broadcast, all_reduce, all_gather, all_gather_v, all_to_all_v };

const char* op_name(Op op) {
    switch (op) {
        case Op::barrier:
            return "barrier";
        case Op::broadcast:
            return "broadcast";
        case Op::all_reduce:
            return "all_reduce";
        case Op::all_gather:
            return "all_gather";
        case Op::all_gather_v:
            return "all_gather_v";
        case Op::all_to_all_v:
            return "all_to_all_v";
    }
    return "?";
}

// One rank's arguments to a collective, valid while the rank is inside the call.
struct Slot {
    Op op = Op::barrier;
    const void* send = nullptr;
    void* recv = nullptr;  // all_reduce and broadcast: the in-place buffer
    size_t bytes = 0;      // broadcast, all_gather (per rank), all_gather_v (own block)
    size_t count = 0;      // all_reduce elements
    int root = 0;
    DType dtype = DType::f32;
    ReduceOp rop = ReduceOp::sum;
    const std::vector<size_t>* a = nullptr;  // all_gather_v recv_bytes; all_to_all_v send_bytes
    const std::vector<size_t>* b = nullptr;  // all_to_all_v recv_bytes
    std::string phase;
};

std::string describe(const Slot& s) {
    std::ostringstream os;
    os << op_name(s.op);
    auto list = [&](const std::vector<size_t>* v) {
        os << "[";
        for (size_t i = 0; v && i < v->size(); ++i) os << (i ? "," : "") << (*v)[i];
        os << "]";
    };
    switch (s.op) {
        case Op::barrier:
            break;
        case Op::broadcast:
            os << "(" << s.bytes << " bytes, root " << s.root << ")";
            break;
        case Op::all_reduce:
            os << "(" << s.count << " " << dtype_name(s.dtype) << ", " << reduce_op_name(s.rop)
               << ")";
            break;
        case Op::all_gather:
            os << "(" << s.bytes << " bytes per rank)";
            break;
        case Op::all_gather_v:
            os << "(recv_bytes ";
            list(s.a);
            os << ")";
            break;
        case Op::all_to_all_v:
            os << "(send_bytes ";
            list(s.a);
            os << ", recv_bytes ";
            list(s.b);
            os << ")";
            break;
    }
    os << " in phase '" << s.phase << "'";
    return os.str();
}

template <class T>
void fold(T* acc, const T* x, size_t n, ReduceOp op) {
    for (size_t i = 0; i < n; ++i) {
        switch (op) {
            case ReduceOp::sum:
                acc[i] = acc[i] + x[i];
                break;
            case ReduceOp::max:
                acc[i] = x[i] > acc[i] ? x[i] : acc[i];
                break;
            case ReduceOp::min:
                acc[i] = x[i] < acc[i] ? x[i] : acc[i];
                break;
        }
    }
}

void fold_any(void* acc, const void* x, size_t n, DType t, ReduceOp op) {
    switch (t) {
        case DType::f32:
            fold(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
            break;
        case DType::f64:
            fold(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
            break;
        case DType::i32:
            fold(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x), n, op);
            break;
        case DType::i64:
            fold(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), n, op);
            break;
    }
}

void copy_bytes(void* dst, const void* src, size_t n) {
    if (n > 0 && dst != src) std::memcpy(dst, src, n);
}

std::vector<size_t> offsets_of(const std::vector<size_t>& sizes) {
    std::vector<size_t> off(sizes.size() + 1, 0);
    for (size_t i = 0; i < sizes.size(); ++i) off[i + 1] = off[i] + sizes[i];
    return off;
}

struct Message {
    std::vector<char> data;
    double arrival = 0.0;
};

struct RecvState {
    void* buf = nullptr;
    size_t bytes = 0;
    bool matched = false;
    double arrival = 0.0;
    std::string error;
};

using Key = std::tuple<int, int, int>;  // (source, destination, tag)

}  // namespace

struct ThreadWorld::State {
    State(int n, const LinkModel& l, std::function<void()> s)
        : P(n),
          link(l),
          sync(std::move(s)),
          timeline(n),
          slots(n),
          waiting(n),
          waiting_on(n),
          finished(n, false) {}

    const int P;
    const LinkModel link;
    const std::function<void()> sync;

    std::mutex turn;  // held by the one rank that computes
    std::mutex m;     // everything below
    std::condition_variable cv;
    VirtualTimeline timeline;

    std::vector<Slot> slots;
    int arrived = 0, departed = 0;
    uint64_t gen_arrive = 0, gen_depart = 0;
    std::vector<char> reduced;

    std::map<Key, std::deque<Message>> sends;
    std::map<Key, std::deque<std::shared_ptr<RecvState>>> recvs;

    bool failed = false;
    int failed_rank = -1;  // -1: the world itself (mismatch, deadlock)
    std::string failure;
    std::vector<std::function<bool()>> waiting;  // per rank, while blocked: what it waits for
    std::vector<std::string> waiting_on;
    std::vector<bool> finished;
    bool ran = false;

    void fail(int rank, const std::string& msg) {
        if (!failed) {
            failed = true;
            failed_rank = rank;
            failure = msg;
        }
        cv.notify_all();
    }

    [[noreturn]] void throw_failed(int rank) const {
        if (failed_rank >= 0) {
            IF_FAIL("virtual rank " << rank << ": virtual rank " << failed_rank
                                    << " failed: " << failure);
        }
        IF_FAIL("virtual rank " << rank << ": " << failure);
    }

    // Every rank still running is waiting on something that has not happened.
    bool all_stuck() const {
        bool any_running = false;
        for (int r = 0; r < P; ++r) {
            if (finished[r]) continue;
            any_running = true;
            if (!waiting[r] || waiting[r]()) return false;
        }
        return any_running;
    }

    void check_deadlock() {
        if (failed || !all_stuck()) return;
        std::ostringstream os;
        os << "deadlock: every virtual rank still running waits on another (";
        bool first = true;
        for (int r = 0; r < P; ++r) {
            os << (first ? "" : "; ") << "rank " << r << " "
               << (finished[r] ? "has finished" : waiting_on[r]);
            first = false;
        }
        os << ")";
        fail(-1, os.str());
    }

    // Waits (lock held) until pred() holds; throws when the world fails first.
    void wait_until(std::unique_lock<std::mutex>& lk, int rank, const std::function<bool()>& pred,
                    const std::string& what) {
        while (!pred()) {
            if (failed) throw_failed(rank);
            waiting[rank] = pred;
            waiting_on[rank] = what;
            check_deadlock();
            if (failed) {
                waiting[rank] = nullptr;
                throw_failed(rank);
            }
            cv.wait(lk);
            waiting[rank] = nullptr;
        }
    }

    // Called by the last rank to arrive: the arguments agree, or the error naming every rank.
    std::string check_slots() const {
        const Slot& s0 = slots[0];
        bool ok = true;
        for (int r = 1; r < P && ok; ++r) {
            const Slot& s = slots[r];
            ok = s.op == s0.op;
            if (!ok) break;
            switch (s.op) {
                case Op::barrier:
                    break;
                case Op::broadcast:
                    ok = s.bytes == s0.bytes && s.root == s0.root;
                    break;
                case Op::all_reduce:
                    ok = s.count == s0.count && s.dtype == s0.dtype && s.rop == s0.rop;
                    break;
                case Op::all_gather:
                    ok = s.bytes == s0.bytes;
                    break;
                case Op::all_gather_v:
                    ok = *s.a == *s0.a;
                    break;
                case Op::all_to_all_v:
                    break;
            }
        }
        if (ok && s0.op == Op::all_to_all_v) {
            for (int r = 0; r < P && ok; ++r) {
                for (int q = 0; q < P && ok; ++q) ok = (*slots[r].b)[q] == (*slots[q].a)[r];
            }
        }
        if (ok) return "";
        std::ostringstream os;
        os << "collective mismatch across virtual ranks:";
        for (int r = 0; r < P; ++r) os << " rank " << r << " calls " << describe(slots[r]) << ";";
        return os.str();
    }

    double cost_of_slots() const {
        const Slot& s0 = slots[0];
        switch (s0.op) {
            case Op::barrier:
                return link.barrier_ms(P);
            case Op::broadcast:
                return link.broadcast_ms(P, s0.bytes);
            case Op::all_reduce:
                return link.all_reduce_ms(P, s0.count, dtype_size(s0.dtype));
            case Op::all_gather:
                return link.all_gather_ms(std::vector<size_t>(P, s0.bytes));
            case Op::all_gather_v:
                return link.all_gather_ms(*s0.a);
            case Op::all_to_all_v: {
                std::vector<std::vector<size_t>> m;
                for (int q = 0; q < P; ++q) m.push_back(*slots[q].a);
                return link.all_to_all_ms(m);
            }
        }
        return 0.0;
    }
};

namespace {

class ThreadComm;

class SendRequest : public RequestImpl {
  public:
    SendRequest(ThreadComm* c, double arrival) : comm_(c), arrival_(arrival) {}
    void wait() override;
    bool test() override;
    void abandon() noexcept override {}

  private:
    ThreadComm* comm_;
    double arrival_;
};

class RecvRequest : public RequestImpl {
  public:
    RecvRequest(ThreadComm* c, std::shared_ptr<RecvState> st, int src, int tag)
        : comm_(c), st_(std::move(st)), src_(src), tag_(tag) {}
    void wait() override;
    bool test() override;
    void abandon() noexcept override;

  private:
    ThreadComm* comm_;
    std::shared_ptr<RecvState> st_;
    int src_, tag_;
};

class ThreadComm final : public Communicator {
  public:
    ThreadComm(ThreadWorld::State& st, int rank)
        : Communicator(rank, st.P, rank, st.P), st_(st), turn_(st.turn, std::defer_lock) {
        set_link(Link{LinkKind::emulated, st.link});
    }

    const char* kind() const override { return "thread"; }
    MemorySpace memory_space() const override { return MemorySpace::host; }
    [[noreturn]] void abort(int code, const std::string& msg) override { abort_job(msg, code); }

    // Thread start: take the turn and start timing.
    void start() {
        take_turn();
        seg_begin();
    }
    // Normal end of the rank's body.
    void finish() {
        end_segment();
        give_turn();
        std::lock_guard<std::mutex> lk(st_.m);
        st_.finished[rank()] = true;
        st_.check_deadlock();
        st_.cv.notify_all();
    }
    // The rank's body threw `what`.
    void fail_here(const std::string& what) {
        if (turn_.owns_lock()) give_turn();
        std::lock_guard<std::mutex> lk(st_.m);
        st_.finished[rank()] = true;
        st_.fail(rank(), what);
    }

    // ---- used by the requests ----
    void end_segment() {
        if (st_.sync) st_.sync();
        const double ms = timing_now_ms() - t0_;
        std::lock_guard<std::mutex> lk(st_.m);
        st_.timeline.compute(rank(), ms);
    }
    void seg_begin() { t0_ = timing_now_ms(); }
    void take_turn() { turn_.lock(); }
    void give_turn() { turn_.unlock(); }
    ThreadWorld::State& state() { return st_; }

    // Gives up the turn for its lifetime (declare it before any lock on st_.m), then takes the
    // turn back and starts the next segment, also when an exception unwinds.
    class TurnGap {
      public:
        explicit TurnGap(ThreadComm& c) : c_(c) { c_.give_turn(); }
        ~TurnGap() {
            c_.take_turn();
            c_.seg_begin();
        }
        TurnGap(const TurnGap&) = delete;
        TurnGap& operator=(const TurnGap&) = delete;

      private:
        ThreadComm& c_;
    };

  protected:
    void on_set_phase(const std::string& phase) override {
        end_segment();
        {
            std::lock_guard<std::mutex> lk(st_.m);
            st_.timeline.set_phase(rank(), phase);
        }
        seg_begin();
    }

    void do_barrier(Stream) override {
        Slot s;
        s.op = Op::barrier;
        collective(s);
    }
    void do_broadcast(void* buf, size_t bytes, int root, Stream) override {
        Slot s;
        s.op = Op::broadcast;
        s.recv = buf;
        s.bytes = bytes;
        s.root = root;
        collective(s);
    }
    void do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) override {
        Slot s;
        s.op = Op::all_reduce;
        s.recv = buf;
        s.count = count;
        s.dtype = dtype;
        s.rop = op;
        collective(s);
    }
    void do_all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream) override {
        Slot s;
        s.op = Op::all_gather;
        s.send = send;
        s.recv = recv;
        s.bytes = bytes_per_rank;
        collective(s);
    }
    void do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream) override {
        Slot s;
        s.op = Op::all_gather_v;
        s.send = send;
        s.recv = recv;
        s.bytes = send_bytes;
        s.a = &recv_bytes;
        collective(s);
    }
    void do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, Stream) override {
        Slot s;
        s.op = Op::all_to_all_v;
        s.send = send;
        s.recv = recv;
        s.a = &send_bytes;
        s.b = &recv_bytes;
        collective(s);
    }

    std::unique_ptr<RequestImpl> do_isend(const void* buf, size_t bytes, int dest, int tag,
                                          Stream) override {
        end_segment();
        double arrival = 0.0;
        {
            std::lock_guard<std::mutex> lk(st_.m);
            const double cost = dest == rank() ? 0.0 : st_.link.message_ms(bytes);
            arrival = st_.timeline.post_message(rank(), dest, cost);
            const Key key{rank(), dest, tag};
            auto it = st_.recvs.find(key);
            if (it != st_.recvs.end() && !it->second.empty()) {
                std::shared_ptr<RecvState> r = it->second.front();
                it->second.pop_front();
                deliver(buf, bytes, *r, arrival, rank(), tag);
                st_.cv.notify_all();
            } else {
                Message msg;
                msg.data.assign(static_cast<const char*>(buf),
                                static_cast<const char*>(buf) + bytes);
                msg.arrival = arrival;
                st_.sends[key].push_back(std::move(msg));
            }
        }
        seg_begin();
        return std::make_unique<SendRequest>(this, arrival);
    }

    std::unique_ptr<RequestImpl> do_irecv(void* buf, size_t bytes, int src, int tag,
                                          Stream) override {
        end_segment();
        auto rs = std::make_shared<RecvState>();
        rs->buf = buf;
        rs->bytes = bytes;
        {
            std::lock_guard<std::mutex> lk(st_.m);
            const Key key{src, rank(), tag};
            auto it = st_.sends.find(key);
            if (it != st_.sends.end() && !it->second.empty()) {
                Message msg = std::move(it->second.front());
                it->second.pop_front();
                deliver(msg.data.data(), msg.data.size(), *rs, msg.arrival, src, tag);
            } else {
                st_.recvs[key].push_back(rs);
            }
        }
        seg_begin();
        return std::make_unique<RecvRequest>(this, rs, src, tag);
    }

  private:
    void deliver(const void* data, size_t bytes, RecvState& r, double arrival, int src, int tag) {
        if (bytes != r.bytes) {
            std::ostringstream os;
            os << "a message of " << bytes << " bytes from rank " << src << " with tag " << tag
               << " does not match the posted receive of " << r.bytes << " bytes";
            r.error = os.str();
        } else {
            copy_bytes(r.buf, data, bytes);
        }
        r.arrival = arrival;
        r.matched = true;
    }

    // Rendezvous of every rank: arrive (the last one checks the arguments, advances the
    // timeline and reduces), move the data, depart (nobody leaves while another still reads its
    // buffers).
    void collective(Slot s) {
        s.phase = phase();
        end_segment();
        TurnGap gap(*this);
        std::unique_lock<std::mutex> lk(st_.m);
        if (st_.failed) st_.throw_failed(rank());
        const uint64_t gen = st_.gen_arrive;
        st_.slots[rank()] = s;
        if (++st_.arrived == size()) {
            const std::string err = st_.check_slots();
            if (!err.empty()) {
                st_.fail(-1, err);
            } else {
                st_.timeline.collective(st_.cost_of_slots());
                if (s.op == Op::all_reduce) reduce();
            }
            st_.gen_arrive++;
            st_.cv.notify_all();
        } else {
            st_.wait_until(
                lk, rank(), [&] { return st_.gen_arrive != gen; }, "in " + describe(s));
        }
        if (st_.failed) st_.throw_failed(rank());
        lk.unlock();
        move_data(s);
        lk.lock();
        const uint64_t gen2 = st_.gen_depart;
        if (++st_.departed == size()) {
            st_.departed = 0;
            st_.arrived = 0;
            st_.gen_depart++;
            st_.cv.notify_all();
        } else {
            st_.wait_until(
                lk, rank(), [&] { return st_.gen_depart != gen2; }, "leaving " + describe(s));
        }
    }

    // In rank order, into the shared result (lock held, every rank arrived).
    void reduce() {
        const Slot& s0 = st_.slots[0];
        const size_t n = s0.count, bytes = n * dtype_size(s0.dtype);
        st_.reduced.assign(static_cast<const char*>(s0.recv),
                           static_cast<const char*>(s0.recv) + bytes);
        for (int q = 1; q < size(); ++q) {
            fold_any(st_.reduced.data(), st_.slots[q].recv, n, s0.dtype, s0.rop);
        }
    }

    // Each rank writes only its own receive buffer and reads the others' send buffers.
    void move_data(const Slot& s) {
        const auto& slots = st_.slots;
        const int r = rank();
        switch (s.op) {
            case Op::barrier:
                break;
            case Op::broadcast:
                if (r != s.root) copy_bytes(s.recv, slots[s.root].recv, s.bytes);
                break;
            case Op::all_reduce:
                copy_bytes(s.recv, st_.reduced.data(), st_.reduced.size());
                break;
            case Op::all_gather:
                for (int q = 0; q < size(); ++q) {
                    copy_bytes(static_cast<char*>(s.recv) + size_t(q) * s.bytes, slots[q].send,
                               s.bytes);
                }
                break;
            case Op::all_gather_v: {
                const std::vector<size_t> off = offsets_of(*s.a);
                for (int q = 0; q < size(); ++q) {
                    copy_bytes(static_cast<char*>(s.recv) + off[q], slots[q].send, (*s.a)[q]);
                }
                break;
            }
            case Op::all_to_all_v: {
                const std::vector<size_t> roff = offsets_of(*s.b);
                for (int q = 0; q < size(); ++q) {
                    const std::vector<size_t> soff = offsets_of(*slots[q].a);
                    copy_bytes(static_cast<char*>(s.recv) + roff[q],
                               static_cast<const char*>(slots[q].send) + soff[r], (*s.b)[q]);
                }
                break;
            }
        }
    }

    ThreadWorld::State& st_;
    std::unique_lock<std::mutex> turn_;
    double t0_ = 0.0;  // runtime/core/timing_clock.h
};

void SendRequest::wait() {
    comm_->end_segment();
    {
        std::lock_guard<std::mutex> lk(comm_->state().m);
        comm_->state().timeline.complete(comm_->rank(), arrival_);
    }
    comm_->seg_begin();
}

// In virtual time a send is complete once its message has arrived: test() says so without
// moving the rank's clock (compute between posting and waiting overlaps the transfer).
bool SendRequest::test() {
    comm_->end_segment();
    bool done = false;
    {
        std::lock_guard<std::mutex> lk(comm_->state().m);
        done = comm_->state().timeline.now(comm_->rank()) >= arrival_;
    }
    comm_->seg_begin();
    return done;
}

void RecvRequest::wait() {
    ThreadWorld::State& st = comm_->state();
    comm_->end_segment();
    {
        ThreadComm::TurnGap gap(*comm_);
        std::unique_lock<std::mutex> lk(st.m);
        std::ostringstream what;
        what << "waits for a message from rank " << src_ << " with tag " << tag_ << " in phase '"
             << comm_->phase() << "'";
        st.wait_until(
            lk, comm_->rank(), [&] { return st_->matched; }, what.str());
        st.timeline.complete(comm_->rank(), st_->arrival);
    }
    IF_CHECK(st_->error.empty(), "virtual rank " << comm_->rank() << ": " << st_->error);
}

bool RecvRequest::test() {
    ThreadWorld::State& st = comm_->state();
    comm_->end_segment();
    bool matched = false, arrived = false;
    {
        std::lock_guard<std::mutex> lk(st.m);
        matched = st_->matched;
        if (!matched && st.failed) st.throw_failed(comm_->rank());
        arrived = matched && st.timeline.now(comm_->rank()) >= st_->arrival;
    }
    if (arrived) {
        comm_->seg_begin();
        wait();  // completes without moving the clock
        return true;
    }
    if (matched) {  // still in flight in virtual time: the clock stays where it is
        comm_->seg_begin();
        return false;
    }
    // Not there yet: let the other ranks run.
    {
        ThreadComm::TurnGap gap(*comm_);
        std::this_thread::yield();
    }
    return false;
}

void RecvRequest::abandon() noexcept {
    std::lock_guard<std::mutex> lk(comm_->state().m);
    for (auto& kv : comm_->state().recvs) {
        auto& q = kv.second;
        for (auto it = q.begin(); it != q.end(); ++it) {
            if (*it == st_) {
                q.erase(it);
                return;
            }
        }
    }
}

}  // namespace

ThreadWorld::ThreadWorld(int n_ranks, const LinkModel& link, std::function<void()> sync) {
    IF_CHECK(n_ranks >= 1, "emulated ranks: need at least 1 virtual rank, not " << n_ranks);
    IF_CHECK(link.alpha_us >= 0.0 && link.beta_gbs > 0.0,
             "link model: alpha " << link.alpha_us << " us must be >= 0 and beta " << link.beta_gbs
                                  << " GB/s > 0");
    st_ = std::make_unique<State>(n_ranks, link, std::move(sync));
}

ThreadWorld::~ThreadWorld() = default;

int ThreadWorld::size() const { return st_->P; }
const LinkModel& ThreadWorld::link() const { return st_->link; }
const VirtualTimeline& ThreadWorld::timeline() const { return st_->timeline; }

void ThreadWorld::run(const std::function<void(Communicator&)>& body) {
    IF_CHECK(!st_->ran, "a ThreadWorld runs once");
    st_->ran = true;
    const int P = st_->P;
    std::vector<std::unique_ptr<ThreadComm>> comms;
    for (int r = 0; r < P; ++r) comms.push_back(std::make_unique<ThreadComm>(*st_, r));
    std::vector<std::exception_ptr> errors(P);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r) {
        threads.emplace_back([&, r] {
            ThreadComm& c = *comms[r];
            try {
                c.start();
                body(c);
                c.finish();
            } catch (const std::exception& e) {
                errors[r] = std::current_exception();
                c.fail_here(e.what());
            } catch (...) {
                errors[r] = std::current_exception();
                c.fail_here("unknown error");
            }
        });
    }
    for (auto& t : threads) t.join();
    if (st_->failed) {
        if (st_->failed_rank >= 0 && errors[st_->failed_rank]) {
            std::rethrow_exception(errors[st_->failed_rank]);
        }
        IF_FAIL("emulated ranks: " << st_->failure);
    }
    for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
    }
}

}  // namespace infoflow
