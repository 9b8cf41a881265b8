// The Mamba-3 layer's per-token operations on the GPU, with the semantics of mamba3_ops.h
// (docs/mamba3.md). Projections and core inputs/outputs are bf16, gates, angles and every
// gradient that feeds a sum fp32. rows = batch x len tokens, [batch, len, ...] layouts.
// Outputs are overwritten except where a gradient is said to be added to (+=). Parameter
// gradients are added through one partial sum per block of kTokenBlock tokens of each
// sequence (add_token_block_partials_cuda): deterministic, and bitwise the same for a
// sequence cut into chunks at multiples of kTokenBlock and run last chunk first. The
// backward calls take a workspace of the bytes the matching *_workspace_bytes returns.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stateflow {

// dt = softplus(dd_dt + dt_bias), adt = min(-softplus(dd_A), -a_floor) dt, lam = sigmoid(trap).
void mamba3_gates_forward_cuda(const __nv_bfloat16* dd_dt, const __nv_bfloat16* dd_A, const __nv_bfloat16* trap,
                               const float* dt_bias, float* dt, float* adt, float* lam, int64_t rows, int64_t H,
                               double a_floor, cudaStream_t stream);
size_t mamba3_gates_backward_workspace_bytes(int64_t rows, int64_t H, int64_t batch);
// ddt, dadt, dlam: the total gradients; d_dt_bias +=.
void mamba3_gates_backward_cuda(const __nv_bfloat16* dd_dt, const __nv_bfloat16* dd_A, const __nv_bfloat16* trap,
                                const float* dt_bias, const float* ddt, const float* dadt, const float* dlam,
                                __nv_bfloat16* d_dd_dt, __nv_bfloat16* d_dd_A, __nv_bfloat16* d_trap,
                                float* d_dt_bias, int64_t rows, int64_t H, int64_t batch, double a_floor,
                                void* workspace, cudaStream_t stream);

// phi_t[h] = wrap(phi_{t-1}[h] + dt_t[h] pi tanh(ang_t)), wrap = remainder(., 2 pi) per token,
// summed per segment of kTokenBlock tokens and then across them (the .cu says how; bitwise
// chunk-invariant at cuts at multiples of kTokenBlock, the CPU op's values up to rounding);
// ang bf16 [rows, NA], dt fp32 [rows, H], phi fp32 [rows, H, NA], phi_in / phi_out [batch, H, NA]
// (phi_in null: zeros).
void mamba3_angles_forward_cuda(const __nv_bfloat16* ang, const float* dt, const float* phi_in, float* phi,
                                float* phi_out, int64_t batch, int64_t len, int64_t H, int64_t NA,
                                cudaStream_t stream);
size_t mamba3_angles_backward_workspace_bytes(int64_t rows, int64_t H, int64_t NA);
// dphi fp32 [rows, H, NA] and dphi_out (null: zeros) -> dang bf16 [rows, NA], ddt += [rows, H],
// dphi_in [batch, H, NA]; the suffix sums of dphi go by segments as the forward's angles.
void mamba3_angles_backward_cuda(const __nv_bfloat16* ang, const float* dt, const float* dphi,
                                 const float* dphi_out, __nv_bfloat16* dang, float* ddt, float* dphi_in,
                                 int64_t batch, int64_t len, int64_t H, int64_t NA, void* workspace,
                                 cudaStream_t stream);

// out[row, h, r] = Rot(phi[row, h]) (bc[row, r, g(h)] + bias[h, r]); bc bf16 [rows, R, G, N]
// (normalised), bias fp32 [H, R, N], out bf16 [rows, H, R, N]. N even, NA <= N / 2.
void mamba3_rotary_bc_forward_cuda(const __nv_bfloat16* bc, const float* bias, const float* phi,
                                   __nv_bfloat16* out, int64_t rows, int64_t H, int64_t R, int64_t G, int64_t N,
                                   int64_t NA, cudaStream_t stream);
size_t mamba3_rotary_bc_backward_workspace_bytes(int64_t rows, int64_t H, int64_t R, int64_t N, int64_t batch);
// dout bf16 [rows, H, R, N] -> dbc bf16 [rows, R, G, N] (summed over a group's heads),
// dbias +=, dphi += [rows, H, NA] (from out, the forward's output).
void mamba3_rotary_bc_backward_cuda(const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* phi,
                                    __nv_bfloat16* dbc, float* dbias, float* dphi, int64_t rows, int64_t H,
                                    int64_t R, int64_t G, int64_t N, int64_t NA, int64_t batch, void* workspace,
                                    cudaStream_t stream);

// MIMO inputs X[row, h, r] = x[row, h] mimo_x[h, r] (bf16 [rows, H, P] -> [rows, H, R, P]).
void mamba3_expand_x_forward_cuda(const __nv_bfloat16* x, const float* mimo_x, __nv_bfloat16* X, int64_t rows,
                                  int64_t H, int64_t R, int64_t P, cudaStream_t stream);
size_t mamba3_rank_params_workspace_bytes(int64_t rows, int64_t H, int64_t R, int64_t P, int64_t batch);
// dX -> dx, dmimo_x +=.
void mamba3_expand_x_backward_cuda(const __nv_bfloat16* x, const float* mimo_x, const __nv_bfloat16* dX,
                                   __nv_bfloat16* dx, float* dmimo_x, int64_t rows, int64_t H, int64_t R, int64_t P,
                                   int64_t batch, void* workspace, cudaStream_t stream);

// out[row, h] = sum_r y[row, h, r] silu(z[row, h] mimo_z[h, r]) mimo_o[h, r]; mimo_* null = ones
// (SISO); y bf16 [rows, H, R, P], z and out bf16 [rows, H * P].
void mamba3_output_gate_forward_cuda(const __nv_bfloat16* y, const __nv_bfloat16* z, const float* mimo_z,
                                     const float* mimo_o, __nv_bfloat16* out, int64_t rows, int64_t H, int64_t R,
                                     int64_t P, cudaStream_t stream);
// dout -> dy, dz; dmimo_z, dmimo_o += (with mimo_*; workspace: mamba3_rank_params_workspace_bytes x 2).
void mamba3_output_gate_backward_cuda(const __nv_bfloat16* y, const __nv_bfloat16* z, const float* mimo_z,
                                      const float* mimo_o, const __nv_bfloat16* dout, __nv_bfloat16* dy,
                                      __nv_bfloat16* dz, float* dmimo_z, float* dmimo_o, int64_t rows, int64_t H,
                                      int64_t R, int64_t P, int64_t batch, void* workspace, cudaStream_t stream);

}  // namespace stateflow
