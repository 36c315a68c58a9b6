// Cooperative pieces (pieces.h).
#include "runtime/core/pieces.h"

#include <algorithm>
#include <climits>

#include "runtime/core/error.h"

namespace infoflow {

namespace {

PieceScope*& current_scope() {
    static thread_local PieceScope* scope = nullptr;
    return scope;
}

int& waits_depth() {
    static thread_local int depth = 0;
    return depth;
}

bool& in_wait() {
    static thread_local bool flag = false;
    return flag;
}

}  // namespace

PieceScope::PieceScope(int piece_tokens, bool split_rows, std::function<void()> on_piece,
                       std::chrono::nanoseconds slice)
    : outer_(current_scope()),
      piece_tokens_(piece_tokens),
      split_rows_(split_rows),
      on_piece_(std::move(on_piece)),
      slice_(slice) {
    IF_CHECK(piece_tokens >= kMinPieceRows,
             "a piece of " << piece_tokens << " tokens; at least " << kMinPieceRows);
    IF_CHECK(slice.count() >= 0, "a negative time slice for pieces");
    current_scope() = this;
}

PieceScope::~PieceScope() { current_scope() = outer_; }

void piece_done(double work) {
    PieceScope* s = current_scope();
    // No scope, work inside the callback itself, or no one waiting for it.
    if (s == nullptr || s->running_ || s->paused_) return;
    s->done_ += work;
    const bool timed_out =
        s->slice_.count() > 0 && std::chrono::steady_clock::now() - s->since_ >= s->slice_;
    if (s->done_ < s->piece_tokens_ && !timed_out) return;
    s->running_ = true;
    try {
        s->on_piece_();
    } catch (...) {
        s->running_ = false;
        s->restart();
        throw;
    }
    s->running_ = false;
    s->restart();  // the next piece's tokens and time count from here (context work only)
}

PieceWaits::PieceWaits() { ++waits_depth(); }
PieceWaits::~PieceWaits() { --waits_depth(); }

void piece_wait_point() {
    if (waits_depth() == 0 || in_wait()) return;
    in_wait() = true;
    try {
        piece_done(0.0);
    } catch (...) {
        in_wait() = false;
        throw;
    }
    in_wait() = false;
}

bool piece_in_wait() { return in_wait(); }

int piece_rows() {
    const PieceScope* s = current_scope();
    return s == nullptr || !s->split_rows_ || s->paused_ ? INT_MAX : s->piece_tokens_;
}

std::vector<std::pair<int, int>> piece_ranges(int n) {
    std::vector<std::pair<int, int>> out;
    const int step = std::max(piece_rows(), kMinPieceRows);
    for (int a = 0; a < n; a += step) out.emplace_back(a, std::min(n, a + step));
    if (out.size() > 1 && out.back().second - out.back().first < kMinPieceRows) {
        const int end = out.back().second;
        out.pop_back();
        out.back().second = end;
    }
    return out;
}

}  // namespace infoflow
