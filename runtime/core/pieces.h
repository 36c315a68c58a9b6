// Cooperative pieces (job serve, docs/serve.md "Batching"). A request's context work -- chunk
// prefills, scoring, the recompute, a `full` prefill -- runs as a sequence of bounded pieces and
// reports each one with `piece_done(work)`, the work counted in tokens through every layer (a
// layer of n rows counts n / n_layer). A thread that opened a PieceScope runs its callback once
// every `piece_tokens` tokens of work: on rank 0 of job serve, one decode step of the requests
// already answering, so a long context delays them by one piece at a time. Forwards over many
// rows are cut into pieces of at most piece_rows() rows, which give the bits of one forward
// (tests/model/test_batch_decode.cpp). Any other thread goes straight on: without a scope
// piece_done does nothing and piece_rows() is unlimited.
//
// The callback runs between pieces on the thread of the interrupted work: it must not touch that
// work's buffers, and must not call a communicator (the other ranks may be waiting in the work's
// next collective).
#pragma once

#include <chrono>
#include <functional>
#include <utility>
#include <vector>

namespace infoflow {

// The fewest rows a piece of a forward takes: fewer rows could take another attention path
// (kernels/cpu: "few query rows", up to 16 query heads' rows) with other rounding.
constexpr int kMinPieceRows = 32;

class PieceScope {
  public:
    // Runs `on_piece` after every `piece_tokens` (>= kMinPieceRows) tokens of work on this
    // thread. `split_rows`: forwards are cut into pieces of piece_tokens rows -- only where the
    // model's products give a row the same bits whatever the rows beside it
    // (products_row_independent, runtime/model/batch_decode.h); otherwise each forward stays one
    // piece.
    // `slice`: the most time between two callbacks while work is reported (zero: no time bound).
    PieceScope(int piece_tokens, bool split_rows, std::function<void()> on_piece,
               std::chrono::nanoseconds slice = std::chrono::nanoseconds(0));
    ~PieceScope();
    PieceScope(const PieceScope&) = delete;
    PieceScope& operator=(const PieceScope&) = delete;
    // The counting starts over (the owner just ran what the callback runs, on its own).
    void restart() {
        done_ = 0.0;
        since_ = std::chrono::steady_clock::now();
    }
    // While paused -- nothing waits for the callback (job serve with no request decoding) -- the
    // work runs as outside a scope: no callback, forwards whole (the same bits either way).
    void pause(bool paused) {
        if (paused_ && !paused) restart();
        paused_ = paused;
    }
    bool paused() const { return paused_; }

  private:
    PieceScope* outer_;
    friend void piece_done(double work);
    friend int piece_rows();
    int piece_tokens_;
    bool split_rows_;
    std::function<void()> on_piece_;
    std::chrono::nanoseconds slice_;
    double done_ = 0.0;
    std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
    bool running_ = false;
    bool paused_ = false;
};

// After a piece of `work` tokens (see above).
void piece_done(double work);

// Inside a PieceWaits, this thread's waits for other ranks (comm/watchdog.h: every collective
// and point-to-point wait polls) are points too: the callback runs there once the time slice
// has passed, so on P ranks a decode step need not wait for a slower rank. Only where the work
// holds nothing in the Model's scratch across its collectives (the recompute's layer loop of
// exchange "kv" keeps its rows in buffers of its own): the callback's decode step uses it.
class PieceWaits {
  public:
    PieceWaits();
    ~PieceWaits();
    PieceWaits(const PieceWaits&) = delete;
    PieceWaits& operator=(const PieceWaits&) = delete;
};

// Called by the communicators' wait loops: piece_done(0.0) inside a PieceWaits, else nothing.
void piece_wait_point();

// Whether the callback running now was called from a wait (piece_wait_point).
bool piece_in_wait();

// The most rows one forward of this thread's work may take at a time: the scope's piece_tokens
// when it splits rows, else unlimited.
int piece_rows();

// [begin, end) row ranges covering n rows in pieces of at most piece_rows() rows, none under
// kMinPieceRows (a short tail joins the piece before it).
std::vector<std::pair<int, int>> piece_ranges(int n);

}  // namespace infoflow
