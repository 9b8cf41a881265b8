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

// AdamW on an fp32 device parameter (bitwise the CPU update), refreshing p.value_bf16 if any.
void adamw_update_device(Param& p, Tensor& m, Tensor& v, double lr, double decay, const AdamWConfig& cfg,
                         int64_t step);
// Sum of squares of every element of the device fp32 tensors ts, in double, in a fixed order;
// the host waits for the GPU once, whatever the number of tensors.
double sq_sum_device(const std::vector<const Tensor*>& ts);
// t *= factor on the device (fp32).
void scale_device(Tensor& t, double factor);

}  // namespace stateflow
