#include "pipeline/mpi_transport.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

namespace stateflow {
namespace {

using Clock = std::chrono::steady_clock;

// MPI is initialised once per process, by the first transport, and finalised at exit, so a
// process can build and drop several pipelines.
class MpiSession {
 public:
  static void ensure() { static MpiSession session; }

 private:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // someone else owns MPI in this process
    int provided = 0;
    SF_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
             "MPI transport: MPI_Init_thread failed; launch stateflow with mpirun -n P");
    owns_ = true;
    SF_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI transport: this MPI does not support MPI_THREAD_FUNNELED");
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  bool owns_ = false;
};

// tag = payload | chunk << 1 | microbatch << 17: 31 bits, within Open MPI's MPI_TAG_UB.
constexpr int kChunkBits = 16, kMicrobatchBits = 14;

int message_tag(const MessageTag& t, int tag_ub) {
  SF_CHECK(t.chunk >= 0 && t.chunk < (1 << kChunkBits) && t.microbatch >= 0 && t.microbatch < (1 << kMicrobatchBits),
           "MPI transport: the ", describe(t), " has no message tag; at most ", 1 << kChunkBits, " chunks and ",
           1 << kMicrobatchBits, " microbatches are supported");
  const int tag = static_cast<int>(t.payload) | t.chunk << 1 | t.microbatch << (1 + kChunkBits);
  SF_CHECK(tag <= tag_ub, "MPI transport: the ", describe(t), " needs message tag ", tag,
           " but this MPI allows tags up to MPI_TAG_UB = ", tag_ub, "; use fewer chunks or microbatches");
  return tag;
}

// Polls done() with short, growing sleeps (an idle rank must not take a core from one that
// computes) until it returns true, or returns false once the deadline has passed.
bool poll_until(const std::function<bool()>& done, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(10);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  return true;
}

bool test(MPI_Request& req) {
  int done = 0;
  MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  return done != 0;
}

// A communication buffer of at least `bytes`, counted on the current tracker as Comm.
Tensor comm_buffer(size_t bytes) { return Tensor::zeros({int64_t((bytes + 3) / 4)}, DType::I32, MemCategory::Comm); }

// One message: a header of int64 words [dtype, ndim, dims...], then the tensor's bytes.
size_t header_bytes(int64_t ndim) { return sizeof(int64_t) * size_t(2 + ndim); }

Tensor pack(const Tensor& t, size_t* bytes) {
  const size_t header = header_bytes(t.ndim());
  *bytes = header + t.nbytes();
  Tensor buf = comm_buffer(*bytes);
  int64_t* h = static_cast<int64_t*>(buf.raw());
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.ndim();
  std::copy(t.shape().begin(), t.shape().end(), h + 2);
  std::memcpy(static_cast<char*>(buf.raw()) + header, t.raw(), t.nbytes());
  return buf;
}

Tensor unpack(const Tensor& buf, size_t bytes, const std::string& what) {
  const int64_t* h = static_cast<const int64_t*>(buf.raw());
  auto malformed = [&](const char* why) { fail("MPI transport: the ", what, " arrived malformed (", why, ")"); };
  if (bytes < header_bytes(0)) malformed("shorter than its header");
  if (h[0] < 0 || h[0] > static_cast<int64_t>(DType::I32)) malformed("unknown dtype");
  if (h[1] < 0 || h[1] > 8 || bytes < header_bytes(h[1])) malformed("bad number of dimensions");
  const Shape shape(h + 2, h + 2 + h[1]);
  const DType dtype = static_cast<DType>(h[0]);
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }) ||
      header_bytes(h[1]) + size_t(shape_numel(shape)) * dtype_size(dtype) != bytes)
    malformed("its size does not match its shape");
  Tensor t = Tensor::zeros(shape, dtype);
  std::memcpy(t.raw(), static_cast<const char*>(buf.raw()) + header_bytes(h[1]), t.nbytes());
  return t;
}

MPI_Datatype mpi_type(DType t, const std::string& what) {
  SF_CHECK(t == DType::F32 || t == DType::F64, "MPI transport: the ", what, " holds ", dtype_name(t),
           ", but only f32 and f64 tensors are summed");
  return t == DType::F32 ? MPI_FLOAT : MPI_DOUBLE;
}

