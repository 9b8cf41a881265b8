#include "pipeline/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "pipeline/watchdog.h"

namespace stateflow {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  return cat(ncclGetErrorString(r), " (", ncclGetLastError(comm), ")");
}

// ncclInProgress is how a non-blocking communicator says "queued, still working".
void nccl_check(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  SF_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL: ", what, " failed: ", nccl_error(r, comm));
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Short, growing sleeps: a waiting stage must not take a core from one that computes.
void backoff(std::chrono::microseconds& pause) {
  std::this_thread::sleep_for(pause);
  pause = std::min(pause * 2, std::chrono::microseconds(1000));
}

// The communicators of this process's endpoints and the failure that stops them all. An NCCL
// call on a communicator holds its lock, so abort_all() may run on any thread (the failed
// stage's) while the others use theirs; it also stops the GPU kernels that wait for a peer.
struct NcclProcess {
  double timeout_s = 0;
  std::vector<ncclComm_t> comms;  // by endpoint; nullptr once aborted
  std::vector<int> devices;
  std::vector<std::unique_ptr<std::mutex>> locks;
  std::mutex failure_mu;
  std::string failure;
  // Watches every transfer in flight from its own thread: the host may be blocked in a CUDA
  // synchronisation that waits for one (a dead peer's), where no timeout of ours runs. After
  // --timeout it aborts the communicators, which ends that wait; the stage then fails naming
  // the peer at its next transport call, or the process exits after another --timeout.
  std::unique_ptr<Watchdog> watchdog;

  NcclProcess(int endpoints, double timeout)
      : timeout_s(timeout), comms(size_t(endpoints), nullptr), devices(size_t(endpoints), -1) {
    for (int i = 0; i < endpoints; ++i) locks.push_back(std::make_unique<std::mutex>());
    watchdog = std::make_unique<Watchdog>(timeout, timeout, [this](const std::string& why) { abort_all(why); });
  }

  std::string failed() {
    std::lock_guard<std::mutex> l(failure_mu);
    return failure;
  }

  void abort_all(const std::string& reason) {
    {
      std::lock_guard<std::mutex> l(failure_mu);
      if (failure.empty()) failure = reason;
    }
    int caller_device = 0;  // aborting may switch GPUs
    cudaGetDevice(&caller_device);
    for (size_t i = 0; i < comms.size(); ++i) {
      std::lock_guard<std::mutex> l(*locks[i]);
      if (comms[i]) ncclCommAbort(comms[i]), comms[i] = nullptr;
    }
    cudaSetDevice(caller_device);
  }

  // Waits until no communicator is busy setting up (init, a group's lazy connections).
  // Returns "" or what went wrong; polls against the timeout.
  std::string wait_ready(const std::vector<size_t>& which, double seconds) {
    const auto deadline = deadline_after(seconds);
    auto pause = std::chrono::microseconds(10);
    while (true) {
      bool busy = false;
      for (size_t i : which) {
        std::lock_guard<std::mutex> l(*locks[i]);
        if (!comms[i]) {
          // Aborted, or a non-blocking split that has not handed out its communicator yet.
          if (std::string why = failed(); !why.empty()) return "the communicator was aborted: " + why;
          busy = true;
          continue;
        }
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comms[i], &state);
        if (state == ncclInProgress) busy = true;
        else if (state != ncclSuccess) return nccl_error(state, comms[i]);
      }
      if (!busy) return "";
      if (Clock::now() >= deadline) return cat("no answer within ", seconds, " s");
      backoff(pause);
    }
  }

  // Every healthy communicator is finalised together (finalize waits for the peers' to be
  // quiescent), then destroyed; one that does not settle in time is aborted.
  ~NcclProcess() {
    watchdog.reset();  // it calls abort_all(): gone before anything that uses
    int caller_device = 0;
    cudaGetDevice(&caller_device);
    std::vector<size_t> live;
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i]) {
        cudaSetDevice(devices[i]);
        ncclCommFinalize(comms[i]);
        live.push_back(i);
      }
    // At the end of a run every rank gets here at about the same time: a short bound.
    const bool settled = wait_ready(live, std::min(timeout_s, 10.0)).empty();
    for (size_t i : live) {
      if (!comms[i]) continue;
      cudaSetDevice(devices[i]);
      settled ? ncclCommDestroy(comms[i]) : ncclCommAbort(comms[i]);
    }
    cudaSetDevice(caller_device);
  }
};

