// The device arrays of one op at one shape (kernels/op_def.h), for its test and its
// benchmark: allocated once, filled from host values (tests: the same values the float64
// reference reads) or drawn on the device with the same formulas (benchmarks: large shapes),
// then each pass launched on them.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/gemm_cuda.h"
#include "kernels/op_def.h"

namespace stateflow {

class OpBuffers {
 public:
  // Throws OutOfMemoryError when the device cannot hold them.
  OpBuffers(const OpDef& op, const OpShape& shape, DType act);
  ~OpBuffers();
  OpBuffers(const OpBuffers&) = delete;
  OpBuffers& operator=(const OpBuffers&) = delete;

  void upload(const OpHost& host);  // every array, each rounded to its storage
  void draw(uint64_t seed);         // In and Acc arrays as draw_inputs(op, shape, act, seed) draws them
  void poison_outputs();            // NaN into every Out array, so an unwritten element shows
  OpHost download() const;          // every array, as float64
  std::vector<unsigned char> raw(const std::string& name) const;  // an array's bytes

  void run(const OpPass& pass);  // launches one pass (asynchronously, default stream)
  void run_all();                // every pass, in order
  // Whether a launch wrote past the op's workspace_bytes (into a guard band kept after it):
  // a definition that under-sizes its workspace shows here rather than as a rare crash.
  bool workspace_overrun() const;

  void* ptr(const std::string& name) const;
  void* workspace() const { return workspace_; }
  size_t bytes() const { return bytes_; }  // device memory held, workspace included
  const std::vector<OpArray>& arrays() const { return arrays_; }
  CublasGemm& gemm() { return *gemm_; }

 private:
  const OpDef& op_;
  OpShape shape_;
  DType act_;
  std::vector<OpArray> arrays_;
  std::map<std::string, void*> ptrs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<CublasGemm> gemm_;
};

}  // namespace stateflow
