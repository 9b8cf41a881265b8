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

// The groups of params a layer may mark to share one bf16 copy (Param::bf16_group), each behind
// its own lever (kernels/cuda/levers.h): the GDN's Wq, Wk, Wv, Wg (fused_proj) and the MLP's W1,
// W3 (fused_mlp).
enum Bf16Group : int { kGdnInProj = 1, kMlpUpProj = 2 };
// Gives each group of params (Param::bf16_group, all of one row count) one bf16 copy, their
// columns side by side, cast from their fp32 values; the separate copies are freed. Only the
// groups whose bf16_group_shared_for_thread() is set (default: the group's lever).
void share_bf16_copies(const std::vector<Param*>& params);
bool& bf16_group_shared_for_thread(int group);
// Casts p.value (on the device) into p's bf16 copy, wherever that lives (after a load).
void refresh_bf16_copy(Param& p);

// AdamW on an fp32 device parameter (bitwise the CPU update), refreshing p.value_bf16 if any.
void adamw_update_device(Param& p, Tensor& m, Tensor& v, double lr, double decay, const AdamWConfig& cfg,
                         int64_t step);
// Sum of squares of every element of the device fp32 tensors ts, in double, in a fixed order;
// the host waits for the GPU once, whatever the number of tensors.
double sq_sum_device(const std::vector<const Tensor*>& ts);
// t *= factor on the device (fp32).
void scale_device(Tensor& t, double factor);

}  // namespace stateflow