// One communicator of the process (`index`): a pipeline's (ranks = stages) or, under data
// parallelism, a stage group's (ranks = replicas). `self` says who this rank is there and
// `peer` what the other ranks are, for messages.
class NcclTransport : public Transport {
 public:
  NcclTransport(std::shared_ptr<NcclProcess> process, size_t index, int rank, int world_size, std::string self = "",
                std::string peer = "stage")
      : process_(std::move(process)), index_(index), rank_(rank), world_size_(world_size),
        device_(process_->devices[index]), self_(self.empty() ? cat("stage ", rank) : std::move(self)),
        peer_(std::move(peer)) {
    GpuScope on(device_);  // made on the caller's thread: leave its current GPU as it was
    cuda_check(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate (comm stream)");
    cuda_check(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaMalloc(&reduce_device_, sizeof(double)), "cudaMalloc (all-reduce buffer)");
    cuda_check(cudaMallocHost(&reduce_host_, sizeof(double)), "cudaMallocHost (all-reduce buffer)");
  }

  ~NcclTransport() override {
    GpuScope on(device_);
    if (process_->failed().empty()) cudaStreamSynchronize(comm_stream_);  // an aborted one has stopped
    for (Batch& b : in_flight_) process_->watchdog->forget(b.watch), cudaEventDestroy(b.done);
    for (Batch& b : reduces_) process_->watchdog->forget(b.watch), cudaEventDestroy(b.done);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    cudaEventDestroy(compute_ready_);
    cudaFree(reduce_device_);
    cudaFreeHost(reduce_host_);
    cudaStreamDestroy(comm_stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override { return "nccl"; }
  int cuda_device() const override { return device_; }

  void begin_batch() override {
    SF_CHECK(!batch_open_, "NCCL transport: begin_batch() twice without end_batch()");
    enter();
    complete_batches();
    call([&](ncclComm_t) { return ncclGroupStart(); }, "ncclGroupStart");
    batch_open_ = true;
    batch_ = Batch{};
  }

  void end_batch() override {
    SF_CHECK(batch_open_, "NCCL transport: end_batch() without begin_batch()");
    batch_open_ = false;
    call([&](ncclComm_t) { return ncclGroupEnd(); }, cat("ncclGroupEnd (", batch_.what, ")"));
    // A non-blocking communicator may still be connecting to the peers here.
    if (std::string why = process_->wait_ready({index_}, process_->timeout_s); !why.empty())
      stop(cat(self_, " could not start the transfer of the ", batch_.what, ": ", why));
    batch_.done = take_event();
    cuda_check(cudaEventRecord(batch_.done, comm_stream_), "cudaEventRecord (transfer done)");
    watch(batch_);
    if (batch_.receives)  // the stage's next kernels read the data
      cuda_check(cudaStreamWaitEvent(compute_stream(), batch_.done, 0), "cudaStreamWaitEvent (receive)");
    in_flight_.push_back(std::move(batch_));
  }

  void send(int peer, const MessageTag& tag, const Tensor& t) override {
    SF_CHECK(t.device() == Device::CUDA, "NCCL transport: the ", describe(tag), " to stage ", peer,
             " is a host tensor; --transport nccl needs --device cuda");
    transfer(peer, tag, [&](ncclComm_t c) { return ncclSend(t.raw(), t.nbytes(), ncclUint8, peer, c, comm_stream_); },
             t);
  }

  Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override {
    SF_CHECK(spec.device == Device::CUDA, "NCCL transport: the ", describe(tag), " from stage ", peer,
             " is expected on the host; --transport nccl needs --device cuda");
    enter();
    Tensor t = Tensor::zeros(spec.shape, spec.dtype, current_category(), Device::CUDA);
    // The transfer must not start before the zero-fill above, nor before queued compute work
    // that still uses a block the caching allocator just handed out again.
    transfer(peer, tag, [&](ncclComm_t c) { return ncclRecv(t.raw(), t.nbytes(), ncclUint8, peer, c, comm_stream_); },
             Tensor());
    return t;
  }

  double all_reduce_sum(double value) override { return all_reduce(value, ncclSum); }
  double all_reduce_max(double value) override { return all_reduce(value, ncclMax); }

  // One NCCL group of in-place sums on the comm stream, after the kernels queued so far on the
  // compute stream (those that wrote the gradients); the backward goes on meanwhile.
  void start_all_reduce_sum(const std::vector<Tensor>& tensors, const std::string& what) override {
    SF_CHECK(!batch_open_, "NCCL transport: an all-reduce inside a batch of sends and receives");
    for (const Tensor& t : tensors)
      SF_CHECK(t.device() == Device::CUDA && t.dtype() == DType::F32, "NCCL transport: the ", what,
               " must be f32 tensors on the GPU, not ", dtype_name(t.dtype()), " on ", device_name(t.device()));
    enter();
    cuda_check(cudaEventRecord(compute_ready_, compute_stream()), "cudaEventRecord (gradients ready)");
    cuda_check(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0), "cudaStreamWaitEvent (comm stream)");
    call([&](ncclComm_t) { return ncclGroupStart(); }, "ncclGroupStart");
    for (const Tensor& t : tensors)
      call([&](ncclComm_t c) {
        return ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), ncclFloat32, ncclSum, c, comm_stream_);
      }, cat("ncclAllReduce of the ", what));
    call([&](ncclComm_t) { return ncclGroupEnd(); }, cat("ncclGroupEnd (", what, ")"));
    if (std::string why = process_->wait_ready({index_}, process_->timeout_s); !why.empty())
      stop(cat(self_, " could not start the sum of the ", what, ": ", why));
    Batch b;
    b.what = cat("sum of the ", what, " over the other ", peer_, "s");
    b.keep = tensors;
    b.done = take_event();
    cuda_check(cudaEventRecord(b.done, comm_stream_), "cudaEventRecord (all-reduce done)");
    watch(b);
    reduces_.push_back(std::move(b));
  }