// One communicator: the whole world (a plain pipeline), or under data parallelism one
// replica's pipeline or one stage's group of replicas. `self` says who this rank is there
// ("stage 1", "stage 1 of replica 0", "replica 0 of stage 1") and `peer` what the other
// ranks are ("stage", "replica"), for messages.
class MpiTransport : public Transport {
 public:
  MpiTransport(double timeout_s, MPI_Comm comm, std::string self, std::string peer)
      : timeout_s_(timeout_s), comm_(comm), peer_(std::move(peer)) {
    SF_CHECK(timeout_s > 0, "transport timeout must be positive, got ", timeout_s);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_size_);
    self_ = self.empty() ? cat("stage ", rank_) : std::move(self);
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
    tag_ub_ = found ? *tag_ub : 32767;  // the least the MPI standard allows
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override { return "mpi"; }

  void send(int peer, const MessageTag& tag, const Tensor& t) override {
    SF_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, self_, ": bad peer ", peer);
    const int mpi_tag = message_tag(tag, tag_ub_);
    size_t bytes = 0;
    Tensor buf = pack(t, &bytes);
    SF_CHECK(bytes <= size_t(INT_MAX), "MPI transport: the ", describe(tag), " is ", bytes,
             " bytes, above the 2 GiB one message can carry; use shorter chunks");
    pending_.push_back({peer, tag, buf, MPI_REQUEST_NULL});
    MPI_Isend(buf.raw(), int(bytes), MPI_BYTE, peer, mpi_tag, comm_, &pending_.back().request);
    complete_sends();
  }

  Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override {
    SF_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, self_, ": bad peer ", peer);
    const int mpi_tag = message_tag(tag, tag_ub_);
    const auto deadline = deadline_from_now();
    auto timed_out = [&] {
      fail(self_, " waited ", timeout_s_, " s for the ", describe(tag), " from ", peer_, " ", peer,
           ", which stalled or died; raise --timeout if its steps are legitimately that slow");
    };
    // A matched probe, then a non-blocking receive: no call here can block past the deadline.
    MPI_Message message;
    MPI_Status status;
    int found = 0;
    auto arrived = [&] {
      MPI_Improbe(peer, mpi_tag, comm_, &found, &message, &status);
      return found != 0;
    };
    if (!poll_until(arrived, deadline)) timed_out();
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    Tensor buf = comm_buffer(size_t(bytes));
    MPI_Request req;
    MPI_Imrecv(buf.raw(), bytes, MPI_BYTE, &message, &req);
    if (!poll_until([&] { return test(req); }, deadline)) timed_out();
    Tensor t = unpack(buf, size_t(bytes), describe(tag));
    check_arrival(t, spec, peer, tag);
    return t;
  }

  double all_reduce_sum(double value) override { return all_reduce(value, MPI_SUM); }
  double all_reduce_max(double value) override { return all_reduce(value, MPI_MAX); }

  void start_all_reduce_sum(const std::vector<Tensor>& tensors, const std::string& what) override {
    for (const Tensor& t : tensors) {
      SF_CHECK(t.on_host(), "MPI transport: the ", what, " is not on the host; use --transport nccl on GPUs");
      SF_CHECK(t.numel() <= INT_MAX, "MPI transport: a tensor of the ", what, " has ", t.numel(),
               " elements, more than one MPI call takes; use smaller layers");
      reduces_.push_back({what, t, MPI_REQUEST_NULL});
      MPI_Iallreduce(MPI_IN_PLACE, t.raw(), int(t.numel()), mpi_type(t.dtype(), what), MPI_SUM, comm_,
                     &reduces_.back().request);
    }
    progress_reduces();
  }

  void wait_all_reduces() override {
    // Testing in order drives MPI's progress, which runs only inside MPI calls here.
    auto all_done = [&] {
      progress_reduces();
      return reduces_.empty();
    };
    if (!poll_until(all_done, deadline_from_now()))
      fail(self_, " waited ", timeout_s_, " s for the sum of the ", reduces_.front().what, " over the other ",
           peer_, "s, which stalled or died; raise --timeout if their steps are legitimately that slow");
  }

  void flush() override {
    auto all_sent = [&] {
      complete_sends();
      return pending_.empty();
    };
    if (!poll_until(all_sent, deadline_from_now())) {
      const PendingSend& s = pending_.front();
      fail(self_, " waited ", timeout_s_, " s for ", peer_, " ", s.peer, " to take the ", describe(s.tag),
           ", which stalled or died; raise --timeout if its steps are legitimately that slow");
    }
  }

  void abort(const std::string& reason) override {
    // Reasons raised here already start with who this rank is; others get the prefix.
    std::cerr << "error: " << (reason.rfind(self_ + " ", 0) == 0 ? "" : self_ + ": ") << reason << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

 private:
  struct PendingReduce {
    std::string what;
    Tensor tensor;  // summed in place: kept alive until MPI is done with it
    MPI_Request request;
  };
  void progress_reduces() {
    while (!reduces_.empty() && test(reduces_.front().request)) reduces_.erase(reduces_.begin());
  }

  struct PendingSend {
    int peer;
    MessageTag tag;
    Tensor buffer;  // kept alive until MPI is done with it
    MPI_Request request;
  };

  Clock::time_point deadline_from_now() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  // Drops the sends MPI has finished with.
  void complete_sends() {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](PendingSend& s) { return test(s.request); }),
                   pending_.end());
  }

  double all_reduce(double value, MPI_Op op) {
    double result = 0;
    MPI_Request req;
    MPI_Iallreduce(&value, &result, 1, MPI_DOUBLE, op, comm_, &req);
    if (!poll_until([&] { return test(req); }, deadline_from_now()))
      fail(self_, " waited ", timeout_s_, " s in an all-reduce for the other ", peer_, "(s), which stalled or died; "
           "raise --timeout if their steps are legitimately that slow");
    return result;
  }

  double timeout_s_;
  MPI_Comm comm_;
  std::string self_, peer_;
  int rank_ = 0, world_size_ = 1, tag_ub_ = 0;
  // Stage flushes every step and a failure aborts the job, so none is left at destruction.
  std::vector<PendingSend> pending_;
  std::vector<PendingReduce> reduces_;  // started, in order
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(double timeout_s) {
  MpiSession::ensure();
  return std::make_unique<MpiTransport>(timeout_s, MPI_COMM_WORLD, "", "stage");
}

