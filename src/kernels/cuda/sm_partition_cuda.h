// Splitting one GPU's multiprocessors (SMs) between threads with CUDA green contexts, so that
// pipeline stages sharing a GPU run side by side, each on its own SMs, like a pipeline of smaller
// GPUs (`--sm-split`). A per-process software partition: nothing about the device changes.
// HBM bandwidth, L2 and the copy engines stay shared.
//
// A thread that enters part i of n makes a green context current: from then on everything it
// issues (kernels on its default stream, streams it creates, cuBLAS and cuDNN calls on them)
// runs on that part's SMs, in a queue of its own that is not ordered with other threads' work.
// The green contexts share the primary context's memory, so pointers pass freely between parts.
#pragma once
#include <string>

namespace stateflow {

// Makes the calling thread run on part `part` (0-based) of `parts` equal, disjoint SM sets of
// its current GPU, for the rest of the thread's life. The parts are made once per GPU and count
// and kept; each holds floor(SMs / parts) rounded down to the driver's granularity (8 on
// Hopper: 2 x 64 of an H200's 132), the SMs left over run nothing. A part may be current to one
// thread at a time. Throws, naming the fix, when the driver has no green contexts or the GPU
// has too few SMs for `parts`.
void use_sm_partition(int part, int parts);

// SMs that work of the calling thread's current context may use (the whole GPU's outside a part).
int sm_count_of_thread();

// "64 of 132 SMs": the size of one of `parts` parts of the current GPU (for profile keys and logs).
std::string sm_partition_description(int parts);

// Waits until the work the calling thread queued on its default stream is done (not other
// threads': with SM partitions, each thread's queue is its own).
void synchronize_thread_stream();

}  // namespace stateflow