  void wait_all_reduces() override {
    enter();
    for (Batch& b : reduces_) {
      wait_for([&] { return done(b.done); }, b.what);
      cuda_check(cudaStreamWaitEvent(compute_stream(), b.done, 0), "cudaStreamWaitEvent (all-reduce)");
    }
    for (Batch& b : reduces_) process_->watchdog->forget(b.watch), spare_events_.push_back(b.done);
    reduces_.clear();
  }

  void flush() override {
    enter();
    while (!in_flight_.empty()) {
      const Batch& b = in_flight_.front();
      wait_for([&] { return done(b.done); }, b.what);
      complete_batches();
    }
  }

  void abort(const std::string& reason) override {
    // Called on this stage's thread: a group left open by a failed batch must not outlive it.
    if (batch_open_) ncclGroupEnd(), batch_open_ = false;
    process_->abort_all(reason.rfind("stage ", 0) == 0 || reason.rfind(self_, 0) == 0 ? reason
                                                                                     : cat(self_, " failed: ", reason));
  }

 private:
  // One NCCL group's transfers: what they were (for errors), the sent tensors kept alive,
  // and the event that fires when all of them are done.
  struct Batch {
    std::string what;
    std::vector<Tensor> keep;
    bool receives = false;
    cudaEvent_t done = nullptr;
    int64_t watch = -1;  // its id on the process's watchdog
  };

  static cudaStream_t compute_stream() { return cublas_for_thread().stream(); }

  // Every call starts here: this thread on our GPU, and no failure elsewhere in the process.
  void enter() {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice (NCCL transport)");
    if (std::string f = process_->failed(); !f.empty()) fail(self_, " stopped because ", f);
  }

  // An NCCL call on our communicator, under its lock.
  template <class F>
  void call(F&& f, const std::string& what) {
    std::lock_guard<std::mutex> l(*process_->locks[index_]);
    ncclComm_t c = process_->comms[index_];
    if (!c) fail(self_, " stopped because ", process_->failed());
    nccl_check(f(c), c, what);
  }