GridTransports make_mpi_grid_transports(int stages, int data_parallel, double timeout_s) {
  MpiSession::ensure();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  GridTransports out;
  out.grid = make_grid(world, stages, data_parallel);
  out.rank = rank;
  // Every rank's host, for the table and the placement check (fixed-size records).
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  std::vector<char> hosts(size_t(world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                MPI_COMM_WORLD);
  for (int r = 0; r < world; ++r) {
    const char* h = hosts.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    out.places.push_back({std::string(h, strnlen(h, MPI_MAX_PROCESSOR_NAME)), -1});
  }
  const int stage = out.grid.stage_of(rank), replica = out.grid.replica_of(rank);
  if (out.grid.replicas == 1) {
    out.pipeline = make_mpi_transport(timeout_s);
    return out;
  }
  // Collective over the world, in the same order on every rank.
  MPI_Comm pipeline = MPI_COMM_NULL, group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, replica, stage, &pipeline);
  MPI_Comm_split(MPI_COMM_WORLD, stage, replica, &group);
  out.pipeline = std::make_unique<MpiTransport>(timeout_s, pipeline, cat("stage ", stage, " of replica ", replica),
                                                "stage");
  out.group = std::make_unique<MpiTransport>(timeout_s, group, cat("replica ", replica, " of stage ", stage),
                                             "replica");
  return out;
}

std::string mpi_broadcast_from_rank0(const std::string& bytes, int rank, double timeout_s) {
  MpiSession::ensure();
  int mpi_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  SF_CHECK(mpi_rank == rank, "MPI says this process is rank ", mpi_rank, " but the launch environment says ", rank,
           "; do not mix --rank flags with mpirun");
  std::string out = bytes;
  MPI_Request req;
  MPI_Ibcast(out.data(), int(out.size()), MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  SF_CHECK(poll_until([&] { return test(req); }, deadline), "rank ", rank, " waited ", timeout_s,
           " s for the NCCL id from rank 0 over MPI; did every rank start? Raise --timeout if rank 0 is slow to start");
  return out;
}

}  // namespace stateflow
