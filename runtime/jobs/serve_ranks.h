// The rank side of job serve (docs/serve.md "How it runs on P ranks"): the drain signals, and the
// collective "command" through which rank 0 starts every rank on a request. Rank 0's main thread
// (the worker, serve_engine.h) is the only thread that computes or talks to the other ranks (MPI
// is initialized FUNNELED); ranks > 0 do nothing but follow its commands (follow_commands).
//
// A command is an all-reduce of three int64s -- the command, the payload's size, and a drain
// flag any rank may raise -- followed, for a request, by the broadcast of its config and tokens;
// then every rank runs the request's pipeline (answer_request) or stores its documents
// (build_store_chunks). While nothing runs on the other ranks, rank 0 sends a heartbeat command
// every serve.heartbeat_s (< parallel.timeout_s), so a waiting rank's collective completes
// before the watchdog's deadline, and a rank that died leaves rank 0's heartbeat waiting.
#pragma once

#include <cstdint>
#include <vector>

namespace infoflow {

class Communicator;
struct Session;

// SIGTERM / SIGINT start a drain (a line on stderr); a second one exits at once (128 + signal).
// SIGPIPE is ignored (a client that hangs up is an error code).
void install_drain_handlers(int rank, int size);
// Whether this process was signalled, or (rank 0) another rank's drain flag reached it.
bool drain_requested();

enum ServeCommand : int64_t { k_heartbeat = 0, k_completion = 1, k_documents = 2, k_shutdown = 3 };

struct CommandWord {
    int64_t command = k_heartbeat;
    int64_t bytes = 0;
    bool drain = false;  // some rank received a signal
};

// Collective: rank 0's command and payload size reach every rank; the drain flag is any rank's
// (raised by another rank, it starts rank 0's drain).
CommandWord exchange_command(Communicator& comm, int64_t command, int64_t bytes);
// Collective: rank 0's payload (n bytes) on every rank.
std::vector<uint8_t> broadcast_payload(Communicator& comm, std::vector<uint8_t> bytes, int64_t n);

// Ranks > 0: run every request rank 0 commands, until it commands the shutdown.
void follow_commands(Session& s, Communicator& comm);

// Pooled buffers (serve.buffer_pool_mb) unused this long are freed after a request, on every
// rank: the pool follows the sizes of the recent requests.
constexpr double k_pool_idle_s = 2.0;

}  // namespace infoflow