  // One send (of `sent`, kept alive until done) or receive (sent undefined), in the open batch
  // or in a batch of its own.
  template <class F>
  void transfer(int peer, const MessageTag& tag, F&& nccl_op, const Tensor& sent) {
    const bool send = sent.defined();
    SF_CHECK(peer >= 0 && peer < world_size_ && peer != rank_, "stage ", rank_, ": bad peer ", peer);
    const bool own_batch = !batch_open_;
    if (own_batch) begin_batch();
    cuda_check(cudaEventRecord(compute_ready_, compute_stream()), "cudaEventRecord (compute ready)");
    cuda_check(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0), "cudaStreamWaitEvent (comm stream)");
    const std::string what = cat(describe(tag), send ? " to stage " : " from stage ", peer);
    batch_.what += (batch_.what.empty() ? "" : ", ") + what;
    call(nccl_op, cat(send ? "send" : "receive", " of the ", what));
    if (send)
      batch_.keep.push_back(sent);
    else
      batch_.receives = true;
    if (own_batch) end_batch();
  }

  // Hands a recorded batch to the process's watchdog (forget it before its event is reused).
  void watch(Batch& b) {
    b.watch = process_->watchdog->watch(cat(self_, ": the ", b.what), [e = b.done, gpu = device_] {
      cudaSetDevice(gpu);  // the watchdog's own thread
      return cudaEventQuery(e) != cudaErrorNotReady;
    });
  }

  static bool done(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) return false;
    cuda_check(r, "cudaEventQuery (transfer)");
    return true;
  }

  // Polls done() against the timeout, the communicator's async error and failures elsewhere;
  // gives up by aborting every communicator of the process and throwing.
  template <class Done>
  void wait_for(Done&& is_done, const std::string& what) {
    const auto deadline = deadline_after(process_->timeout_s);
    auto pause = std::chrono::microseconds(10);
    while (true) {
      enter();
      std::string error;
      {
        std::lock_guard<std::mutex> l(*process_->locks[index_]);
        ncclComm_t c = process_->comms[index_];
        ncclResult_t state = ncclSuccess;
        if (c) ncclCommGetAsyncError(c, &state);
        if (state != ncclSuccess && state != ncclInProgress) error = nccl_error(state, c);
      }
      if (!error.empty()) stop(cat(self_, ": NCCL failed while waiting for the ", what, ": ", error));
      if (is_done()) return;
      if (Clock::now() >= deadline)
        stop(cat(self_, " waited ", process_->timeout_s, " s for the ", what,
                 ", which stalled or died; raise --timeout if its steps are legitimately that slow"));
      backoff(pause);
    }
  }

  // Gives up: when another stage failed first (and aborted our communicator), that is the
  // cause to report; else this failure aborts every communicator of the process.
  [[noreturn]] void stop(const std::string& why) {
    if (std::string f = process_->failed(); !f.empty()) fail(self_, " stopped because ", f);
    process_->abort_all(why);
    fail(why);
  }

  // Drops the batches whose transfers are done (their sent tensors go back to the stage).
  void complete_batches() {
    while (!in_flight_.empty() && done(in_flight_.front().done)) {
      process_->watchdog->forget(in_flight_.front().watch);  // before its event is used again
      spare_events_.push_back(in_flight_.front().done);
      in_flight_.pop_front();
    }
  }

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (transfer)");
    return e;
  }

  // On the comm stream, after every transfer queued before it; blocks the host (with the timeout).
  double all_reduce(double value, ncclRedOp_t op) {
    SF_CHECK(!batch_open_, "NCCL transport: an all-reduce inside a batch of sends and receives");
    enter();
    *reduce_host_ = value;
    cuda_check(cudaMemcpyAsync(reduce_device_, reduce_host_, sizeof(double), cudaMemcpyHostToDevice, comm_stream_),
               "cudaMemcpyAsync (all-reduce input)");
    call([&](ncclComm_t c) { return ncclAllReduce(reduce_device_, reduce_device_, 1, ncclFloat64, op, c, comm_stream_); },
         "ncclAllReduce");
    const std::string what = cat("all-reduce of the other ", peer_, "(s)");
    if (std::string why = process_->wait_ready({index_}, process_->timeout_s); !why.empty())
      stop(cat(self_, " could not start an all-reduce: ", why));
    cuda_check(cudaMemcpyAsync(reduce_host_, reduce_device_, sizeof(double), cudaMemcpyDeviceToHost, comm_stream_),
               "cudaMemcpyAsync (all-reduce result)");
    cudaEvent_t e = take_event();
    cuda_check(cudaEventRecord(e, comm_stream_), "cudaEventRecord (all-reduce)");
    wait_for([&] { return done(e); }, what);
    spare_events_.push_back(e);
    return *reduce_host_;
  }

  std::shared_ptr<NcclProcess> process_;
  size_t index_;
  int rank_, world_size_, device_;
  std::string self_, peer_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  double* reduce_device_ = nullptr;
  double* reduce_host_ = nullptr;  // pinned
  bool batch_open_ = false;
  Batch batch_;
  std::deque<Batch> in_flight_;
  std::deque<Batch> reduces_;  // gradient sums started and not yet waited for
  std::vector<cudaEvent_t> spare_events_;
};

