// The optimizer's and the gradient clipping's operations on parameters that live on the GPU
// (model/cuda/device_ops_cuda.cpp; a CPU-only build has stubs that throw).
#pragma once
#include <cstdint>
#include <vector>

#include "model/param.h"
#include "model/optimizer.h"

namespace stateflow {

// Starts device d's backend (GPU: init_cuda_backend); nothing for the CPU.
void init_device(Device d);

// --sm-split: runs the calling thread's GPU work, for the rest of its life, on part `part` of
// `parts` equal, disjoint sets of its GPU's multiprocessors (kernels/cuda/sm_partition_cuda.h);
// returns the part's multiprocessor count. The thread's work is then queued apart from other
// threads': hand a device tensor to another thread only after synchronize_gpu_thread().
int use_gpu_sm_partition(int part, int parts);
// Waits for the GPU work the calling thread queued (not the whole GPU's).
void synchronize_gpu_thread();

// AdamW on an fp32 device parameter (bitwise the CPU update), refreshing p.value_bf16 if any.
void adamw_update_device(Param& p, Tensor& m, Tensor& v, double lr, double decay, const AdamWConfig& cfg,
                         int64_t step);
// Sum of squares of every element of the device fp32 tensors ts, in double, in a fixed order;
// the host waits for the GPU once, whatever the number of tensors.
double sq_sum_device(const std::vector<const Tensor*>& ts);
// t *= factor on the device (fp32).
void scale_device(Tensor& t, double factor);

}  // namespace stateflow
