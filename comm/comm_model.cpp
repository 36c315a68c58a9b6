#include "comm/comm_model.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace infoflow {

const char* link_kind_name(LinkKind k) {
    switch (k) {
        case LinkKind::shm: return "shm";
        case LinkKind::tcp: return "tcp";
        case LinkKind::ib: return "ib";
        case LinkKind::nvlink: return "nvlink";
        case LinkKind::emulated: return "emulated";
    }
    return "?";
}

LinkModel link_defaults(LinkKind k) {
    LinkModel m;  // nvlink, and the emulated link unless the world says otherwise
    switch (k) {
        case LinkKind::shm:
            m.alpha_us = 1.0;
            m.beta_gbs = 8.0;
            break;
        case LinkKind::tcp:
            m.alpha_us = 30.0;
            m.beta_gbs = 1.2;
            break;
        case LinkKind::ib:
            m.alpha_us = 3.0;
            m.beta_gbs = 12.0;
            break;
        case LinkKind::nvlink:
        case LinkKind::emulated:
            break;
    }
    return m;
}

double LinkModel::step_ms(double bytes) const {
    return alpha_us * 1e-3 + bytes / (beta_gbs * 1e6);  // 1 GB/s = 1e6 bytes per ms
}

double LinkModel::message_ms(size_t bytes) const { return step_ms(double(bytes)); }

double LinkModel::barrier_ms(int n_ranks) const {
    int steps = 0;
    for (int reach = 1; reach < n_ranks; reach *= 2) ++steps;
    return steps * step_ms(0.0);
}

double LinkModel::broadcast_ms(int n_ranks, size_t bytes) const {
    if (n_ranks <= 1) return 0.0;
    return (n_ranks - 1) * alpha_us * 1e-3 + double(bytes) / (beta_gbs * 1e6);
}

double LinkModel::all_reduce_ms(int n_ranks, size_t count, size_t elem_bytes) const {
    if (n_ranks <= 1) return 0.0;
    const size_t chunk = elem_bytes * ((count + size_t(n_ranks) - 1) / size_t(n_ranks));
    return 2.0 * (n_ranks - 1) * step_ms(double(chunk));
}

double LinkModel::all_gather_ms(const std::vector<size_t>& block_bytes) const {
    const int p = int(block_bytes.size());
    if (p <= 1) return 0.0;
    const size_t most = *std::max_element(block_bytes.begin(), block_bytes.end());
    return (p - 1) * step_ms(double(most));
}

double LinkModel::all_to_all_ms(const std::vector<std::vector<size_t>>& send_bytes) const {
    const int p = int(send_bytes.size());
    double t = 0.0;
    for (int k = 1; k < p; ++k) {
        size_t most = 0;
        for (int q = 0; q < p; ++q) most = std::max(most, send_bytes[q].at((q + k) % p));
        t += step_ms(double(most));
    }
    return t;
}

VirtualTimeline::VirtualTimeline(int n_ranks)
    : clock_(n_ranks, 0.0),
      phases_(n_ranks),
      current_(n_ranks, 0),
      link_free_(n_ranks, std::vector<double>(n_ranks, 0.0)) {
    IF_CHECK(n_ranks >= 1, "a virtual timeline needs at least one rank, not " << n_ranks);
    for (auto& p : phases_) p.push_back(PhaseTiming{"other"});
}

PhaseTiming& VirtualTimeline::current(int rank) { return phases_.at(rank)[current_[rank]]; }

void VirtualTimeline::set_phase(int rank, const std::string& phase) {
    current(rank).exit_ms = clock_[rank];
    auto& list = phases_[rank];
    for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].phase == phase) {
            current_[rank] = int(i);
            return;
        }
    }
    PhaseTiming p;
    p.phase = phase;
    p.enter_ms = p.exit_ms = clock_[rank];
    list.push_back(p);
    current_[rank] = int(list.size() - 1);
}

void VirtualTimeline::compute(int rank, double ms) {
    PhaseTiming& p = current(rank);
    clock_.at(rank) += ms;
    p.compute_ms += ms;
    p.segments += 1;
    p.exit_ms = clock_[rank];
}

double VirtualTimeline::collective(double cost_ms) {
    const double start = *std::max_element(clock_.begin(), clock_.end());
    const double end = start + cost_ms;
    for (int r = 0; r < size(); ++r) {
        PhaseTiming& p = current(r);
        p.wait_ms += start - clock_[r];
        p.comm_ms += cost_ms;
        p.collectives += 1;
        clock_[r] = end;
        p.exit_ms = end;
    }
    return end;
}

double VirtualTimeline::post_message(int src, int dst, double cost_ms) {
    current(src).messages += 1;
    if (src == dst) return clock_.at(src);
    double& free_at = link_free_.at(src).at(dst);
    const double start = std::max(clock_[src], free_at);
    free_at = start + cost_ms;
    return free_at;
}

void VirtualTimeline::complete(int rank, double done_ms) {
    PhaseTiming& p = current(rank);
    if (done_ms > clock_.at(rank)) {
        p.wait_ms += done_ms - clock_[rank];
        clock_[rank] = done_ms;
    }
    p.exit_ms = clock_[rank];
}

std::vector<PhaseTiming> VirtualTimeline::phases(int rank) const { return phases_.at(rank); }

std::vector<std::pair<std::string, double>> VirtualTimeline::critical_path(
    const std::vector<std::string>& names) const {
    std::vector<std::pair<std::string, double>> out;
    double before = 0.0;
    for (const std::string& name : names) {
        double end = before;
        for (const auto& list : phases_) {
            for (const PhaseTiming& p : list) {
                if (p.phase == name) end = std::max(end, p.exit_ms);
            }
        }
        out.push_back({name, end - before});
        before = end;
    }
    return out;
}

}  // namespace infoflow