// NCCL connects two ranks lazily, at their first transfer, and a connection needs both
// sides. A batch that sends to a peer and receives from it would then wait for the peer to
// connect its send, which it only reaches after computing on this very batch's data: a
// deadlock. One exchange between every pair of ranks at start-up connects them all.
// The first n communicators of the process are ranks first_rank.. of the world_size to connect.
void connect_all_peers(NcclProcess& process, size_t n, int first_rank, int world_size) {
  const size_t bytes = size_t(1) << 20;
  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<char*> buffers(n, nullptr);  // one block to send, then one per peer to receive into
  for (size_t i = 0; i < n; ++i) {
    cuda_check(cudaSetDevice(process.devices[i]), "cudaSetDevice (NCCL connect)");
    cuda_check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreate (NCCL connect)");
    cuda_check(cudaMalloc(&buffers[i], bytes * size_t(1 + world_size)), "cudaMalloc (NCCL connect)");
  }
  nccl_check(ncclGroupStart(), nullptr, "ncclGroupStart (connect)");
  for (size_t i = 0; i < n; ++i)
    for (int peer = 0; peer < world_size; ++peer) {
      if (peer == first_rank + int(i)) continue;
      nccl_check(ncclSend(buffers[i], bytes, ncclUint8, peer, process.comms[i], streams[i]), process.comms[i],
                 "ncclSend (connect)");
      nccl_check(ncclRecv(buffers[i] + bytes * size_t(1 + peer), bytes, ncclUint8, peer, process.comms[i], streams[i]),
                 process.comms[i], "ncclRecv (connect)");
    }
  nccl_check(ncclGroupEnd(), nullptr, "ncclGroupEnd (connect)");
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  std::string why = process.wait_ready(all, process.timeout_s);
  const auto deadline = deadline_after(process.timeout_s);
  auto pause = std::chrono::microseconds(10);
  for (size_t i = 0; i < n && why.empty(); ++i) {
    cudaError_t r;
    while ((r = cudaStreamQuery(streams[i])) == cudaErrorNotReady && Clock::now() < deadline) backoff(pause);
    if (r != cudaSuccess) why = r == cudaErrorNotReady ? cat("no answer within ", process.timeout_s, " s")
                                                       : std::string(cudaGetErrorString(r));
  }
  if (!why.empty()) process.abort_all(why);  // stops the exchange before its buffers go
  for (size_t i = 0; i < n; ++i) {
    cudaSetDevice(process.devices[i]);
    cudaStreamSynchronize(streams[i]);
    cudaFree(buffers[i]);
    cudaStreamDestroy(streams[i]);
  }
  if (!why.empty())
    fail("NCCL: connecting the ", world_size, " ranks failed: ", why,
         "; check that every rank runs, or raise --timeout; NCCL_DEBUG=INFO says more");
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // a dead peer must never block the host inside NCCL
  return config;
}

