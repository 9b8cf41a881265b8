// What a Mamba-3 forward pass keeps for its backward pass, on the CPU and on the GPU (the GPU
// keeps the projections, B/C, the core's inputs and outputs in bf16, gates and angles in fp32).
#pragma once
#include "model/layer.h"

namespace stateflow {

struct Mamba3Stash : Stash {
  Tensor x;                       // layer input [rows, D]
  State state_in;                 // what entered the chunk (empty = zeros)
  Tensor z, xr, Bp, Cp;           // projections: gate, x, B and C before their norms
  Tensor dd_dt, dd_A, trap, ang;  // projections of the per-head scalars and the angles
  Tensor rstd_B, rstd_C;          // RMSNorm of B and C
  Tensor dt, adt, lam, phi;       // gates [rows, H]; cumulative angle [rows, H, NA]
  Tensor X, b, c;                 // core inputs [rows, H, R, P|N] (b, c rotated; GPU SISO: X is xr)
  Tensor y, o;                    // core output [rows, H, R, P]; gated output [rows, H*P]
  Tensor yn, rstd_y;              // output_norm: RMSNorm of y (the gate's input) and its statistics
};

}  // namespace stateflow
