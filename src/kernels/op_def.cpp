#include "kernels/op_def.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/op_inputs.h"

namespace stateflow {

int64_t OpShape::operator[](const std::string& name) const {
  for (const auto& [n, v] : sizes)
    if (n == name) return v;
  fail("op shape {", label(), "} has no size '", name, "'");
}

OpShape OpShape::with(const std::string& name, int64_t value) const {
  OpShape s = *this;
  for (auto& [n, v] : s.sizes)
    if (n == name) {
      v = value;
      return s;
    }
  fail("op shape {", label(), "} has no size '", name, "'");
}

std::string OpShape::times(const std::vector<std::string>& names) const {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " x ") + std::to_string((*this)[n]);
  return s;
}

std::string OpShape::label() const {
  std::string s;
  for (const auto& [n, v] : sizes) s += (s.empty() ? "" : ", ") + n + " " + std::to_string(v);
  return s;
}

OpArray OpDef::array(const OpShape& shape, const std::string& array_name) const {
  for (const OpArray& a : arrays(shape))
    if (a.name == array_name) return a;
  fail("op '", name, "' has no array '", array_name, "'");
}

const OpPass& OpDef::pass(const std::string& pass_name) const {
  for (const OpPass& p : passes)
    if (p.name == pass_name) return p;
  fail("op '", name, "' has no pass '", pass_name, "'");
}

namespace {

std::vector<OpDef>& registry() {
  static std::vector<OpDef> ops;
  return ops;
}

}  // namespace

OpRegistration::OpRegistration(OpDef def) {
  std::vector<OpDef>& ops = registry();
  SF_CHECK(!def.name.empty() && def.arrays && !def.passes.empty() && !def.test_shapes.empty() && def.bench_shapes,
           "op '", def.name, "' is incomplete: it needs a name, arrays, passes, test shapes and bench shapes");
  for (const OpPass& p : def.passes)
    SF_CHECK(!p.name.empty() && !p.writes.empty() && p.reference && p.flops && p.bytes, "op '", def.name, "' pass '",
             p.name, "' is incomplete: it needs a name, the arrays it writes, a reference, FLOPs and bytes");
  for (const OpDef& o : ops) SF_CHECK(o.name != def.name, "op '", def.name, "' is registered twice");
  const auto at = std::lower_bound(ops.begin(), ops.end(), def.name,
                                   [](const OpDef& o, const std::string& n) { return o.name < n; });
  ops.insert(at, std::move(def));
}

const std::vector<OpDef>& all_ops() { return registry(); }

const OpDef& op_named(const std::string& name) {
  std::string known;
  for (const OpDef& o : all_ops()) {
    if (o.name == name) return o;
    known += (known.empty() ? "" : ", ") + o.name;
  }
  fail("no op named '", name, "'; registered: ", known);
}

DType array_dtype(ArrayType t, DType act) {
  switch (t) {
    case ArrayType::Act: return act;
    case ArrayType::F32: return DType::F32;
    case ArrayType::BF16: return DType::BF16;
    case ArrayType::I32: return DType::I32;
  }
  return act;
}

size_t array_bytes(ArrayType t, DType act) { return dtype_size(array_dtype(t, act)); }

double round_to_storage(double x, DType stored) {
  switch (stored) {
    case DType::F32: return double(float(x));
    case DType::BF16: return double(float_from_bf16(bf16_from_float(float(x))));
    default: return x;
  }
}

uint64_t array_seed(uint64_t seed, size_t index) { return op_inputs::bits_at(seed, 1000 + index); }

OpHost draw_inputs(const OpDef& op, const OpShape& shape, DType act, uint64_t seed) {
  OpHost host;
  const std::vector<OpArray> arrays = op.arrays(shape);
  for (size_t a = 0; a < arrays.size(); ++a) {
    const OpArray& arr = arrays[a];
    std::vector<double>& v = host[arr.name];
    v.assign(size_t(arr.size), 0.0);
    if (arr.role == Role::Out) continue;
    const uint64_t s = array_seed(seed, a);
    const DType stored = array_dtype(arr.type, act);
    const bool unit_rows = arr.fill.kind == Fill::Kind::UnitRows;
    const int64_t width = unit_rows ? arr.fill.width : 1;
    SF_CHECK(width >= 1 && arr.size % width == 0, "op '", op.name, "': array '", arr.name, "' of ", arr.size,
             " elements is not whole rows of ", width);
    for (int64_t row = 0; row < arr.size / width; ++row) {
      const double inv = unit_rows ? op_inputs::inv_row_norm(s, uint64_t(row), width) : 1.0;
      for (int64_t j = row * width; j < (row + 1) * width; ++j)
        v[size_t(j)] = round_to_storage(op_inputs::fill_value(arr.fill, s, j, inv), stored);
    }
  }
  return host;
}

}  // namespace stateflow
