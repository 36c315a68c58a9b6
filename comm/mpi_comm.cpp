// MpiComm: every Communicator op as one MPI call on a private duplicate of the base
// communicator, data as MPI_BYTE (reductions as their MPI type), host buffers only. Counts and
// displacements are MPI ints: a call whose sizes do not fit is refused with an error naming them
// (the largest exchange, a layer's selected K/V, is far below 2 GiB). Every return code is
// checked (IF_MPI_CHECK); the duplicate has MPI_ERRORS_RETURN so errors reach us as codes.
#include "comm/mpi_comm.h"

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "comm/mpi_env.h"
#include "runtime/core/error.h"

namespace infoflow {

namespace detail {

std::string mpi_error_string(int code) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS || len <= 0) {
        return "MPI error " + std::to_string(code);
    }
    return std::string(buf, len);
}

void throw_mpi_error(const char* file, int line, const char* call, int code) {
    std::ostringstream os;
    os << "MPI call failed: " << mpi_error_string(code);
    throw_error(file, line, call, os.str());
}

}  // namespace detail

namespace {

int to_int(size_t v, const char* what) {
    IF_CHECK(v <= static_cast<size_t>(INT_MAX),
             what << " of " << v << " bytes exceeds the MPI count limit (" << INT_MAX << ")");
    return static_cast<int>(v);
}

// Counts and prefix-sum displacements of a *_v call, as MPI ints.
void counts_displs(const std::vector<size_t>& bytes, const char* what, std::vector<int>& counts,
                   std::vector<int>& displs) {
    counts.resize(bytes.size());
    displs.resize(bytes.size());
    size_t off = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
        counts[i] = to_int(bytes[i], what);
        displs[i] = to_int(off, what);
        off += bytes[i];
    }
    to_int(off, what);
}

MPI_Datatype mpi_type(DType t) {
    switch (t) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::f64:
            return MPI_DOUBLE;
        case DType::i32:
            return MPI_INT32_T;
        case DType::i64:
            return MPI_INT64_T;
    }
    IF_FAIL("unknown DType " << static_cast<int>(t));
}

MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return MPI_SUM;
        case ReduceOp::max:
            return MPI_MAX;
        case ReduceOp::min:
            return MPI_MIN;
    }
    IF_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

bool mpi_finalized() {
    int fin = 0;
    MPI_Finalized(&fin);
    return fin != 0;
}

// One isend/irecv. A receive checks on completion that the message had the posted size.
class MpiRequest : public RequestImpl {
  public:
    MpiRequest(MPI_Request req, bool is_recv, size_t bytes, int peer, int tag)
        : req_(req), is_recv_(is_recv), bytes_(bytes), peer_(peer), tag_(tag) {}

    void wait() override {
        MPI_Status st;
        check(MPI_Wait(&req_, &st), st);
    }
    bool test() override {
        int flag = 0;
        MPI_Status st;
        check(MPI_Test(&req_, &flag, &st), st);
        return flag != 0;
    }
    void abandon() noexcept override {
        if (req_ == MPI_REQUEST_NULL || mpi_finalized()) return;
        if (is_recv_) {
            MPI_Cancel(&req_);
            MPI_Wait(&req_, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
        } else {
            MPI_Request_free(&req_);
        }
    }

  private:
    void check(int rc, const MPI_Status& st) const {
        if (rc != MPI_SUCCESS) {
            IF_FAIL((is_recv_ ? "irecv from" : "isend to")
                    << " rank " << peer_ << " (tag " << tag_ << ", " << bytes_
                    << " bytes) failed: " << detail::mpi_error_string(rc));
        }
        if (!is_recv_ || req_ != MPI_REQUEST_NULL) return;  // a send, or not complete yet
        int got = 0;
        IF_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
        IF_CHECK(static_cast<size_t>(got) == bytes_,
                 "irecv from rank " << peer_ << " (tag " << tag_ << ") posted " << bytes_
                                    << " bytes but the message has " << got);
    }

    MPI_Request req_;
    bool is_recv_;
    size_t bytes_;
    int peer_;
    int tag_;
};

}  // namespace

struct MpiComm::Setup {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
};

MpiComm::Setup MpiComm::setup(MPI_Comm base) {
    IF_CHECK(MpiEnv::initialized(), "MpiComm: MPI is not initialized (hold an MpiEnv)");
    Setup s;
    IF_MPI_CHECK(MPI_Comm_dup(base, &s.comm));
    IF_MPI_CHECK(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN));
    IF_MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
    IF_MPI_CHECK(MPI_Comm_size(s.comm, &s.size));
    MPI_Comm node = MPI_COMM_NULL;
    IF_MPI_CHECK(MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    IF_MPI_CHECK(MPI_Comm_rank(node, &s.local_rank));
    IF_MPI_CHECK(MPI_Comm_size(node, &s.local_size));
    IF_MPI_CHECK(MPI_Comm_free(&node));
    return s;
}

