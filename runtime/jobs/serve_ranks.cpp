// Signals and the command protocol of job serve (serve_ranks.h).
#include "runtime/jobs/serve_ranks.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>

#include "comm/communicator.h"
#include "runtime/jobs/jobs.h"
#include "runtime/jobs/serve_request.h"
#include "runtime/jobs/session.h"
#include "runtime/method/chunk_store.h"
#include "runtime/store/kv_store.h"

namespace infoflow {

namespace {

std::atomic<int> g_signal{0};  // the first SIGTERM / SIGINT received (0: none)
// Rank 0: another rank's drain flag arrived (kept apart from g_signal, so that this process's
// own first signal still drains rather than exiting at once).
std::atomic<bool> g_remote_drain{false};
char g_signal_line[96];

extern "C" void on_serve_signal(int sig) {
    if (g_signal.load() != 0) ::_exit(128 + sig);  // a second signal: stop now
    g_signal.store(sig);
    ssize_t ignored = ::write(STDERR_FILENO, g_signal_line, std::strlen(g_signal_line));
    (void)ignored;
}

}  // namespace

void install_drain_handlers(int rank, int size) {
    std::snprintf(g_signal_line, sizeof g_signal_line,
                  "[rank %d/%d] signal received: draining (a second one stops at once)\n", rank,
                  size);
    struct sigaction sa {};
    sa.sa_handler = on_serve_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
}

bool drain_requested() { return g_signal.load() != 0 || g_remote_drain.load(); }

CommandWord exchange_command(Communicator& comm, int64_t command, int64_t bytes) {
    int64_t w[3] = {comm.rank() == 0 ? command : 0, comm.rank() == 0 ? bytes : 0,
                    g_signal.load() != 0 ? 1 : 0};
    {
        PhaseScope scope(comm, "serve");
        comm.all_reduce(w, 3, DType::i64, ReduceOp::max);
    }
    if (w[2] != 0 && comm.rank() == 0) g_remote_drain.store(true);  // rank 0 leads the drain
    return {w[0], w[1], w[2] != 0};
}

std::vector<uint8_t> broadcast_payload(Communicator& comm, std::vector<uint8_t> bytes, int64_t n) {
    bytes.resize(size_t(n));
    PhaseScope scope(comm, "serve");
    comm.broadcast(bytes.data(), bytes.size(), 0);
    return bytes;
}

void follow_commands(Session& s, Communicator& comm) {
    for (;;) {
        const CommandWord w = exchange_command(comm, k_heartbeat, 0);
        if (w.command == k_heartbeat) continue;
        if (w.command == k_shutdown) return;
        Config cfg;
        PreparedRequest req;
        decode_work(broadcast_payload(comm, {}, w.bytes), &cfg, &req);
        if (w.command == k_completion) {
            answer_request(cfg, s, req, {});
        } else {
            std::unique_ptr<KvStore> store =
                open_store_for(*s.model, req.tokenizer_hash, cfg, true);
            build_store_chunks(s, cfg, req, *store);
        }
        s.model->backend().release_idle_buffers(k_pool_idle_s);
    }
}

}  // namespace infoflow
