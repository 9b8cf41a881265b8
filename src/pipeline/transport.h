// How stages talk: point-to-point tensors keyed by what they carry, plus the two small
// collectives a training step needs. One interface for in-process threads (local), CPU
// processes (MPI) and GPUs (NCCL). Every blocking call gives up after the transport's
// timeout with an Error that names the peer, so a dead or stalled stage never hangs a run.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"
#include "pipeline/schedule.h"

namespace stateflow {

// What a message is: the output of F(m,c) (activation) or B(m,c) (input gradient).
struct MessageTag {
  Payload payload = Payload::Activation;
  int microbatch = 0;
  int chunk = 0;
  auto operator<=>(const MessageTag&) const = default;
};
std::string describe(const MessageTag& t);

// What the receiver expects a message to be. NCCL must post a receive of known size; the
// other transports check the arriving tensor against it, so a sender and a receiver that
// disagree fail at once instead of corrupting a later step.
struct MessageSpec {
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
};
// Throws an Error naming the message, the peer and both shapes/dtypes/devices when t does not
// match spec.
void check_arrival(const Tensor& t, const MessageSpec& spec, int peer, const MessageTag& tag);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;
  // The GPU (CUDA device index) this rank's stage must run on, or -1 where the transport does
  // not place stages (local and MPI transports: the stage uses the process's current device).
  virtual int cuda_device() const { return -1; }
  // Asynchronous: returns at once; the tensor must not be modified afterwards.
  virtual void send(int peer, const MessageTag& tag, const Tensor& t) = 0;
  // The tagged message from `peer`, which must match `spec` (allocated on the receiver,
  // charged to the thread's current category); throws after the timeout. Host transports
  // block until it has arrived; on a GPU it may return at once with the data still arriving,
  // ordered before any later work on the stage's compute stream.
  virtual Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) = 0;
  // Bracket a run of consecutive sends and receives that may be issued together (NCCL: one
  // group, so two stages sending to each other at the same time cannot deadlock).
  virtual void begin_batch() {}
  virtual void end_batch() {}
  // Sum of `value` over all ranks, returned on every rank.
  virtual double all_reduce_sum(double value) = 0;
  virtual double all_reduce_max(double value) = 0;
  // Data parallelism, on a stage group's transport (one rank per replica): starts summing
  // each tensor in place over the group's ranks and returns at once; `what` names them in
  // errors. Every rank starts the same tensors in the same order. Transports that join no
  // replicas (local threads) refuse.
  virtual void start_all_reduce_sum(const std::vector<Tensor>& tensors, const std::string& what);
  // Returns when every sum started is done (throws after the timeout naming what it waited for).
  virtual void wait_all_reduces() {}
  // Waits for outstanding sends to complete (end of a step).
  virtual void flush() = 0;
  // Tells every peer that this rank failed, so they stop waiting for it (best effort).
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace stateflow