MpiComm::MpiComm(MPI_Comm base) : MpiComm(setup(base)) {}

MpiComm::MpiComm(const Setup& s)
    : Communicator(s.rank, s.size, s.local_rank, s.local_size), comm_(s.comm) {
    void* ub = nullptr;
    int flag = 0;
    IF_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag));
    if (flag && ub) tag_ub_ = *static_cast<int*>(ub);
}

MpiComm::~MpiComm() {
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
}

void MpiComm::abort(int code, const std::string& msg) {
    std::fflush(stdout);
    std::fprintf(stderr, "[rank %d/%d] error: %s\n", rank(), size(), msg.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, code);
    std::_Exit(code);
}

void MpiComm::do_barrier(Stream) { IF_MPI_CHECK(MPI_Barrier(comm_)); }

void MpiComm::do_broadcast(void* buf, size_t bytes, int root, Stream) {
    IF_MPI_CHECK(MPI_Bcast(buf, to_int(bytes, "broadcast"), MPI_BYTE, root, comm_));
}

void MpiComm::do_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream) {
    const int n = to_int(count, "all_reduce element count");
    IF_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(dtype), mpi_op(op), comm_));
}

void MpiComm::do_all_gather(const void* send, size_t bytes_per_rank, void* recv, Stream) {
    const int n = to_int(bytes_per_rank, "all_gather block");
    to_int(bytes_per_rank * size(), "all_gather result");
    const bool in_place = send == static_cast<const char*>(recv) + bytes_per_rank * rank();
    IF_MPI_CHECK(
        MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
}

void MpiComm::do_all_gather_v(const void* send, size_t send_bytes, void* recv,
                              const std::vector<size_t>& recv_bytes, Stream) {
    std::vector<int> counts, displs;
    counts_displs(recv_bytes, "all_gather_v", counts, displs);
    const bool in_place = send == static_cast<const char*>(recv) + displs[rank()];
    IF_MPI_CHECK(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, counts[rank()], MPI_BYTE, recv,
                                counts.data(), displs.data(), MPI_BYTE, comm_));
    (void)send_bytes;  // == recv_bytes[rank()], checked by Communicator::all_gather_v
}

void MpiComm::do_all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                              const std::vector<size_t>& recv_bytes, Stream) {
    std::vector<int> scounts, sdispls, rcounts, rdispls;
    counts_displs(send_bytes, "all_to_all_v send", scounts, sdispls);
    counts_displs(recv_bytes, "all_to_all_v recv", rcounts, rdispls);
    IF_MPI_CHECK(MPI_Alltoallv(send, scounts.data(), sdispls.data(), MPI_BYTE, recv, rcounts.data(),
                               rdispls.data(), MPI_BYTE, comm_));
}

std::unique_ptr<RequestImpl> MpiComm::do_isend(const void* buf, size_t bytes, int dest, int tag,
                                               Stream) {
    IF_CHECK(tag <= tag_ub_, "isend: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Isend(buf, to_int(bytes, "isend"), MPI_BYTE, dest, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, false, bytes, dest, tag);
}

std::unique_ptr<RequestImpl> MpiComm::do_irecv(void* buf, size_t bytes, int src, int tag, Stream) {
    IF_CHECK(tag <= tag_ub_, "irecv: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    MPI_Request req = MPI_REQUEST_NULL;
    IF_MPI_CHECK(MPI_Irecv(buf, to_int(bytes, "irecv"), MPI_BYTE, src, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, true, bytes, src, tag);
}

void MpiComm::do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                          size_t recv_bytes, int src, int tag, Stream) {
    IF_CHECK(tag <= tag_ub_, "sendrecv: tag " << tag << " above MPI_TAG_UB " << tag_ub_);
    MPI_Status st;
    const int rc =
        MPI_Sendrecv(send, to_int(send_bytes, "sendrecv send"), MPI_BYTE, dest, tag, recv,
                     to_int(recv_bytes, "sendrecv recv"), MPI_BYTE, src, tag, comm_, &st);
    if (rc != MPI_SUCCESS) {
        IF_FAIL("sendrecv (to rank " << dest << ", " << send_bytes << " bytes; from rank " << src
                                     << ", " << recv_bytes << " bytes; tag " << tag
                                     << ") failed: " << detail::mpi_error_string(rc));
    }
    int got = 0;
    IF_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
    IF_CHECK(static_cast<size_t>(got) == recv_bytes,
             "sendrecv from rank " << src << " (tag " << tag << ") expected " << recv_bytes
                                   << " bytes but the message has " << got);
}

std::unique_ptr<Communicator> make_mpi_communicator() {
    return std::make_unique<MpiComm>(MPI_COMM_WORLD);
}

}  // namespace infoflow
