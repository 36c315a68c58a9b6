// The timing model of emulated ranks (bench-ttft with bench.emulate_timing, docs/design.md §10): an
// alpha-beta cost per collective and message, and the virtual timeline on which P ranks' measured
// compute segments and modelled communication are laid out. Pure arithmetic, no threads and no
// clocks: comm/thread_comm.cpp feeds it measured segment times; the tests feed it known ones.
//
// The alpha-beta model. One step of an algorithm costs alpha + bytes / beta (alpha: latency of one
// message, beta: bandwidth of one link in one direction). The collectives are costed as the ring
// algorithms NCCL uses inside one node, each step moving one block per rank at the same time:
//   all_gather(B per rank)        (P-1) steps of B
//   all_gather_v(R[])             (P-1) steps of max_q R[q] (every block is in flight each step)
//   all_reduce(n elements of e)   reduce-scatter + all-gather: 2(P-1) steps of e*ceil(n/P)
//   broadcast(B)                  pipelined chain: (P-1)*alpha + B/beta
//   all_to_all_v(S[q][r])         (P-1) rounds, round k: rank q sends to (q+k)%P; each round
//                                 costs one step of the largest block sent in it
//   barrier                       ceil(log2 P) steps of 0 bytes (dissemination)
//   one message of B bytes        one step of B (none for a message to oneself)
// P = 1 costs nothing. Messages on one directed link (src -> dst) are serialized.
//
// The timeline. Every rank has a virtual clock. A compute segment advances its rank's clock by
// its measured duration. A collective is a synchronization point: every clock becomes
// max over ranks of the clocks + the collective's cost, so a run whose phases communicate only
// through collectives costs the BSP sum over its collectives of (the slowest rank's segment +
// the collective). A message posted at clock t on link src -> dst starts at max(t, the link's
// previous message's arrival) and arrives cost later; the receiver's wait ends at
// max(its clock, the arrival), so compute between posting and waiting overlaps the transfer
// (ring attention's block exchange, docs/design.md §5.4), and a send completes when its message arrives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace infoflow {

// Link figures of one intra-node link. Defaults: NVLink of an H100 SXM node (900 GB/s
// bidirectional per GPU, 450 GB/s per direction nominal); 370 GB/s is the per-direction figure
// collectives reach in practice (about 80% of nominal), and 10 us the latency of one NCCL step.
struct LinkModel {
    double alpha_us = 10.0;
    double beta_gbs = 370.0;  // GB/s = 1e9 bytes per second, one direction

    // alpha + bytes / beta in milliseconds.
    double step_ms(double bytes) const;

    double message_ms(size_t bytes) const;
    double barrier_ms(int n_ranks) const;
    double broadcast_ms(int n_ranks, size_t bytes) const;
    double all_reduce_ms(int n_ranks, size_t count, size_t elem_bytes) const;
    // block_bytes[q] = rank q's block (P entries).
    double all_gather_ms(const std::vector<size_t>& block_bytes) const;
    // send_bytes[q][r] = what rank q sends to rank r (P x P; the diagonal is not sent).
    double all_to_all_ms(const std::vector<std::vector<size_t>>& send_bytes) const;
};

// The links a cost model tells apart, each with default alpha-beta figures (one direction, large
// messages; documented in docs/design.md §5.2):
//   shm      ranks of one node over MPI (shared memory)        alpha 1 us,  beta 8 GB/s
//   tcp      nodes over TCP (10 Gb Ethernet)                   alpha 30 us, beta 1.2 GB/s
//   ib       nodes over InfiniBand (100 Gb/s class)            alpha 3 us,  beta 12 GB/s
//   nvlink   GPUs of one node through NCCL (H100 SXM NVLink)   the LinkModel defaults above
//   emulated the virtual ranks of bench.emulate_timing: the link given to the ThreadWorld
enum class LinkKind { shm, tcp, ib, nvlink, emulated };
const char* link_kind_name(LinkKind k);
LinkModel link_defaults(LinkKind k);

struct Link {
    LinkKind kind = LinkKind::shm;
    LinkModel model = link_defaults(LinkKind::shm);
};

// One rank's time in one phase (ms). compute is measured; comm and wait are modelled:
// comm = the cost of the collectives it took part in, wait = time spent waiting for slower ranks
// at collectives and for messages still in flight. compute + comm + wait = exit - enter for a
// phase entered once.
struct PhaseTiming {
    std::string phase;
    double compute_ms = 0.0;
    double comm_ms = 0.0;
    double wait_ms = 0.0;
    double enter_ms = 0.0;  // clock when the rank first entered the phase
    double exit_ms = 0.0;   // clock when the rank last left it (or now, while inside)
    int segments = 0;       // compute segments measured
    int collectives = 0;
    int messages = 0;  // messages this rank posted
};

class VirtualTimeline {
  public:
    explicit VirtualTimeline(int n_ranks);

    int size() const { return int(clock_.size()); }
    double now(int rank) const { return clock_.at(rank); }

    // Rank `rank` enters `phase` (leaving its current one at its clock). The phase before the
    // first call is "other".
    void set_phase(int rank, const std::string& phase);
    // A measured compute segment of `ms` on `rank`.
    void compute(int rank, double ms);
    // A collective of every rank costing `cost_ms`; returns the clock every rank leaves it with.
    double collective(double cost_ms);
    // A message posted by `src` to `dst` at src's clock, costing `cost_ms` on the link; returns
    // its arrival time.
    double post_message(int src, int dst, double cost_ms);
    // `rank` waits for an operation that completes at `done_ms`.
    void complete(int rank, double done_ms);

    // Rank `rank`'s phases in order of first entry.
    std::vector<PhaseTiming> phases(int rank) const;
    // The critical path through `names` (phases in execution order): entry i is
    // max_r exit_r(names[i]) - max_r exit_r(names[i-1]) (0 before the first), over the ranks
    // that entered the phase; the entries sum to max_r exit_r(names.back()).
    std::vector<std::pair<std::string, double>> critical_path(
        const std::vector<std::string>& names) const;

  private:
    PhaseTiming& current(int rank);
    std::vector<double> clock_;
    std::vector<std::vector<PhaseTiming>> phases_;  // per rank, in order of first entry
    std::vector<int> current_;                      // index into phases_[rank]
    std::vector<std::vector<double>> link_free_;    // [src][dst]: arrival of the last message
};

}  // namespace infoflow