// Starts every endpoint's communicator of this process (one per GPU in `process->devices`)
// as ranks first_rank.. of world_size, in one group, and waits until they are up.
void init_communicators(NcclProcess& process, const ncclUniqueId& id, int first_rank, int world_size) {
  ncclConfig_t config = non_blocking_config();
  std::vector<size_t> all;
  nccl_check(ncclGroupStart(), nullptr, "ncclGroupStart (init)");
  for (size_t i = 0; i < process.comms.size(); ++i) {
    cuda_check(cudaSetDevice(process.devices[i]), "cudaSetDevice (NCCL init)");
    nccl_check(ncclCommInitRankConfig(&process.comms[i], world_size, id, first_rank + int(i), &config), nullptr,
               cat("ncclCommInitRankConfig (rank ", first_rank + int(i), " on GPU ", process.devices[i], ")"));
    all.push_back(i);
  }
  nccl_check(ncclGroupEnd(), nullptr, "ncclGroupEnd (init)");
  if (std::string why = process.wait_ready(all, process.timeout_s); !why.empty()) {
    process.abort_all(why);
    fail("NCCL: starting the communicator of ", world_size, " rank(s) failed: ", why,
         "; check that every rank runs (and reached the same rendezvous), or raise --timeout; NCCL_DEBUG=INFO "
         "says more");
  }
  connect_all_peers(process, process.comms.size(), first_rank, world_size);
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<std::unique_ptr<Transport>> make_nccl_transports(int world_size, double timeout_s) {
  SF_CHECK(timeout_s > 0, "transport timeout must be positive, got ", timeout_s);
  const int gpus = cuda_device_count();
  SF_CHECK(world_size <= gpus, "--stages ", world_size, " needs ", world_size, " GPUs, found ", gpus, ": use --stages ",
           std::max(gpus, 1), ", or --transport local to run every stage on GPU 0");
  int caller_device = 0;  // set again at the end: the caller keeps its GPU
  cuda_check(cudaGetDevice(&caller_device), "cudaGetDevice");
  auto process = std::make_shared<NcclProcess>(world_size, timeout_s);
  for (int i = 0; i < world_size; ++i) process->devices[size_t(i)] = i;
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  init_communicators(*process, id, 0, world_size);
  std::vector<std::unique_ptr<Transport>> out;
  for (int i = 0; i < world_size; ++i) out.push_back(std::make_unique<NcclTransport>(process, size_t(i), i, world_size));
  cuda_check(cudaSetDevice(caller_device), "cudaSetDevice (back to the caller's GPU)");
  return out;
}

// Selects this rank's GPU and returns rank 0's NCCL id, shared by share_id.
static ncclUniqueId shared_unique_id(int rank, int device,
                                     const std::function<std::string(const std::string&)>& share_id) {
  const int gpus = cuda_device_count();
  SF_CHECK(device >= 0 && device < gpus, "rank ", rank, " has local rank ", device, " but this host has ", gpus,
           " GPU(s); start at most one process per GPU on each host");
  cuda_check(cudaSetDevice(device), "cudaSetDevice (this rank's GPU)");
  ncclUniqueId id{};
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  const std::string shared = share_id(std::string(reinterpret_cast<const char*>(&id), sizeof id));
  SF_CHECK(shared.size() == sizeof id, "NCCL: the id from rank 0 has ", shared.size(), " bytes, not ", sizeof id,
           "; every rank must run the same stateflow");
  std::copy(shared.begin(), shared.end(), reinterpret_cast<char*>(&id));
  return id;
}

std::unique_ptr<Transport> make_nccl_transport(int rank, int world_size, int device, double timeout_s,
                                               const std::function<std::string(const std::string&)>& share_id) {
  SF_CHECK(timeout_s > 0, "transport timeout must be positive, got ", timeout_s);
  const ncclUniqueId id = shared_unique_id(rank, device, share_id);
  auto process = std::make_shared<NcclProcess>(1, timeout_s);
  process->devices[0] = device;
  init_communicators(*process, id, rank, world_size);
  return std::make_unique<NcclTransport>(process, 0, rank, world_size);
}

namespace {

// The communicators of a data-parallel rank, by slot in its NcclProcess.
enum GridSlot : size_t { kPipelineComm = 0, kGroupComm = 1, kWorldComm = 2 };

// Waits for the slots' communicators to settle; on failure aborts them all and says what failed.
void settle(NcclProcess& process, const std::vector<size_t>& slots, const std::string& what) {
  if (std::string why = process.wait_ready(slots, process.timeout_s); !why.empty()) {
    process.abort_all(why);
    fail("NCCL: ", what, " failed: ", why, "; check that every rank runs (and reached the same rendezvous), or ",
         "raise --timeout; NCCL_DEBUG=INFO says more");
  }
}

// Every rank's host and GPU, gathered over the world communicator.
std::vector<RankPlace> gather_places(NcclProcess& process, int rank, int world_size) {
  struct Record {
    char host[256];
    int gpu;
  };
  Record mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  mine.gpu = process.devices[kWorldComm];
  Record* device_records = nullptr;
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (placement)");
  cuda_check(cudaMalloc(&device_records, sizeof(Record) * size_t(world_size)), "cudaMalloc (placement)");
  cuda_check(cudaMemcpy(device_records + rank, &mine, sizeof mine, cudaMemcpyHostToDevice), "cudaMemcpy (placement)");
  nccl_check(ncclAllGather(device_records + rank, device_records, sizeof(Record), ncclUint8,
                           process.comms[kWorldComm], stream),
             process.comms[kWorldComm], "ncclAllGather (placement)");
  settle(process, {kWorldComm}, "gathering every rank's host and GPU");
  const auto deadline = deadline_after(process.timeout_s);
  auto pause = std::chrono::microseconds(10);
  cudaError_t r;
  while ((r = cudaStreamQuery(stream)) == cudaErrorNotReady && Clock::now() < deadline) backoff(pause);
  if (r != cudaSuccess) {
    process.abort_all("placement gather failed");
    fail("NCCL: gathering every rank's host and GPU failed: ",
         r == cudaErrorNotReady ? cat("no answer within ", process.timeout_s, " s") : cudaGetErrorString(r));
  }
  std::vector<Record> all(static_cast<size_t>(world_size));
  cuda_check(cudaMemcpy(all.data(), device_records, sizeof(Record) * all.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy (placement)");
  cudaFree(device_records);
  cudaStreamDestroy(stream);
  std::vector<RankPlace> out;
  for (const Record& rec : all) out.push_back({std::string(rec.host, strnlen(rec.host, sizeof rec.host)), rec.gpu});
  return out;
}

}  // namespace

GridTransports make_nccl_grid_transports(int rank, int world_size, int device, int stages, int data_parallel,
                                         double timeout_s,
                                         const std::function<std::string(const std::string&)>& share_id) {
  SF_CHECK(timeout_s > 0, "transport timeout must be positive, got ", timeout_s);
  GridTransports out;
  out.grid = make_grid(world_size, stages, data_parallel);
  out.rank = rank;
  const int stage = out.grid.stage_of(rank), replica = out.grid.replica_of(rank);
  const ncclUniqueId id = shared_unique_id(rank, device, share_id);
  auto process = std::make_shared<NcclProcess>(3, timeout_s);
  for (int& d : process->devices) d = device;
  // The world, then its two splits (collective over the world, in this order on every rank).
  ncclConfig_t config = non_blocking_config();
  nccl_check(ncclCommInitRankConfig(&process->comms[kWorldComm], world_size, id, rank, &config), nullptr,
             cat("ncclCommInitRankConfig (rank ", rank, " on GPU ", device, ")"));
  settle(*process, {kWorldComm}, cat("starting the communicator of ", world_size, " rank(s)"));
  out.places = gather_places(*process, rank, world_size);
  // A non-blocking split leaves the new handle null until it completes, while the parent reports
  // it in progress: settle the parent first, then the child.
  nccl_check(ncclCommSplit(process->comms[kWorldComm], replica, stage, &process->comms[kPipelineComm], &config),
             process->comms[kWorldComm], "ncclCommSplit (replica pipelines)");
  settle(*process, {kWorldComm}, cat("making replica ", replica, "'s pipeline communicator"));
  settle(*process, {kPipelineComm}, cat("making replica ", replica, "'s pipeline communicator"));
  nccl_check(ncclCommSplit(process->comms[kWorldComm], stage, replica, &process->comms[kGroupComm], &config),
             process->comms[kWorldComm], "ncclCommSplit (stage groups)");
  settle(*process, {kWorldComm}, cat("making stage ", stage, "'s group communicator"));
  settle(*process, {kGroupComm}, cat("making stage ", stage, "'s group communicator"));
  if (stages > 1) connect_all_peers(*process, 1, stage, stages);  // slot 0: the pipeline
  out.pipeline = std::make_unique<NcclTransport>(process, kPipelineComm, stage, stages,
                                                 cat("stage ", stage, " of replica ", replica), "stage");
  out.group = std::make_unique<NcclTransport>(process, kGroupComm, replica, out.grid.replicas,
                                              cat("replica ", replica, " of stage ", stage), "replica");
  return out;
}

}  // namespace stateflow
