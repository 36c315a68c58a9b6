#include "runtime/core/progress.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace infoflow {
namespace progress {
namespace {

std::atomic<bool> g_enabled{false};
std::atomic<bool> g_phase_lines{true};
int g_context = 0, g_suffix = 0, g_recompute = 0;

// Tokens a phase processes, or 0 when unknown (decode: the answer length is known only after).
int phase_tokens(const std::string& name) {
    if (name == "prefill" || name == "ring_prefill") return g_context + g_suffix;
    if (name == "chunk_prefill" || name == "shard_prefill" || name == "scoring" ||
        name == "reorder") {
        return g_context;
    }
    if (name == "recompute") return g_recompute;
    if (name == "suffix_prefill") return g_suffix;
    return 0;
}

void emit(const std::string& line) {
    std::fprintf(stderr, "[progress] %s\n", line.c_str());
    std::fflush(stderr);
}

}  // namespace

void set_enabled(bool on) { g_enabled = on; }
bool enabled() { return g_enabled; }
void set_phase_lines(bool on) { g_phase_lines = on; }

void set_tokens(int context, int suffix, int recompute) {
    g_context = context;
    g_suffix = suffix;
    g_recompute = recompute;
}

void phase_begin(const std::string& name) {
    if (!g_enabled || !g_phase_lines) return;
    const int n = phase_tokens(name);
    emit(name + (n > 0 ? " (" + std::to_string(n) + " tokens) ..." : " ..."));
}

void phase_end(const std::string& name, double ms) {
    if (!g_enabled || !g_phase_lines) return;
    const int n = phase_tokens(name);
    char buf[160];
    if (n > 0 && ms > 0.0) {
        std::snprintf(buf, sizeof buf, "%s done: %.1f ms, %d tokens, %.0f tok/s", name.c_str(), ms,
                      n, n / (ms / 1000.0));
    } else {
        std::snprintf(buf, sizeof buf, "%s done: %.1f ms", name.c_str(), ms);
    }
    emit(buf);
}

void note(const std::string& text) {
    if (g_enabled) emit(text);
}

std::string format_duration(double s) {
    if (s < 0) s = 0;
    char buf[64];
    const long t = long(s + 0.5);
    if (t < 60) {
        std::snprintf(buf, sizeof buf, "%ld s", t);
    } else if (t < 3600) {
        std::snprintf(buf, sizeof buf, "%ld min %02ld s", t / 60, t % 60);
    } else {
        std::snprintf(buf, sizeof buf, "%ld h %02ld min", t / 3600, (t % 3600) / 60);
    }
    return buf;
}

Sweep::Sweep(std::string what, int total)
    : what_(std::move(what)), total_(total), t0_(std::chrono::steady_clock::now()) {}

std::string Sweep::eta() const {
    if (done_ <= 0) return "?";
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return format_duration(el / done_ * std::max(0, total_ - done_));
}

void Sweep::step() {
    ++done_;
    if (!g_enabled || what_.empty()) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::string line = what_ + " " + std::to_string(done_) + "/" + std::to_string(total_) +
                       ", elapsed " + format_duration(el);
    if (done_ < total_) line += ", ETA " + format_duration(el / done_ * (total_ - done_));
    emit(line);
}

}  // namespace progress
}  // namespace infoflow
