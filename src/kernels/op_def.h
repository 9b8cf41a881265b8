// One definition per GPU kernel family ("op"): the shapes it is tested and benchmarked at, how
// its inputs are drawn, its float64 reference, its tolerances, the FLOPs and bytes of each
// timed pass, and how to launch each pass on device arrays. The kernel tests
// (tests/cuda/test_op_defs_cuda.cpp walks every registered op) and the benchmarks (bench/)
// read the same definition, so a kernel's correctness check and its timing cannot drift
// apart. docs/design.md, "How to define a kernel's op", has a worked example.
//
// An op names its arrays; each is an input, an output, or an accumulator (read, then added
// into, like dW += x^T dy). Values live on the host as float64, already rounded to what the
// array's storage holds, so the reference sees exactly what the kernel reads.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace stateflow {

// Named integers of one case: sizes, and settings a launch takes (e.g. a tile width).
struct OpShape {
  std::vector<std::pair<std::string, int64_t>> sizes;
  int64_t operator[](const std::string& name) const;  // throws Error naming the missing size
  std::string label() const;                          // "rows 37, dim 48"
  OpShape with(const std::string& name, int64_t value) const;  // a copy with one size changed
  std::string times(const std::vector<std::string>& names) const;  // {"rows", "dim"} -> "37 x 48"
};

// The sizes a benchmark program runs at; an op makes its bench shapes from them.
struct BenchSizes {
  int64_t batch = 1, tokens = 32768, dim = 2048, heads = 16, mlp_hidden = 5632, vocab = 32000, conv = 4;
};

// An array's element type. Act is the activation type the op is run with (f32 or bf16).
enum class ArrayType { Act, F32, BF16, I32 };

// How an input's values are drawn from (seed, index): the same formulas on the host
// (draw_inputs) and on the device (OpBuffers::draw), kernels/op_inputs.h.
struct Fill {
  enum class Kind {
    Normal,     // a + b * N(0, 1)
    Uniform,    // uniform in [a, b)
    UnitRows,   // rows of `width` normals scaled to unit length (l2-normalised q, k)
    Sigmoid,    // sigmoid(N(0, 1)): gates in (0, 1) like beta
    LogDecay,   // -A_h softplus(N(0, 1) + dt_bias_h), h = index % width, A_h in [1, 16), dt in
                // [0.001, 0.1): log-decays as a linear-recurrence layer makes them
    Ids,        // integers in [0, width) (token ids, targets)
  };
  Kind kind = Kind::Normal;
  double a = 0, b = 1;
  int64_t width = 0;
  static Fill normal(double scale = 1, double mean = 0) { return {Kind::Normal, mean, scale, 0}; }
  static Fill uniform(double lo, double hi) { return {Kind::Uniform, lo, hi, 0}; }
  static Fill unit_rows(int64_t width) { return {Kind::UnitRows, 0, 1, width}; }
  static Fill sigmoid() { return {Kind::Sigmoid, 0, 1, 0}; }
  static Fill log_decay(int64_t heads) { return {Kind::LogDecay, 0, 1, heads}; }
  static Fill ids(int64_t below) { return {Kind::Ids, 0, 1, below}; }
};

enum class Role { In, Out, Acc };

// An array's tolerance: max|got - ref| / max|ref| at most `f32` when the op runs with f32
// activations and `bf16` with bf16 (0 = the same values exactly).
struct Tolerance {
  double f32 = 2e-5, bf16 = 1.5e-2;
  double at(DType act) const { return act == DType::BF16 ? bf16 : f32; }
};
constexpr Tolerance kFp32Math{2e-5, 2e-5};  // fp32 storage and arithmetic whatever the activations
constexpr Tolerance kExact{0, 0};

struct OpArray {
  std::string name;
  ArrayType type;
  int64_t size;  // elements
  Role role;
  Fill fill = {};           // In and Acc
  Tolerance tolerance = {};  // Out and Acc
};

using OpHost = std::map<std::string, std::vector<double>>;  // array name -> values

struct OpLaunch;  // kernels/cuda/op_launch.h: device pointers, workspace, cuBLAS handle

// One timed launch of the op ("fwd", "bwd", ...). Passes run in order on the same arrays;
// each has its float64 reference, which reads the inputs and what earlier passes left.
struct OpPass {
  std::string name;
  std::vector<std::string> writes;  // the Out and Acc arrays it writes: what its test compares
  // Sets `writes` in host from the other arrays, in float64; `act` says what the kernel stores
  // intermediates in (a reference may round one as the kernel does).
  std::function<void(const OpShape&, DType act, OpHost& host)> reference;
  std::function<double(const OpShape&)> flops;  // matrix FLOPs (multiply-add = 2); 0 when memory-bound
  std::function<double(const OpShape&)> bytes;  // fewest bytes it must move: each input read once, each output written once
  void (*run)(const OpLaunch&) = nullptr;       // set in CUDA builds only
  bool baseline = false;  // a library call timed for comparison (left out of the GEMM ceiling)
};

struct OpDef {
  std::string name;    // "rmsnorm"
  std::string label;   // the bench's row name before the pass: "rmsnorm" -> "rmsnorm fwd"
  std::vector<DType> acts = {DType::F32, DType::BF16};  // activation types it is tested with
  std::vector<OpShape> test_shapes;
  std::function<std::vector<OpShape>(const BenchSizes&)> bench_shapes;
  std::function<std::vector<OpArray>(const OpShape&)> arrays;
  // Device workspace a launch gets (set in CUDA builds: only launches use it).
  std::function<size_t(const OpShape&)> workspace_bytes = [](const OpShape&) { return size_t(0); };
  std::vector<OpPass> passes;
  std::function<std::string(const OpShape&)> bench_label = [](const OpShape& s) { return s.label(); };
  std::string bench = "kernels_bench";  // the bench program that times it

  OpArray array(const OpShape& shape, const std::string& name) const;  // throws naming it
  const OpPass& pass(const std::string& name) const;                          // throws naming it
};

// Registry: each op file registers its definition with
//   static const OpRegistration registered(make_rmsnorm_op());
struct OpRegistration {
  explicit OpRegistration(OpDef def);
};
const std::vector<OpDef>& all_ops();             // sorted by name
const OpDef& op_named(const std::string& name);  // throws Error listing the known ops

// An array's element type, and its bytes per element, when run with activation type `act`.
size_t array_bytes(ArrayType t, DType act);
DType array_dtype(ArrayType t, DType act);
// x as an array of type `stored` holds it (bf16 / f32 rounding; ids unchanged).
double round_to_storage(double x, DType stored);

// Every In and Acc array of the op at `shape`, drawn with seeds derived from `seed` and the
// array's position, rounded to its storage; Out arrays sized and zero.
OpHost draw_inputs(const OpDef& op, const OpShape& shape, DType act, uint64_t seed);
// The seed array number `index` of an op is drawn with (host and device agree).
uint64_t array_seed(uint64_t seed, size_t index);

}  // namespace stateflow
