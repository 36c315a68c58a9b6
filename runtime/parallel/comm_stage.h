// Collectives whose buffers are in a backend's memory (K/V rows, attention states, queries).
// A communicator that reads that memory — any communicator with the CPU backend, a device
// communicator (NCCL) with a device backend — runs on the buffers directly; a host communicator
// (MPI, self) with a device backend goes through host copies: download the send buffer, run the
// collective on host memory, upload the result. A device communicator is given the backend's
// stream, so its transfers follow the ops that wrote their buffers. Byte accounting is the
// communicator's either way. Arguments mean what they mean on Communicator
// (comm/communicator.h).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"

namespace infoflow {

// True when `comm` can read and write `be`'s buffers itself.
bool comm_reads_backend(const Communicator& comm, const Backend& be);

void all_gather_backend(Communicator& comm, Backend& be, const void* send, size_t bytes_per_rank,
                        void* recv);
void all_gather_v_backend(Communicator& comm, Backend& be, const void* send, size_t send_bytes,
                          void* recv, const std::vector<size_t>& recv_bytes);
void all_to_all_v_backend(Communicator& comm, Backend& be, const void* send,
                          const std::vector<size_t>& send_bytes, void* recv,
                          const std::vector<size_t>& recv_bytes);

// Non-blocking point-to-point on backend memory. Where the communicator cannot read it, a send
// goes from a host copy taken at isend and a receive lands in a host buffer that complete()
// uploads into place; both host buffers live in this object.
class BackendP2P {
  public:
    BackendP2P(Communicator& comm, Backend& be);
    Request isend(const void* buf, size_t bytes, int dest, int tag);
    Request irecv(void* buf, size_t bytes, int src, int tag);
    // After every request it returned has completed: staged receives into place, buffers freed.
    void complete();

  private:
    struct Staged {
        void* dst = nullptr;  // backend memory of a receive; nullptr for a send
        std::vector<char> host;
    };
    Communicator& comm_;
    Backend& be_;
    bool direct_;
    std::vector<std::unique_ptr<Staged>> staged_;
};

}  // namespace infoflow
