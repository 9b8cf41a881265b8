#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace stateflow {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    SF_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

Storage::Storage(size_t bytes, MemCategory c, MemoryTracker& t)
    : data_(allocate_bytes(bytes, c, t)), bytes_(bytes), category_(c), tracker_(t) {}

Storage::~Storage() { free_bytes(data_, bytes_, category_, tracker_); }

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory c) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), c,
                                         current_tracker());
  return t;
}

Tensor Tensor::reshape(const Shape& s) const {
  SF_CHECK(shape_numel(s) == numel(), "cannot reshape ", shape_str(shape_), " to ", shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::clone(MemCategory c) const {
  Tensor t = zeros(shape_, dtype_, c);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

void Tensor::zero_() {
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  SF_CHECK(src.numel() == numel() && src.dtype() == dtype_, "copy_from: shape/dtype mismatch ",
           shape_str(src.shape()), " ", dtype_name(src.dtype()), " -> ", shape_str(shape_), " ",
           dtype_name(dtype_));
  if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
}

void Tensor::add_(const Tensor& other) {
  SF_CHECK(other.numel() == numel() && other.dtype() == dtype_, "add_: shape/dtype mismatch ",
           shape_str(other.shape()), " vs ", shape_str(shape_));
  dispatch_float(dtype_, [&](auto z) {
    using T = decltype(z);
    T* a = data<T>();
    const T* b = other.data<T>();
    for (int64_t i = 0; i < numel(); ++i) a[i] += b[i];
  });
}

double Tensor::item() const {
  SF_CHECK(numel() == 1, "item() needs a single element, shape is ", shape_str(shape_));
  return dispatch_float(dtype_, [&](auto z) {
    using T = decltype(z);
    return static_cast<double>(*data<T>());
  });
}

static double to_double_at(const Tensor& t, int64_t i) {
  return dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    return static_cast<double>(t.data<T>()[i]);
  });
}

double max_rel_diff(const Tensor& a, const Tensor& ref) {
  SF_CHECK(a.numel() == ref.numel(), "max_rel_diff: sizes differ ", shape_str(a.shape()), " vs ",
           shape_str(ref.shape()));
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = to_double_at(a, i), r = to_double_at(ref, i);
    if (std::isnan(x) != std::isnan(r)) return INFINITY;
    num = std::max(num, std::fabs(x - r));
    den = std::max(den, std::fabs(r));
  }
  if (den == 0) return num;  // reference all zero: report the absolute difference
  return num / den;
}

}  // namespace stateflow
